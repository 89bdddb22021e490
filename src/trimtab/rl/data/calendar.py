"""Dates of market data: reading a date column into local calendar days, and bars per year.

A stamp keeps the calendar day written in it (``2024-01-08 00:00:00+09:00`` is 2024-01-08, the
exchange's own day, not the UTC one); the UTC offsets are kept so the loader can tell assets
stamped by different exchanges apart. Bars per year come from the dates' spacing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trimtab.rl.data.issues import DataError, data_error

__all__ = ["SPACINGS", "Stamps", "dominant_spacing", "parse_dates", "periods_per_year"]

# YYYY-MM-DD, then optionally a time (T or space) and a UTC offset (Z, +09:00, +0900, +09).
_ISO = (
    r"^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?))?\s*(Z|[+-]\d{2}(?::?\d{2})?)?$"
)
_DMY = r"^(\d{1,4})([/.\-])(\d{1,2})\2(\d{1,4})(?:[ T].*)?$"
_FIX_DATE = "Write dates as YYYY-MM-DD."


@dataclass(frozen=True)
class Stamps:
    """A date column read as written: ``days`` (datetime64[D], the local calendar day),
    ``clock`` (int64 nanoseconds since local midnight; 0 without a time) and ``offsets``
    (float minutes east of UTC; NaN where the stamp has no offset). One entry per row."""

    days: np.ndarray
    clock: np.ndarray
    offsets: np.ndarray

    def take(self, idx: np.ndarray) -> Stamps:
        return Stamps(self.days[idx], self.clock[idx], self.offsets[idx])


def clock_text(ns: int) -> str:
    """``"09:30"`` (``"09:30:15"`` with seconds) for nanoseconds since midnight."""
    s = int(ns) // 1_000_000_000
    h, m, sec = s // 3600, s // 60 % 60, s % 60
    return f"{h:02d}:{m:02d}" + (f":{sec:02d}" if sec else "")


def offset_text(minutes: float) -> str:
    """``"+09:00"``, ``"-05:00"``, ``"+05:30"`` for minutes east of UTC."""
    m = round(minutes)
    return f"{'-' if m < 0 else '+'}{abs(m) // 60:02d}:{abs(m) % 60:02d}"


def parse_dates(series: Any, file: str, col: str, where: np.ndarray, unit: str) -> Stamps:
    """Read a date column (pandas Series: ISO 8601 text, or a datetime column of a Parquet
    file) as written; raises ``DataError`` naming the row of an unreadable date, or naming the
    format of a column that is not ISO 8601 (``13/01/2024`` looks like DD/MM/YYYY)."""
    import pandas as pd

    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        stamps = series.reset_index(drop=True)
        if stamps.dt.tz is not None:
            local = stamps.dt.tz_localize(None)  # the wall clock where the stamp was taken
            utc = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
            offsets = ((local - utc) / pd.Timedelta(minutes=1)).to_numpy(np.float64)
        else:
            local, offsets = stamps, np.full(len(stamps), np.nan)
        shown = stamps.astype(str)
    else:
        text = series.astype(object).where(series.notna(), "").astype(str).str.strip()
        text = text.reset_index(drop=True)
        parts = text.str.extract(_ISO)
        other = parts[0].isna() & (text != "")
        if other.any():
            raise _not_iso(text[other], file, col)
        local = pd.to_datetime(
            parts[0] + "T" + parts[1].fillna("00:00"), format="ISO8601", errors="coerce"
        )
        offsets = _offset_minutes(parts[2])
        shown = text
    nat = local.isna().to_numpy()
    if nat.any():
        i = int(np.argmax(nat))
        raise data_error(
            file, f"{unit} {where[i]}", col, f"cannot read date '{shown.iloc[i]}'", _FIX_DATE
        )
    # pandas may hold the stamps in any resolution (ns, us, s): count in nanoseconds
    since = (local - local.dt.normalize()).to_numpy().astype("timedelta64[ns]")
    clock = since.astype(np.int64)
    return Stamps(local.to_numpy().astype("datetime64[D]"), clock, offsets)


def _offset_minutes(text: Any) -> np.ndarray:
    """Minutes east of UTC of ``Z``/``+09:00``/``-0530``/``+09`` (NaN where there is none)."""
    import pandas as pd

    text = text.fillna("")
    digits = text.str.replace(r"[^0-9]", "", regex=True)
    hours = pd.to_numeric(digits.str[:2], errors="coerce").to_numpy(np.float64)
    mins = pd.to_numeric(digits.str[2:4], errors="coerce").fillna(0).to_numpy(np.float64)
    sign = np.where(text.str.startswith("-").to_numpy(), -1.0, 1.0)
    out = sign * (hours * 60 + mins)
    return np.where((text == "Z").to_numpy(), 0.0, out)


def _not_iso(text: Any, file: str, col: str) -> DataError:
    """One line naming the format the non-ISO dates seem to be in, and how to write them."""
    example, looks = text.iloc[0], None
    fix = "Write them as YYYY-MM-DD (e.g. 2024-01-13), with an optional time and UTC offset."
    dmy = text.str.extract(_DMY)
    if dmy[0].notna().all():
        sep = str(dmy[1].iloc[0])
        year = "YYYY" if (dmy[3].str.len() == 4).all() else "YY"
        if (dmy[0].str.len() == 4).all():
            looks = f"YYYY{sep}MM{sep}DD" + (" without zero padding" if sep == "-" else "")
        else:
            first, second = dmy[0].astype(int), dmy[2].astype(int)
            day_first, month_first = bool((first > 12).any()), bool((second > 12).any())
            dd_mm, mm_dd = f"DD{sep}MM{sep}{year}", f"MM{sep}DD{sep}{year}"
            if day_first and not month_first:
                row = int(np.argmax((first > 12).to_numpy()))
                example, looks = text.iloc[row], dd_mm
                d, m, y = dmy[0].iloc[row], dmy[2].iloc[row], dmy[3].iloc[row]
                if year == "YYYY":
                    fix = (
                        f"Write them as YYYY-MM-DD ('{example}' is {y}-{int(m):02d}-{int(d):02d})."
                    )
            elif month_first and not day_first:
                row = int(np.argmax((second > 12).to_numpy()))
                example, looks = text.iloc[row], mm_dd
                m, d, y = dmy[0].iloc[row], dmy[2].iloc[row], dmy[3].iloc[row]
                if year == "YYYY":
                    fix = (
                        f"Write them as YYYY-MM-DD ('{example}' is {y}-{int(m):02d}-{int(d):02d})."
                    )
            elif not day_first:
                looks = f"{dd_mm} or {mm_dd}: ambiguous, no day above 12 tells which"
            else:
                looks = f"a mix of {dd_mm} and {mm_dd}"
    elif text.str.fullmatch(r"\d{8}").all():
        looks = "YYYYMMDD"
    elif text.str.fullmatch(r"-?\d+(\.\d+)?").all():
        looks = "numbers: Unix times or spreadsheet serial dates?"
    problem = f"dates like '{example}' are not ISO 8601"
    return data_error(file, "", col, problem + (f" (they look like {looks})" if looks else ""), fix)


#: Spacing classes of the gap between consecutive bars: name, shortest and longest gap in
#: calendar days, bars per year. The ranges absorb holidays and month-end business days (a
#: daily gap of 1-4 days, a month-end to month-end gap of 28-33).
SPACINGS: tuple[tuple[str, int, int, float], ...] = (
    ("daily", 1, 5, 252.0),
    ("weekly", 6, 8, 52.0),
    ("monthly", 25, 35, 12.0),
    ("quarterly", 84, 98, 4.0),
    ("yearly", 355, 375, 1.0),
)
#: More than this share of gaps outside the most common class is a mixed or irregular spacing.
MAX_OFF_SPACING = 0.10
#: Daily bars trade 7 days a week (crypto: 365 bars a year) when at least this share of dates
#: fall on a weekend and fewer than this share of gaps skip a day. Business days skip the
#: weekend in one gap in five; a Sunday-Thursday market has weekend dates but skips Fri-Sat.
WEEKEND_SHARE = 0.10


def _classes(dates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gaps in calendar days between consecutive dates, and each one's index in ``SPACINGS``
    (-1: fits none)."""
    steps = np.diff(np.asarray(dates, dtype="datetime64[D]")).astype(np.int64)
    cls = np.full(steps.shape, -1)
    for k, (_, lo, hi, _) in enumerate(SPACINGS):
        cls[(steps >= lo) & (steps <= hi)] = k
    return steps, cls


def dominant_spacing(dates: np.ndarray) -> str | None:
    """The name of the most common spacing class of the gaps (ties: the finer one), or
    ``None`` with fewer than 2 dates or no gap in any class. Never raises."""
    _, cls = _classes(dates)
    counts = np.bincount(cls[cls >= 0], minlength=len(SPACINGS))
    return SPACINGS[int(np.argmax(counts))][0] if counts.any() else None


def periods_per_year(dates: np.ndarray, *, source: str = "the dates") -> float:
    """Bars per year implied by the spacing of ``dates`` (sorted, datetime64): 252 for business
    days, 365 for daily bars that include weekends (crypto), 52 weekly, 12 monthly, 4
    quarterly, 1 yearly. Each gap is classed (see ``SPACINGS``); the most common class gives
    the figure, holidays and a few missing bars being fine. Raises ``DataError`` when fewer
    than 2 dates are given, dates do not increase, or more than ``MAX_OFF_SPACING`` of the
    gaps lie outside the most common class (mixed or irregular spacing)."""
    days = np.asarray(dates, dtype="datetime64[D]")
    if len(days) < 2:
        raise DataError(
            f"{source}: {len(days)} date(s), but bars per year are inferred from the gaps "
            "between dates. Give at least 2 rows."
        )
    steps, cls = _classes(days)
    if (steps <= 0).any():
        i = int(np.argmax(steps <= 0))
        raise DataError(
            f"{source}: dates do not increase ({days[i]} then {days[i + 1]}), so the bar "
            "spacing is undefined. Sort the dates, oldest first, one row per date."
        )
    counts = np.bincount(cls[cls >= 0], minlength=len(SPACINGS))
    best = int(np.argmax(counts))
    off = len(steps) - int(counts[best])
    if off > MAX_OFF_SPACING * len(steps):
        found = [
            f"{int(n)} {name} ({lo}-{hi} days)"
            for (name, lo, hi, _), n in zip(SPACINGS, counts)
            if n
        ]
        odd = np.flatnonzero(cls == -1)
        if odd.size:
            i = int(odd[0])
            found.append(
                f"{odd.size} fit no spacing (e.g. {steps[i]} days from {days[i]} to {days[i + 1]})"
            )
        raise DataError(
            f"{source}: the bar spacing is mixed or irregular: of {len(steps)} gaps between "
            f"dates, {', '.join(found)}; more than {MAX_OFF_SPACING:.0%} differ from the most "
            f"common ({SPACINGS[best][0]}), so bars per year (which annualise Sharpe ratios "
            "and costs) are undefined. Resample every file to one spacing (e.g. one row per "
            "trading day, or per week), or keep only the part of the history with one spacing"
        )
    if SPACINGS[best][0] == "daily":
        daily = steps[cls == best]
        weekend = float(np.mean(~np.is_busday(days)))
        if weekend >= WEEKEND_SHARE and float(np.mean(daily > 1)) < WEEKEND_SHARE:
            return 365.0
    return SPACINGS[best][3]
