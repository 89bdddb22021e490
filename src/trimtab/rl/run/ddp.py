"""``trimtab train`` with several learner processes (``torchrun --nproc-per-node N -m trimtab
train ...``): DDP on the agent's online network, each rank its own envs and replay.

What each rank does differently, and what they share:

- **Seeds.** Rank ``r`` runs with ``run.seed + SEED_STRIDE * r`` (rank 0 with the run's own
  seed): its envs, replay sampling and exploration are its own; the network starts from rank
  0's weights (DDP broadcasts them), and the target network is synced from them.
- **Gradients** are averaged by DDP in the backward pass, so the clip, the optimizer and its
  statistics see the same gradients and produce the same weights and slots on every rank.
- **Bounds and flags.** The targets and trunk bounds (measured on each rank's own batch), the
  sentinel's threshold scales and its first-fire records are reduced over the ranks once per
  learn step by :class:`trimtab.distributed.RankConsistent`; every halt decision is taken on
  merged records, so all ranks stop at the same step with one report naming the rank.
- **Files.** Rank 0 alone writes the run directory: config, metrics, checkpoints, report.
  A mid-fold checkpoint holds every rank's fold state (envs, replay, generator), gathered to
  rank 0, so each rank resumes exactly; it refuses another world size. A fold checkpoint holds
  no fold state and resumes at any world size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trimtab.distributed import RankConsistent, consistent_ranks
from trimtab.rl.configio import ConfigError
from trimtab.rl.run.checkpoint import CheckpointError

__all__ = ["SEED_STRIDE", "AgentDDP", "NullLog", "Ranks", "fold_state_for", "rank_seed",
           "world_size_from_env"]  # fmt: skip

#: Rank r runs with seed ``run.seed + SEED_STRIDE * r``: far apart, so that the per-fold seeds
#: derived from it (``fold_seeds``: ``seed * 1009 + fold``) never meet another rank's.
SEED_STRIDE = 100_003

BACKENDS = ("gloo", "nccl")


def world_size_from_env() -> int:
    """The number of processes torchrun (or any ``env://`` launcher) started: ``WORLD_SIZE``."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank_seed(seed: int, rank: int) -> int:
    return seed + SEED_STRIDE * rank


#: DDP's runtime statistics (its logger) are gathered on iterations 1-10 and then every
#: ``sample rate`` iterations (torch's default: 100) by host waits on CUDA events of the
#: previous iteration (``cudaEventSynchronize``, which ``set_sync_debug_mode`` does not see):
#: the trainer reads none of them, so after the first 10 iterations it takes none.
NO_RUNTIME_STATS = 2**31 - 1


class AgentDDP(DistributedDataParallel):
    """DDP around the agent's online network, which the agent calls as its own network: the
    network's other methods (``q_values``, ``quantiles``) and its ``state_dict`` (without
    DDP's ``module.`` prefix) pass through to it. Its runtime statistics are off after the
    first 10 iterations (:data:`NO_RUNTIME_STATS`): no host wait in the learn step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set_ddp_runtime_logging_sample_rate(NO_RUNTIME_STATS)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":  # not wrapped yet: no recursion through self.module
                raise
            return getattr(self.module, name)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self.module.load_state_dict(*args, **kwargs)


@dataclass
class Ranks:
    """This process's place in a multi-process run, and the collective steps the runner takes
    (built by :meth:`init` from torchrun's environment)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    consistent: RankConsistent | None = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # --- setting up ---------------------------------------------------------------------------
    @classmethod
    def init(cls, device: str, backend: str | None = None) -> Ranks:
        """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``). ``device`` is ``run.device``: on ``cuda``
        each rank takes ``cuda:LOCAL_RANK`` (with more ranks than GPUs on a node, ``LOCAL_RANK``
        modulo the GPU count: ranks share GPUs, which only ``gloo`` allows). ``backend``:
        ``gloo`` on the CPU and ``nccl`` on CUDA unless named."""
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]  # fmt: skip
        if missing:
            raise ConfigError(
                f"a multi-process run needs torchrun's environment; {missing} unset: launch with "
                "`torchrun --nproc-per-node N -m trimtab train ...`"
            )
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if device.startswith("cuda:"):
            raise ConfigError(
                f"run.device={device!r} under {world} processes: each rank takes "
                "cuda:LOCAL_RANK; set run.device = 'cuda' (or --device cuda)"
            )
        dev, shared = torch.device(device), 0
        if device == "cuda":
            count = torch.cuda.device_count()
            if count == 0:
                raise ConfigError("run.device = 'cuda' but torch sees no CUDA device; use "
                                  "--device cpu")  # fmt: skip
            # more ranks on this node than GPUs: rank r shares GPU r mod count (gloo only)
            dev = torch.device("cuda", local % count)
            here = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            shared = here if here > count else 0
        backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
        if backend not in BACKENDS:
            raise ConfigError(f"--dist-backend {backend!r}: choose one of {list(BACKENDS)}")
        if backend == "nccl" and shared:
            raise ConfigError(
                f"{shared} ranks on {torch.cuda.device_count()} GPU(s) of this node: NCCL refuses "
                "two ranks on one device; launch at most one process per GPU, or share GPUs "
                "with --dist-backend gloo (collectives through host memory: slower, and not "
                "free of host syncs)"
            )
        if not dist.is_available() or not dist.is_backend_available(backend):
            raise ConfigError(
                f"torch.distributed backend {backend!r} is not available in this torch build "
                f"({torch.__version__}); use --dist-backend gloo (CPU) or a build with "
                f"{backend}"
            )
        if backend == "nccl" and dev.type != "cuda":
            raise ConfigError("the nccl backend runs on CUDA devices: set --device cuda, or use "
                              "--dist-backend gloo on the CPU")  # fmt: skip
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend, rank=rank, world_size=world)
        return cls(rank, world, local, backend, dev)

    def config(self, cfg: Any) -> Any:
        """This rank's config: its seed (rank 0: the run's own, which ``config.toml`` keeps);
        the learn step eager (a CUDA graph of it would hold DDP's collectives: refused when
        asked for, off under ``auto``). ``cuda`` is this rank's device (:meth:`init` made
        ``cuda:LOCAL_RANK`` the current one)."""
        if cfg.run.cuda_graph == "on":
            raise ConfigError(
                f"run.cuda_graph='on' under {self.world_size} processes: the captured learn "
                "step cannot hold DDP's gradient all-reduce; set run.cuda_graph = 'off' or 'auto'"
            )
        run = replace(cfg.run, seed=rank_seed(cfg.run.seed, self.rank), cuda_graph="off")
        return replace(cfg, run=run)

    def out(self, out: str) -> str:
        """Rank 0's run directory, the same for every rank (a default name holds the time)."""
        box = [out]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def agree(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on rank 0 and hand its result to every rank; an exception there is
        raised on every rank (so none waits in a collective for a rank that gave up)."""
        box: list[Any] = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn(*args))
            except Exception as e:  # re-raised below on every rank, rank 0 included
                box[0] = ("error", e)
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise value
        return value

    def parts(self) -> dict[str, Any]:
        """What :func:`trimtab.rl.agent.learner.build_learner` takes from this process's place
        in the run, passed in once: ``wrap_online`` puts DDP on the online network (rank 0's
        weights broadcast, the target copied from them) and ``consistent`` reduces the bounds,
        threshold scales and sentinel over the ranks (one all_reduce before each step's fold,
        one of the flags before each halt decision)."""
        ids = [self.device.index] if self.device.type == "cuda" else None

        def wrap_online(net: nn.Module) -> nn.Module:
            # static_graph: the IQN head's parameters are used outside the network's forward
            # (or, with iqn_weight = 0, not at all); the same set every step.
            return AgentDDP(net, device_ids=ids, broadcast_buffers=False, static_graph=True)

        if self.consistent is None:
            self.consistent = RankConsistent()
        return {"wrap_online": wrap_online, "consistent": self.consistent}

    def prepare(self, cfg: Any, resume: bool) -> tuple[Path, Any]:
        """Rank 0 prepares and locks the run directory (:func:`prepare_run_dir`); every rank
        gets its path, or rank 0's error."""
        from trimtab.rl.run.rundir import prepare_run_dir

        held: list[Any] = []

        def prepare() -> str:
            run_dir, lock = prepare_run_dir(cfg, resume)
            held.append(lock)
            return str(run_dir)

        run_dir = Path(self.agree(prepare))
        return run_dir, held[0] if held else _NoLock()

    # --- checkpoints --------------------------------------------------------------------------
    def gather_fold_state(self, fold: dict[str, Any], learner: Any) -> dict[str, Any] | None:
        """Every rank's fold state, on rank 0 (None elsewhere): what a mid-fold checkpoint
        holds so that each rank resumes where it was. First the ranks are checked to hold the
        same weights and state vector (a divergence is an error, not a checkpoint)."""
        self.check_consistent(learner)
        fold = {**fold, "agent_generator": learner.agent.generator.get_state(),
                "torch_rng": torch.get_rng_state()}  # fmt: skip
        states: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(fold, states, dst=0)
        if not self.is_main:
            return None
        return {"world_size": self.world_size, "ranks": states}

    def check_consistent(self, learner: Any) -> None:
        """Raise on every rank if the ranks' state vectors or weights differ (one gather of the
        state vector and each weight's sum and sum of squares; a host read)."""
        params = [p.detach().double() for p in learner.params]
        sums = torch.stack([torch.stack([p.sum(), p.square().sum()]) for p in params])
        if not consistent_ranks([learner.stability.state.tensor, sums.to(self.device)]):
            raise RuntimeError(
                f"the {self.world_size} ranks hold different weights or bounds at step "
                f"{learner.agent.num_updates}: a part of the step is not rank-consistent "
                "(a bug: please report it with the run's config)"
            )

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class _NoLock:
    """What ranks other than 0 hold instead of the run directory's lock."""

    def release(self) -> None:
        pass


class NullLog:
    """The metrics log of ranks other than 0: rank 0 alone writes ``metrics.csv``."""

    def write(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def fold_state_for(
    fold_state: dict[str, Any] | None, ranks: Ranks | None, path: Path | str, learner: Any
) -> dict[str, Any] | None:
    """This process's part of a checkpoint's fold state; a checkpoint written mid-fold by
    another number of processes is refused (each rank's envs and replay were saved)."""
    if fold_state is None:  # a fold checkpoint: any number of processes continues it
        return None
    world = 1 if ranks is None else ranks.world_size
    saved = fold_state.get("world_size", 1) if "ranks" in fold_state else 1
    if saved != world:
        raise CheckpointError(
            f"checkpoint {path} was written mid-fold by {saved} process(es) and holds each "
            f"one's envs and replay; this run has {world}. Resume it with "
            f"`torchrun --nproc-per-node {saved} -m trimtab train --resume ...` (or plain "
            "`trimtab train --resume` for 1), or resume from a fold checkpoint "
            "(RUN_DIR/checkpoints/fold_K.pt), which any number of processes can continue"
        )
    if ranks is None:
        return fold_state
    own = fold_state["ranks"][ranks.rank]
    learner.agent.generator.set_state(own["agent_generator"])  # this rank's streams
    torch.set_rng_state(own["torch_rng"])
    return own
