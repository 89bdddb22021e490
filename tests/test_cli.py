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
