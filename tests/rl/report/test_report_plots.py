"""The run report's plots and HTML, built from fabricated run directories: every market plot
is dated, the HTML reads in a trader's order, and older or Gymnasium run directories still
build."""

from __future__ import annotations

import json

import matplotlib.dates as mdates
import numpy as np
import pytest
from test_report import fabricate

from trimtab.rl.report.build import build_report
from trimtab.rl.report.plots import market_figures


def _dated(ax, first: str, last: str) -> bool:
    """Whether the axis's x is a date axis whose view spans the dates ``first .. last``:
    a date formatter alone would pass over bar numbers read as days since 1970."""
    formatter = ax.xaxis.get_major_formatter()
    if not isinstance(formatter, (mdates.ConciseDateFormatter, mdates.AutoDateFormatter,
                                  mdates.DateFormatter)):  # fmt: skip
        return False
    lo, hi = (np.datetime64(d.replace(tzinfo=None), "D") for d in
              mdates.num2date(ax.get_xlim()))  # fmt: skip
    return lo <= np.datetime64(first) and np.datetime64(last) <= hi and hi - lo < 1000


@pytest.mark.parametrize("assets", [2, 9])  # a panel per asset; a heat map past six
def test_every_market_plot_has_a_date_axis_over_the_test_days(tmp_path, assets):
    summary = fabricate(tmp_path / "run", assets=assets)
    figs, note = market_figures(tmp_path / "run", summary)
    assert note is None
    assert set(figs) == {"equity_pooled.png", "drawdowns.png", "positions.png", "equity.png"}
    start, end = summary["oos"]["start"], summary["oos"]["end"]
    for name, fig in figs.items():
        axes = [ax for ax in fig.axes if ax.axison and ax.get_label() != "<colorbar>"]
        assert axes, name
        for i, ax in enumerate(axes):
            fold = summary["folds"][i] if name == "equity.png" else None
            first, last = (fold["test_start"], fold["test_end"]) if fold else (start, end)
            assert _dated(ax, first, last), (name, i)
        # the date labels a reader sees: drawn, and none of them empty on the bottom axis
        fig.canvas.draw()
        labels = [t.get_text() for t in axes[-1].get_xticklabels() if t.get_visible()]
        assert len([t for t in labels if t]) >= 3, (name, labels)


def test_pooled_equity_shows_the_agent_every_baseline_and_the_fold_boundaries(tmp_path):
    summary = fabricate(tmp_path / "run")
    figs, _ = market_figures(tmp_path / "run", summary)
    ax = figs["equity_pooled.png"].axes[0]
    names = set(ax.get_legend_handles_labels()[1])
    assert {"agent", "buy & hold", "flat (cash)", "momentum", "reversal", "MA crossover",
            "random (median draw)", "oracle (knows the regime)",
            "random draws, 5–95%"} <= names  # fmt: skip
    assert [t.get_text().strip() for t in ax.texts] == ["fold 0", "fold 1", "fold 2"]
    assert ax.get_yscale() == "log"


def test_report_html_reads_in_order_and_states_costs_verdict_and_warnings(tmp_path):
    summary = fabricate(tmp_path / "run", execution="same_close")
    text = build_report(tmp_path / "run").read_text()
    order = ["OPTIMISTIC: filled at the close that was just seen", "class=verdict",
             "Data warnings", "AAA: 2 extreme one-day moves", "Pooled out of sample",
             "Agent minus each baseline", "plots/equity_pooled.png", "plots/drawdowns.png",
             "plots/positions.png", "plots/equity.png", "Out-of-sample results per fold",
             "Training diagnostics"]  # fmt: skip
    at = [text.index(s) for s in order]
    assert at == sorted(at)
    assert summary["oos"]["start"] in text and "[-0.40, +1.60]" in text
    for name in ("equity_pooled", "drawdowns", "positions", "equity"):
        assert (tmp_path / "run" / "plots" / f"{name}.png").stat().st_size > 10_000


def test_an_old_run_directory_without_oos_or_dates_still_builds(tmp_path):
    """Written before the pooled backtest: no oos.csv, undated fold curves named
    ``buy_hold_log_return``, ``extreme_moves`` flags: per-fold plots by test day, a note."""
    run = tmp_path / "old"
    summary = fabricate(run, pooled=False)
    for k in range(3):
        path = run / "folds" / f"fold_{k}.csv"
        lines = path.read_text().splitlines()
        head = lines[0].split(",")
        keep = [
            j for j, h in enumerate(head) if h in ("agent_log_return", "buy_and_hold_log_return")
        ]
        rows = [",".join(line.split(",")[j] for j in keep) for line in lines]
        path.write_text("\n".join(rows).replace("buy_and_hold_", "buy_hold_") + "\n")
    for row in summary["folds"]:
        for key in ("baselines", "breakeven_bps", "data_flags", "execution", "optimistic"):
            row.pop(key)
        row["extreme_moves"] = ["AAA 2019-03-04 +40%"]
    for key in ("data_warnings", "data_issues", "aggregate"):
        summary.pop(key)
    (run / "summary.json").write_text(json.dumps(summary))
    text = build_report(run).read_text()
    assert "no pooled out-of-sample result" in text
    assert "1 extreme move(s) in test window" in text
    figs, note = market_figures(run, summary)
    assert list(figs) == ["equity.png"] and "oos.csv" in note
    assert figs["equity.png"].axes[0].get_xlabel() == "test day"


def test_a_gymnasium_summary_builds_its_own_report(tmp_path):
    run = tmp_path / "gym"
    run.mkdir()
    row = {"fold": 0, "episodes": 10, "mean_return": 480.5, "std_return": 12.25,
           "min_return": 450.0, "max_return": 500.0, "steps": 2000, "nonfinite": 0}  # fmt: skip
    summary = {"env": "gym:CartPole-v1", "folds": [row], "halted": None, "stability": "off",
               "seed": 1, "seconds": 2.0, "eval": row}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.csv").write_text("step,fold,loss/total\n500,0,1.5\n1000,0,0.7\n")
    text = build_report(run).read_text()
    assert "Greedy evaluation" in text and "<td>480.5</td>" in text
    assert "Pooled" not in text and "fills:" not in text and "plots/losses.png" in text
    assert not (run / "plots" / "equity.png").exists()


def test_a_pool_of_workers_draws_the_same_report(tmp_path):
    """report_pool's workers (spawned processes) draw the plots side by side: the same files,
    byte for byte, and the same HTML as one process drawing them in turn."""
    import shutil

    from trimtab.rl.report.build import report_pool

    serial, pooled = tmp_path / "a" / "run", tmp_path / "b" / "run"
    fabricate(serial)
    shutil.copytree(serial, pooled)
    pool = report_pool(2)
    try:
        assert build_report(pooled, pool=pool).read_text() == build_report(serial).read_text()
    finally:
        pool.shutdown()
    names = sorted(p.name for p in (serial / "plots").iterdir())
    assert len(names) >= 4 and names == sorted(p.name for p in (pooled / "plots").iterdir())
    for name in names:
        assert (serial / "plots" / name).read_bytes() == (pooled / "plots" / name).read_bytes()


def test_a_broken_pool_leaves_the_plots_to_this_process(tmp_path):
    from concurrent.futures import Executor
    from concurrent.futures.process import BrokenProcessPool

    class Broken(Executor):
        def map(self, *args, **kwargs):
            raise BrokenProcessPool("a worker was killed")

    fabricate(tmp_path / "run")
    with pytest.warns(RuntimeWarning, match="plot workers failed .*a worker was killed"):
        text = build_report(tmp_path / "run", pool=Broken()).read_text()
    assert "plots/equity_pooled.png" in text and (tmp_path / "run/plots/equity.png").is_file()
