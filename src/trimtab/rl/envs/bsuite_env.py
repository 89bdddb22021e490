"""bsuite (DeepMind's behaviour suite) under its own rules: ``env.name = "bsuite:<bsuite_id>"``
(e.g. ``bsuite:cartpole_scale/3``), bsuite's own environment through ``dm_env``, logged by
bsuite's own CSV logger into ``<run>/bsuite/``, where ``bsuite.logging.csv_load`` and an
experiment's ``analysis.score`` read it.

The rules kept: one environment, stepped episode after episode (``env.n_envs`` is 1), for the
experiment's own episode budget (``bsuite.sweep.EPISODES``; ``gym.total_steps``, when set,
caps the env steps as well); the rewards the agent sees are the environment's own (the
``*_scale`` experiments scale them; ``env.reward_scale`` stays 1 for a run under bsuite's rules).
One thing is added: bsuite leaves many ids unseeded (``seed = None``), so each run is seeded
from ``run.seed`` and the id's number, which makes a run reproducible and ``--resume``-able;
the id still fixes the experiment and its settings.

bsuite 0.3.5, its last release, still names ``np.int`` (removed in NumPy 1.24) and
``collections.Mapping`` (removed in Python 3.10): those aliases (the builtins ``int``,
``float``, ``bool`` and ``collections.abc.Mapping``, which they always were) are restored before
bsuite is imported, where they are missing, so bsuite's own environments and loaders run. Its
analysis code asks matplotlib for the style ``seaborn-poster`` (``seaborn-v0_8-poster`` since
matplotlib 3.6) and sets global styles as it is imported: the old name is registered for the new
style, and the import runs inside ``matplotlib.rc_context`` so the run's own plots keep theirs.
"""

from __future__ import annotations

import builtins
import collections
import collections.abc
import importlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import ConfigError
from trimtab.rl.envs.gym_state import EnvStateError, from_data, to_data
from trimtab.rl.envs.protocol import EnvStep, FoldPlan

__all__ = ["BSUITE_PREFIX", "BsuiteAdapter", "analysis_module", "bsuite_modules", "score_results"]

BSUITE_PREFIX = "bsuite:"
#: attributes of bsuite's env layers rebuilt with the env, never saved (the chain link, the
#: logger, whose rows are saved apart, and constants of the env's construction)
_SKIP = frozenset({"_env", "_logger", "_init_fn", "_cartpole_config"})


def bsuite_modules() -> tuple[Any, Any, Any]:
    """``(bsuite, bsuite.sweep, bsuite.logging.csv_logging)``; a one-line error naming the
    extra when bsuite is not installed."""
    for alias in ("int", "float", "bool"):  # bsuite 0.3.5 names these; NumPy >= 1.24 lacks them
        if alias not in np.__dict__:
            setattr(np, alias, getattr(builtins, alias))
    if not hasattr(collections, "Mapping"):  # its loader's; Python >= 3.10 lacks it
        collections.Mapping = collections.abc.Mapping  # type: ignore[attr-defined]
    try:
        bsuite = importlib.import_module("bsuite")
        sweep = importlib.import_module("bsuite.sweep")
        csv_logging = importlib.import_module("bsuite.logging.csv_logging")
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"env.name = 'bsuite:...' needs bsuite ({e.name} is not installed): "
            "pip install 'trimtab[bsuite]'"
        ) from None
    return bsuite, sweep, csv_logging


def _layers(env: Any) -> list[Any]:
    out = [env]
    while "_env" in vars(out[-1]):
        out.append(vars(out[-1])["_env"])
    return out


class BsuiteAdapter:
    """One bsuite id as one "fold": its episode budget of training on one env, logged in
    bsuite's format, then ``gym.eval_episodes`` greedy episodes on a fresh, unlogged env."""

    #: the env steps on the host: collection runs eagerly (trimtab.rl.run.collect)
    on_device = False
    reward_parts = False  # one reward per step

    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        _, sweep, _ = bsuite_modules()
        self.cfg, self.device = cfg, device
        self.bsuite_id = cfg.env.name.removeprefix(BSUITE_PREFIX)
        if self.bsuite_id not in sweep.SWEEP:
            experiments = sorted({i.split(sweep.SEPARATOR)[0] for i in sweep.SWEEP})
            raise ConfigError(
                f"env.name = {cfg.env.name!r}: {self.bsuite_id!r} is no bsuite id; an id is "
                f"EXPERIMENT/NUMBER (e.g. cartpole_scale/3), the experiments: "
                f"{', '.join(experiments)}"
            )
        if cfg.env.n_envs != 1:
            raise ConfigError(
                f"env.n_envs = {cfg.env.n_envs}: a bsuite run steps one env, episode after "
                "episode, as bsuite's rules and logger count them; leave env.n_envs at "
                '"auto" (1) or set it to 1'
            )
        self.experiment, number = self.bsuite_id.split(sweep.SEPARATOR)
        self.number = int(number)
        self.settings = dict(sweep.SETTINGS[self.bsuite_id])
        self.budget = int(sweep.EPISODES[self.bsuite_id])
        probe = self._make(seed=0)
        spec = probe.action_spec()
        if not hasattr(spec, "num_values"):
            raise ConfigError(f"{cfg.env.name}: the agent needs discrete actions, not {spec}")
        self.branch_sizes = [int(spec.num_values)]
        self.obs_dim = int(np.prod(probe.observation_spec().shape))
        self.n_folds, self.n_envs = 1, 1
        self.results_dir = Path(cfg.run.out) / "bsuite"
        self.env: Any = None
        self.ep_return = 0.0
        # the training returns of the last 100 episodes, for the summary
        self.finished: collections.deque[float] = collections.deque(maxlen=100)

    # --- the env ---------------------------------------------------------------------------
    def _seed(self, seed: int) -> int:
        return seed * 1000 + self.number

    def _make(self, seed: int) -> Any:
        """The id's environment, seeded where bsuite leaves it unseeded."""
        bsuite, _, _ = bsuite_modules()
        kwargs = dict(self.settings)
        if "seed" in kwargs and kwargs["seed"] is None:
            kwargs["seed"] = self._seed(seed)
        return bsuite.load(self.experiment, kwargs)

    def plan(self, k: int) -> FoldPlan:
        g = self.cfg.gym
        cap = None if g.total_steps == "auto" else int(g.total_steps)
        # the progress bar's length: the cap's updates, else a guess of 100 steps an episode
        steps = cap if cap is not None else 100 * self.budget
        expected = max((steps - g.learning_starts) // g.train_every, 1)
        return FoldPlan(k, g.learning_starts, expected, max_env_steps=cap,
                        stop=self.budget_spent)  # fmt: skip

    def budget_spent(self) -> bool:
        """Whether the experiment's episode budget is done (bsuite's logger counts it)."""
        return self.env is not None and _episodes(self.env) >= self.budget

    def updates_due(self, before: int, after: int) -> int:
        """One gradient step per ``gym.train_every`` env steps."""
        every = self.cfg.gym.train_every
        return after // every - before // every

    def open_fold(self, k: int, seed: int) -> Tensor:
        _, _, csv_logging = bsuite_modules()
        self.env = csv_logging.wrap_environment(
            self._make(seed), self.bsuite_id, str(self.results_dir), overwrite=True
        )
        self.ep_return = 0.0
        return self._obs(self.env.reset().observation)

    def _obs(self, observation: Any) -> Tensor:
        x = np.asarray(observation, dtype=np.float32).reshape(1, -1)
        return torch.as_tensor(x, device=self.device)

    def step(self, action: Tensor) -> EnvStep:
        ts = self.env.step(int(action.reshape(-1)[0]))
        reward = float(ts.reward or 0.0)
        final = self._obs(ts.observation)
        self.ep_return += reward
        ended = self.ep_return
        last = ts.last()
        terminated = last and float(ts.discount) == 0.0
        if last:  # same-step reset: the successor stored is the true last observation
            self.finished.append(ended)
            self.ep_return = 0.0
            obs = self._obs(self.env.reset().observation)
        else:
            obs = final
        dev = self.device
        return EnvStep(
            obs, torch.tensor([reward], dtype=torch.float32, device=dev), final,
            torch.tensor([terminated], device=dev), torch.tensor([last and not terminated],
                                                                 device=dev),
            torch.tensor([ended], dtype=torch.float64, device=dev),
        )  # fmt: skip

    def generators(self) -> list[torch.Generator]:
        """No device generator: the env draws from its own numpy generator on the host."""
        return []

    # --- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain data: every layer's data attributes (numbers, arrays, numpy random states,
        the cart-pole's state) and the logger's rows."""
        layers = []
        for layer in _layers(self.env):
            attrs = {}
            for name, value in vars(layer).items():
                if name in _SKIP:
                    continue
                try:
                    attrs[name] = to_data(value)
                except TypeError:
                    continue
            layers.append({"class": type(layer).__qualname__, "attrs": attrs})
        logger = vars(self.env)["_logger"]
        return {"layers": layers, "log": to_data(list(logger._data)),
                "ep_return": self.ep_return, "finished": list(self.finished)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        layers = _layers(self.env)
        names = [type(layer).__qualname__ for layer in layers]
        saved = [s["class"] for s in state["layers"]]
        if names != saved:
            raise EnvStateError(
                f"the saved bsuite env has the layers {saved}, this one {names}: it was made "
                "by another bsuite version or id"
            )
        for layer, s in zip(layers, state["layers"], strict=True):
            for name, data in s["attrs"].items():
                setattr(layer, name, from_data(data, getattr(layer, name, None)))
        logger = vars(self.env)["_logger"]
        logger._data = from_data(state["log"])
        if logger._data:  # the CSV as it was at the checkpoint (later rows were redone)
            import pandas as pd

            pd.DataFrame(logger._data).to_csv(logger._save_path, index=False)
        self.ep_return = float(state["ep_return"])
        self.finished = collections.deque(state["finished"], maxlen=100)

    def normalizer_state(self) -> None:
        return None

    # --- the end ---------------------------------------------------------------------------
    def evaluate(self, agent: Any, k: int) -> tuple[dict[str, Any], None]:
        """Undiscounted returns (the env's own rewards) of ``gym.eval_episodes`` greedy
        episodes on a fresh env that logs nothing; bsuite's score is from the training log."""
        env = self._make(seed=10_000 + self.cfg.run.seed)
        returns = []
        for _ in range(self.cfg.gym.eval_episodes):
            ts, total = env.reset(), 0.0
            while not ts.last():
                a = agent.act(self._obs(ts.observation), 0, greedy=True)
                ts = env.step(int(a.reshape(-1)[0]))
                total += float(ts.reward or 0.0)
            returns.append(total)
        recent = list(self.finished)
        row = {"fold": k, "episodes": len(returns), "mean_return": float(np.mean(returns)),
               "std_return": float(np.std(returns)), "min_return": float(np.min(returns)),
               "max_return": float(np.max(returns)),
               "train_return_last100": float(np.mean(recent)) if recent else None,
               "train_episodes": _episodes(self.env)}  # fmt: skip
        return row, None

    def summary(self, rows: list[dict[str, Any]], run_dir: Any = None) -> dict[str, Any]:
        keys = ("episodes", "mean_return", "std_return", "min_return", "max_return")
        out: dict[str, Any] = {
            "bsuite_id": self.bsuite_id,
            "bsuite_experiment": self.experiment,
            "bsuite_settings": {k: v for k, v in self.settings.items() if k != "seed"},
            "bsuite_budget_episodes": self.budget,
            "bsuite_dir": "bsuite",
            "train_episodes": rows[-1]["train_episodes"] if rows else None,
            # whether the experiment's whole budget ran (bsuite scores a shorter log too, on
            # the episodes it has: not the experiment's score)
            "bsuite_complete": bool(rows) and rows[-1]["train_episodes"] >= self.budget,
            "train_return_last100": rows[-1]["train_return_last100"] if rows else None,
            "eval": {k: rows[-1][k] for k in keys} if rows else None,
        }
        if run_dir is not None and rows:
            out["bsuite_score"] = score_results(Path(run_dir) / "bsuite", self.experiment)
        return out

    def close(self) -> None:
        if self.env is not None:
            self.env.flush()
        self.env = None


def _episodes(env: Any) -> int:
    """The episodes bsuite's logging wrapper has counted (its ``_episode``)."""
    return int(vars(env)["_episode"])


def score_results(results_dir: Path, experiment: str) -> float | None:
    """bsuite's own score of the ids logged in ``results_dir`` for ``experiment``
    (``bsuite.experiments.<experiment>.analysis.score`` on ``csv_load``'s frame); None where
    nothing was logged (a run shorter than bsuite's first log point)."""
    bsuite_modules()
    from bsuite.logging import csv_load

    if not any(Path(results_dir).glob("*.csv")):
        return None
    df, _ = csv_load.load_bsuite(str(results_dir))
    df = df[df.bsuite_env == experiment]
    if df.empty:
        return None
    return float(analysis_module(experiment).score(df))


def analysis_module(experiment: str) -> Any:
    """``bsuite.experiments.<experiment>.analysis`` (its ``score`` and plots), imported without
    changing matplotlib's global style (see the module docstring)."""
    bsuite_modules()
    import matplotlib
    import matplotlib.style

    library = matplotlib.style.library
    if "seaborn-poster" not in library and "seaborn-v0_8-poster" in library:
        library["seaborn-poster"] = library["seaborn-v0_8-poster"]
    with matplotlib.rc_context():
        return importlib.import_module(f"bsuite.experiments.{experiment}.analysis")
