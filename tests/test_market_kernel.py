"""The batched market env's one-launch Triton step against its eager torch step (the reference),
env against env from the same seed, data and actions: every field of every step, the state
and the generator, through ruin, truncations and resets, with and without reward parts, cash
and borrow; with the same log1p on both sides, bit for bit under the interpreter; on a GPU
within float32 or float64 rounding, with no host synchronisation, and captured in a CUDA graph.
Then the choice of implementation, the kernel's imports and its compiled arithmetic."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from _kernel_checks import assert_leaf, assert_runs_without_triton, compiled_ptx
from trimtab.kernels import market as market_kernel
from trimtab.rl.backtest.execution import Costs, Fills
from trimtab.rl.envs.trading import BatchedTradingEnv, StepResult, evaluate

T, WINDOW = 40, 6  # days; short episodes: truncations and resets within a few steps
COSTS = {
    "carry": Costs(commission_bps=2.0, half_spread_bps=3.0, borrow_pct=0.5, cash_pct=2.0),
    "borrow": Costs(commission_bps=1.0, borrow_pct=3.0),  # no cash rate: its term is 0 * ...
    "turnover": Costs(commission_bps=10.0),  # no financing: the term is skipped
}
DISCRETE = ("obs", "final_obs", "terminated", "truncated")  # copies, levels and flags


def _tol(dtype):
    """A reward is about a dozen rounded operations and three log1p on values of magnitude 1 or
    less (the bad tick's ~1000/A enters only a log1p, whose slope 1 / (1 + x) shrinks its
    ulps); a log1p within a couple of ulp (the interpreter's ``log(u) x / (u - 1)`` against
    torch's CPU log1p; libdevice's against torch's on a GPU), sums over assets in another order
    on a GPU: a few ulp at unit scale, which 16 eps bounds with room."""
    eps = torch.finfo(dtype).eps
    return {"rtol": 16 * eps, "atol": 16 * eps}


def _market(n_assets, n_features, execution, seed=0):
    """Features and fills of ``T`` days: small returns, and every fifth day a bad tick (x1000
    for a day) on one asset, before the fill or after it: a short position through it is ruin."""
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((T, n_assets, n_features))
    pre, post = 0.02 * rng.standard_normal((T, n_assets)), 0.01 * rng.standard_normal((T, n_assets))
    pre[0] = post[0] = 0.0
    for k, day in enumerate(range(4, T, 5)):
        (pre if k % 2 else post)[day, day % n_assets] = math.log(1000.0)
    if execution == "same_close":
        return feats, Fills.same_close(pre + post)
    if execution == "next_close":
        return feats, Fills(pre + post, np.zeros_like(pre), execution)
    return feats, Fills(pre, post, execution)


def _pair(n, n_assets, n_features, dtype, device, *, parts=True, costs="carry",
          execution="next_open", levels=(-1.0, 0.0, 1.0), seed=3):  # fmt: skip
    """The reference env and the kernel env, same seed, same data."""
    feats, fills = _market(n_assets, n_features, execution)
    return tuple(
        BatchedTradingEnv(feats, fills, n, WINDOW, levels, COSTS[costs], device, seed, dtype,
                          reward_parts=parts, impl=impl)
        for impl in ("torch", "triton")
    )  # fmt: skip


def _compare(want: StepResult, got: StepResult, tol) -> None:
    for name in StepResult._fields:
        a, b = getattr(got, name), getattr(want, name)
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, name
        if name in DISCRETE:
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, **tol, msg=lambda m, name=name: f"{name}: {m}")


def _run(ref, ker, steps, rng, tol, *, no_sync=False):
    """Step both envs under the same random actions (negative indices among them, as torch
    reads them); compare after every step. The kernel's episode return is set to the
    reference's after each step (an ulp a step would add up over an episode). Returns how many
    episodes ended in ruin and by the window alone."""
    n, n_levels = ref.n_envs, len(ref.levels)
    ends = np.zeros(2, dtype=int)
    for _ in range(steps):
        action = torch.as_tensor(rng.integers(-n_levels, n_levels, (n, ref.n_assets)),
                                 device=ref.device)  # fmt: skip
        want = ref.step(action)
        if no_sync:  # the kernel's step alone: the comparisons read the device
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = ker.step(action)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        else:
            got = ker.step(action)
        _compare(want, got, tol)
        for name in ("position", "t", "start"):
            assert torch.equal(getattr(ker, name), getattr(ref, name)), name
        torch.testing.assert_close(ker.episode_return, ref.episode_return, **tol)
        ker.episode_return.copy_(ref.episode_return)
        assert torch.equal(ker.generator.get_state(), ref.generator.get_state())  # same draws
        ends += [int(want.terminated.sum()), int(want.truncated.sum())]
    return ends


@pytest.fixture
def small_blocks(monkeypatch):
    """Programs of 8 envs: 5 envs are one part-filled program, 17 are three; feature columns
    copied 16 at a time: 35 are three passes, the last part-filled."""
    monkeypatch.setattr(market_kernel, "MARKET_BLOCK", 8)
    monkeypatch.setattr(market_kernel, "FEATURE_CHUNK", 16)


CASES = [  # n, assets, features, dtype, parts, costs, execution
    (1, 1, 2, torch.float64, False, "carry", "next_open"),
    (1, 3, 4, torch.float32, True, "carry", "next_open"),
    (5, 3, 3, torch.float32, True, "borrow", "same_close"),
    (5, 3, 2, torch.float64, False, "turnover", "next_close"),
    (17, 3, 4, torch.float64, True, "carry", "same_close"),
    (17, 1, 3, torch.float32, True, "turnover", "next_open"),
    (5, 5, 7, torch.float64, True, "carry", "next_open"),  # 35 feature columns: two chunks
]


@pytest.mark.parametrize(("n", "n_assets", "n_features", "dtype", "parts", "costs", "execution"),
                         CASES)  # fmt: skip
def test_kernel_step_matches_the_torch_step(
    kernel_device, small_blocks, n, n_assets, n_features, dtype, parts, costs, execution
):
    ref, ker = _pair(n, n_assets, n_features, dtype, kernel_device, parts=parts, costs=costs,
                     execution=execution)  # fmt: skip
    assert ker._launch is not None and ref._launch is None
    ends = _run(ref, ker, 24, np.random.default_rng(n + n_assets), _tol(dtype))
    assert ends[0] >= 1 and ends[1] >= 1, ends  # ruined, and cut at the window's end


def _numpy_log1p(monkeypatch):
    """torch's log1p replaced by the interpreter's (``log(u) x / (u - 1)``, numpy's log and
    division): the only operation whose implementations differ (by an ulp or two)."""

    def log1p(t):
        x = t.numpy()
        u = 1 + x
        exact = u == 1
        d = np.where(exact, np.ones_like(x), u - 1)
        return torch.from_numpy(np.where(exact, x, np.log(u) * (x / d)))

    monkeypatch.setattr(torch, "log1p", log1p)


@pytest.mark.parametrize(
    ("n_assets", "dtype", "execution"),
    [(3, torch.float32, "next_open"), (3, torch.float64, "same_close"),
     (1, torch.float32, "next_close")],
)  # fmt: skip
def test_kernel_step_is_the_torch_step_bit_for_bit_given_the_same_log1p(
    kernel_device, small_blocks, monkeypatch, n_assets, dtype, execution
):
    """Every other operation is the reference's, rounded where it rounds, in its order (torch's
    CPU sum over up to 4 assets adds them in order, from 0, as the kernel does)."""
    if kernel_device.type == "cuda":
        pytest.skip("the interpreter's check; on a GPU the gpu tests compare within rounding")
    _numpy_log1p(monkeypatch)
    ref, ker = _pair(9, n_assets, 3, dtype, kernel_device, execution=execution)
    ends = _run(ref, ker, 16, np.random.default_rng(1), {"rtol": 0, "atol": 0})
    assert ends[0] >= 1 and ends[1] >= 1, ends


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_cuda_division_by_a_python_number_is_a_multiply_by_its_reciprocal(
    kernel_device, monkeypatch, dtype
):
    """The kernel's CUDA arithmetic (``level / A`` as torch's CUDA kernel computes it, a multiply
    by the host-rounded reciprocal) run on the CPU: within an ulp of the CPU's divisions, and
    the reciprocal is ``1 / 3`` rounded once in the env's dtype. Levels that are not powers of
    two, so that the two roundings differ."""
    if kernel_device.type == "cuda":
        pytest.skip("on a GPU the gpu tests compare this path with torch's")
    _numpy_log1p(monkeypatch)
    monkeypatch.setattr(market_kernel, "torch_divides_by_reciprocal", lambda device: True)
    levels = (-1.0, -0.32, 0.0, 0.32, 1.0)  # 0.32 / 3 and 0.32 * (1 / 3) round apart
    ref, ker = _pair(64, 3, 2, dtype, kernel_device, levels=levels)
    inv = ker._tables.constants[market_kernel.CONSTANTS.index("inv_n_assets")].item()
    assert inv == (1 / 3 if dtype == torch.float64 else np.float32(1) / np.float32(3))
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(3):
        action = torch.as_tensor(rng.integers(0, len(levels), (64, 3)))
        want, got = ref.step(action), ker.step(action)
        _compare(want, got, _tol(dtype))
        differ += int((got.parts != want.parts).sum() + (got.reward != want.reward).sum())
        ker.episode_return.copy_(ref.episode_return)
    assert differ > 0  # the reciprocal path ran: it does not round as the divisions do


@pytest.mark.parametrize(
    "make_action",
    [
        lambda a: a.int(),
        lambda a: a.T.contiguous().T,  # column-major
        lambda a: torch.stack([a, 2 - a], dim=-1)[..., 0],  # strided rows
        lambda a: a - 3,  # negative indices, from the end
    ],
    ids=["int32", "column-major", "strided", "negative"],
)
def test_actions_of_any_integer_dtype_and_strides_are_read_as_the_reference_reads_them(
    kernel_device, make_action
):
    ref, ker = _pair(4, 3, 2, torch.float64, kernel_device)
    rng = np.random.default_rng(4)
    for _ in range(3):
        action = make_action(torch.as_tensor(rng.integers(0, 3, (4, 3)), device=kernel_device))
        _compare(ref.step(action), ker.step(action), _tol(torch.float64))
        ker.episode_return.copy_(ref.episode_return)


def test_the_greedy_evaluation_runs_the_kernel_as_the_reference(kernel_device, monkeypatch):
    """``evaluate``'s one float64 env with the kernel (forced here; ``impl=None`` chooses it on
    CUDA): the same weights and ruin day as the reference's, returns within float64 rounding."""
    from trimtab.rl.envs import trading

    feats, fills = _market(3, 2, "next_open")
    actions = np.random.default_rng(2).integers(0, 3, (T - 1, 3))
    want = evaluate(feats, fills, actions, costs=COSTS["carry"])
    monkeypatch.setattr(trading, "resolve_impl", lambda impl, tensors, **kw: "triton")
    got = evaluate(feats, fills, actions, costs=COSTS["carry"], device=kernel_device)
    assert got.ruin == want.ruin is not None
    np.testing.assert_array_equal(got.weights, want.weights)
    np.testing.assert_allclose(got.log_returns, want.log_returns, **_tol(torch.float64))


@pytest.mark.parametrize(
    ("action", "error", "message"),
    [
        (torch.zeros(2, 3), TypeError, r"need an int64 or int32 tensor of shape \(2, 3\), got "
         r"torch.float32 \(pass action.long\(\)\)"),
        (torch.zeros(2, 3, dtype=torch.uint8), TypeError, "int64 or int32"),
        (torch.zeros(3, 2, dtype=torch.long), ValueError, r"shape \(2, 3\).*got \(3, 2\)"),
        (torch.zeros(6, dtype=torch.long), ValueError, r"shape \(2, 3\).*got \(6,\)"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("kernel", [False, True])
def test_a_wrong_action_is_refused_on_either_path(kernel_device, kernel, action, error, message):
    """The kernel would read a transposed or flat action of as many elements as a scrambled one;
    the reference reads a uint8 tensor as a mask: both refuse, before anything is written."""
    ref, ker = _pair(2, 3, 2, torch.float64, kernel_device)
    env = ker if kernel else ref
    before = env.state_dict()
    with pytest.raises(error, match=message):
        env.step(action.to(env.device))
    after = env.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in ("t", "position", "episode_return"))


def test_an_action_out_of_range_is_a_nan_position_on_the_kernel_path(kernel_device):
    """The reference refuses an index out of ``[-L, L)`` (an IndexError, or a device assert on
    CUDA); the kernel cannot without a sync: the level is NaN, so are that env's position,
    reward and observation (what the sentinel's env checks name); the other envs step as
    the reference does, and a negative index in range counts from the end."""
    ref, ker = _pair(3, 2, 2, torch.float64, kernel_device)
    action = torch.tensor([[0, 2], [7, 1], [-1, -3]], device=ker.device)
    if ref.device.type == "cpu":  # on CUDA the reference's refusal is a device assert, which
        with pytest.raises(IndexError):  # would end the process's CUDA context
            ref.step(action)
    ref2, _ = _pair(3, 2, 2, torch.float64, kernel_device)
    want = ref2.step(torch.tensor([[0, 2], [0, 1], [2, 0]], device=ker.device))
    got = ker.step(action)
    assert got.reward[1].isnan() and ker.position[1, 0].isnan() and got.final_obs[1, -2].isnan()
    assert not ker.position[1, 1].isnan()
    for i in (0, 2):
        torch.testing.assert_close(got.reward[i], want.reward[i], rtol=1e-12, atol=0)
        torch.testing.assert_close(ker.position[i], ref2.position[i], rtol=0, atol=0)


def test_impl_none_keeps_the_reference_on_the_cpu():
    feats, fills = _market(1, 2, "next_open")
    env = BatchedTradingEnv(feats, fills, 3, WINDOW)
    assert env.impl is None and env._launch is None


@pytest.mark.parametrize(
    ("kwargs", "interpret", "error", "message"),
    [
        ({"impl": "cuda"}, "0", ValueError, r"impl must be None, 'torch' or 'triton', got 'cuda'"),
        ({"impl": "triton"}, "0", RuntimeError, r"impl='triton' needs CUDA tensors.*INTERPRET"),
        ({"impl": "triton", "dtype": torch.float16}, "1", ValueError,
         r"impl='triton': the market step's kernel computes in float32 or float64, not "
         r"torch.float16"),
    ],
)  # fmt: skip
def test_impl_errors(monkeypatch, kwargs, interpret, error, message):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)  # "0": no interpreter to run a CPU env
    feats, fills = _market(1, 2, "next_open")
    with pytest.raises(error, match=message):
        BatchedTradingEnv(feats, fills, 2, WINDOW, device="cpu", **kwargs)


def test_the_kernel_is_a_leaf_imported_only_when_chosen():
    """The kernel module imports nothing of trimtab but its sibling leaves in ``trimtab.kernels``
    (design invariant 8); a CPU env, which runs the reference, never imports Triton (STYLE:
    Triton loads lazily, on first kernel use)."""
    assert_leaf(market_kernel, {"__future__", "collections", "os", "typing", "torch", "triton"})
    code = (
        "import torch\n"
        "from trimtab.rl.envs.trading import BatchedTradingEnv\n"
        "env = BatchedTradingEnv(torch.randn(9, 2, 1), torch.zeros(9, 2), 3, 4)\n"
        "env.step(torch.ones(3, 2, dtype=torch.long))\n"
    )
    assert_runs_without_triton(code)


# The kernel compiled for an H100 (sm_90) with the launch's options, on this machine (no GPU
# needed): what the interpreter cannot show, how Triton lowers the arithmetic.
_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from trimtab.kernels import market as mk

out = {}
for dt, options in (("fp64", mk.launch_options()), ("fp32", mk.launch_options()),
                    ("fp32-default", {"num_warps": 4})):
    f = dt[:4]
    sig = {"action": "*i64", "act_s0": "i32", "act_s1": "i32", "levels": f"*{f}",
           "n_levels": "i32", "features": f"*{f}", "pre": f"*{f}", "post": f"*{f}",
           "c": f"*{f}", "position": f"*{f}", "t": "*i64", "start": "*i64",
           "episode_return": f"*{f}", "fresh": "*i64", "obs": f"*{f}", "final_obs": f"*{f}",
           "reward": f"*{f}", "terminated": "*i1", "truncated": "*i1", "ep_return": f"*{f}",
           "parts": f"*{f}", "n": "i32", "window_len": "i32"}
    flags = {"A": 3, "AF": 12, "CHUNK": 16, "PARTS": True, "CARRY": True, "OVERNIGHT_OLD": True,
             "RECIPROCAL": True, "LIBDEVICE": True, "BLOCK": 128}
    sig.update(dict.fromkeys(flags, "constexpr"))
    src = ASTSource(mk._market_step_kernel, sig, constexprs=flags)
    out[dt] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
json.dump(out, open(sys.argv[1], "w"))
"""


def test_the_compiled_kernel_rounds_as_torch_does(kernel_device, tmp_path):
    """Every float add, subtract and multiply rounded on its own (``.rn``: never contracted into
    an FMA), no approximate division or log, no subnormal flushing, and log1p libdevice's
    (whose own float64 code seeds a Newton step with ``rcp.approx.ftz.f64``: the only
    approximate or flushing instruction allowed); Triton's defaults (the control) would
    contract and flush."""
    if kernel_device.type == "cuda":
        pytest.skip("on a GPU the gpu tests compare the compiled kernel with torch")
    pytest.importorskip("triton.backends.nvidia")
    ptx = compiled_ptx(_COMPILE, tmp_path)
    loose = re.compile(r"\b(?:add|sub|mul)\.f(?:32|64)\b|\b\w+\.approx\.[\w.]+|div\.full|\.ftz")
    allowed = {"fp64": {"rcp.approx.ftz.f64", ".ftz"}, "fp32": set()}
    for dt, libdevice in (("fp64", "__nv_log1p."), ("fp32", "__nv_log1pf.")):
        assert set(loose.findall(ptx[dt])) <= allowed[dt], (dt, set(loose.findall(ptx[dt])))
        assert f"mul.rn.f{dt[2:]}" in ptx[dt] and f"sub.rn.f{dt[2:]}" in ptx[dt]
        assert libdevice in ptx[dt] and "lg2.approx" not in ptx[dt]
    assert {"mul.f32", ".ftz"} <= set(loose.findall(ptx["fp32-default"]))


def test_pack_constants_wants_every_slot_but_the_derived_one():
    with pytest.raises(ValueError, match=r"need exactly .*'per_turnover'"):
        market_kernel.pack_constants({"floor": -1.0}, torch.float64, torch.device("cpu"))


# --- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("costs", "execution"), [("carry", "next_open"), ("turnover", "same_close")]
)
def test_kernel_step_is_the_eager_step_on_cuda(dtype, costs, execution):
    """Within float32 or float64 rounding (``_tol``) every step, with no host sync; positions,
    days, flags and observations the same."""
    ref, ker = _pair(1031, 3, 4, dtype, torch.device("cuda"), costs=costs, execution=execution,
                     seed=11)  # fmt: skip
    feats, fills = _market(3, 4, execution)
    # impl=None (the default) picks the kernel on CUDA
    assert BatchedTradingEnv(feats, fills, 2, WINDOW, device="cuda")._launch is not None
    ker.step(torch.zeros(1031, 3, dtype=torch.long, device="cuda"))  # compiles the kernel
    ker.load_state_dict(ref.state_dict())
    ends = _run(ref, ker, 300, np.random.default_rng(1), _tol(dtype), no_sync=True)
    assert ends[0] >= 10000 and ends[1] >= 20000, ends  # (measured on the CPU: ~22000, ~38000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_captured_kernel_step_replays_the_eager_steps(dtype):
    from trimtab.rl.agent.graphed import CapturedStep

    feats, fills = _market(3, 4, "next_open")
    eager, graphed = (BatchedTradingEnv(feats, fills, 500, WINDOW, costs=COSTS["carry"],
                                        device="cuda", seed=5, dtype=dtype, reward_parts=True)
                      for _ in range(2))  # fmt: skip
    assert eager._launch is not None and graphed._launch is not None

    def step(batch):
        return {k: v for k, v in graphed.step(batch["action"])._asdict().items() if v is not None}

    # the autoreset's draws continue the env's generator: registered with the graph
    captured = CapturedStep(step, [graphed.generator], addresses=lambda: (), warmup=1)
    actions = torch.Generator(device="cuda").manual_seed(0)
    resets = 0
    for _ in range(60):
        action = torch.randint(0, 3, (500, 3), device="cuda", generator=actions)
        want, got = eager.step(action), captured({"action": action})
        for name, value in got.items():
            assert torch.equal(value, getattr(want, name)), name
        for name in ("position", "t", "start", "episode_return"):
            assert torch.equal(getattr(graphed, name), getattr(eager, name)), name
        resets += int((want.terminated | want.truncated).sum())
    assert captured.captures == 1 and captured.graph is not None
    assert resets >= 4000  # replays reset envs (measured on the CPU: ~5700)
    assert torch.equal(graphed.generator.get_state(), eager.generator.get_state())


@pytest.mark.gpu
@pytest.mark.parametrize("capture", [False, True])
def test_the_greedy_evaluation_on_cuda_is_the_cpu_one(capture):
    """``evaluate`` (one float64 env, captured or not) runs the kernel on CUDA: the same days,
    weights and ruin as on the CPU, returns within float64 rounding."""
    feats, fills = _market(3, 2, "next_open")
    actions = np.random.default_rng(2).integers(0, 3, (T - 1, 3))
    cpu = evaluate(feats, fills, actions, costs=COSTS["carry"])
    gpu = evaluate(feats, fills, actions, costs=COSTS["carry"], device="cuda", capture=capture)
    assert gpu.ruin == cpu.ruin is not None
    np.testing.assert_array_equal(gpu.weights, cpu.weights)
    np.testing.assert_allclose(gpu.log_returns, cpu.log_returns, rtol=1e-14, atol=1e-14)
