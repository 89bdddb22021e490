"""Dates of loaded files: local calendar days under UTC offsets, non-ISO formats and intraday
bars refused in one line, and bars per year inferred from the spacing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trimtab.rl.data.calendar import periods_per_year
from trimtab.rl.data.load import DataError, load_ohlcv

HEADER = "Date,Open,High,Low,Close,Volume\n"


def write(path: Path, stamps: list[str], start: float = 10.0) -> Path:
    """A CSV of ``stamps`` (as written) with consistent bars rising by 1 a row."""
    body = "".join(
        f"{s},{start + i},{start + i + 1},{start + i - 1},{start + i + 0.5},100\n"
        for i, s in enumerate(stamps)
    )
    path.write_text(HEADER + body)
    return path


DAYS = ["2024-01-08", "2024-01-09", "2024-01-10", "2024-01-11", "2024-01-12"]


@pytest.mark.parametrize(
    "stamp",
    [
        "{d} 00:00:00+09:00",  # yfinance, Tokyo: UTC is the day before
        "{d} 00:00:00+05:30",  # Mumbai
        "{d} 23:00:00-05:00",  # New York, late: UTC is the day after
        "{d}T00:00:00+0900",
        "{d}T16:00:00Z",
        "{d} 16:00",
        "{d}",
    ],
)
def test_a_stamp_keeps_its_local_calendar_day(tmp_path: Path, stamp: str) -> None:
    path = write(tmp_path / "A.csv", [stamp.format(d=d) for d in DAYS])
    d = load_ohlcv(path)
    np.testing.assert_array_equal(d.dates, np.array(DAYS, dtype="datetime64[D]"))
    assert d.issues == ()


def test_parquet_datetime_columns_keep_their_local_day(tmp_path: Path) -> None:
    for tz in ("Asia/Tokyo", "America/New_York", None):
        stamps = pd.DatetimeIndex(DAYS).tz_localize(tz) + pd.Timedelta(hours=0 if tz else 16)
        c = 10.0 + np.arange(len(DAYS))
        frame = pd.DataFrame(
            {"Date": stamps, "Open": c, "High": c + 1, "Low": c - 1, "Close": c, "Volume": 1.0}
        )
        frame.to_parquet(tmp_path / "A.parquet")
        d = load_ohlcv(tmp_path / "A.parquet")
        np.testing.assert_array_equal(d.dates, np.array(DAYS, dtype="datetime64[D]"))


def test_assets_at_different_offsets_align_on_local_days_with_a_warning(tmp_path: Path) -> None:
    write(tmp_path / "N225.csv", [f"{d} 00:00:00+09:00" for d in DAYS])
    write(tmp_path / "SPY.csv", [f"{d} 00:00:00-05:00" for d in DAYS[1:]])
    d = load_ohlcv(tmp_path)
    np.testing.assert_array_equal(d.dates, np.array(DAYS[1:], dtype="datetime64[D]"))
    (tz,) = [i for i in d.issues if i.kind == "timezone"]
    assert tz.asset is None and tz.first is None
    for part in ("N225.csv", "SPY.csv", "N225 +09:00", "SPY -05:00", "local trading days",
                 "14 hours apart", "4 of 4 aligned days"):  # fmt: skip
        assert part in tz.message, part
    assert tz.message in d.warnings


def test_one_exchange_across_daylight_saving_is_not_a_time_zone_issue(tmp_path: Path) -> None:
    days = ["2024-03-08", "2024-03-11", "2024-03-12"]  # US clocks change on 2024-03-10
    stamps = ["2024-03-08 00:00:00-05:00", "2024-03-11 00:00:00-04:00", "2024-03-12 00:00-04:00"]
    write(tmp_path / "A.csv", stamps)
    write(tmp_path / "B.csv", stamps)
    write(tmp_path / "C.csv", days)  # no offset: nothing to compare
    assert [i for i in load_ohlcv(tmp_path).issues if i.kind == "timezone"] == []
    write(tmp_path / "D.csv", ["2024-03-08 00:00+09:00", "2024-03-11 00:00-05:00", days[2]])
    (tz,) = [i for i in load_ohlcv(tmp_path / "D.csv").issues if i.kind == "timezone"]
    assert tz.asset == "D" and "mixes time zones" in tz.message


def test_intraday_bars_are_refused_in_one_line(tmp_path: Path) -> None:
    stamps = [f"2024-01-08 {t}:00-05:00" for t in ("09:30", "09:35", "09:40", "09:45")]
    path = write(tmp_path / "A.csv", [*stamps, "2024-01-09 09:30:00-05:00"])
    with pytest.raises(DataError) as info:
        load_ohlcv(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}: line 3: several bars on 2024-01-08 ")
    for part in ("(09:30, 09:35, 09:40, ...)", "intraday bars are not supported",
                 "daily or coarser", "Resample to daily bars"):  # fmt: skip
        assert part in msg, part
    write(path, ["2024-01-08", "2024-01-08 00:00"])  # the same stamp twice: a duplicate
    with pytest.raises(DataError, match="line 3, column 'Date': duplicate date 2024-01-08"):
        load_ohlcv(path)


# (dates written, the format the message must name, and more it must say)
NOT_ISO = [
    (["12/01/2024", "13/01/2024"], "(they look like DD/MM/YYYY)", "'13/01/2024' is 2024-01-13"),
    (["01/12/2024", "01/13/2024"], "(they look like MM/DD/YYYY)", "'01/13/2024' is 2024-01-13"),
    (["01/02/2024", "02/02/2024"], "DD/MM/YYYY or MM/DD/YYYY: ambiguous", "YYYY-MM-DD"),
    (["13.01.24", "14.01.24"], "(they look like DD.MM.YY)", "YYYY-MM-DD"),
    (["13/01/2024", "01/13/2024"], "a mix of DD/MM/YYYY and MM/DD/YYYY", "YYYY-MM-DD"),
    (["2024/01/12", "2024/01/13"], "(they look like YYYY/MM/DD)", "YYYY-MM-DD"),
    (["2024-1-12", "2024-1-13"], "YYYY-MM-DD without zero padding", "YYYY-MM-DD"),
    (["20240112", "20240113"], "(they look like YYYYMMDD)", "YYYY-MM-DD"),
    (["45303", "45304"], "spreadsheet serial dates", "YYYY-MM-DD"),
    (["Jan 12, 2024", "Jan 13, 2024"], "dates like 'Jan 12, 2024' are not ISO 8601.", "YYYY"),
]


@pytest.mark.parametrize("dates,looks,fix", NOT_ISO, ids=[d[1][:24] for d in NOT_ISO])
def test_a_date_column_that_is_not_iso_is_named_as_such(
    tmp_path: Path, dates: list[str], looks: str, fix: str
) -> None:
    """Before: DD/MM/YYYY dates were blamed as 'decreasing dates'."""
    path = tmp_path / "A.csv"
    path.write_text(HEADER + "".join(f'"{d}",1,1,1,1,1\n' for d in dates))
    with pytest.raises(DataError) as info:
        load_ohlcv(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: column 'Date': dates like '") and "\n" not in msg
    assert "are not ISO 8601" in msg and looks in msg and fix in msg
    assert "decreasing" not in msg


def test_a_non_iso_date_among_iso_ones_is_named(tmp_path: Path) -> None:
    path = write(tmp_path / "A.csv", [*DAYS[:3], "15/01/2024"])
    with pytest.raises(DataError, match=r"dates like '15/01/2024' .* DD/MM/YYYY"):
        load_ohlcv(path)


def bdays(n: int, start: str = "2015-01-01") -> np.ndarray:
    return pd.bdate_range(start, periods=n).to_numpy().astype("datetime64[D]")


def test_bars_per_year_from_the_spacing() -> None:
    holidays = np.delete(bdays(600), [10, 50, 51, 300, 420])
    weekly = pd.date_range("2015-01-02", periods=200, freq="W-FRI").to_numpy().copy()
    weekly[[20, 70]] -= np.timedelta64(1, "D")  # Good Friday: Thursday's bar
    cases = {
        252.0: holidays,
        365.0: pd.date_range("2020-01-01", periods=800, freq="D").to_numpy(),
        52.0: weekly,
        12.0: pd.date_range("2010-01-01", periods=120, freq="BME").to_numpy(),
        4.0: pd.date_range("2000-01-01", periods=60, freq="BQE").to_numpy(),
        1.0: pd.date_range("1990-01-01", periods=30, freq="BYE").to_numpy(),
    }
    for want, dates in cases.items():
        assert periods_per_year(dates) == want, want
    # A Sunday-Thursday market has weekend dates but skips two days a week: not crypto.
    sun_thu = pd.bdate_range("2015-01-01", periods=500, freq="C", weekmask="Sun Mon Tue Wed Thu")
    assert periods_per_year(sun_thu.to_numpy()) == 252.0
    assert periods_per_year(bdays(2)) == 252.0  # two weekdays: no weekend to suggest crypto
    # a 3-month hole in 10 years of business days is one odd gap: still daily
    assert periods_per_year(np.delete(bdays(2520), np.s_[1000:1063])) == 252.0


def test_mixed_or_irregular_spacing_is_refused_in_one_line() -> None:
    mixed = np.concatenate([bdays(100), pd.date_range("2016-01-01", periods=30, freq="W-FRI")])
    rng = np.random.default_rng(0)
    irregular = np.datetime64("2020-01-01") + np.cumsum(rng.integers(9, 20, 50))
    for dates, parts in (
        (mixed, ["99 daily (1-5 days)", "29 weekly (6-8 days)", "most common (daily)"]),
        (irregular, ["fit no spacing (e.g.", "days from 2020-01"]),
    ):
        with pytest.raises(DataError) as info:
            periods_per_year(np.asarray(dates, dtype="datetime64[D]"), source="X.csv")
        msg = str(info.value)
        assert msg.startswith("X.csv: the bar spacing is mixed or irregular") and "\n" not in msg
        assert "Resample every file to one spacing" in msg
        for part in parts:
            assert part in msg, part
    with pytest.raises(DataError, match="1 date"):
        periods_per_year(bdays(1))
    with pytest.raises(DataError, match="do not increase"):
        periods_per_year(bdays(5)[::-1])


def test_a_weekly_file_annualises_with_52_bars(tmp_path: Path) -> None:
    """Its Sharpe ratio is then annualised by sqrt(52), not sqrt(252)."""
    weeks = pd.date_range("2015-01-02", periods=150, freq="W-FRI")
    closes = 100 * np.exp(np.cumsum(np.random.default_rng(1).normal(0.002, 0.02, len(weeks))))
    path = tmp_path / "W.csv"
    path.write_text(
        HEADER + "".join(f"{w.date()},{c},{c},{c},{c},1\n" for w, c in zip(weeks, closes))
    )
    d = load_ohlcv(path)
    assert d.periods_per_year == 52.0
    assert not [i for i in d.issues if i.kind == "gap"]  # a week apart is no gap in weekly bars
    # a missing quarter in weekly bars is a gap, measured beyond the usual spacing
    path.write_text(HEADER + "".join(
        f"{w.date()},{c},{c},{c},{c},1\n" for i, (w, c) in enumerate(zip(weeks, closes))
        if not 40 <= i < 53
    ))  # fmt: skip
    (gap,) = [i for i in load_ohlcv(path).issues if i.kind == "gap"]
    assert (gap.first, gap.last) == (str(weeks[39].date()), str(weeks[53].date()))
    assert "beyond the usual 4 between weekly bars" in gap.message


def test_monthly_and_business_day_files(tmp_path: Path) -> None:
    months = pd.date_range("2010-01-01", periods=60, freq="BME")
    write(tmp_path / "M.csv", [str(m.date()) for m in months])
    d = load_ohlcv(tmp_path / "M.csv")
    assert d.periods_per_year == 12.0 and d.issues == ()
    write(tmp_path / "D.csv", [str(x) for x in bdays(40)])
    assert load_ohlcv(tmp_path / "D.csv").periods_per_year == 252.0
