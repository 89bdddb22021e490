"""Loading and validating OHLCV files: formats, alignment, gaps, and every defect's message."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trimtab.rl.data.load import DataError, MarketData, extreme_moves, load_ohlcv

YAHOO = "Date,Open,High,Low,Close,Adj Close,Volume\n"
SNAKE = "date,open,high,low,close,adj_close,volume\n"


def rows(dates: list[str], start: float = 10.0) -> str:
    out = []
    for i, d in enumerate(dates):
        c = start + i
        out.append(f"{d},{c},{c + 1},{c - 1},{c + 0.5},{c + 0.25},{100 + i}\n")
    return "".join(out)


DAYS = [f"2021-03-{d:02d}" for d in (1, 2, 3, 4, 5, 8, 9, 10, 11, 12)]
GOOD = YAHOO + rows(DAYS)


def frame(dates: list[str], start: float = 10.0) -> pd.DataFrame:
    c = start + np.arange(len(dates), dtype=float)
    return pd.DataFrame(
        {
            "Date": pd.to_datetime(dates),
            "Open": c,
            "High": c + 1,
            "Low": c - 1,
            "Close": c + 0.5,
            "Adj Close": c + 0.25,
            "Volume": 100.0 + np.arange(len(dates)),
        }
    )


def edit(text: str, line: int, col: int | slice, value: str) -> str:
    """Set cell(s) ``col`` (0-based) of file line ``line`` (1-based) to ``value``."""
    lines = text.splitlines(keepends=True)
    cells = lines[line - 1].rstrip("\n").split(",")
    if isinstance(col, slice):
        cells[col] = [value] * len(range(*col.indices(len(cells))))
    else:
        cells[col] = value
    lines[line - 1] = ",".join(cells) + "\n"
    return "".join(lines)


# (id, file name, content, load kwargs, substrings the message must contain)
DEFECTS = [
    ("missing_column", "A.csv", GOOD.replace(",Volume", ",Vol"), {}, ["line 1", "'volume'"]),
    ("bad_date", "A.csv", edit(GOOD, 4, 0, "2021-13-45"), {}, ["line 4", "'Date'", "2021-13-45"]),
    ("duplicate_date", "A.csv", edit(GOOD, 3, 0, DAYS[0]), {}, ["line 3", "'Date'", "duplicate"]),
    (
        "decreasing_date",
        "A.csv",
        edit(GOOD, 5, 0, "2021-02-01"),
        {},
        ["line 5", "'Date'", "decreasing"],
    ),
    ("nan_cell", "A.csv", edit(GOOD, 6, 4, "NaN"), {}, ["line 6", "'Close'", "NaN"]),
    ("empty_cell", "A.csv", edit(GOOD, 2, 2, ""), {}, ["line 2", "'High'", "empty"]),
    ("text_cell", "A.csv", edit(GOOD, 7, 1, "abc"), {}, ["line 7", "'Open'", "'abc'"]),
    ("zero_price", "A.csv", edit(GOOD, 3, 3, "0"), {}, ["line 3", "'Low'", "zero or negative"]),
    (
        "negative_price",
        "A.csv",
        edit(GOOD, 9, 5, "-2"),
        {},
        ["line 9", "'Adj Close'", "negative price"],
    ),
    (
        "negative_volume",
        "A.csv",
        edit(GOOD, 11, 6, "-5"),
        {},
        ["line 11", "'Volume'", "negative volume"],
    ),
    ("high_below_low", "A.csv", edit(GOOD, 4, 2, "5"), {}, ["line 4", "'High'", "below Low"]),
    ("open_outside", "A.csv", edit(GOOD, 6, 1, "1"), {}, ["line 6", "'Open'", "outside"]),
    ("close_outside", "A.csv", edit(GOOD, 5, 4, "13000"), {}, ["line 5", "'Close'", "outside"]),
    ("too_few_rows", "A.csv", GOOD, {"min_rows": 50}, ["A.csv", "10 aligned rows", "50"]),
    ("empty_file", "A.csv", "", {}, ["A.csv", "empty"]),
    ("header_only", "A.csv", YAHOO, {}, ["A.csv", "no data rows"]),
    (
        "corrupt_parquet",
        "A.parquet",
        b"PAR1 this is not parquet",
        {},
        ["A.parquet", "unreadable Parquet"],
    ),
    ("unknown_extension", "A.xlsx", GOOD, {}, ["A.xlsx", "unknown file type", ".xlsx"]),
    (
        "nan_row_error",
        "A.csv",
        edit(GOOD, 4, slice(1, 7), "null"),
        {"gaps": "error"},
        ["line 4", "'Date'", "gaps="],
    ),
    (
        "calendar_gap_error",
        "A.csv",
        YAHOO + rows([*DAYS[:3], "2021-04-01"]),
        {"gaps": "error"},
        ["line 5", "'Date'", "business days missing"],
    ),
]


@pytest.mark.parametrize("name,fname,content,kwargs,expect", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_defect_raises_data_error_naming_file_line_column(
    tmp_path: Path, name: str, fname: str, content: str | bytes, kwargs: dict, expect: list[str]
) -> None:
    path = tmp_path / fname
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(DataError) as info:
        load_ohlcv(path, **kwargs)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert fname in msg and "\n" not in msg
    for part in expect:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_yahoo_snake_parquet_and_long_formats_agree(tmp_path: Path) -> None:
    (tmp_path / "yahoo").mkdir()
    (tmp_path / "yahoo" / "AAA.csv").write_text(GOOD)
    (tmp_path / "yahoo" / "BBB.csv").write_text(YAHOO + rows(DAYS, 20.0))
    (tmp_path / "snake").mkdir()
    (tmp_path / "snake" / "AAA.csv").write_text(SNAKE + rows(DAYS))
    (tmp_path / "snake" / "BBB.csv").write_text(
        "Date,Open,High,Low,Close,adj close,volume\n" + rows(DAYS, 20.0)
    )
    (tmp_path / "pq").mkdir()
    frame(DAYS).set_index("Date").to_parquet(tmp_path / "pq" / "AAA.parquet")  # date as index
    frame(DAYS, 20.0).to_parquet(tmp_path / "pq" / "BBB.parquet")
    long = pd.concat([frame(DAYS).assign(Symbol="AAA"), frame(DAYS, 20.0).assign(Symbol="BBB")])
    long = long.sort_values("Date", kind="stable")  # interleaved symbols
    long.to_csv(tmp_path / "long.csv", index=False)
    long.rename(columns={"Symbol": "ticker"}).to_parquet(tmp_path / "long.parquet")

    loaded = [
        load_ohlcv(tmp_path / p) for p in ("yahoo", "snake", "pq", "long.csv", "long.parquet")
    ]
    ref = loaded[0]
    assert ref.assets == ("AAA", "BBB") and ref.n_days == len(DAYS)
    assert ref.dates[0] == np.datetime64("2021-03-01")
    for d in loaded[1:]:
        assert d.assets == ref.assets
        np.testing.assert_array_equal(d.dates, ref.dates)
        for k in ("open", "high", "low", "close", "volume", "adj_close"):
            np.testing.assert_allclose(getattr(d, k), getattr(ref, k))


def test_returns_prefer_adjusted_close(tmp_path: Path) -> None:
    path = tmp_path / "A.csv"
    path.write_text(YAHOO + "2021-03-01,10,10,10,10,5,1\n2021-03-02,10,10,10,10,10,1\n")
    d = load_ohlcv(path)
    np.testing.assert_allclose(d.log_returns()[:, 0], [0.0, np.log(2.0)])
    path.write_text(
        SNAKE.replace(",adj_close", "") + "2021-03-01,10,10,10,10,1\n2021-03-02,20,20,20,20,1\n"
    )
    np.testing.assert_allclose(load_ohlcv(path).log_returns()[:, 0], [0.0, np.log(2.0)])


def test_alignment_keeps_common_dates_and_reports(tmp_path: Path) -> None:
    (tmp_path / "A.csv").write_text(YAHOO + rows(DAYS))
    (tmp_path / "B.csv").write_text(YAHOO + rows(DAYS[2:]))
    d = load_ohlcv(tmp_path)
    np.testing.assert_array_equal(d.dates, np.array(DAYS[2:], dtype="datetime64[D]"))
    np.testing.assert_allclose(d.close[:, 0], 10.5 + np.arange(2, 10))  # A's own rows kept
    assert any("A loses 2 of 10" in n for n in d.notes)
    (tmp_path / "C.csv").write_text(YAHOO + rows(["2022-01-03", "2022-01-04"]))
    with pytest.raises(DataError, match="no date in common"):
        load_ohlcv(tmp_path)


def test_gap_policies(tmp_path: Path) -> None:
    path = tmp_path / "A.csv"
    path.write_text(edit(GOOD, 4, slice(1, 7), "null"))  # Yahoo-style holiday row on line 4
    dropped = load_ohlcv(path, gaps="drop")
    assert dropped.n_days == 9 and np.datetime64("2021-03-03") not in dropped.dates
    assert any("line 4" in n for n in dropped.notes)
    filled = load_ohlcv(path, gaps="ffill")
    assert filled.n_days == 10
    for k in ("open", "high", "low", "close"):
        assert filled.__getattribute__(k)[2, 0] == 11.5  # the previous close
    assert filled.adj_close[2, 0] == 11.25 and filled.volume[2, 0] == 0.0
    assert filled.log_returns()[2, 0] == 0.0
    with pytest.raises(DataError, match="line 4"):
        load_ohlcv(path, gaps="error")
    # A leading empty row cannot be filled: it is dropped.
    path.write_text(edit(GOOD, 2, slice(1, 7), ""))
    assert load_ohlcv(path, gaps="ffill").dates[0] == np.datetime64("2021-03-02")


def test_calendar_gap_is_reported_not_filled(tmp_path: Path) -> None:
    path = tmp_path / "A.csv"
    path.write_text(YAHOO + rows([*DAYS[:3], "2021-04-01", "2021-04-02"]))
    d = load_ohlcv(path, gaps="drop", max_gap_days=5)
    assert d.n_days == 5 and any("business days missing" in n for n in d.notes)
    assert load_ohlcv(path, gaps="error", max_gap_days=30).n_days == 5


def test_long_file_lines_point_into_the_file(tmp_path: Path) -> None:
    text = "Date,Ticker,Open,High,Low,Close,Volume\n"
    text += "2021-03-01,X,1,1,1,1,1\n2021-03-01,Y,1,1,1,1,1\n2021-03-02,X,1,1,1,1,1\n"
    text += "2021-03-01,Y,1,1,1,1,1\n"  # Y goes back in time on line 5
    (tmp_path / "long.csv").write_text(text)
    with pytest.raises(DataError, match=r"long.csv \[Y\]: line 5, column 'Date'"):
        load_ohlcv(tmp_path / "long.csv")


def test_dates_with_time_zone_and_yfinance_three_line_header(tmp_path: Path) -> None:
    path = tmp_path / "SPY.csv"
    path.write_text(
        "Price,Close,High,Low,Open,Volume\nTicker,SPY,SPY,SPY,SPY,SPY\nDate,,,,,\n"
        "2021-03-01 00:00:00-05:00,2,3,1,2,10\n2021-03-02 00:00:00-05:00,2,3,1,2,10\n"
    )
    d = load_ohlcv(path)
    np.testing.assert_array_equal(d.dates, np.array(["2021-03-01", "2021-03-02"], "datetime64[D]"))
    path.write_text(path.read_text().replace("2,3,1,2,10\n2021", "2,3,1,-2,10\n2021"))
    with pytest.raises(DataError, match="line 4, column 'Open'"):
        load_ohlcv(path)


def test_market_data_slice_and_require_rows() -> None:
    t, a = 6, 2
    arr = np.arange(1.0, t * a + 1).reshape(t, a)
    dates = np.datetime64("2021-01-04") + np.arange(t)
    d = MarketData(dates, ("A", "B"), arr, arr, arr, arr, arr, arr, source="x")
    s = d.slice(2, 5)
    assert s.n_days == 3 and s.n_assets == 2 and s.dates[0] == dates[2]
    np.testing.assert_array_equal(s.close, arr[2:5])
    assert d.require_rows(6) is d
    with pytest.raises(DataError, match="only 6 aligned rows, but 7 are needed for 2 folds"):
        d.require_rows(7, "2 folds")
    with pytest.raises(ValueError, match="shape"):
        MarketData(dates, ("A",), arr, arr, arr, arr, arr, arr)


def test_asset_name_is_the_file_stem_even_with_dots(tmp_path: Path) -> None:
    (tmp_path / "BRK.B.csv.gz").write_bytes(gzip.compress(GOOD.encode()))
    (tmp_path / "^GSPC.pq").write_bytes(b"")
    assert load_ohlcv(tmp_path / "BRK.B.csv.gz").assets == ("BRK.B",)
    with pytest.raises(DataError, match=r"\^GSPC.pq: the file is empty"):
        load_ohlcv(tmp_path)


def test_an_asset_given_twice_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "A.csv").write_text(GOOD)
    frame(DAYS).to_parquet(tmp_path / "A.parquet")
    with pytest.raises(DataError, match=r"asset 'A' also comes from .*A.csv"):
        load_ohlcv(tmp_path)


def _walk(n: int, seed: int = 0, sigma: float = 0.01) -> np.ndarray:
    """Closes of a heavy-tailed random walk (Student-t, 3 d.o.f.)."""
    r = np.random.default_rng(seed).standard_t(3, n) * sigma
    return 100 * np.exp(np.cumsum(r))


def _ohlcv(closes: np.ndarray) -> str:
    dates = pd.bdate_range("2015-01-01", periods=len(closes))
    return SNAKE + "".join(f"{d.date()},{c},{c},{c},{c},{c},100\n" for d, c in zip(dates, closes))


def test_extreme_move_is_a_warning_with_its_date(tmp_path: Path) -> None:
    """A bad tick (Close x1000 for one day) loads; its two extreme moves are one ``bad_tick``
    issue naming both dates (a move is reported once, under its most specific kind)."""
    closes = _walk(1500)
    closes[700] *= 1000
    path = tmp_path / "A.csv"
    path.write_text(_ohlcv(closes))
    d = load_ohlcv(path)
    assert len(d.warnings) == 1 and "\n" not in d.warnings[0]
    (issue,) = d.issues
    assert issue.kind == "bad_tick" and issue.message == d.warnings[0]
    assert (issue.first, issue.last) == (str(d.dates[700]), str(d.dates[701]))
    assert str(d.dates[700]) in d.warnings[0] and str(d.dates[701]) in d.warnings[0]
    np.testing.assert_array_equal(np.nonzero(extreme_moves(d.log_returns()))[0], [700, 701])


@pytest.mark.parametrize("seed", range(5))
def test_heavy_tails_are_not_extreme(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "A.csv"
    path.write_text(_ohlcv(_walk(1500, seed)))
    d = load_ohlcv(path)
    assert d.warnings == () and d.issues == ()
