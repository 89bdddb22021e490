"""Checks of loaded data that warn rather than refuse: extreme moves, possible unadjusted
splits, bad ticks, still series, alignment losses, mixed time zones; each a :class:`DataIssue`.

They work on arrays (dates ``[T]``, values ``[T, A]``), so ``data.py`` can import them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from trimtab.rl.data.calendar import offset_text
from trimtab.rl.data.issues import DataIssue

__all__ = [
    "BAD_TICK_SIGMAS",
    "EXTREME_MOVE_SIGMAS",
    "SPLIT_SIGMAS",
    "alignment_issues",
    "extreme_moves",
    "move_issues",
    "robust_spread",
    "still_issues",
    "timezone_issues",
]

#: A one-day log return this many robust standard deviations (1.4826 x the median absolute
#: deviation of the asset's own log returns) from its median is an extreme move. Why 30: daily
#: returns have tails like Student-t with 3-4 degrees of freedom, where a 30-sigma day is rarer
#: than 1 in 10,000 days; a bad tick (x1000: log 6.9) or a 1:10 split (log 2.3) is hundreds.
EXTREME_MOVE_SIGMAS = 30.0
#: A move at a split ratio is flagged from this many robust sigmas: an unadjusted 3:2 split
#: (log 2/3 = -0.405) on a stock of 2% daily volatility is 20 sigmas, under the 30 above; a
#: Student-t(3) day beyond 8 sigmas that also lands within 2% of a split ratio is ~1e-5 a day.
SPLIT_SIGMAS = 8.0
#: Close-to-close ratios of common splits (k: a k-for-1 split divides the price by k; a
#: reverse split multiplies it by k) with their names, and how close a ratio must come.
#: A split day also carries that day's own move: one beyond the tolerance hides the split (a
#: wider window would flag many genuine 9-sigma days of volatile, heavy-tailed stocks).
SPLIT_RATIOS = {2.0: "2:1", 3.0: "3:1", 1.5: "3:2", 4.0: "4:1", 5.0: "5:1", 10.0: "10:1"}
SPLIT_TOLERANCE = 0.02
#: A bad tick: two consecutive moves each beyond this many robust sigmas, of opposite signs,
#: whose sum is within ``BAD_TICK_CANCEL`` of the larger (the price went away and came back).
BAD_TICK_SIGMAS = 8.0
BAD_TICK_CANCEL = 0.25


def robust_spread(log_returns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per asset, the median and robust standard deviation (1.4826 x MAD) of rows ``1:`` of
    ``[T, A]`` log returns (row 0 has no return). Both ignore the outliers they help find."""
    r = np.asarray(log_returns, dtype=np.float64)[1:]
    if len(r) == 0:
        zeros = np.zeros(np.shape(log_returns)[1])
        return zeros, zeros
    med = np.median(r, axis=0)
    return med, 1.4826 * np.median(np.abs(r - med), axis=0)


def extreme_moves(log_returns: np.ndarray) -> np.ndarray:
    """``[T, A]`` bool: the one-day moves far outside each asset's own spread (row 0, which
    has no return, never). Robust: the median and MAD ignore the moves they are to find."""
    r = np.asarray(log_returns, dtype=np.float64)
    out = np.zeros(r.shape, dtype=bool)
    if len(r) < 2:
        return out
    med, spread = robust_spread(r)
    # a series flat on most days has no spread to judge by (still_issues() warns about it)
    out[1:] = (np.abs(r[1:] - med) > EXTREME_MOVE_SIGMAS * spread) & (spread > 0)
    return out


def _sigmas(r: np.ndarray, med: float, spread: float) -> np.ndarray:
    """``|r - med| / spread``; where the spread is 0, any move is infinitely many."""
    dev = np.abs(r - med)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(spread > 0, dev / spread, np.where(dev > 0, np.inf, 0.0))


def _split_name(r: float) -> str | None:
    """``"3:2"`` (or ``"reverse 2:3"``) when ``exp(r)`` is within the tolerance of a split."""
    tol = np.log1p(SPLIT_TOLERANCE)
    for k, name in SPLIT_RATIOS.items():
        if abs(r + np.log(k)) <= tol:
            return name
        if abs(r - np.log(k)) <= tol:
            a, b = name.split(":")
            return f"reverse {b}:{a}"
    return None


def move_issues(
    dates: np.ndarray,
    assets: Sequence[str],
    files: Sequence[str],
    log_returns: np.ndarray,
    adjusted: Sequence[bool],
) -> list[DataIssue]:
    """Every bad tick, possible unadjusted split (only for assets whose file had no Adj Close:
    ``adjusted[a]`` false) and other extreme move, as issues ordered by date. Each move is
    reported once, under the most specific kind: a bad tick, then a split, then extreme."""
    r = np.asarray(log_returns, dtype=np.float64)
    med, spread = robust_spread(r)
    extreme = extreme_moves(r)
    found: list[DataIssue] = []
    for a, name in enumerate(assets):
        z = _sigmas(r[:, a], med[a], spread[a])
        z[0] = 0.0
        used = np.zeros(len(r), dtype=bool)

        def move(t: int, a: int = a) -> str:
            return f"{np.expm1(r[t, a]):+.1%} (log {r[t, a]:+.3f})"

        big = (z > BAD_TICK_SIGMAS) & (spread[a] > 0)
        for t in np.flatnonzero(big[:-1] & big[1:]):
            x, y = r[t, a], r[t + 1, a]
            if used[t] or x * y >= 0 or abs(x + y) > BAD_TICK_CANCEL * max(abs(x), abs(y)):
                continue
            used[t : t + 2] = True
            d0, d1 = str(dates[t]), str(dates[t + 1])
            found.append(DataIssue("bad_tick", name, d0, d1, (
                f"{files[a]}: {name} on {d0} and {d1}: {move(t)} then {move(t + 1)} "
                f"({z[t]:.0f} and {z[t + 1]:.0f} robust standard deviations of its own "
                f"returns): a one-day spike that reverses the next day looks like a bad tick. "
                f"Check the row of {d0}"
            )))  # fmt: skip
        if not adjusted[a]:
            for t in np.flatnonzero((z > SPLIT_SIGMAS) & ~used):
                split = _split_name(r[t, a])
                if split is None:
                    continue
                used[t] = True
                d = str(dates[t])
                found.append(DataIssue("split", name, d, d, (
                    f"{files[a]}: {name} on {d}: {move(t)}, {z[t]:.0f} robust standard "
                    f"deviations, is the ratio of a {split} split: possibly an unadjusted "
                    f"split. The file has no Adj Close column; give adjusted prices or "
                    f"adjust the closes before {d}"
                )))  # fmt: skip
        for t in np.flatnonzero(extreme[:, a] & ~used):
            d = str(dates[t])
            found.append(DataIssue("extreme", name, d, d, (
                f"{files[a]}: {name} on {d}: {move(t)}, an extreme one-day move of "
                f"{z[t]:.0f} robust standard deviations of its own returns (over "
                f"{EXTREME_MOVE_SIGMAS:g}): a bad tick or an unadjusted split looks like "
                "this. Check the row (or use Adj Close)"
            )))  # fmt: skip
    return sorted(found, key=lambda i: (i.first or "", list(assets).index(i.asset or "")))


def still_issues(
    dates: np.ndarray,
    assets: Sequence[str],
    files: Sequence[str],
    log_returns: np.ndarray,
    volume: np.ndarray,
) -> list[DataIssue]:
    """Assets whose price does not move on most days (no spread: Sharpe ratios and extreme
    moves mean nothing there; the issue spans every date) or whose volume is always zero."""
    r = np.asarray(log_returns, dtype=np.float64)[1:]
    span = (str(dates[0]), str(dates[-1])) if len(dates) else (None, None)
    out = []
    for i, a in enumerate(assets):
        flat = int(np.sum(r[:, i] == 0))
        if r.shape[0] and flat * 2 > r.shape[0]:
            out.append(DataIssue("still", a, *span, (
                f"{files[i]}: {a}'s price does not change on {flat} of {r.shape[0]} days "
                f"({span[0]}..{span[1]}); Sharpe ratios on it are undefined or meaningless. "
                "Check the file (a stale or forward-filled series looks like this)"
            )))  # fmt: skip
        if not np.any(volume[:, i]):
            out.append(DataIssue("still", a, None, None, (
                f"{files[i]}: {a}'s volume is zero on every day; check the file"
            )))  # fmt: skip
    return out


#: An asset as the alignment checks see it: name, how messages name it (file [symbol]), dates.
Span = tuple[str, str, np.ndarray]


def _listed(dates: np.ndarray, limit: int = 5) -> str:
    shown = ", ".join(str(d) for d in dates[:limit])
    return shown + (f" and {len(dates) - limit} more" if len(dates) > limit else "")


def alignment_issues(assets: Sequence[Span], common: np.ndarray) -> list[DataIssue]:
    """What each asset lost to the inner join on ``common`` (the dates all assets share):
    rows before the first / after the last common date (an asset starting years later cuts
    every other one to its span), and dates inside the common span that another one lacks."""
    start, end = max(d[0] for _, _, d in assets), min(d[-1] for _, _, d in assets)
    starters = ", ".join(name for name, _, d in assets if d[0] == start)
    enders = ", ".join(name for name, _, d in assets if d[-1] == end)
    out = []
    for name, label, dates in assets:
        lost, n = ~np.isin(dates, common), len(dates)
        head = f"{label}: {name} loses"
        parts = (
            (lost & (dates < common[0]), f"before {common[0]}, the first date all assets "
             f"share ({starters} starts on {start}); every asset is cut to the span all cover"),
            (lost & (dates > common[-1]), f"after {common[-1]}, the last date all assets "
             f"share ({enders} ends on {end}); every asset is cut to the span all cover"),
        )  # fmt: skip
        for mask, why in parts:
            if mask.any():
                d, k = dates[mask], int(mask.sum())
                out.append(DataIssue("alignment", name, str(d[0]), str(d[-1]), (
                    f"{head} {k} of {n} rows to alignment: {d[0]}..{d[-1]}, {why}"
                )))  # fmt: skip
        inside = lost & (dates > common[0]) & (dates < common[-1])
        if inside.any():
            d = dates[inside]
            lack = ", ".join(b for b, _, other in assets if not np.isin(d, other).all())
            out.append(DataIssue("alignment", name, str(d[0]), str(d[-1]), (
                f"{head} {d.size} of {n} rows to alignment: {d.size} date(s) inside the common "
                f"span that {lack} lack(s) ({_listed(d)}); the next return spans each of them"
            )))  # fmt: skip
    return out


def timezone_issues(
    assets: Sequence[Span], offsets: Sequence[np.ndarray], common: np.ndarray
) -> list[DataIssue]:
    """Assets stamped at different UTC offsets (``offsets``: minutes east of UTC per row, NaN
    without one) on the same local days: different exchanges' closes, aligned on their local
    trading days. Also a file whose own offsets differ by more than a daylight-saving hour."""
    out = []
    for (name, label, _), off in zip(assets, offsets):
        own = off[~np.isnan(off)]
        if own.size and own.max() - own.min() > 60:
            shown = ", ".join(offset_text(m) for m in np.unique(own))
            out.append(DataIssue("timezone", name, None, None, (
                f"{label}: {name}'s stamps carry UTC offsets {shown}, more than a "
                "daylight-saving hour apart: the file mixes time zones, and each row keeps the "
                "day written in it. Check how the file was exported"
            )))  # fmt: skip
    aware = [(a, off) for a, off in zip(assets, offsets) if not np.isnan(off).all()]
    if len(aware) < 2:
        return out
    offs = np.stack([off[np.isin(a[2], common)] for a, off in aware], axis=1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row: no stamp has one
        spread = np.nanmax(offs, axis=1) - np.nanmin(offs, axis=1)
    differ = spread > 0
    if differ.any():
        shown = "; ".join(
            f"{a[0]} " + "/".join(offset_text(m) for m in np.unique(col[~np.isnan(col)]))
            for (a, _), col in zip(aware, offs.T)
        )
        files = ", ".join(dict.fromkeys(a[1] for a, _ in aware))
        out.append(DataIssue("timezone", None, None, None, (
            f"{files}: the assets' stamps carry different UTC offsets ({shown}) on "
            f"{int(differ.sum())} of {len(common)} aligned days: they are aligned on their "
            f"local trading days (the date written in each stamp), so a cross-market rule may "
            f"compare closes up to {np.nanmax(spread) / 60:g} hours apart"
        )))  # fmt: skip
    return out
