"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    for code in blocks:
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)
    assert int(namespace["engaged"][0]) > 0  # the p99 clamp engaged on about 1% of 4096
