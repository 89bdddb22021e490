"""The batched CartPole's one-launch Triton step against its eager torch step (the reference),
env against env from the same seed under the same actions: every field of every step, the state,
the counters and the generator, through terminations, truncations and resets; with the same sin
and cos on both sides, bit for bit under the interpreter; on a GPU bit for bit as they are, with
no host synchronisation, and captured in a CUDA graph. Then the choice of implementation."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from _kernel_checks import assert_leaf, assert_runs_without_triton, compiled_ptx
from trimtab.kernels import cartpole as cartpole_kernel
from trimtab.rl.envs.cartpole import BatchedCartPole

FIELDS = ("obs", "reward", "terminated", "truncated", "final_obs", "episode_return")
EXACT = ("reward", "terminated", "truncated", "episode_return")
MAX_STEPS = 20  # short episodes: truncations within a few dozen steps


def _pair(n, dtype, device, max_episode_steps=MAX_STEPS, seed=3):
    """The reference env and the kernel env, same seed."""
    return tuple(BatchedCartPole(n, device, seed, dtype, max_episode_steps, impl=impl)
                 for impl in ("torch", "triton"))  # fmt: skip


def _numpy_sin_cos(monkeypatch):
    """torch's sin and cos replaced by numpy's, which the interpreter runs for ``tl.sin`` and
    ``tl.cos``: the only operations whose CPU implementations differ (by an ulp, now and then)."""
    for name in ("sin", "cos"):
        f = getattr(np, name)
        monkeypatch.setattr(torch, name, lambda t, f=f: torch.from_numpy(f(t.numpy())))


def _run(ref, ker, steps, rng, *, exact):
    """Step both envs under the same random actions; compare after every step. Returns how many
    episodes ended by falling and by the time limit alone. ``exact`` on CUDA in float32: each
    step within float32 rounding (1e-6 of the state's unit scale) of the reference's, from the
    reference's state (the kernel's float32 sin, cos and quotients round as torch's within an
    ulp, not bit for bit, and an ulp of a term shows in a sum that cancels; a falling pole
    would carry it into a visible difference over many steps)."""
    n, dtype = ref.n_envs, ref.dtype
    resync = exact and ref.device.type == "cuda" and dtype == torch.float32
    if exact:
        tol = {"rtol": 0, "atol": 0}
    elif dtype == torch.float64:
        # numpy's sin/cos and torch's CPU ones may differ in the last bit; the dynamics carry
        # that ulp through the episode (a few steps of Euler integration, no amplification)
        tol = {"rtol": 1e-12, "atol": 0}
    else:  # the same in float32, near zero as well (a state component crossing zero)
        tol = {"rtol": 1e-4, "atol": 1e-6}
    ends = np.zeros(2, dtype=int)
    for _ in range(steps):
        action = torch.as_tensor(rng.integers(0, 2, n), device=ref.device)
        want, got = ref.step(action), ker.step(action)
        for name in FIELDS:
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.shape == b.shape, name
            if name in EXACT:
                assert torch.equal(a, b), name
            elif resync:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
            else:
                torch.testing.assert_close(a, b, **tol, msg=lambda m, name=name: f"{name}: {m}")
        if resync:
            torch.testing.assert_close(ker.state, ref.state, rtol=1e-6, atol=1e-6)
            ker.state.copy_(ref.state)
        else:
            torch.testing.assert_close(ker.state, ref.state, **tol)
        assert torch.equal(ker.elapsed, ref.elapsed)
        assert torch.equal(ker.episode_return, ref.episode_return)
        assert torch.equal(ker.generator.get_state(), ref.generator.get_state())  # same draws
        ends += [int(want.terminated.sum()), int((want.truncated & ~want.terminated).sum())]
    return ends


@pytest.fixture
def small_blocks(monkeypatch):
    """Programs of 16 envs: 7 envs are one part-filled program, 33 are three."""
    monkeypatch.setattr(cartpole_kernel, "CARTPOLE_BLOCK", 16)


@pytest.mark.parametrize("n", [1, 7, 33])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernel_step_matches_the_torch_step(kernel_device, small_blocks, dtype, n):
    ref, ker = _pair(n, dtype, kernel_device)
    ends = _run(ref, ker, 60, np.random.default_rng(n), exact=kernel_device.type == "cuda")
    assert ends[0] >= 1 and ends[1] >= 1, ends  # poles fell, and episodes were cut at 20 steps


@pytest.mark.parametrize("n", [1, 7, 33])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernel_step_is_the_torch_step_bit_for_bit_given_the_same_sin_and_cos(
    kernel_device, small_blocks, monkeypatch, dtype, n
):
    """Every other operation is the reference's, rounded where it rounds, in its order."""
    if kernel_device.type == "cuda":
        pytest.skip("the interpreter's check; on a GPU the gpu tests compare bit for bit")
    _numpy_sin_cos(monkeypatch)
    ref, ker = _pair(n, dtype, kernel_device)
    ends = _run(ref, ker, 60, np.random.default_rng(n), exact=True)
    assert ends[0] >= 1 and ends[1] >= 1, ends


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_step_from_far_flung_states_is_the_torch_step_bit_for_bit(
    kernel_device, monkeypatch, dtype
):
    """Near the upright, the small terms' roundings vanish in the large ones (reassociating
    ``m l theta_dot^2 sin theta`` changes ~1 state in 10^5); from states up to 3 m, 10 m/s,
    1.6 rad and 30 rad/s away every operation's rounding shows in the step."""
    if kernel_device.type == "cuda":
        pytest.skip("the interpreter's check; on a GPU the gpu tests compare bit for bit")
    _numpy_sin_cos(monkeypatch)
    n = 4096
    ref, ker = _pair(n, dtype, kernel_device)
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([3.0, 10.0, 1.6, 30.0], dtype=dtype)
    for _ in range(3):
        saved = ref.state_dict()
        saved["state"] = (2 * torch.rand(n, 4, generator=g, dtype=dtype) - 1) * scale
        ref.load_state_dict(saved)
        ker.load_state_dict(saved)
        action = torch.randint(0, 2, (n,), generator=g)
        want, got = ref.step(action), ker.step(action)
        for name in FIELDS:
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert torch.equal(ker.state, ref.state)
        assert 0 < int(want.terminated.sum()) < n  # both sides of the thresholds


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_cuda_division_by_a_python_number_is_a_multiply_by_its_reciprocal(
    kernel_device, monkeypatch, dtype
):
    """The kernel's CUDA arithmetic (``/ TOTAL_MASS`` as torch's CUDA kernel computes it, a
    multiply by the host-rounded reciprocal) run on the CPU: within an ulp or two of the CPU's
    divisions, and the reciprocal is ``1 / 1.1`` rounded once in the state's dtype."""
    if kernel_device.type == "cuda":
        pytest.skip("on a GPU the gpu tests compare this path with torch's bit for bit")
    _numpy_sin_cos(monkeypatch)
    monkeypatch.setattr(cartpole_kernel, "torch_divides_by_reciprocal", lambda device: True)
    ref, ker = _pair(64, dtype, kernel_device, max_episode_steps=500)
    inv = ker._constants[cartpole_kernel.CONSTANTS.index("inv_total_mass")].item()
    assert inv == (1 / 1.1 if dtype == torch.float64 else np.float32(1) / np.float32(1.1))
    eps = torch.finfo(dtype).eps
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(3):  # one step from the same states (no drift carried between steps)
        ker.load_state_dict(ref.state_dict())
        action = torch.as_tensor(rng.integers(0, 2, 64))
        want, got = ref.step(action), ker.step(action)
        # the step adds tau * acceleration to the state: an ulp or two of the accelerations
        torch.testing.assert_close(ker.state, ref.state, rtol=4 * eps, atol=4 * eps)
        assert torch.equal(got.terminated, want.terminated)
        differ += int((ker.state != ref.state).sum())
    assert differ > 0  # the reciprocal path ran: it does not round as the divisions do


@pytest.mark.parametrize(
    "make_action",
    [
        lambda a: a.bool(),
        lambda a: a.int(),
        lambda a: a.double(),
        lambda a: a.double() * 0.5,  # 0.5 is not 1: left, as the reference reads it
        lambda a: torch.stack([a, 1 - a], dim=1)[:, 0],  # a strided view
        lambda a: a.reshape(-1, 1),  # [N, 1]
    ],
    ids=["bool", "int32", "float", "half-float", "strided", "column"],
)
def test_actions_of_any_dtype_and_stride_are_read_as_the_reference_reads_them(
    kernel_device, make_action
):
    ref, ker = _pair(9, torch.float64, kernel_device)
    rng = np.random.default_rng(4)
    for _ in range(5):
        action = make_action(torch.as_tensor(rng.integers(0, 2, 9), device=kernel_device))
        want, got = ref.step(action), ker.step(action)
        torch.testing.assert_close(got.final_obs, want.final_obs, rtol=1e-6, atol=0)
        torch.testing.assert_close(ker.state, ref.state, rtol=1e-12, atol=0)


def test_impl_none_keeps_the_reference_on_the_cpu():
    env = BatchedCartPole(3)
    assert env.impl is None and env._launch is None
    assert BatchedCartPole(3, impl="torch")._launch is None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"impl": "cuda"}, ValueError, r"impl must be None, 'torch' or 'triton', got 'cuda'"),
        ({"impl": "triton"}, RuntimeError, r"impl='triton' needs CUDA tensors.*TRITON_INTERPRET"),
    ],
)
def test_impl_errors(monkeypatch, kwargs, error, message):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a CPU env, and no interpreter to run it
    with pytest.raises(error, match=message):
        BatchedCartPole(2, device="cpu", **kwargs)


def test_the_kernel_is_a_leaf_imported_only_when_chosen():
    """The kernel module imports nothing of trimtab but its sibling leaves in ``trimtab.kernels``
    (design invariant 8); a CPU env, which runs the reference, never imports Triton (STYLE:
    Triton loads lazily, on first kernel use)."""
    assert_leaf(cartpole_kernel, {"__future__", "collections", "torch", "triton"})
    code = (
        "import torch\n"
        "from trimtab.rl.envs.cartpole import BatchedCartPole\n"
        "BatchedCartPole(3).step(torch.ones(3, dtype=torch.long))\n"
    )
    assert_runs_without_triton(code)


# The kernel compiled for an H100 (sm_90) with the launch's options, on this machine (no GPU
# needed): what the interpreter cannot show, how Triton lowers the arithmetic.
_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from trimtab.kernels import cartpole as ck

out = {}
for dt, options in (("fp64", ck.launch_options()), ("fp32", ck.launch_options()),
                    ("fp32-default", {"num_warps": 4})):
    f = dt[:4]
    sig = {"state": f"*{f}", "action": "*i64", "action_stride": "i32", "elapsed": "*i64",
           "episode_return": "*fp32", "u": f"*{f}", "c": f"*{f}", "obs": "*fp32",
           "final_obs": "*fp32", "reward": "*fp32", "terminated": "*i1", "truncated": "*i1",
           "ep_return": "*fp32", "n": "i32", "max_steps": "i32", "WRITE_OBS": "constexpr",
           "RECIPROCAL": "constexpr", "BLOCK": "constexpr"}
    src = ASTSource(ck._cartpole_step_kernel, sig,
                    constexprs={"WRITE_OBS": True, "RECIPROCAL": True, "BLOCK": 256})
    out[dt] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
json.dump(out, open(sys.argv[1], "w"))
"""


def test_the_compiled_kernel_rounds_as_torch_does(kernel_device, tmp_path):
    """No approximate sin, cos or division, no subnormal flushing, every float add, subtract
    and multiply rounded on its own (``.rn``: never contracted into an FMA); Triton's defaults
    (the control) would have all three."""
    if kernel_device.type == "cuda":
        pytest.skip("on a GPU the gpu tests compare the compiled kernel with torch bit for bit")
    pytest.importorskip("triton.backends.nvidia")
    ptx = compiled_ptx(_COMPILE, tmp_path)
    loose = re.compile(r"\b(?:add|sub|mul)\.f(?:32|64)\b|\.approx\.|div\.full|\.ftz")
    for dt in ("fp64", "fp32"):
        assert not loose.findall(ptx[dt]), (dt, sorted(set(loose.findall(ptx[dt]))))
        assert f"div.rn.f{dt[2:]}" in ptx[dt] and f"mul.rn.f{dt[2:]}" in ptx[dt]
    assert {"mul.f32", ".ftz"} <= set(loose.findall(ptx["fp32-default"]))


def test_pack_constants_wants_every_slot_but_the_derived_one():
    with pytest.raises(ValueError, match=r"need exactly .*'tau'"):
        cartpole_kernel.pack_constants({"gravity": 9.8}, torch.float64, torch.device("cpu"))


# --- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernel_step_is_the_eager_step_on_cuda(dtype):
    """float64 bit for bit; float32 within its rounding a step (``_run``)."""
    ref, ker = _pair(1031, dtype, torch.device("cuda"), max_episode_steps=40, seed=11)
    assert ker._launch is not None and BatchedCartPole(2, "cuda")._launch is not None  # impl=None
    ends = _run(ref, ker, 300, np.random.default_rng(1), exact=True)
    assert ends[0] >= 1000 and ends[1] >= 100, ends  # (measured on the CPU: ~13000 and ~1000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_captured_kernel_step_replays_the_eager_steps(dtype):
    from trimtab.rl.agent.graphed import CapturedStep

    eager, graphed = (BatchedCartPole(500, "cuda", 5, dtype, 40) for _ in range(2))

    def step(batch):
        return {k: v for k, v in graphed.step(batch["action"])._asdict().items() if v is not None}

    # the reset draws continue the env's generator: registered with the graph
    captured = CapturedStep(step, [graphed.generator], addresses=lambda: (), warmup=1)
    actions = torch.Generator(device="cuda").manual_seed(0)
    resets = 0
    for _ in range(120):
        action = torch.randint(0, 2, (500,), device="cuda", generator=actions)
        want, got = eager.step(action), captured({"action": action})
        for name in FIELDS:
            torch.testing.assert_close(got[name], getattr(want, name), rtol=0, atol=0)
        assert torch.equal(graphed.state, eager.state)
        resets += int((want.terminated | want.truncated).sum())
    assert captured.captures == 1 and captured.graph is not None
    assert resets >= 1000  # replays drew reset states (measured on the CPU: ~2650)
    assert torch.equal(graphed.generator.get_state(), eager.generator.get_state())
