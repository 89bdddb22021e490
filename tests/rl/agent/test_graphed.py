"""The CUDA-graph settings and the host-read cadence, on the CPU: run.cuda_graph's refusals, the
learner's check every run.check_every steps, and a halt that no checkpoint outlives. (Captured
and eager runs are compared number for number in test_learner_gpu.py, on a GPU.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from rl_helpers import random_batch, tiny, wired_learner

from trimtab.rl.agent.learner import Learner, uses_cuda_graph
from trimtab.rl.config import RunConfig
from trimtab.rl.configio import ConfigError
from trimtab.rl.run import checkpoint as ckpt
from trimtab.rl.run.rundir import TrainingHalted
from trimtab.rl.train import train

BAD_RUN = [
    ({"cuda_graph": "on"}, r"cuda_graph='on' .* needs device='cuda'; on the CPU set"),
    (
        {"cuda_graph": "sometimes"},
        r"run.cuda_graph: must be one of \['auto', 'on', 'off'\], got 'sometimes'",
    ),
    ({"check_every": 0}, r"check_every=0 must be an integer >= 1"),
    ({"check_every": True}, r"run.check_every: expected an integer, got True"),
    ({"check_every": 2.5}, r"run.check_every: expected an integer, got 2.5"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_RUN)
def test_bad_graph_settings_are_refused_naming_the_key(fields, message):
    with pytest.raises(ValueError, match=r"invalid \[run\] config: " + message):
        RunConfig(**fields)


def test_on_is_refused_where_the_device_resolves_to_the_cpu():
    run = RunConfig(device="cuda", cuda_graph="on")
    with pytest.raises(ConfigError, match=r"run.cuda_graph = 'on' .* this run is on cpu"):
        uses_cuda_graph(run, torch.device("cpu"))
    assert uses_cuda_graph(run, torch.device("cuda"))
    assert uses_cuda_graph(RunConfig(device="cuda"), torch.device("cuda"))  # auto
    assert not uses_cuda_graph(RunConfig(device="cuda", cuda_graph="off"), torch.device("cuda"))
    assert not uses_cuda_graph(RunConfig(), torch.device("cpu"))


def test_the_cpu_learner_runs_eagerly_and_refuses_a_graph(tmp_path):
    learner = wired_learner(tiny(tmp_path))
    assert learner.graph is None  # auto on the CPU
    with pytest.raises(ValueError, match="needs the agent on a CUDA device"):
        Learner(learner.agent, learner.stability, learner.guard, cuda_graph=True)


def test_the_flag_is_read_every_check_every_steps_and_names_the_fire(tmp_path):
    """K = 3: the host reads the flag after updates 3, 6, 9 only; a NaN reward in the 5th batch
    (learn step 4 of the fold) is found at the read after update 6, which names step 4 and the
    one step that ran after it."""
    learner = wired_learner(tiny(tmp_path, on_nonfinite="halt", check_every=3))
    reads = []
    sentinel = learner.stability.sentinel
    real = sentinel.peek
    sentinel.peek = lambda: reads.append(learner.agent.num_updates) or real()
    found = {}
    for i in range(9):
        batch = random_batch()
        if i == 4:
            batch["reward"][3] = math.nan
        learner.learn(batch)
        message = learner.poll()
        if message is not None:
            found[learner.agent.num_updates] = message
    assert reads == [3, 6, 9]
    assert sorted(found) == [6, 9]
    assert "'replay.reward' fired first: nan in phase batch at learn step 4 of" in found[6]
    assert "1 learn step(s) ran after it" in found[6] and "4 learn step(s)" in found[9]


def test_the_cadence_follows_the_update_count_across_a_resume(tmp_path):
    """The count is the agent's (saved in checkpoints), so a resumed run reads on the same
    steps as an uninterrupted one."""
    learner = wired_learner(tiny(tmp_path, check_every=4))
    learner.agent.num_updates = 7
    learner.stability.sentinel.peek = lambda: True
    learner.halt_message = lambda: "fired"
    assert learner.poll() is None
    learner.agent.num_updates = 8
    assert learner.poll() == "fired"


def test_no_checkpoint_holds_a_step_after_the_fire(tmp_path):
    """A checkpoint after every step, the flag read only every 1000: the run still halts at the
    first checkpoint after the fire (learn step 5), which it does not write."""
    out = tmp_path / "run"
    cfg = tiny(out, on_nonfinite="halt", checkpoint_every=1, log_every=1000, check_every=1000)

    def poison(learner):
        learner.stability.checks.fault = ("replay.reward", 5, math.nan)

    with pytest.raises(TrainingHalted, match=r"'replay.reward' fired first: nan .* step 5 of"):
        train(cfg, setup=poison)
    saved = ckpt.load(Path(out) / "checkpoints" / "last.pt", fingerprint=None)
    assert saved["progress"]["global_step"] == 5  # steps 0-4; not the poisoned step 5
    weights = saved["agent"]["online"].values()
    assert all(bool(torch.isfinite(w).all()) for w in weights)


def test_a_capture_keeps_every_table_it_reads():
    """Tables built or found in the cache inside keep_host_copies() are handed to the graph's
    owner (an eviction from the LRU cache must not free what a captured graph reads); nested
    blocks pass theirs out; nothing is kept outside."""
    from trimtab.kernels import _table

    xs = [torch.zeros(3), torch.zeros(5)]
    with _table.keep_host_copies() as outer:
        with _table.keep_host_copies() as inner:
            built = _table.pointer_table(xs, 4)
        found = _table.pointer_table(xs, 4)
        array = _table.pointer_array(xs)
    assert found is built
    for t in (built.ptrs, built.numels, built.block_start, built.block_tensor, array):
        assert any(k is t for k in inner + outer) and any(k is t for k in outer)
    assert any(k is built.block_tensor for k in inner)
    _table.pointer_table(xs, 4)  # no capture: nothing collected anywhere
    assert _table._kept is None


def test_an_own_stream_goes_back_to_the_free_streams_with_its_owner(monkeypatch):
    """OwnStream's stream is one no live OwnStream holds; a collected one's is reused (a long
    sweep's trials make no new stream each); per device. The CUDA calls are stood in for."""
    import gc

    from trimtab.rl.agent import graphed

    made: list[object] = []
    device = [0]
    monkeypatch.setattr(graphed, "dedicated_stream", lambda: made.append(object()) or made[-1])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    monkeypatch.setattr(graphed, "_FREE", {})
    a, b = graphed.OwnStream(), graphed.OwnStream()
    sa, sb = a.stream, b.stream
    assert sa is not sb and a.stream is sa and len(made) == 2
    del a
    gc.collect()
    c = graphed.OwnStream()
    assert c.stream is sa and len(made) == 2  # reused, not made
    device[0] = 1
    d = graphed.OwnStream()
    assert d.stream is not sa and len(made) == 3  # another device's free streams are its own
    device[0] = 0
    e = graphed.OwnStream()  # b and c are alive: their streams are not free
    assert e.stream not in (sa, sb) and len(made) == 4
