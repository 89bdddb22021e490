"""The walk-forward trading trainer: market data, features, environments, metrics.

Submodules are imported explicitly (``from trimtab.rl.envs.trading import BatchedTradingEnv``);
importing this package loads nothing heavy (no pandas, no gymnasium).

- ``market``: the embedded seeded synthetic market (regimes, fat tails, learnable structure).
- ``data``: loading and validating users' OHLCV files (CSV / Parquet) into ``MarketData``.
- ``features``: causal per-asset features and a training-window-only normaliser.
- ``env``: the batched torch trading environment and its gymnasium wrapper.
- ``metrics``: per-window Sharpe, return, drawdown, turnover, hit rate and baselines.
"""
