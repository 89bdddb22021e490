"""The run report's own parts: reading a run's CSV files without pandas."""

from __future__ import annotations

import math

import numpy as np

from trimtab.rl.report import _read_csv


def test_read_csv_reads_numbers_empty_cells_and_non_finite_values(tmp_path):
    """The metrics log's cells as MetricsLog writes them: numbers, "" for None, nan and inf;
    a column holding another value comes back as strings; an empty file as no columns."""
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss/c51,bound/x,note\n500,1.5,,a\n1000,nan,inf,b\n1500,-2e-3,-inf,\n")
    cols = _read_csv(path)
    assert list(cols) == ["step", "loss/c51", "bound/x", "note"]
    assert cols["step"].dtype == np.float64 and cols["step"].tolist() == [500.0, 1000.0, 1500.0]
    loss = cols["loss/c51"]
    assert loss[0] == 1.5 and math.isnan(loss[1]) and loss[2] == -2e-3
    bound = cols["bound/x"]
    assert math.isnan(bound[0]) and bound[1] == math.inf and bound[2] == -math.inf
    assert cols["note"].tolist() == ["a", "b", ""]
    (tmp_path / "empty.csv").write_text("")
    assert _read_csv(tmp_path / "empty.csv") == {}
