"""How much of the oracle's edge the features expose to a learner with one fold's data: simple
supervised predictors of each asset's next filled return, fit on each walk-forward training
window only and traded out of sample, net of the trainer's fills and costs.

    python benchmarks/experiments/probe_signal.py [--set KEY=VALUE ...] [--out FILE.json] \\
        [--key NAME]

It uses the trainer's own pieces on the trainer's default config (``--set`` changes it, as
``trimtab train --set`` does): :func:`trimtab.rl.run.walkforward.load_market` (features, next-open
fills, costs), :func:`~trimtab.rl.run.walkforward.make_folds` and the per-fold normaliser
(:func:`~trimtab.rl.run.walkforward.fold_arrays`), and the backtest's
:func:`~trimtab.rl.backtest.baselines.simulate` (the env's formula), so a probe's pooled
out-of-sample Sharpe is computed as the agent's is: each fold's test window traded from the
decision on the last training day, the folds' daily net returns concatenated, the Sharpe of
their excess over the cash rate (:func:`trimtab.rl.backtest.stats.sharpe`).

Target: what a position taken at decision ``t`` earns per unit weight if it is held one day,
``y_t = post_{t+1} + pre_{t+2}`` (the intraday part of the next bar and the overnight part of
the one after: the next-open fill's share; the oracle bets on its expectation). Predictors,
one model shared by the assets (as the agent's trunk is), fit on the training window's
decisions (less the embargo), ridge penalty and no-trade band chosen on the window's last
quarter (fit on the first three quarters), then refit on the whole window:

- ``ridge``: ridge regression on the eight features of ``WIDE``;
- ``ridge_pairs``: on the features and their pairwise products and squares (``ret_1 x
  autocorr_20`` is the product the market's regime-dependent autocorrelation rewards);
- ``mlp``: a small MLP (2 x 32, weight decay, 300 full-batch Adam epochs);
- ``ridge_ac``: ridge on the features plus the two signed-move products ``ac_move_1``,
  ``mkt_ac_move_1`` alone;
- ``mlp_vol``: the same MLP on the run's observation (``env.features``; by default ``ret_1`` and
  ``mkt_vol_10``);
- ``mlp_bins``: the same MLP on the run's observation as the trainer encodes it with
  ``env.feature_bins = VOL_BINS`` (each feature and its piecewise-linear components over
  quantile bins of the training window, :class:`~trimtab.rl.data.features.FeatureNormalizer`);
- ``volbin``: ridge on ``ret_1`` and a constant within each of ``VOL_BINS`` bins of the
  market's volatility level ``mkt_vol_10`` (bin edges: quantiles of the training window): a
  sign of the bet on yesterday's move per volatility level, the model class of the market's
  regime-dependent autocorrelation, with 2 x ``VOL_BINS`` coefficients;
- ``regime_known``: a diagnostic ceiling that no trader has: ridge on the day's true regime
  (one-hot) and its product with ``ret_1``; it says whether one fold's data suffice once the
  regime is known (then the features, not the data, are what limit a learner).

Position rules (levels ``-1, 0, 1`` as the agent's, or continuous): ``sign`` (the sign of the
prediction), ``band`` (flat unless ``|prediction|`` exceeds a band), ``hold`` (hysteresis: move
to the sign of the prediction only when ``|prediction|`` exceeds the band, else keep the last
level). Each model x rule's pooled Sharpe, turnover and the fraction of the oracle's Sharpe
are recorded, with the baselines on the same days for reference.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trimtab.benchmarking import benchmark_parser, markdown_table, provenance, save_record
from trimtab.rl.backtest import baselines as bl
from trimtab.rl.backtest import stats
from trimtab.rl.backtest.pooled import _oracle_edge
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import apply_overrides, from_dict
from trimtab.rl.data.features import FEATURE_NAMES, FeatureNormalizer
from trimtab.rl.run.walkforward import load_market, make_folds

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "probe_signal.json"
LAMBDAS = (0.1, 1.0, 10.0, 100.0, 1000.0)
BAND_QUANTILES = (0.0, 0.25, 0.5, 0.75, 0.9)
VOL_BINS = 6
#: the eight per-asset features the ridge, pairs and MLP models read (the earlier default)
WIDE = FEATURE_NAMES[:8]


def design(x: np.ndarray, kind: str) -> np.ndarray:
    """Rows ``[N, F]`` of normalised features -> the model's inputs (with a constant)."""
    cols = [np.ones((len(x), 1)), x]
    if kind == "pairs":
        f = x.shape[1]
        cols.append(np.stack([x[:, i] * x[:, j] for i in range(f) for j in range(i, f)], 1))
    return np.concatenate(cols, 1)


def ridge_fit(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    pen = lam * np.eye(x.shape[1])
    pen[0, 0] = 0.0  # the intercept is not shrunk
    return np.linalg.solve(x.T @ x + pen, x.T @ y)


def mlp_fit(x: np.ndarray, y: np.ndarray, wd: float, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
        torch.nn.ReLU(), torch.nn.Linear(32, 1),
    )  # fmt: skip
    xt = torch.as_tensor(x, dtype=torch.float32)
    scale = float(np.std(y)) or 1.0
    yt = torch.as_tensor(y / scale, dtype=torch.float32)[:, None]
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=wd)
    for _ in range(300):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(xt), yt)
        loss.backward()
        opt.step()
    net.scale = scale  # type: ignore[attr-defined]
    return net


def mlp_predict(net: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return net(torch.as_tensor(x, dtype=torch.float32))[:, 0].numpy() * net.scale  # type: ignore[attr-defined]


def positions(pred: np.ndarray, rule: str, band: float) -> np.ndarray:
    """Levels ``[L, A]`` from predictions ``[L, A]``."""
    if rule == "sign":
        return np.sign(pred)
    if rule == "band":
        return np.where(np.abs(pred) > band, np.sign(pred), 0.0)
    if rule == "hold":
        out = np.zeros_like(pred)
        prev = np.zeros(pred.shape[1])
        for i in range(len(pred)):
            prev = np.where(np.abs(pred[i]) > band, np.sign(pred[i]), prev)
            out[i] = prev
        return out
    raise ValueError(rule)


def run_levels(levels: np.ndarray, market: Any, start: int, end: int) -> np.ndarray:
    """Net daily log returns of levels ``[L, A]`` over decisions ``start .. end - 1``."""
    sim = bl.simulate(levels, market.fills.slice(start + 1, end + 1), market.costs)
    return sim.log_returns[0], sim.weights[0]


def fold_data(market: Any, fold: Any, feats_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fold's features normalised with its training window's statistics (as
    :func:`trimtab.rl.run.walkforward.fold_arrays`), and the targets ``y [T, A]``."""
    norm = FeatureNormalizer().fit(feats_all[fold.train_start : fold.fit_end])
    pre, post = market.fills.pre, market.fills.post
    t_len = len(pre)
    y = np.full(pre.shape, np.nan)
    y[: t_len - 2] = np.expm1(post[1 : t_len - 1]) + np.expm1(pre[2:t_len])
    return norm.transform(feats_all[: fold.test_end]), y


def sharpe_of(x: np.ndarray, market: Any) -> float:
    return stats.sharpe(x, market.periods_per_year, market.costs.cash_per_bar)


def probe(cfg: TrainConfig) -> dict[str, Any]:
    market = load_market(cfg)
    folds = make_folds(market.n_days, cfg)
    # every feature (the default 8 and the two products), for the probes that use them
    every = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, features=FEATURE_NAMES))
    full = load_market(every).features.astype(np.float64)
    # the wide models read the eight features of the earlier default observation
    default_idx = [FEATURE_NAMES.index(n) for n in WIDE]
    ac_idx = [*default_idx, FEATURE_NAMES.index("ac_move_1"), FEATURE_NAMES.index("mkt_ac_move_1")]
    obs_idx = [FEATURE_NAMES.index(n) for n in cfg.env.features]
    models = {
        "ridge": (default_idx, "linear"),
        "ridge_ac": (ac_idx, "linear"),
        "ridge_pairs": (default_idx, "pairs"),
        "mlp": (default_idx, "mlp"),
        "mlp_vol": (obs_idx, "mlp"),
        "mlp_bins": (obs_idx, "mlp_bins"),
        "volbin": ([FEATURE_NAMES.index("ret_1"), FEATURE_NAMES.index("mkt_vol_10")], "volbin"),
        # a diagnostic ceiling, not a trader: the day's true regime (one-hot, and x ret_1)
        "regime_known": ([FEATURE_NAMES.index("ret_1")], "regime"),
    }
    rules = ("sign", "band", "hold")
    curves: dict[str, list[np.ndarray]] = {}
    weights: dict[str, list[np.ndarray]] = {}
    chosen: dict[str, list[dict[str, Any]]] = {}
    ic: dict[str, list[float]] = {}
    base_curves: dict[str, list[np.ndarray]] = {n: [] for n in ("buy_and_hold", "oracle")}
    for fold in folds:
        feats, y = fold_data(market, fold, full)
        start, end = fold.train_end - 1, fold.test_end - 1  # decisions of the test window
        tr = np.arange(fold.train_start, fold.fit_end - 2)  # targets inside the fit window
        cut = tr[: int(0.75 * len(tr))], tr[int(0.75 * len(tr)) :]
        te = np.arange(start, end)
        # the observation as the trainer encodes it with env.feature_bins = VOL_BINS
        raw = full[: fold.test_end][:, :, obs_idx]
        binned = FeatureNormalizer(bins=VOL_BINS).fit(raw[fold.train_start : fold.fit_end])
        encoded = binned.transform(raw)
        level = feats[:, 0, FEATURE_NAMES.index("mkt_vol_10")]  # the same for every asset
        edges = np.quantile(level[tr], np.linspace(0, 1, VOL_BINS + 1)[1:-1])
        r = market.log_returns
        base_curves["buy_and_hold"].append(
            run_levels(bl.buy_and_hold(r, start=start, end=end), market, start, end)[0]
        )
        edge = _oracle_edge(market, start, end, cfg.env.execution)
        base_curves["oracle"].append(
            run_levels(
                bl.oracle_levels(edge, (-1, 0, 1), market.costs.per_turnover), market, start, end
            )[0]
        )
        for name, (idx, kind) in models.items():

            def rows(
                days: np.ndarray, idx=idx, kind=kind, feats=feats, edges=edges, encoded=encoded
            ) -> np.ndarray:
                if kind == "mlp_bins":
                    return encoded[days].reshape(len(days) * encoded.shape[1], -1)
                x = feats[days][:, :, idx].reshape(-1, len(idx))
                if kind == "volbin":  # [ret_1, level] -> per bin: ret_1 and a constant
                    onehot = np.eye(VOL_BINS)[np.searchsorted(edges, x[:, 1])]
                    return np.concatenate([onehot * x[:, :1], onehot], 1)
                if kind == "regime":
                    oh = np.repeat(np.eye(4)[market.regimes[days]], feats.shape[1], axis=0)
                    return np.concatenate([oh, oh * x], 1)
                return x if kind == "mlp" else design(x, kind)

            def fit(days: np.ndarray, reg: float, kind=kind, y=y):
                x, t = rows(days), y[days].reshape(-1)
                if kind.startswith("mlp"):
                    return mlp_fit(x, t, reg)
                return ridge_fit(x, t, reg * len(x) / 1000.0)

            def predict(model: Any, days: np.ndarray, kind=kind) -> np.ndarray:
                x = rows(days)
                p = mlp_predict(model, x) if kind.startswith("mlp") else x @ model
                return p.reshape(len(days), -1)

            regs = (1e-4, 1e-3, 1e-2) if kind.startswith("mlp") else LAMBDAS
            # choose the penalty and each rule's band on the window's last quarter, in-sample
            best: dict[str, tuple[float, float, float]] = {}
            for reg in regs:
                m = fit(cut[0], reg)
                p_val = predict(m, cut[1])
                p_fit = predict(m, cut[0])
                for rule in rules:
                    for q in BAND_QUANTILES if rule != "sign" else (0.0,):
                        band = float(np.quantile(np.abs(p_fit), q))
                        lv = positions(p_val, rule, band)
                        s = sharpe_of(run_levels(lv, market, cut[1][0], cut[1][-1] + 1)[0], market)
                        if rule not in best or s > best[rule][0]:
                            best[rule] = (s, reg, q)
            for rule in rules:
                _, reg, q = best[rule]
                m = fit(tr, reg)
                p_fit = predict(m, tr)
                band = float(np.quantile(np.abs(p_fit), q))
                p_te = predict(m, te)
                key = f"{name}/{rule}"
                x, w = run_levels(positions(p_te, rule, band), market, start, end)
                curves.setdefault(key, []).append(x)
                weights.setdefault(key, []).append(w)
                chosen.setdefault(key, []).append({"fold": fold.index, "reg": reg, "band_q": q})
                if rule == "sign":
                    yt = y[te]
                    ok = np.isfinite(yt)
                    ic.setdefault(name, []).append(float(np.corrcoef(p_te[ok], yt[ok])[0, 1]))
    oracle = sharpe_of(np.concatenate(base_curves["oracle"]), market)
    out: dict[str, Any] = {
        "baselines": {n: sharpe_of(np.concatenate(c), market) for n, c in base_curves.items()},
        "probes": {},
    }
    for key, parts in curves.items():
        x = np.concatenate(parts)
        w = np.concatenate(weights[key])
        s = sharpe_of(x, market)
        out["probes"][key] = {
            "sharpe": s,
            "oracle_fraction": s / oracle,
            "turnover": stats.turnover(w),
            "exposure": stats.exposure(w),
            "per_fold_sharpe": [sharpe_of(p, market) for p in parts],
            "chosen": chosen[key],
        }
    out["information_coefficient"] = {k: [round(v, 4) for v in vals] for k, vals in ic.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = benchmark_parser(__doc__, DEFAULT_OUT, key=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = from_dict(TrainConfig, apply_overrides({}, args.set))
    res = probe(cfg)
    record = {**provenance("cpu"), "overrides": args.set, **res}
    print(f"baselines: {res['baselines']}")
    header = ["probe", "pooled Sharpe", "of oracle", "turnover", "exposure", "per fold"]
    body = [(k, f"{v['sharpe']:+.2f}", f"{v['oracle_fraction']:.2f}", f"{v['turnover']:.3f}",
             f"{v['exposure']:.2f}", " ".join(f"{s:+.2f}" for s in v["per_fold_sharpe"]))
            for k, v in res["probes"].items()]  # fmt: skip
    print(markdown_table(header, body))
    print("IC per fold:", res["information_coefficient"])
    key = save_record(args.out, args.key, record)
    print(f"record {key} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
