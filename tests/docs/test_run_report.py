"""A run's report.html in a browser: its plots load, its sections come in a trader's order, and
the data warnings of one's own data stand out before any figure."""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_helpers import broken_local_links, keep, save_shot, train_run


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The embedded market: every baseline, the oracle among them; no data warnings."""
    return train_run(tmp_path_factory.mktemp("run") / "run", "--set", "data.synthetic_days=400")


def test_report_in_a_browser(report, browser, tmp_path):
    shot = save_shot(tmp_path, "report")
    page = browser.open(report.as_uri(), shot, max_height=16000)
    keep(shot)
    assert not page["errors"], page["errors"]
    assert not page["failed"], page["failed"]
    assert not page["broken"], page["broken"]
    assert page["images"] >= 4, "the report shows its plots"
    assert not broken_local_links(page, report.parent)
    html = report.read_text()
    # a trader's order: the verdict and the data warnings, the pooled backtest beside the
    # baselines, its dated plots, the folds, then the training diagnostics
    order = ["best simple baseline", "Data", "Pooled out of sample", "Out-of-sample plots",
             "Out-of-sample results per fold", "Training diagnostics"]  # fmt: skip
    at = [html.find(h) for h in order]
    assert all(i >= 0 for i in at) and at == sorted(at), dict(zip(order, at))


def test_report_with_data_warnings_in_a_browser(report_warned, browser, tmp_path):
    """The warnings stand out before any figure, each said once, and flag what they touch."""
    shot = save_shot(tmp_path, "report-data-warnings")
    page = browser.open(report_warned.as_uri(), shot, max_height=16000)
    keep(shot)
    assert not page["errors"] and not page["failed"] and not page["broken"], page
    html = report_warned.read_text()
    box = html.split("<div class=warn>")[1].split("</div>")[0]
    for kind in ("gap", "alignment", "split"):
        assert f"<td>{kind}</td>" in box, kind
    assert box.count("20 business days missing") == 1, "a warning said twice"
    assert "Read the data warnings first" in html
    at = [html.find(h) for h in ("class=verdict", "Data warnings", "Pooled out of sample")]
    assert all(i >= 0 for i in at) and at == sorted(at), at


def test_training_plots_name_the_window_each_fold_trained_on():
    import numpy as np

    from trimtab.rl.report.plots import _train_windows, figure

    ax = figure().subplots()
    step, fold = np.arange(1.0, 7.0), np.array([0.0, 0, 0, 1, 1, 1])
    folds = [{"fold": 0, "train_start": "2010-02-03", "train_end": "2010-07-23"},
             {"fold": 1, "train_start": "2010-07-29", "train_end": "2011-01-17"}]  # fmt: skip
    _train_windows(ax, step, fold, folds)
    assert [t.get_text() for t in ax.texts] == [
        " fold 0: trained on 2010-02-03 … 2010-07-23",
        " fold 1: trained on 2010-07-29 … 2011-01-17",
    ]
    assert [t.get_position()[0] for t in ax.texts] == [1.0, 4.0]
