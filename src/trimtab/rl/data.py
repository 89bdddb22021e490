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
Gaps
    A *NaN row* (every value cell empty, e.g. Yahoo's ``null`` holiday rows) or a run of more
    than ``max_gap_days`` missing business days between consecutive dates. ``gaps="error"``
    raises; ``"drop"`` deletes NaN rows; ``"ffill"`` replaces each NaN row by a flat bar at the
    previous close with zero volume (a leading NaN row is dropped). Calendar gaps are only
    reported by ``drop``/``ffill``: the next return then spans the gap. A row with *some* empty
    cells is always an error (which value should it have?). Assets are then aligned on the
    dates they all have (inner join); what each one lost is reported in ``MarketData.notes``.
Consistency
    ``High < Low``, or an Open or Close outside ``[Low, High]``, is an error. A one-day move far
    outside the series' own spread (see :func:`extreme_moves`) is not (a crash is real), but it
    is listed with its date in ``MarketData.warnings``: a bad tick or an unadjusted split looks
    exactly like this and would dominate training and any test window that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

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
    "date": "Write dates as YYYY-MM-DD.",
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
}


class DataError(ValueError):
    """A defect in the user's market data; the message is self-contained and says how to fix it."""


@dataclass(frozen=True, eq=False)
class MarketData:
    """Aligned daily OHLCV of ``A`` assets over ``T`` days (arrays ``[T, A]``, float64).

    ``adj_close`` equals ``close`` when the source had no adjusted close; returns use it.
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

    def __post_init__(self) -> None:
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

    def slice(self, start: int | None, end: int | None) -> MarketData:
        """Rows ``start:end`` (positions, Python slice semantics), notes kept."""
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


@dataclass
class _Asset:
    name: str
    file: str
    dates: np.ndarray  # datetime64[D]
    values: dict[str, np.ndarray]
    lines: np.ndarray  # line (CSV) or row (Parquet) of each entry, for messages


def _fail(file: str, where: str, col: str | None, problem: str, fix: str) -> DataError:
    loc = ", ".join(p for p in (where, f"column '{col}'" if col is not None else "") if p)
    return DataError(f"{file}: {loc + ': ' if loc else ''}{problem}. {fix}")


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


def _dates(series, file: str, col: str, where: np.ndarray, unit: str) -> np.ndarray:
    import pandas as pd

    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        parsed = pd.to_datetime(series, utc=True)
    else:
        text = series.astype(object).where(series.notna(), "").astype(str).str.strip()
        parsed = pd.to_datetime(text, errors="coerce", format="ISO8601", utc=True)
        retry = parsed.isna() & (text != "")
        if retry.any():
            parsed[retry] = pd.to_datetime(text[retry], errors="coerce", format="mixed", utc=True)
    nat = parsed.isna().to_numpy()
    if nat.any():
        i = int(np.argmax(nat))
        at = f"{unit} {where[i]}"
        raise _fail(file, at, col, f"cannot read date '{series.iloc[i]}'", _FIX["date"])
    # A timezone-aware stamp keeps its exchange-local calendar day.
    local = parsed.dt.tz_convert(None) if series.dtype.kind != "M" else parsed.dt.tz_localize(None)
    return local.to_numpy().astype("datetime64[D]")


def _parse(path: Path, gaps: GapPolicy, max_gap_days: int) -> tuple[list[_Asset], list[str]]:
    df, unit, first = _read(path)
    file = str(path)
    if len(df) == 0:
        raise _fail(file, "", None, "no data rows under the header", _FIX["data"])
    cols = _columns(df, file, f"line {first - 1} (header)" if unit == "line" else "schema")
    where = np.arange(first, first + len(df))
    dates = _dates(df[cols["date"]], file, cols["date"], where, unit)
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
    assets, notes = [], []
    for name, idx in zip(groups, members):
        label = f"{file} [{name}]" if "symbol" in cols else file
        a = _Asset(name, file, dates[idx], {c: v[idx] for c, v in vals.items()}, where[idx])
        _check_order(a, label, cols["date"], unit)
        notes += _apply_gaps(a, nan_row[idx], gaps, max_gap_days, label, cols["date"], unit)
        assets.append(a)
    return assets, notes


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


#: A one-day log return this many robust standard deviations (1.4826 x the median absolute
#: deviation of the asset's own log returns) from its median is an extreme move. Why 30: daily
#: returns have tails like Student-t with 3-4 degrees of freedom, where a 30-sigma day is rarer
#: than 1 in 10,000 days; a bad tick (x1000: log 6.9) or a 1:10 split (log 2.3) is hundreds.
EXTREME_MOVE_SIGMAS = 30.0


def extreme_moves(log_returns: np.ndarray) -> np.ndarray:
    """``[T, A]`` bool: the one-day moves far outside each asset's own spread (row 0, which
    has no return, never). Robust: the median and MAD ignore the moves they are to find."""
    r = np.asarray(log_returns, dtype=np.float64)[1:]
    if len(r) == 0:
        return np.zeros(np.shape(log_returns), dtype=bool)
    med = np.median(r, axis=0)
    spread = 1.4826 * np.median(np.abs(r - med), axis=0)
    # a series flat on most days has no spread to judge by (still_series() warns about it)
    out = (np.abs(r - med) > EXTREME_MOVE_SIGMAS * spread) & (spread > 0)
    return np.vstack([np.zeros((1, r.shape[1]), dtype=bool), out])


def still_series(data: MarketData) -> list[str]:
    """Warnings for assets whose price does not move on most days (no spread: Sharpe ratios and
    extreme moves mean nothing there) or whose volume is zero throughout."""
    r = data.log_returns()[1:]
    out = []
    for i, a in enumerate(data.assets):
        flat = int(np.sum(r[:, i] == 0))
        if r.shape[0] and flat * 2 > r.shape[0]:
            out.append(
                f"{data.source}: {a}'s price does not change on {flat} of {r.shape[0]} days; "
                "Sharpe ratios on it are undefined or meaningless. Check the file (a stale "
                "or forward-filled series looks like this)"
            )
        if not np.any(data.volume[:, i]):
            out.append(f"{data.source}: {a}'s volume is zero on every day; check the file")
    return out


def describe_moves(data: MarketData, mask: np.ndarray, limit: int = 5) -> list[str]:
    """``"ASSET on DATE: +690.8% (log +6.908)"`` for the first ``limit`` marked moves."""
    r = data.log_returns()
    days, assets = np.nonzero(mask)
    return [
        f"{data.assets[a]} on {data.dates[d]}: {np.expm1(r[d, a]):+.1%} (log {r[d, a]:+.3f})"
        for d, a in zip(days[:limit], assets[:limit])
    ]


def _check_order(a: _Asset, file: str, col: str, unit: str) -> None:
    d = a.dates
    step = d[1:] - d[:-1]
    zero = np.timedelta64(0)
    for bad, what in ((step == zero, "duplicate"), (step < zero, "decreasing")):
        if bad.any():
            i = int(np.argmax(bad)) + 1
            at = f"{unit} {a.lines[i]}"
            raise _fail(
                file, at, col, f"{what} date {d[i]} (previous row: {d[i - 1]})", _FIX["order"]
            )


def _apply_gaps(
    a: _Asset, nan_row: np.ndarray, gaps: str, max_gap_days: int, file: str, col: str, unit: str
) -> list[str]:
    notes = []
    if nan_row.any():
        i = int(np.argmax(nan_row))
        if gaps == "error":
            at = f"{unit} {a.lines[i]}"
            raise _fail(file, at, col, f"row of {a.dates[i]} has no values", _FIX["nan_row"])
        notes.append(
            f"{file}: {int(nan_row.sum())} empty row(s), first at {unit} {a.lines[i]}: "
            + ("dropped" if gaps == "drop" else "filled flat from the previous close")
        )
        n, valid = len(nan_row), np.flatnonzero(~nan_row)
        keep = ~nan_row
        if gaps == "ffill" and valid.size:
            prev = valid[np.clip(np.searchsorted(valid, np.arange(n), side="right") - 1, 0, None)]
            keep = np.arange(n) >= valid[0]  # nothing to fill a leading empty row from
            old = a.values
            fills = {c: old["adj_close" if c == "adj_close" else "close"][prev] for c in old}
            fills["volume"] = np.zeros(n)
            a.values = {c: np.where(nan_row, fills[c], v) for c, v in old.items()}
        a.dates, a.lines = a.dates[keep], a.lines[keep]
        a.values = {c: v[keep] for c, v in a.values.items()}
    if len(a.dates) == 0:
        raise _fail(file, "", None, "no row has values", _FIX["data"])
    missing = np.busday_count(a.dates[:-1], a.dates[1:]) - 1
    long = missing > max_gap_days
    if long.any():
        i = int(np.argmax(long)) + 1
        span = f"{int(missing[i - 1])} business days missing between {a.dates[i - 1]} and "
        span += f"{a.dates[i]} (max_gap_days={max_gap_days})"
        if gaps == "error":
            at = f"{unit} {a.lines[i]}"
            raise _fail(file, at, col, span, _FIX["gap"])
        notes.append(
            f"{file}: {int(long.sum())} gap(s) over {max_gap_days} business days, "
            f"first: {span} (kept: the next return spans it)"
        )
    return notes


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
    its folds need). Alignment and gap handling are reported in ``MarketData.notes``.
    """
    if gaps not in ("drop", "ffill", "error"):
        raise ValueError(f"gaps must be 'drop', 'ffill' or 'error', got {gaps!r}")
    files = _files(paths)
    assets: list[_Asset] = []
    notes: list[str] = []
    for path in files:
        parsed, file_notes = _parse(path, gaps, max_gap_days)
        notes += file_notes
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
    for a in assets:
        lost = len(a.dates) - common.size
        if lost:
            notes.append(
                f"{a.file}: {a.name} loses {lost} of {len(a.dates)} rows to alignment "
                "on the dates all assets share"
            )
    cols = {}
    for c in (*VALUE_COLUMNS, "adj_close"):
        cols[c] = np.stack(
            [a.values.get(c, a.values["close"])[np.isin(a.dates, common)] for a in assets], axis=1
        )
    data = MarketData(
        common, tuple(a.name for a in assets), source=source, notes=tuple(notes), **cols
    )
    data.require_rows(min_rows, "min_rows")
    warnings = still_series(data)
    mask = extreme_moves(data.log_returns())
    if mask.any():
        shown = "; ".join(describe_moves(data, mask))
        more = f" (and {int(mask.sum()) - 5} more)" if mask.sum() > 5 else ""
        warning = (
            f"{source}: {int(mask.sum())} extreme one-day move(s), over {EXTREME_MOVE_SIGMAS:g} "
            f"robust standard deviations of the asset's own returns: {shown}{more}. A bad tick "
            "or an unadjusted split looks like this; check those rows (or use Adj Close)"
        )
        warnings.append(warning)
    return replace(data, warnings=tuple(warnings))
