"""``trimtab config``: every key of the config, read from the dataclasses, with a meaning; and
``--help`` shows defaults."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trimtab.cli import main
from trimtab.rl.config import DEVICE_PROFILES, TrainConfig
from trimtab.rl.config_reference import field_comments, format_reference, reference


def _all_keys() -> set[str]:
    cfg = TrainConfig()
    return {f"{s.name}.{f.name}" for s in dataclasses.fields(cfg)
            for f in dataclasses.fields(getattr(cfg, s.name))}  # fmt: skip


def test_every_key_is_listed_once_with_a_meaning():
    entries = reference()
    keys = [e["key"] for e in entries]
    assert len(keys) == len(set(keys)) and set(keys) == _all_keys()
    assert [k for k, e in zip(keys, entries) if len(e["meaning"]) < 12] == []
    by = {e["key"]: e for e in entries}
    assert by["run.stability"]["allowed"] == ["adaptive", "fixed", "off"]
    assert by["agent.lr"]["type"] == "float" and by["agent.lr"]["default"] == 1e-3
    assert by["agent.batch_size"]["default"] == "auto"
    assert by["agent.batch_size"]["device_default"] == DEVICE_PROFILES["cpu"]["agent.batch_size"]


def test_the_device_profile_is_resolved_for_the_device_asked():
    # the reference is the default run's, the market, which keeps the CPU profile on CUDA
    cuda = {e["key"]: e for e in reference("cuda")}
    assert cuda["env.n_envs"]["device_default"] == DEVICE_PROFILES["cpu"]["env.n_envs"]
    assert cuda["agent.batch_size"]["device_default"] == DEVICE_PROFILES["cpu"]["agent.batch_size"]
    assert cuda["run.device"]["device_default"] == "cuda"


def test_comments_above_and_beside_a_field_are_joined():
    @dataclasses.dataclass
    class Example:
        # the first line
        # and the second
        a: int = 1  # beside it
        b: str = "x#y"  # a hash in a string is no comment

    assert field_comments(Example) == {
        "a": "the first line and the second beside it",
        "b": "a hash in a string is no comment",
    }


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_trimtab_config_prints_it(fmt, capsys):
    assert main(["config", "--format", fmt, "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert {e["key"] for e in json.loads(out)} == _all_keys()
    elif fmt == "markdown":
        assert "| `agent.lr` | float | `0.001` | `0.001` |" in out and "## `[gym]`" in out
    else:
        assert (
            "[walkforward]" in out
            and '  n_envs = 16    # int | "auto"; default "auto", resolved on cuda' in out
        )
    assert out == format_reference(reference("cuda"), fmt, "cuda")


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(config run.device; default cpu)" in out
    assert "(config walkforward.steps_per_fold; default 2500)" in out
    assert "trimtab config" in out
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "(default: cpu)" in " ".join(capsys.readouterr().out.split())


def test_gamma_auto_shows_the_value_a_market_run_resolves():
    by = {e["key"]: e for e in reference()}
    assert by["agent.gamma"]["default"] == "auto" and by["agent.gamma"]["device_default"] == 0.0
