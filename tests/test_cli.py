from __future__ import annotations

import subprocess
import sys

from trimtab.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 0
    assert "info" in capsys.readouterr().out


def test_info_prints_versions(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("trimtab ") and "torch" in out


def test_console_script_entry_runs():
    out = subprocess.run(
        [sys.executable, "-m", "trimtab.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "usage: trimtab" in out.stdout


def test_import_does_not_import_triton():
    code = "import sys, trimtab; trimtab.StateVector; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_python_dash_m_runs_the_same_command_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "trimtab", "info"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("trimtab "), out.stderr


def test_a_missing_trainer_dependency_is_one_line(tmp_path):
    """The library installs without the trainer's dependencies; a trainer command then says
    which extra to install (here tomli_w is made unimportable in a fresh interpreter)."""
    code = (
        "import sys; sys.modules['tomli_w'] = None\n"
        "from trimtab.cli import main\n"
        f"sys.exit(main(['train', '--out', {str(tmp_path / 'run')!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    err = proc.stderr.strip()
    assert proc.returncode == 2, err
    assert "needs the trainer's dependencies (tomli_w is not installed)" in err, err
    assert "pip install 'trimtab[train]'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_building_the_parser_imports_no_torch():
    """`trimtab --version`, `--help` and a typo answer at once: the parser, its help defaults
    included, is built without importing torch or the config."""
    code = (
        "import sys\n"
        "from trimtab.cli import build_parser\n"
        "build_parser()\n"
        "assert 'torch' not in sys.modules and 'trimtab.rl.config' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith(('torch', 'trimtab')))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
