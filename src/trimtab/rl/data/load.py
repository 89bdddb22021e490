"""Market data: the ``MarketData`` container, and loading users' OHLCV files into it.

Every defect in a file is a ``DataError`` naming the file, the line and the column, and saying
how to fix it, so the command line can print it as one line without a traceback.

Accepted input
    CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``); one file per asset (the
    asset is the file stem, ``SPY.csv`` -> ``SPY``), a directory of such files, or one long file
    with a ``symbol``/``ticker`` column. Column names are matched ignoring case, spaces and
    underscores: Yahoo's ``Date, Open, High, Low, Close, Adj Close, Volume`` and ``date, open,
    ..., adj_close, volume`` both work; other columns are ignored.
Returns
    Log returns come from ``Adj Close`` when the file has it (splits and dividends are then
    not mistaken for price moves), else from ``Close``. Open/high/low stay unadjusted: the
    features only use their ratios to each other.
Line numbers
    CSV: the line in the file, header = line 1, so the first data row is line 2 (blank lines
    count). Parquet has no lines: ``row N`` is the 1-based data row.
Dates
    ISO 8601 text (``YYYY-MM-DD``, optionally a time and a UTC offset) or a Parquet datetime
    column. A stamp keeps the calendar day written in it: ``2024-01-08 00:00:00+09:00`` is
    2024-01-08, the exchange's day. Other formats (``13/01/2024``) are refused, naming the
    format they look like; several bars on one day (intraday data) are refused.
Gaps
    A *NaN row* (every value cell empty, e.g. Yahoo's ``null`` holiday rows) or a run of more
    than ``max_gap_days`` missing business days between consecutive dates (beyond the usual
    spacing, for weekly or coarser bars). ``gaps="error"`` raises; ``"drop"`` deletes NaN rows;
    ``"ffill"`` replaces each NaN row by a flat bar at the previous close with zero volume (a
    leading NaN row is dropped). Calendar gaps are only reported by ``drop``/``ffill``: the
    next return then spans the gap. A row with *some* empty cells is always an error (which
    value should it have?). Assets are then aligned on the dates they all have (inner join).
Issues
    Every problem that is reported rather than refused is a :class:`DataIssue` in
    ``MarketData.issues`` (kind, asset, dates, one-line message): each long gap, each run of
    empty rows, what each asset lost to alignment, assets stamped at different UTC offsets,
    possible unadjusted splits, bad ticks, extreme moves, still series. ``MarketData.warnings``
    holds their messages; :func:`issues_in_window` those touching a test window.
Consistency
    ``High < Low``, or an Open or Close outside ``[Low, High]``, is an error. A one-day move far
    outside the series' own spread (see :func:`extreme_moves`) is not (a crash is real), but it
    is an issue: a bad tick or an unadjusted split looks exactly like this and would dominate
    training and any test window that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from trimtab.rl.data.calendar import Stamps, clock_text, dominant_spacing, parse_dates
from trimtab.rl.data.calendar import periods_per_year as _periods_per_year
from trimtab.rl.data.checks import (
    EXTREME_MOVE_SIGMAS,
    alignment_issues,
    extreme_moves,
    move_issues,
    still_issues,
    timezone_issues,
)
from trimtab.rl.data.issues import ISSUE_KINDS, DataError, DataIssue, data_error

__all__ = [
    "EXTREME_MOVE_SIGMAS",
    "ISSUE_KINDS",
    "DataError",
    "DataIssue",
    "MarketData",
    "describe_moves",
    "extreme_moves",
    "issues_in_window",
    "load_ohlcv",
    "still_series",
]

GapPolicy = Literal["drop", "ffill", "error"]
VALUE_COLUMNS = ("open", "high", "low", "close", "volume")
_PRICE_COLUMNS = ("open", "high", "low", "close", "adj_close")
_ALIASES = {
    "date": "date", "datetime": "date", "timestamp": "date",
    "open": "open", "high": "high", "low": "low", "close": "close",
    "adjclose": "adj_close", "adjustedclose": "adj_close", "volume": "volume",
    "symbol": "symbol", "ticker": "symbol",
}  # fmt: skip
_NA_TOKENS = frozenset({"", "nan", "null", "none", "na", "n/a", "#n/a", "-"})
_EXTENSIONS = (".csv", ".csv.gz", ".parquet", ".pq")
_FIX = {
    "ext": "Give CSV (.csv, .csv.gz) or Parquet (.parquet, .pq) files.",
    "parquet": "Re-export the file; it may be truncated or not Parquet.",
    "csv": "Save it as comma-separated UTF-8 text with one header line.",
    "row": "Fix or delete the row.",
    "cell": "Fill in the value or delete the row (rows empty in every column "
    "are handled by gaps='drop'|'ffill').",
    "ohlc": "Fix the row: a bar's Open and Close lie within [Low, High] (a misplaced decimal "
    "or mixed-up columns give this).",
    "order": "Sort the file by date, oldest first, with one row per date.",
    "nan_row": "Delete it, or pass gaps='drop' or gaps='ffill'.",
    "data": "Give a file with data rows.",
    "dup": "Keep only one of them.",
    "dir": "Put one file per asset in it, or give a file.",
    "asset": "Give each asset once.",
    "gap": "Fill the gap, pass gaps='drop', or raise max_gap_days.",
    "intraday": "Resample to daily bars (one row per trading day).",
}
#: The issues that record how the loader handled the rows (``MarketData.notes``).
_HANDLING = ("gap", "empty_row", "alignment")


@dataclass(frozen=True, eq=False)
class MarketData:
    """Aligned daily OHLCV of ``A`` assets over ``T`` days (arrays ``[T, A]``, float64).

    ``adj_close`` equals ``close`` when the source had no adjusted close; returns use it.
    ``issues``: every data problem the loader reported (:class:`DataIssue`); ``warnings``: their
    messages, then any other warnings given; ``notes``: how rows were handled (gaps, empty
    rows, alignment).
    """

    dates: np.ndarray
    assets: tuple[str, ...]
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray
    adj_close: np.ndarray
    source: str = "synthetic"
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
    issues: tuple[DataIssue, ...] = field(default=())

    def __post_init__(self) -> None:
        issues = tuple(self.issues)
        messages = tuple(i.message for i in issues)
        extra = tuple(w for w in self.warnings if w not in messages)
        object.__setattr__(self, "issues", issues)
        object.__setattr__(self, "warnings", messages + extra)
        t, a = len(self.dates), len(self.assets)
        object.__setattr__(self, "dates", np.asarray(self.dates, dtype="datetime64[D]"))
        for name in (*VALUE_COLUMNS, "adj_close"):
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.shape != (t, a):
                raise ValueError(f"MarketData.{name} has shape {arr.shape}, expected {(t, a)}")
            object.__setattr__(self, name, arr)

    @property
    def n_days(self) -> int:
        return len(self.dates)

    @property
    def n_assets(self) -> int:
        return len(self.assets)

    @property
    def periods_per_year(self) -> float:
        """Bars per year from the dates' spacing (252 business days, 365 with weekends, 52
        weekly, 12 monthly, ...); raises ``DataError`` on a mixed or irregular spacing."""
        return _periods_per_year(self.dates, source=self.source)

    def slice(self, start: int | None, end: int | None) -> MarketData:
        """Rows ``start:end`` (positions, Python slice semantics); notes, warnings and issues
        kept whole (they may concern dates outside the slice)."""
        s = slice(start, end)
        arrays = {k: getattr(self, k)[s] for k in (*VALUE_COLUMNS, "adj_close")}
        return replace(self, dates=self.dates[s], **arrays)

    def log_returns(self) -> np.ndarray:
        """``[T, A]`` close-to-close log returns of ``adj_close``; row 0 (no previous day) is 0."""
        out = np.zeros_like(self.adj_close)
        out[1:] = np.diff(np.log(self.adj_close), axis=0)
        return out

    def require_rows(self, n: int, what: str = "the folds asked for") -> MarketData:
        """Raise ``DataError`` unless there are at least ``n`` rows; returns ``self``."""
        if self.n_days < n:
            raise DataError(
                f"{self.source}: only {self.n_days} aligned rows, but {n} are needed for {what}. "
                "Provide a longer history, or ask for fewer or shorter folds."
            )
        return self


def issues_in_window(data: MarketData, first: str, last: str) -> list[str]:
    """The messages of ``data``'s issues whose dates touch ``[first, last]`` (ISO dates,
    inclusive), e.g. to flag a test window. Issues without dates (zero volume throughout, a
    time-zone caveat on every row) concern no window in particular and are left out."""
    lo, hi = _iso_day(first, "first"), _iso_day(last, "last")
    if lo > hi:
        raise ValueError(f"issues_in_window: first={first} is after last={last}")
    return [
        i.message
        for i in data.issues
        if i.first is not None
        and i.last is not None
        and _iso_day(i.first, "first") <= hi
        and _iso_day(i.last, "last") >= lo
    ]


def _iso_day(text: str, what: str) -> np.datetime64:
    try:
        return np.datetime64(str(text), "D")
    except ValueError:
        msg = f"issues_in_window: {what}={text!r} is not an ISO date (YYYY-MM-DD)"
        raise ValueError(msg) from None


@dataclass
class _Asset:
    name: str
    file: str
    label: str  # the file, and the symbol in a long file: how messages name the asset
    dates: np.ndarray  # datetime64[D], the local calendar day as written
    clock: np.ndarray  # int64 ns since local midnight (intraday stamps are refused)
    offsets: np.ndarray  # minutes east of UTC, NaN where the stamp had none
    values: dict[str, np.ndarray]
    lines: np.ndarray  # line (CSV) or row (Parquet) of each entry, for messages

    @property
    def adjusted(self) -> bool:
        return "adj_close" in self.values

    def keep(self, mask: np.ndarray) -> None:
        self.dates, self.clock, self.offsets = (
            x[mask] for x in (self.dates, self.clock, self.offsets)
        )
        self.lines, self.values = self.lines[mask], {c: v[mask] for c, v in self.values.items()}


_fail = data_error


def _read(path: Path):  # -> (DataFrame, unit, first_line)
    import pandas as pd

    name = path.name.lower()
    if not any(name.endswith(ext) for ext in _EXTENSIONS):
        raise _fail(str(path), "", None, f"unknown file type '{path.suffix}'", _FIX["ext"])
    if not path.is_file():
        raise _fail(str(path), "", None, "no such file", "Check the path.")
    if path.stat().st_size == 0:
        raise _fail(str(path), "", None, "the file is empty", _FIX["data"])
    if name.endswith((".parquet", ".pq")):
        import pyarrow as pa

        try:
            df = pd.read_parquet(path)
        except (OSError, pa.ArrowException) as exc:
            raise _fail(
                str(path), "", None, f"unreadable Parquet ({exc})", _FIX["parquet"]
            ) from None
        if not isinstance(df.index, pd.RangeIndex):
            df = df.reset_index()  # pandas writes a date index as an index column
        return df, "row", 1
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise _fail(
            str(path), "", None, f"unreadable CSV ({str(exc).strip()})", _FIX["csv"]
        ) from None
    first = 2
    cols = list(df.columns)
    # yfinance >= 0.2.51 writes three header lines: Price/Ticker/Date.
    if cols and cols[0] == "Price" and len(df) >= 2 and tuple(df.iloc[:2, 0]) == ("Ticker", "Date"):
        df = df.iloc[2:].rename(columns={"Price": "Date"})
        first = 4
    return df, "line", first


def _columns(df, file: str, header: str) -> dict[str, str]:
    """Canonical name -> the file's column name; raises on missing or doubled columns."""
    found: dict[str, str] = {}
    for col in df.columns:
        key = str(col).lower().replace(" ", "").replace("_", "").replace("-", "").replace(".", "")
        canon = _ALIASES.get(key)
        if canon is None:
            continue
        if canon in found:
            raise _fail(file, header, str(col), f"duplicates column '{found[canon]}'", _FIX["dup"])
        found[canon] = str(col)
    missing = [c for c in ("date", *VALUE_COLUMNS) if c not in found]
    if missing:
        hint = ""
        if len(df.columns) == 1 and ";" in str(df.columns[0]):
            hint = " The file seems to use ';' as separator; save it comma-separated."
        raise _fail(
            file,
            header,
            missing[0],
            f"missing column(s) {missing}",
            f"Columns found: {[str(c) for c in df.columns]}; need Date, Open, High, Low, "
            f"Close, Volume (Adj Close optional).{hint}",
        )
    return found


def _numbers(series, file: str, col: str, where: np.ndarray, unit: str):
    """Float values and a missing mask; text that is neither a number nor empty raises."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series):
        vals = series.to_numpy(dtype=np.float64, na_value=np.nan)
        missing = np.isnan(vals)
        text = None
    else:
        text = series.astype(object).where(series.notna(), "").astype(str).str.strip()
        missing = text.str.lower().isin(_NA_TOKENS).to_numpy()
        vals = pd.to_numeric(text.where(~missing, "nan"), errors="coerce").to_numpy(np.float64)
    bad = ~missing & ~np.isfinite(vals)
    if bad.any():
        i = int(np.argmax(bad))
        shown = text.iloc[i] if text is not None else vals[i]
        at = f"{unit} {where[i]}"
        raise _fail(file, at, col, f"'{shown}' is not a finite number", _FIX["row"])
    return vals, missing


def _parse(path: Path, gaps: GapPolicy, max_gap_days: int) -> tuple[list[_Asset], list[DataIssue]]:
    df, unit, first = _read(path)
    file = str(path)
    if len(df) == 0:
        raise _fail(file, "", None, "no data rows under the header", _FIX["data"])
    cols = _columns(df, file, f"line {first - 1} (header)" if unit == "line" else "schema")
    where = np.arange(first, first + len(df))
    stamps = parse_dates(df[cols["date"]], file, cols["date"], where, unit)
    names = [c for c in (*_PRICE_COLUMNS, "volume") if c in cols]
    parsed = {c: _numbers(df[cols[c]], file, cols[c], where, unit) for c in names}
    vals = {c: v for c, (v, _) in parsed.items()}
    miss = np.stack([m for _, m in parsed.values()], axis=1)
    nan_row, partial = miss.all(1), miss.any(1) & ~miss.all(1)
    if partial.any():
        i = int(np.argmax(partial))
        col = cols[names[int(np.argmax(miss[i]))]]
        at = f"{unit} {where[i]}"
        raise _fail(file, at, col, "empty or NaN cell", _FIX["cell"])
    for c in names:
        bad = ~nan_row & ((vals[c] < 0) if c == "volume" else (vals[c] <= 0))
        if bad.any():
            i = int(np.argmax(bad))
            kind = "negative volume" if c == "volume" else "zero or negative price"
            at = f"{unit} {where[i]}"
            raise _fail(file, at, cols[c], f"{kind} {vals[c][i]:g}", _FIX["row"])
    _check_ohlc(vals, ~nan_row, cols, file, where, unit)
    if "symbol" in cols:
        sym = df[cols["symbol"]].astype(str).str.strip().to_numpy()
        groups = list(dict.fromkeys(sym))
        members = [np.flatnonzero(sym == g) for g in groups]
    else:
        stem = path.name[: -len(next(e for e in _EXTENSIONS if path.name.lower().endswith(e)))]
        groups, members = [stem], [np.arange(len(df))]
    assets, issues = [], []
    for name, idx in zip(groups, members):
        label = f"{file} [{name}]" if "symbol" in cols else file
        st: Stamps = stamps.take(idx)
        values = {c: v[idx] for c, v in vals.items()}
        a = _Asset(name, file, label, st.days, st.clock, st.offsets, values, where[idx])
        _check_order(a, cols["date"], unit)
        issues += _apply_gaps(a, nan_row[idx], gaps, max_gap_days, cols["date"], unit)
        assets.append(a)
    return assets, issues


def _check_ohlc(
    vals: dict[str, np.ndarray],
    rows: np.ndarray,
    cols: dict[str, str],
    file: str,
    where: np.ndarray,
    unit: str,
) -> None:
    """``Low <= Open, Close <= High`` on every row with values (exact: equal prices pass)."""
    o, h, lo, c = (vals[k] for k in ("open", "high", "low", "close"))
    checks = (
        ("high", h < lo, lambda i: f"High {h[i]:g} is below Low {lo[i]:g}"),
        ("open", (o < lo) | (o > h), lambda i: f"Open {o[i]:g} is outside [Low, High] = "
                                               f"[{lo[i]:g}, {h[i]:g}]"),
        ("close", (c < lo) | (c > h), lambda i: f"Close {c[i]:g} is outside [Low, High] = "
                                                f"[{lo[i]:g}, {h[i]:g}]"),
    )  # fmt: skip
    for col, bad, what in checks:
        bad = bad & rows
        if bad.any():
            i = int(np.argmax(bad))
            raise _fail(file, f"{unit} {where[i]}", cols[col], what(i), _FIX["ohlc"])


def still_series(data: MarketData) -> list[str]:
    """Warnings for assets whose price does not move on most days (no spread: Sharpe ratios and
    extreme moves mean nothing there) or whose volume is zero throughout."""
    labels = [data.source] * data.n_assets
    found = still_issues(data.dates, data.assets, labels, data.log_returns(), data.volume)
    return [i.message for i in found]


def describe_moves(data: MarketData, mask: np.ndarray, limit: int = 5) -> list[str]:
    """``"ASSET on DATE: +690.8% (log +6.908)"`` for the first ``limit`` marked moves."""
    r = data.log_returns()
    days, assets = np.nonzero(mask)
    return [
        f"{data.assets[a]} on {data.dates[d]}: {np.expm1(r[d, a]):+.1%} (log {r[d, a]:+.3f})"
        for d, a in zip(days[:limit], assets[:limit])
    ]


def _check_order(a: _Asset, col: str, unit: str) -> None:
    """One bar per local day, dates increasing; several bars on a day is intraday data."""
    d = a.dates
    step = d[1:] - d[:-1]
    zero = np.timedelta64(0)
    intraday = (step == zero) & (a.clock[1:] != a.clock[:-1])
    if intraday.any():
        i = int(np.argmax(intraday)) + 1
        times = [clock_text(c) for c in a.clock[d == d[i]]]
        shown = ", ".join(times[:3]) + (", ..." if len(times) > 3 else "")
        raise _fail(
            a.label,
            f"{unit} {a.lines[i]}",
            None,
            f"several bars on {d[i]} ({shown}): intraday bars are not supported; the trainer "
            "works on daily or coarser bars",
            _FIX["intraday"],
        )
    for bad, what in ((step == zero, "duplicate"), (step < zero, "decreasing")):
        if bad.any():
            i = int(np.argmax(bad)) + 1
            at = f"{unit} {a.lines[i]}"
            raise _fail(
                a.label, at, col, f"{what} date {d[i]} (previous row: {d[i - 1]})", _FIX["order"]
            )


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``(first, last)`` positions (inclusive) of each run of consecutive true entries."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1))


def _apply_gaps(
    a: _Asset, nan_row: np.ndarray, gaps: str, max_gap_days: int, col: str, unit: str
) -> list[DataIssue]:
    """Drop or fill the empty rows, and find the long calendar gaps: an issue for each run of
    empty rows and each gap (``gaps='error'`` raises on the first instead)."""
    file, issues = a.label, []
    if nan_row.any():
        i = int(np.argmax(nan_row))
        if gaps == "error":
            at = f"{unit} {a.lines[i]}"
            raise _fail(file, at, col, f"row of {a.dates[i]} has no values", _FIX["nan_row"])
        n, valid = len(nan_row), np.flatnonzero(~nan_row)
        keep = ~nan_row
        if gaps == "ffill" and valid.size:
            prev = valid[np.clip(np.searchsorted(valid, np.arange(n), side="right") - 1, 0, None)]
            keep = np.arange(n) >= valid[0]  # nothing to fill a leading empty row from
            old = a.values
            fills = {c: old["adj_close" if c == "adj_close" else "close"][prev] for c in old}
            fills["volume"] = np.zeros(n)
            a.values = {c: np.where(nan_row, fills[c], v) for c, v in old.items()}
        for s, e in _runs(nan_row):
            d0, d1, k = str(a.dates[s]), str(a.dates[e]), e - s + 1
            rows = f"{unit} {a.lines[s]}" if k == 1 else f"{unit}s {a.lines[s]}-{a.lines[e]}"
            what = "filled flat from the previous close, with zero volume" if keep[s] else (
                "dropped" if gaps == "drop" else "dropped (no earlier close to fill it from)"
            )  # fmt: skip
            span = d0 if k == 1 else f"{d0}..{d1}"
            issues.append(DataIssue("empty_row", a.name, d0, d1, (
                f"{file}: {k} empty row(s) on {span} ({rows}, every value empty): {what}"
            )))  # fmt: skip
        a.keep(keep)
    if len(a.dates) == 0:
        raise _fail(file, "", None, "no row has values", _FIX["data"])
    busy = np.busday_count(a.dates[:-1], a.dates[1:])
    spacing = dominant_spacing(a.dates)
    # weekly or coarser bars: a gap is what is missing beyond the usual spacing
    usual = 1 if spacing in (None, "daily") else max(1, int(np.median(busy)))
    missing = busy - usual
    beyond = "" if usual == 1 else f" beyond the usual {usual - 1} between {spacing} bars"
    for i in np.flatnonzero(missing > max_gap_days) + 1:
        d0, d1 = str(a.dates[i - 1]), str(a.dates[i])
        span = f"{int(missing[i - 1])} business days missing between {d0} and {d1}{beyond} "
        span += f"(max_gap_days={max_gap_days})"
        if gaps == "error":
            raise _fail(file, f"{unit} {a.lines[i]}", col, span, _FIX["gap"])
        issues.append(DataIssue("gap", a.name, d0, d1, (
            f"{file}: {a.name}: {span}; kept: the next return spans the gap"
        )))  # fmt: skip
    return issues


def _files(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    out: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(
                p for p in item.iterdir() if p.is_file() and p.name.lower().endswith(_EXTENSIONS)
            )
            if not found:
                raise _fail(str(item), "", None, "no .csv or .parquet files", _FIX["dir"])
            out += found
        else:
            out.append(item)
    if not out:
        raise DataError("no data files given. Give a file, a list of files or a directory.")
    return out


def load_ohlcv(
    paths: str | Path | Sequence[str | Path],
    *,
    gaps: GapPolicy = "drop",
    max_gap_days: int = 5,
    min_rows: int = 2,
) -> MarketData:
    """Read, validate and align OHLCV files (see the module docstring for formats and rules).

    ``paths``: a file, a directory (every CSV/Parquet file in it) or a list of them.
    ``min_rows``: raise ``DataError`` when fewer aligned rows remain (the trainer passes what
    its folds need). Every problem reported rather than refused is in ``MarketData.issues``
    (and its message in ``warnings``); gap and alignment handling also in ``notes``.
    """
    if gaps not in ("drop", "ffill", "error"):
        raise ValueError(f"gaps must be 'drop', 'ffill' or 'error', got {gaps!r}")
    files = _files(paths)
    assets: list[_Asset] = []
    issues: list[DataIssue] = []
    for path in files:
        parsed, file_issues = _parse(path, gaps, max_gap_days)
        issues += file_issues
        for a in parsed:
            twin = next((b for b in assets if b.name == a.name), None)
            if twin is not None:
                raise _fail(
                    a.file, "", None, f"asset '{a.name}' also comes from {twin.file}", _FIX["asset"]
                )
            assets.append(a)
    source = str(paths) if isinstance(paths, (str, Path)) else ", ".join(map(str, files))
    common = assets[0].dates
    for a in assets[1:]:
        common = np.intersect1d(common, a.dates)
    if common.size == 0:
        spans = "; ".join(f"{a.name}: {a.dates[0]}..{a.dates[-1]}" for a in assets)
        raise DataError(
            f"{source}: the assets have no date in common ({spans}). "
            "Give files that cover a common period."
        )
    spans = [(a.name, a.label, a.dates) for a in assets]
    issues += alignment_issues(spans, common)
    issues += timezone_issues(spans, [a.offsets for a in assets], common)
    cols = {}
    for c in (*VALUE_COLUMNS, "adj_close"):
        cols[c] = np.stack(
            [a.values.get(c, a.values["close"])[np.isin(a.dates, common)] for a in assets], axis=1
        )
    notes = tuple(i.message for i in issues if i.kind in _HANDLING)
    names = tuple(a.name for a in assets)
    data = MarketData(common, names, source=source, notes=notes, **cols)
    data.require_rows(min_rows, "min_rows")
    labels, r = [a.label for a in assets], data.log_returns()
    issues += still_issues(data.dates, names, labels, r, data.volume)
    issues += move_issues(data.dates, names, labels, r, [a.adjusted for a in assets])
    return replace(data, issues=tuple(issues))
