"""What a training run prints while it runs: each fold's progress (a tqdm bar on a terminal,
plain lines elsewhere) and each fold's line of out-of-sample results as it ends."""

from __future__ import annotations

import sys
import time
from typing import Any

from trimtab.rl.config import TrainConfig
from trimtab.rl.envs.protocol import FoldPlan

__all__ = ["LineProgress", "close_bar", "fold_bar", "print_fold", "show_row"]


class LineProgress:
    """Progress as plain lines, for a stderr that is not a terminal (a log file, a scheduler's
    capture): one line per tenth of the fold and at its end, where a tqdm bar would rewrite
    itself hundreds of times a second into the file."""

    def __init__(self, total: int, initial: int, desc: str, stream: Any = None) -> None:
        self.total, self.n, self.desc = max(int(total), 1), int(initial), desc
        self.stream = stream if stream is not None else sys.stderr
        self.postfix: dict[str, str] = {}
        self._next, self._printed, self._n0 = self._after(self.n), self.n, self.n
        self._t0 = time.perf_counter()

    def _after(self, n: int) -> int:
        tenth = max(self.total // 10, 1)
        return (n // tenth + 1) * tenth

    def set_postfix(self, values: dict[str, str]) -> None:
        self.postfix = dict(values)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self._next:
            self._next = self._after(self.n)
            self._line()

    def _line(self) -> None:
        self._printed = self.n
        rate = (self.n - self._n0) / max(time.perf_counter() - self._t0, 1e-9)
        extra = "".join(f"  {k}={v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}/{self.total} steps ({100 * self.n // self.total}%, "
              f"{rate:.0f} steps/s){extra}", file=self.stream, flush=True)  # fmt: skip

    def close(self) -> None:  # the fold's last count, unless that line was just printed
        if self.n != self._printed:
            self._line()


def fold_bar(cfg: TrainConfig, plan: FoldPlan, initial: int) -> Any:
    if not cfg.run.progress:
        return None
    if not sys.stderr.isatty():  # a file: a line per tenth, not a redrawn bar
        return LineProgress(plan.expected_updates, initial, f"fold {plan.index}")
    from tqdm.auto import tqdm

    return tqdm(
        total=plan.expected_updates, initial=initial, desc=f"fold {plan.index}",
        unit="step", dynamic_ncols=True, leave=True,
    )  # fmt: skip


def show_row(bar: Any, row: dict[str, float | None]) -> None:
    if bar is not None:
        shown = {"loss": "loss/total", "ret": "episode_return", "bound": "bound/support"}
        values = {k: row.get(c) for k, c in shown.items()}
        bar.set_postfix({k: f"{v:.3g}" for k, v in values.items() if v is not None})


def close_bar(bar: Any) -> None:
    if bar is not None:
        bar.close()


def _sharpe(value: float | None) -> str:
    return "undefined (prices do not move)" if value is None else f"{value:+.2f}"


def _flags(row: dict[str, Any]) -> str:
    """What makes a fold's numbers untrustworthy, said next to them."""
    out = ""
    flags = row.get("data_flags") or []
    if flags:
        more = f" (+{len(flags) - 3} more)" if len(flags) > 3 else ""
        out += f"  [! data: {'; '.join(flags[:3])}{more} -- check the data]"
    if row.get("extreme_moves"):  # a summary written before data_flags
        out += f"  [! test window earns {len(row['extreme_moves'])} extreme one-day move(s): "
        out += "; ".join(row["extreme_moves"][:3]) + " -- check the data]"
    if row.get("ruin"):
        out += f"  [! ruin on {row['ruin']}: the portfolio lost everything]"
    if row.get("optimistic"):
        out += "  [OPTIMISTIC: filled at the close that was just seen]"
    return out


def print_fold(row: dict[str, Any], show: bool) -> None:
    if not show:
        return
    if "sharpe" in row:
        from trimtab.rl.report.tables import best_baseline, label  # (this function's own)

        best = best_baseline(row)
        other = f", best baseline {label(best[0])} {_sharpe(best[1])}" if best else ""
        print(
            f"fold {row['fold']} test {row['test_start']}..{row['test_end']}: "
            f"Sharpe {_sharpe(row['sharpe'])} vs buy & hold {_sharpe(row['buy_hold_sharpe'])}"
            f"{other}; return {row['total_return']:+.1%} (B&H {row['buy_hold_return']:+.1%}), "
            f"max DD {row['max_drawdown']:.1%}, turnover {row['turnover']:.3f}" + _flags(row),
            flush=True,
        )
    else:
        print(
            f"greedy evaluation: {row['episodes']} episodes, mean return "
            f"{row['mean_return']:.1f} ± {row['std_return']:.1f}",
            flush=True,
        )
