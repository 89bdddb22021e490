"""Issue 27's config truth: every value that is NaN, out of range or unknown is refused in one
line by the dataclasses themselves, from Python and from the command line, before any run
directory exists."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from trimtab.cli import main
from trimtab.rl.config import TrainConfig
from trimtab.rl.configio import ConfigError, from_dict

#: (section, key, bad value as Python passes it, as the command line spells it, message pattern)
BAD = [
    ("run", "stability", "adaptve", "adaptve", r"run\.stability: must be one of"),
    ("run", "on_nonfinite", "explode", "explode", r"run\.on_nonfinite: must be one of"),
    ("run", "checkpoint_every", 0, "0", r"checkpoint_every"),
    ("agent", "lr", math.nan, "nan", r"agent\.lr: expected a finite number, got nan"),
    ("agent", "lr", -1.0, "-1", r"lr > 0"),
    ("agent", "kappa", math.nan, "nan", r"agent\.kappa: expected a finite number"),
    ("agent", "gamma", 2.0, "2.0", r"gamma=2\.0 must be a number in \[0, 1\]"),
    ("agent", "gamma", math.inf, "inf", r"agent\.gamma: expected a finite number"),
    ("agent", "hidden", 0, "0", r"hidden=0 < 1"),
    ("agent", "batch_size", math.nan, "nan", r"agent\.batch_size: expected an integer"),
    ("agent", "nope", 1, "1", r"unknown config key agent\.nope"),
    ("env", "n_envs", 0, "0", r"n_envs >= 1"),
    ("env", "reward_scale", math.inf, "inf", r"env\.reward_scale: expected a finite number"),
    ("env", "commission_bps", "cheap", "cheap", r"env\.commission_bps: expected a number"),
    ("walkforward", "folds", 0, "0", r"folds=0 must be >= 1"),
    ("data", "synthetic_days", -3, "-3", r"synthetic_days=-3 must be >= 100"),
    ("backtest", "bootstrap_draws", math.nan, "nan", r"backtest\.bootstrap_draws"),
    ("nosuch", "key", 1, "1", r"unknown config (key|section)"),
]
IDS = [f"{s}.{k}={c}" for s, k, _, c, _ in BAD]


def _one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1 and "Traceback" not in text


@pytest.mark.parametrize(("section", "key", "value", "cli", "pattern"), BAD, ids=IDS)
def test_python_refuses_a_bad_value_in_one_line(tmp_path, section, key, value, cli, pattern):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=pattern) as err:
        from_dict(TrainConfig, {"run": {"out": str(out)}, section: {key: value}})
    assert _one_line(str(err.value)), str(err.value)
    # the dataclass itself, built directly (dataclasses.replace runs its __init__)
    sub = getattr(TrainConfig(), section, None)
    if sub is not None and key in {f.name for f in dataclasses.fields(sub)}:
        with pytest.raises(ConfigError, match=pattern) as err:
            dataclasses.replace(sub, **{key: value})
        assert _one_line(str(err.value)), str(err.value)
    assert not out.exists()


@pytest.mark.parametrize(("section", "key", "value", "cli", "pattern"), BAD, ids=IDS)
def test_the_command_line_refuses_a_bad_value_in_one_line(
    tmp_path: Path, capsys, section, key, value, cli, pattern
):
    out = tmp_path / "run"
    code = main(["train", "--out", str(out), "--no-progress", "--set", f"{section}.{key}={cli}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("trimtab: error:") and _one_line(err), err
    assert pytest.importorskip("re").search(pattern, err), err
    assert not out.exists()


def test_a_bad_value_in_a_config_file_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text("[agent]\nlr = nan\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(toml), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "agent.lr: expected a finite number" in err and _one_line(err) and not out.exists()
