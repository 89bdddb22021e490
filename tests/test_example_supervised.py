from __future__ import annotations

import importlib.util
import math
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "supervised.py"


def test_supervised_example_runs_a_few_steps():
    spec = importlib.util.spec_from_file_location("supervised_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    first = mod.main(steps=1)
    loss = mod.main(steps=40)
    assert math.isfinite(loss) and loss < first
