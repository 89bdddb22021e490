"""What a run's config needs in memory, checked against what its device has before any run
directory exists, and the one line an out-of-memory during a run ends in.

The estimate counts what grows with the config's sizes: the replay buffer (allocated whole at
each fold's start), the networks with their gradients, target copy and optimizer moments, one
learn step's activations, and the envs stepped together. It is an estimate (allocator slack,
CUDA graphs and the interpreter are not in it): a config is refused only when the estimate
alone exceeds what is available, so nothing that would fit is refused.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from trimtab.rl.configio import ConfigError
from trimtab.rl.envs.protocol import EnvAdapter

__all__ = ["OutOfMemory", "available_bytes", "check_memory", "estimate_bytes", "is_out_of_memory",
           "out_of_memory"]  # fmt: skip

#: a Gymnasium env copy on the host (a Python object with its state and spaces), measured on
#: CartPole-v1 with tracemalloc: ~6 KiB; rounded up
HOST_ENV_BYTES = 16 << 10
#: floats held per on-device env (observation, next observation, reward, position, episode
#: bookkeeping) per observation dimension: the collector keeps ~4 copies of an observation
ENV_FLOATS_PER_OBS_DIM = 4
#: the networks' parameters are held ~6 times: online, target, gradient, Adam's two moments,
#: and the weight clamp's statistics / a captured step's static copies
PARAMETER_COPIES = 6
#: a key to lower for each part of the estimate
LOWER = {
    "replay": "agent.replay_capacity",
    "networks": "agent.hidden (or agent.depth)",
    "activations": "agent.batch_size (or agent.n_tau)",
    "envs": "env.n_envs",
}


class OutOfMemory(ConfigError):
    """The device ran out of memory; the message names the config keys to lower."""


def _parameters(obs_dim: int, branch_sizes: Sequence[int], a: Any) -> int:
    if a.assetwise is True:  # one branch's network on one asset's block, shared by the branches
        d = len(branch_sizes)
        return _parameters(obs_dim // d, branch_sizes[:1], replace(a, assetwise=False))
    h = int(a.hidden)
    hh = int(a.head_hidden or h)
    if a.trunk == "gated":  # one Linear, then depth gated residual blocks of 4 H x H each
        trunk = obs_dim * h + 4 * int(a.depth) * h * h
    else:
        trunk = obs_dim * h + (int(a.depth) - 1) * h * h + 2 * h * int(a.depth)
    value = (h * hh + hh * int(a.n_atoms)) if a.dueling else 0  # one value stream
    head = value + sum(h * hh + hh * n * int(a.n_atoms) for n in branch_sizes)  # advantages
    # the IQN head: τ's cosine embedding into the trunk's width, a quantile stream per branch
    iqn = int(a.iqn_embed) * h + h + (h * hh + hh if a.dueling else 0)
    iqn += sum(h * hh + hh * n for n in branch_sizes)
    iqn = iqn if a.iqn_weight > 0 else 0
    return trunk + head + iqn


def estimate_bytes(
    cfg: Any, obs_dim: int, branch_sizes: Sequence[int], envs_on_device: bool
) -> dict[str, int]:
    """Bytes per part of a run of ``cfg`` (a :class:`~trimtab.rl.config.TrainConfig`) whose
    envs observe ``obs_dim`` floats and act on ``branch_sizes``: ``replay``, ``networks``,
    ``activations`` and ``envs`` (on the device when ``envs_on_device``, else on the host)."""
    a = cfg.agent
    d = len(branch_sizes)
    # a reward per branch (the market's per-asset parts) or one: the larger, as an upper bound
    row = 2 * obs_dim * 4 + d * 8 + 4 * d + 4 + (4 if a.prioritized else 0)
    replay = (int(a.replay_capacity) + 1) * row
    networks = PARAMETER_COPIES * 4 * _parameters(obs_dim, branch_sizes, a)
    b, h = int(a.batch_size), int(a.hidden)
    trunks = d if a.assetwise is True else 1  # the assetwise trunk runs once per branch
    widest = max(branch_sizes)
    per_sample = (
        3 * (int(a.depth) + 2) * h * trunks  # trunk activations (online, target, next)
        + 4 * d * widest * int(a.n_atoms)  # logits and probabilities, online and target
        + (int(a.n_tau) + int(a.n_tau_target)) * (h * trunks + int(a.iqn_embed) + 2 * d * widest)
    )
    activations = 4 * b * per_sample * 2  # forward and backward
    n_envs = int(cfg.env.n_envs)
    envs = n_envs * (ENV_FLOATS_PER_OBS_DIM * obs_dim * 4 if envs_on_device else HOST_ENV_BYTES)
    return {"replay": replay, "networks": networks, "activations": activations, "envs": envs}


def available_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` (CUDA: the driver's free bytes; the CPU: ``MemAvailable`` of
    /proc/meminfo, else free pages), or None where it cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**24 else f"{n / 2**20:.3g} MiB"


def check_memory(cfg: Any, adapter: EnvAdapter, device: torch.device) -> dict[str, int]:
    """Refuse (:class:`~trimtab.rl.configio.ConfigError`, one line) a config whose estimate
    (:func:`estimate_bytes`) exceeds the memory ``device`` has free, naming the parts and the
    keys to lower; returns the estimate. Host envs count against the host's memory."""
    parts = estimate_bytes(cfg, adapter.obs_dim, adapter.branch_sizes, adapter.on_device)
    checks = [(device, parts)]
    if not adapter.on_device and device.type != "cpu":  # host envs beside a GPU's parts
        host = {"envs": parts["envs"]}
        checks = [(device, {k: v for k, v in parts.items() if k not in host}),
                  (torch.device("cpu"), host)]  # fmt: skip
    for where, need in checks:
        have = available_bytes(where)
        total = sum(need.values())
        if have is None or total <= have:
            continue
        big = sorted(need.items(), key=lambda kv: -kv[1])
        said = ", ".join(f"{k} {_gib(v)}" for k, v in big if v >= total / 100)
        raise ConfigError(
            f"this config needs about {_gib(total)} on {where} ({said}) and {where} has "
            f"{_gib(have)} free: lower {LOWER[big[0][0]]}"
            + (f" or {LOWER[big[1][0]]}" if len(big) > 1 and big[1][1] > total / 4 else "")
        )
    return parts


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure: CUDA's, Python's, or the CPU allocator's
    RuntimeError."""
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def out_of_memory(
    error: BaseException, parts: dict[str, int], device: torch.device, run_dir: Any
) -> OutOfMemory:
    """The one line an out-of-memory during a run ends in: where, and the keys that size what
    the run holds, largest first by the estimate ``parts`` (:func:`estimate_bytes`)."""
    keys = [LOWER[k] for k, _ in sorted(parts.items(), key=lambda kv: -kv[1])]
    return OutOfMemory(
        f"out of memory on {device} during the run in {run_dir} ({type(error).__name__}): "
        f"lower {', '.join(keys[:-1])} or {keys[-1]} (largest first, by the estimate: "
        f"{', '.join(f'{k} {_gib(v)}' for k, v in parts.items())}); a resumed run keeps its "
        "config, so start a new run with the lower value"
    )
