"""CartPole-v1 as ``n_envs`` torch environments stepped by one call, on any device.

Gymnasium's dynamics, thresholds, rewards and reset distribution, computed for a whole batch
with no host synchronisation and no Python loop over envs, so a CartPole run can keep
thousands of envs on a GPU (and its step can be captured in a CUDA graph).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from trimtab._impl import resolve_impl
from trimtab.rl.envs.trading import StepResult

__all__ = ["BatchedCartPole", "cartpole_dynamics"]

# Gymnasium's CartPoleEnv constants (gymnasium/envs/classic_control/cartpole.py), computed the
# same way so that every float64 operation below is the one gymnasium does.
GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds per step (Euler integrator)
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
MAX_EPISODE_STEPS = 500  # CartPole-v1's TimeLimit
RESET_LOW, RESET_HIGH = -0.05, 0.05
#: What the step's Triton kernel reads (:data:`trimtab.kernels.cartpole.CONSTANTS`).
_KERNEL_CONSTANTS = {
    "force_mag": FORCE_MAG, "neg_force_mag": -FORCE_MAG, "gravity": GRAVITY,
    "masspole": MASSPOLE, "total_mass": TOTAL_MASS, "length": LENGTH,
    "polemass_length": POLEMASS_LENGTH, "four_thirds": 4.0 / 3.0, "tau": TAU,
    "x_threshold": X_THRESHOLD, "theta_threshold": THETA_THRESHOLD,
    "reset_low": RESET_LOW, "reset_span": RESET_HIGH - RESET_LOW,
}  # fmt: skip


def cartpole_dynamics(state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
    """One Euler step of ``state [N, 4] = (x, x_dot, theta, theta_dot)`` under ``action [N]``
    (1 pushes right, anything else left): the next state and whether it terminates.

    With ``F = ±10``, ``m = 0.1``, ``M = 1.1``, ``l = 0.5`` (Barto, Sutton & Anderson 1983, as
    in Gymnasium; Florian 2005 for the derivation):

        temp = (F + m l theta_dot^2 sin theta) / M
        theta_acc = (g sin theta - cos theta temp) / (l (4/3 - m cos^2 theta / M))
        x_acc = temp - m l theta_acc cos theta / M

    then ``x += tau x_dot; x_dot += tau x_acc; theta += tau theta_dot; theta_dot += tau
    theta_acc``, and the episode terminates when ``|x| > 2.4`` or ``|theta| > 12 deg``.
    """
    x, x_dot, theta, theta_dot = state.unbind(-1)
    force = torch.where(action == 1, FORCE_MAG, -FORCE_MAG).to(state.dtype)
    costheta, sintheta = torch.cos(theta), torch.sin(theta)
    temp = (force + POLEMASS_LENGTH * theta_dot.square() * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * costheta.square() / TOTAL_MASS)
    )
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    # x += tau x_dot, ... for the four components at once: per element the same multiply and
    # add as Gymnasium's four lines (three tensor ops instead of nine, which the CPU notices)
    nxt = state + TAU * torch.stack([x_dot, xacc, theta_dot, thetaacc], dim=-1)
    # Gymnasium's x < -2.4 or x > 2.4 (and theta's) is |x| > 2.4: the same for every float
    x, theta = nxt[..., 0], nxt[..., 2]
    terminated = (x.abs() > X_THRESHOLD) | (theta.abs() > THETA_THRESHOLD)
    return nxt, terminated


class BatchedCartPole:
    """``n_envs`` CartPole-v1 episodes, all stepped by one call, with same-step autoreset.

    The state is held in ``dtype`` (float64, as Gymnasium, by default; float32 is the fast
    choice on a GPU); observations are float32, as Gymnasium's. A step applies
    :func:`cartpole_dynamics`, pays a reward of 1 (also on the terminating step), terminates
    past the thresholds and truncates at step 500 (``truncated`` is Gymnasium's TimeLimit flag,
    so it can be set together with ``terminated``). Where an episode ended, ``final_obs`` is the
    state it reached and ``obs`` the next episode's first observation, drawn from
    ``U(-0.05, 0.05)^4`` by a seeded ``torch.Generator`` on the env's device.

    On CUDA (``impl=None`` with Triton installed) a step is one ``torch.rand`` (the reset draw)
    and one Triton launch (:mod:`trimtab.kernels.cartpole`) in place of the eager step's
    dozens of ops, with their arithmetic op for op: in float64 the same bits (the GPU tests
    check it), in float32 within its rounding a step (1e-6 of the state's scale: its sin, cos
    and quotients round as torch's within an ulp); the eager step is the reference and the CPU
    path. ``impl="torch"`` or ``"triton"`` forces one, by :func:`trimtab._impl.resolve_impl`'s
    rules.
    """

    obs_dim = 4
    n_actions = 2

    def __init__(
        self,
        n_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
        max_episode_steps: int = MAX_EPISODE_STEPS,
        impl: str | None = None,
    ) -> None:
        if n_envs < 1 or max_episode_steps < 1:
            raise ValueError(
                f"need n_envs >= 1 and max_episode_steps >= 1, got {n_envs} and {max_episode_steps}"
            )
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.n_envs, self.device, self.dtype = n_envs, torch.device(device), dtype
        self.max_episode_steps = max_episode_steps
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.state = torch.zeros(n_envs, 4, dtype=dtype, device=self.device)
        self.elapsed = torch.zeros(n_envs, dtype=torch.long, device=self.device)
        self.episode_return = torch.zeros(n_envs, dtype=torch.float32, device=self.device)
        self.impl = impl
        self._launch: Any = None
        if resolve_impl(impl, (self.state,)) == "triton":
            from trimtab.kernels import cartpole as cartpole_kernel

            self._launch = cartpole_kernel.launch_step
            self._constants = cartpole_kernel.pack_constants(_KERNEL_CONSTANTS, dtype, self.device)
        self.reset()

    def _uniform(self) -> Tensor:
        return torch.rand(self.n_envs, 4, generator=self.generator, dtype=self.dtype,
                          device=self.device)  # fmt: skip

    def _initial_states(self) -> Tensor:
        return RESET_LOW + (RESET_HIGH - RESET_LOW) * self._uniform()  # numpy's uniform(low, high)

    def reset(self, seed: int | None = None) -> Tensor:
        """Start every env anew; ``seed`` reseeds the generator first. Returns ``obs [N, 4]``."""
        if seed is not None:
            self.generator.manual_seed(seed)
        self.state.copy_(self._initial_states())
        self.elapsed.zero_()
        self.episode_return.zero_()
        return self.state.float()

    def step(self, action: Tensor) -> StepResult:
        """Apply ``action [N]`` or ``[N, 1]`` (0 left, 1 right); see the class docstring."""
        if self._launch is not None:  # the kernel computes the reset states from the same draw
            return StepResult(*self._launch(self.state, action.reshape(self.n_envs), self.elapsed,
                                            self.episode_return, self._uniform(), self._constants,
                                            self.max_episode_steps))  # fmt: skip
        nxt, terminated = cartpole_dynamics(self.state, action.reshape(self.n_envs))
        self.elapsed += 1
        truncated = self.elapsed >= self.max_episode_steps
        reward = torch.ones(self.n_envs, dtype=torch.float32, device=self.device)
        self.episode_return += reward
        ep_return = self.episode_return.clone()
        done = terminated | truncated
        # Drawn every step, used where an episode ended: computing, not branching, keeps the
        # step free of host syncs and the random stream independent of which envs finished.
        fresh = self._initial_states()
        self.state.copy_(torch.where(done.unsqueeze(1), fresh, nxt))
        self.elapsed.masked_fill_(done, 0)
        self.episode_return.masked_fill_(done, 0.0)
        return StepResult(self.state.float(), reward, terminated, truncated, nxt.float(), ep_return)

    def state_dict(self) -> dict[str, Any]:
        """Everything that evolves: states, step counts, returns, the generator."""
        return {
            "state": self.state.clone(),
            "elapsed": self.elapsed.clone(),
            "episode_return": self.episode_return.clone(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["state"].shape != self.state.shape:
            raise ValueError(
                f"env state holds {state['state'].shape[0]} envs, this env {self.n_envs}"
            )
        for name in ("state", "elapsed", "episode_return"):
            getattr(self, name).copy_(state[name])
        self.generator.set_state(state["generator"])
