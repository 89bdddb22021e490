"""The guides' code runs as written: the Python examples of the docs, and every ``trimtab``
command of the README and the docs, parsed, its config built, and run where it takes seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_helpers import ROOT

DOCS = sorted((ROOT / "docs").rglob("*.md"))


def _blocks(lang: str) -> list[tuple[Path, str]]:
    import re

    out = []
    for path in DOCS:
        for code in re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S):
            out.append((path, code))
    return out


def test_docs_python_examples_run():
    blocks = _blocks("python")
    assert blocks
    for path, code in blocks:
        exec(compile(code, str(path), "exec"), {})


def _commands() -> list[tuple[Path, list[str]]]:
    import shlex

    out = []
    for path, code in _blocks("bash") + [(ROOT / "README.md", c) for c in _readme_bash()]:
        for line in code.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("torchrun "):
                line = "trimtab " + line.split(" -m trimtab ", 1)[1]
            if line.startswith("trimtab "):
                out.append((path, shlex.split(line)[1:]))
    return out


def _readme_bash() -> list[str]:
    import re

    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_every_trimtab_command_in_the_docs_parses_and_its_config_builds():
    """Each ``trimtab ...`` line of the README and the docs is accepted by the command line's
    parser, and each ``train`` line's config (its --set keys and values) builds."""
    from trimtab.cli import build_parser
    from trimtab.rl.run.cli import build_config

    commands = _commands()
    assert len(commands) > 15
    parser = build_parser()
    for path, argv in commands:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{path.name}: trimtab {' '.join(argv)}: refused by the parser")
        if argv[0] == "train" and not args.resume and not args.seeds:
            if args.config and not (ROOT / args.config).exists():
                continue
            cwd = os.getcwd()
            os.chdir(ROOT)
            try:
                build_config(args)
            except Exception as e:
                pytest.fail(f"{path.name}: trimtab {' '.join(argv)}: {e}")
            finally:
                os.chdir(cwd)


def test_short_commands_run_as_written(tmp_path):
    """The docs' commands that take seconds run as written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for argv in (
        ["config"],
        ["config", "--format", "json"],
        ["info"],
        ["sweep", "--out", str(tmp_path / "s"), "--grid", "run.stability=adaptive,off",
         "--seeds", "0", "1", "--dry-run"],
    ):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "trimtab", *argv], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, (argv, proc.stderr[-2000:])
        assert proc.stdout.strip(), argv


@pytest.mark.slow
def test_run_directory_commands_run_as_written(report_warned, tmp_path):
    """The guides' ``trimtab report RUN_DIR`` and ``trimtab eval RUN_DIR --data ...`` lines,
    on a finished run, with its directory and data folder put in for the placeholders; and the
    docs page's ``python docs/gen_pages.py --out ...``."""
    run = report_warned.parent
    prices = run.parent / "prices"
    swap = {"runs/RUN_DIR": str(run), "other_prices/": str(prices), "prices/": str(prices)}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    ran = set()
    for path, argv in _commands():
        if argv[0] not in ("eval", "report") or "--resume" in argv:
            continue
        argv = [swap.get(a, a) for a in argv]
        proc = subprocess.run([sys.executable, "-m", "trimtab", *argv], capture_output=True,
                              text=True, env=env, timeout=300)  # fmt: skip
        assert proc.returncode == 0, (path.name, argv, proc.stderr[-2000:])
        ran.add(argv[0])
    assert ran == {"eval", "report"}
    line = next(ln for _, code in _blocks("bash") for ln in code.splitlines()
                if ln.startswith("python docs/gen_pages.py"))  # fmt: skip
    argv = line.split("#")[0].split()[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "pages")
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "pages/reference/config.md").is_file()
    assert (tmp_path / "pages/results/trading.md").is_file()
