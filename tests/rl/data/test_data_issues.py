"""Every data problem the loader does not refuse is a ``DataIssue`` with its dates: gaps,
empty rows, alignment losses, unadjusted splits, bad ticks, extreme moves, still series."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trimtab.rl.data.load import DataIssue, MarketData, extreme_moves, issues_in_window, load_ohlcv

HEADER = "Date,Open,High,Low,Close,Volume\n"


def write(path: Path, closes: np.ndarray, start: str = "2015-01-01", adj: bool = False) -> Path:
    """A CSV of flat bars (O=H=L=C) on business days from ``start``; ``adj``: with an Adj
    Close column equal to the close."""
    dates = pd.bdate_range(start, periods=len(closes))
    head = HEADER.replace("Volume", "Adj Close,Volume") if adj else HEADER
    path.write_text(
        head
        + "".join(
            f"{d.date()},{c},{c},{c},{c}," + (f"{c}," if adj else "") + "100\n"
            for d, c in zip(dates, closes)
        )
    )
    return path


def walk(n: int, vol: float, seed: int = 0, quiet: tuple[int, ...] = ()) -> np.ndarray:
    """Closes of a Gaussian random walk; no move on the ``quiet`` days (e.g. a split day, so
    the split's ratio shows as written)."""
    r = np.random.default_rng(seed).normal(0.0, vol, n)
    r[list(quiet)] = 0.0
    return 100 * np.exp(np.cumsum(r))


def kinds(d: MarketData) -> list[str]:
    return [i.kind for i in d.issues]


def test_every_long_gap_is_an_issue_with_its_dates(tmp_path: Path) -> None:
    dates = pd.bdate_range("2019-06-03", "2020-12-31")
    spring = (dates > "2020-03-02") & (dates < "2020-06-01")
    autumn = (dates > "2020-09-01") & (dates < "2020-09-14")
    dates = dates[~(spring | autumn)]
    path = tmp_path / "SPY.csv"
    path.write_text(HEADER + "".join(f"{d.date()},10,10,10,10,1\n" for d in dates))
    d = load_ohlcv(path)
    gaps = [i for i in d.issues if i.kind == "gap"]
    assert [(g.first, g.last) for g in gaps] == [
        ("2020-03-02", "2020-06-01"),
        ("2020-09-01", "2020-09-14"),
    ]
    assert "SPY.csv: SPY: 64 business days missing between 2020-03-02 and 2020-06-01" in (
        gaps[0].message
    )
    assert all(g.asset == "SPY" and g.message in d.warnings and g.message in d.notes for g in gaps)


def test_every_run_of_empty_rows_is_an_issue(tmp_path: Path) -> None:
    body = "".join(f"2021-03-{x:02d},{x},{x},{x},{x},1\n" for x in range(1, 13))
    lines = (HEADER + body).split("\n")
    for i in (1, 5, 6, 9):  # file lines 2, 6, 7 and 10: the first row, a run of two, one
        lines[i] = lines[i].split(",")[0] + ",,,,,"
    path = tmp_path / "A.csv"
    path.write_text("\n".join(lines))
    dropped = load_ohlcv(path, gaps="drop")
    runs = [(i.first, i.last) for i in dropped.issues if i.kind == "empty_row"]
    assert runs == [("2021-03-01", "2021-03-01"), ("2021-03-05", "2021-03-06"),
                    ("2021-03-09", "2021-03-09")]  # fmt: skip
    assert "A.csv: 2 empty row(s) on 2021-03-05..2021-03-06 (lines 6-7" in dropped.issues[1].message
    assert all(i.message.endswith("dropped") for i in dropped.issues)
    filled = load_ohlcv(path, gaps="ffill")
    assert filled.issues[0].message.endswith("dropped (no earlier close to fill it from)")
    assert all("filled flat" in i.message for i in filled.issues[1:])


def test_alignment_losses_say_which_rows_and_why(tmp_path: Path) -> None:
    write(tmp_path / "OLD.csv", walk(1083, 0.01), start="2012-01-02")
    write(tmp_path / "NEW.csv", walk(300, 0.01), start="2015-01-01")
    d = load_ohlcv(tmp_path)
    assert d.dates[0] == np.datetime64("2015-01-01")
    (cut,) = [i for i in d.issues if i.kind == "alignment"]
    assert (cut.asset, cut.first, cut.last) == ("OLD", "2012-01-02", "2014-12-31")
    assert "OLD.csv: OLD loses 783 of 1083 rows to alignment: 2012-01-02..2014-12-31" in (
        cut.message
    )
    assert "NEW starts on 2015-01-01" in cut.message and "every asset is cut" in cut.message
    # NEW lacks a day inside the span; OLD goes on past NEW's end
    text = (tmp_path / "NEW.csv").read_text().splitlines()
    (tmp_path / "NEW.csv").write_text("\n".join(text[:11] + text[12:200]) + "\n")
    d = load_ohlcv(tmp_path)
    lost = {(i.first, i.last): i.message for i in d.issues if i.kind == "alignment"}
    assert any("1 date(s) inside the common span that NEW lack(s) (2015-01-15)" in m
               for m in lost.values())  # fmt: skip
    assert any("the last date all assets share (NEW ends on" in m for m in lost.values())
    assert issues_in_window(d, "2015-01-15", "2015-01-15") == [lost[("2015-01-15", "2015-01-15")]]


def test_an_unadjusted_3_for_2_split_is_flagged(tmp_path: Path) -> None:
    """-33.3% on a 2%-vol stock is ~20 robust sigmas: under the 30 of extreme moves."""
    closes = walk(1000, 0.02, quiet=(600,))
    closes[600:] *= 2 / 3
    d = load_ohlcv(write(tmp_path / "A.csv", closes))
    assert not extreme_moves(d.log_returns()).any()
    (split,) = d.issues
    day = str(d.dates[600])
    assert (split.kind, split.asset, split.first, split.last) == ("split", "A", day, day)
    assert (
        "3:2 split" in split.message and "-33.3%" in split.message and "Adj Close" in split.message
    )
    # the same prices with an Adj Close column: returns come from it, no split is suspected
    assert load_ohlcv(write(tmp_path / "A.csv", closes, adj=True)).issues == ()


def test_a_10_for_1_split_and_a_reverse_split_are_reported_once(tmp_path: Path) -> None:
    closes = walk(1000, 0.01, quiet=(300, 800))
    closes[300:] /= 10
    closes[800:] *= 5
    d = load_ohlcv(write(tmp_path / "A.csv", closes))
    assert kinds(d) == ["split", "split"]  # not also "extreme", though both are
    assert "10:1 split" in d.issues[0].message and "reverse 1:5 split" in d.issues[1].message
    assert np.flatnonzero(extreme_moves(d.log_returns())).tolist() == [300, 800]


def test_a_spike_that_reverses_is_a_bad_tick(tmp_path: Path) -> None:
    closes = walk(1000, 0.01)
    closes[400] *= 1.3  # ~23 sigmas each way: under the extreme-move bar
    d = load_ohlcv(write(tmp_path / "A.csv", closes))
    (tick,) = d.issues
    assert (tick.kind, tick.first, tick.last) == ("bad_tick", str(d.dates[400]), str(d.dates[401]))
    assert "reverses the next day" in tick.message and "A.csv: A on" in tick.message


def test_a_crash_that_stays_is_an_extreme_move(tmp_path: Path) -> None:
    closes = walk(1000, 0.01, quiet=(500,))
    closes[500:] *= 0.6  # -40%, not a split ratio, not reversed
    d = load_ohlcv(write(tmp_path / "A.csv", closes))
    (crash,) = d.issues
    assert (crash.kind, crash.first) == ("extreme", str(d.dates[500]))
    assert "-40.0%" in crash.message and "robust standard deviations" in crash.message


@pytest.mark.parametrize("seed", range(4))
def test_ordinary_volatile_prices_raise_no_issue(tmp_path: Path, seed: int) -> None:
    r = np.random.default_rng(seed).standard_t(4, 1500) * 0.02
    d = load_ohlcv(write(tmp_path / "A.csv", 100 * np.exp(np.cumsum(r))))
    assert d.issues == ()


def test_still_series_are_issues(tmp_path: Path) -> None:
    write(tmp_path / "A.csv", np.full(50, 10.0))
    (tmp_path / "B.csv").write_text(
        (tmp_path / "A.csv").read_text().replace(",100\n", ",0\n").replace("10.0,", "11.0,")
    )
    d = load_ohlcv(tmp_path)
    still = {(i.asset, i.first): i.message for i in d.issues if i.kind == "still"}
    assert "does not change on 49 of 49 days" in still[("A", str(d.dates[0]))]
    assert "volume is zero on every day" in still[("B", None)]


def test_issues_in_window_touching_and_inclusive(tmp_path: Path) -> None:
    dates = np.datetime64("2021-01-04") + np.arange(10)
    arr = np.ones((10, 1))
    issues = (
        DataIssue("gap", "A", "2021-01-05", "2021-01-07", "A.csv: gap 01-05..01-07"),
        DataIssue("bad_tick", "A", "2021-01-10", "2021-01-11", "A.csv: tick 01-10"),
        DataIssue("still", "A", None, None, "A.csv: volume zero"),
    )
    d = MarketData(dates, ("A",), arr, arr, arr, arr, arr, arr, issues=issues, warnings=("x",))
    assert d.warnings == (*[i.message for i in issues], "x")
    assert issues_in_window(d, "2021-01-07", "2021-01-09") == ["A.csv: gap 01-05..01-07"]
    assert issues_in_window(d, "2021-01-08", "2021-01-09") == []
    assert issues_in_window(d, "2021-01-01", "2021-01-10") == [i.message for i in issues[:2]]
    assert issues_in_window(d.slice(5, None), "2021-01-11", "2021-01-20") == ["A.csv: tick 01-10"]
    with pytest.raises(ValueError, match="not an ISO date"):
        issues_in_window(d, "11/01/2021", "2021-01-20")
    with pytest.raises(ValueError, match="after last"):
        issues_in_window(d, "2021-01-20", "2021-01-01")


def test_data_issue_is_validated() -> None:
    for bad, match in (
        (("typo", None, None, None, "m"), "kind"),
        (("gap", "A", "2021-01-05", None, "m"), "both first and last"),
        (("gap", "A", "2021-01-06", "2021-01-05", "m"), "after last"),
        (("gap", "A", None, None, "two\nlines"), "one line"),
    ):
        with pytest.raises(ValueError, match=match):
            DataIssue(*bad)
