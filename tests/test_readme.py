"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    spaces = []
    for code in blocks:
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)
        spaces.append(namespace)
    guard = spaces[0]["guard"]
    assert guard.steps == 20 and bool(spaces[0]["applied"])
    bounds = namespace["bounds"]
    assert bounds.values.isfinite().all()  # the layer measured the activation, fold set the slot
    assert float(namespace["policy"].found_inf) == 0.0
