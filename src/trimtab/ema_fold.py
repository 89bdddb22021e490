"""The adaptive EMA's update as PyTorch operators: the CPU path (through TorchScript), the
reference of the CUDA kernels (:mod:`trimtab.kernels.ema`) and the layout of the state it updates.
"""

from __future__ import annotations

import torch

from trimtab.kernels.ema_layout import (
    AGREE_FRACTION,
    EMA_BANK,
    LEAD_TOL,
    META_RATE,
    NOISE_RATE,
    NOISY_RUN,
    OUTLIER_Z,
    QUIET_STEPS,
    R_FLOOR_LOG,
    SHIFT_RUN,
    TINY,
)
from trimtab.kernels.ema_layout import clipped_second_moment as _clipped_second_moment
from trimtab.kernels.ema_layout import t_threshold as _t_threshold

__all__ = ["BANK_STATE", "RUN_STATE", "SLOT_STATE", "fold_reference"]

# Per slot, and per slot and candidate (level, slope, the covariance of both over R, log weight).
SLOT_STATE = ("mean", "r", "prev_obs", "prev_z", "alpha")
RUN_STATE = ("run_n", "run_sum", "run_d2", "quiet")  # the shift detector's run
BANK_STATE = EMA_BANK


def fold_reference(
    s: dict[str, torch.Tensor],
    rows_state: torch.Tensor,
    bank_state: torch.Tensor,
    q_level: torch.Tensor,
    q_slope: torch.Tensor,
    obs: torch.Tensor,
    mask: torch.Tensor | None,
    log: bool,
    # the module's constants as defaults: TorchScript reads no global number
    noise_rate: float = NOISE_RATE,
    outlier_z: float = OUTLIER_Z,
    r_floor_log: float = R_FLOOR_LOG,
    tiny: float = TINY,
    agree_fraction: float = AGREE_FRACTION,
    quiet_steps: int = QUIET_STEPS,
    shift_run: int = SHIFT_RUN,
    noisy_run: int = NOISY_RUN,
    meta_rate: float = META_RATE,
    lead_tol: float = LEAD_TOL,
) -> torch.Tensor:
    """One update of :class:`trimtab.estimate.AdaptiveEMA` on the estimator's state ``s``
    (whose per-slot fields are the rows of ``rows_state``, its bank fields those of
    ``bank_state``), in place; returns the estimate."""
    dtype = rows_state.dtype
    # No branch on values anywhere below: every case is a torch.where, so nothing syncs.
    y = obs.to(dtype)
    finite = torch.isfinite(y)
    chosen = torch.ones_like(finite) if mask is None else mask
    take = chosen & finite
    s["nonfinite_count"].add_((chosen & ~finite).to(torch.int64))
    count = s["count"] + take.to(torch.int64)
    first = take & (count == 1)
    y = torch.where(take, y, s["prev_obs"].nan_to_num(0.0))  # keep NaN/Inf out of the maths

    # Differences seen so far (including this one) and R's meta-rate: 1/n, then NOISE_RATE.
    n = (count - 1).clamp(min=1).to(dtype)
    b = torch.clamp(1.0 / n, min=noise_rate)
    dof = torch.clamp(n - 1.0, min=1.0, max=(2.0 - noise_rate) / noise_rate)
    c = _t_threshold(outlier_z, dof)
    kappa = _clipped_second_moment(c)

    # Noise variance R from first differences (var Δy = 2R + Q ≈ 2R), winsorized at c.
    d2 = (y - s["prev_obs"]).square()
    r_old = s["r"]
    has_r = torch.isfinite(r_old)
    d2c = torch.where(has_r, torch.minimum(d2, c * c * 2.0 * r_old) / kappa, d2)
    r_new = torch.where(has_r, r_old + b * (0.5 * d2c - r_old), 0.5 * d2)
    floor = r_floor_log if log else tiny  # update_log: a magnitude's resolution
    r_use = torch.where(has_r, r_old, r_new).clamp(min=floor)[:, None]

    # Every candidate predicts (state and covariance over R, F = [[1, 1], [0, 1]]).
    level, slope, score = s["level"], s["slope"], s["score"]
    a_ll = s["p_ll"] + 2.0 * s["p_ls"] + s["p_ss"] + q_level
    a_ls = s["p_ls"] + s["p_ss"]
    a_ss = s["p_ss"] + q_slope
    pred = level + slope
    s_norm = a_ll + 1.0  # innovation variance over R
    sd = (s_norm * r_use).sqrt()
    cc = c[:, None]
    v = (y[:, None] - pred).clamp(-cc * sd, cc * sd)  # winsorized innovation

    # The mixture's innovation, standardized, tests for a level shift.
    w = torch.softmax(score, 1)
    pred_mix = (w * pred).sum(1)
    var_mix = (w * (s_norm * r_use + (pred - pred_mix[:, None]).square())).sum(1)
    z = (y - pred_mix) / var_mix.sqrt()
    prev_z = s["prev_z"]
    # A run: consecutive exceedances of one sign, each agreeing with the one before (they
    # differ by no more than the c √(2R) two noisy observations of one level do, or by less
    # than AGREE_FRACTION of their distance from the prediction: a level that moved with its
    # noise, as a magnitude's does). SHIFT_RUN of them are a shift that began SHIFT_RUN - 1
    # steps ago; NOISY_RUN if the run began within QUIET_STEPS of an exceedance that was not
    # a shift (rising or heavy-tailed noise, where a few one-signed values are common). A lone
    # exceedance is an outlier. A test on y, not on z, which also differs by the prediction's
    # move between the two, a move that grows with the shift.
    exceed = z.abs() > c
    both = exceed & (prev_z.abs() > c)
    r_ref = torch.where(has_r, r_old, r_new)
    agree = d2 <= c * c * 2.0 * r_ref
    apart = torch.minimum((y - pred_mix).abs(), (s["prev_obs"] - pred_mix).abs())
    near = d2 <= (agree_fraction * apart).square() if not log else torch.zeros_like(exceed)
    link = both & (z * prev_z > 0) & (agree | near)
    run_n = torch.where(link, s["run_n"] + 1.0, exceed.to(dtype))
    run_sum = torch.where(link, s["run_sum"], 0.0) + torch.where(exceed, y, 0.0)
    # the noise of a run whose values disagree by R's measure: R rises with its level
    run_d2 = torch.where(link, s["run_d2"] + torch.where(agree, 0.0, 0.5 * d2), 0.0)
    # Quiet steps before the run (counted up to QUIET_STEPS); an exceedance that ends
    # without a shift (an outlier, a broken run) starts the count again.
    ended = (s["run_n"] > 0.0) & ~link
    calm = ((s["run_n"] == 0.0) & ~exceed).to(dtype)
    quiet = torch.where(ended, (~exceed).to(dtype), s["quiet"] + calm)
    quiet = quiet.clamp(max=quiet_steps)
    need = torch.where(quiet >= quiet_steps, float(shift_run), float(noisy_run))
    shift = run_n >= need
    # One agreeing exceedance short of a shift, the two hypotheses are about even: the
    # reported level is their midpoint (the state is unchanged), which halves a true shift's
    # last step of lag and costs a false one a quarter of its squared offset, once.
    pending = (run_n >= 2.0) & (run_n == need - 1.0)
    # Two exceedances that do not link (opposite signs, or far apart) are a rise of the noise
    # (a level does not move both ways): R jumps to their half squared difference (over c² R),
    # as a shift restarts the level; at a shift whose values disagreed, R jumps to the noise
    # among them.
    rise = both & (z * prev_z < 0 if log else ~link) & has_r
    r_new = torch.where(rise, torch.maximum(r_new, 0.5 * d2), r_new)
    r_run = run_d2 / (run_n - 1.0).clamp(min=1.0)
    r_new = torch.where(shift, torch.maximum(r_new, r_run), r_new)

    # Kalman update of every candidate (P = P⁻ - k kᵀ S, written without cancellation).
    k_l, k_s = a_ll / s_norm, a_ls / s_norm
    level_new, slope_new = pred + k_l * v, slope + k_s * v
    p_ss_new = a_ss - k_s * a_ls
    # Discounted squared prediction error: the tracking error plus R, whatever the model.
    score_new = (1.0 - meta_rate) * score - 0.5 * v.square() / r_use
    # Keep the best candidate at log weight 0, so the scores stay bounded in float32, and
    # share META_RATE of the weight out evenly (fixed share, Herbster & Warmuth 1998): no
    # candidate falls below log(META_RATE / K), so the weights can switch within a few steps.
    sc = score_new - score_new.max(1, keepdim=True)[0]
    sc = ((1.0 - meta_rate) * sc.exp() + meta_rate / sc.shape[1]).log()
    # A shift restarts every candidate but the leaders (within LEAD_TOL of the best) from the
    # run's observations of the new level; the leaders keep the old level at the least
    # weight, so a false shift (noise values that look like one level, as a rise of the noise
    # or heavy tails give) is undone as soon as the restarted candidates err. The first
    # observation restarts every candidate and replaces the estimate. The other scores
    # survive a shift, not a first observation.
    # Leaders by the scores before this observation: those of the regime the run left, and
    # not a tie decided by how this step's errors round.
    lead = shift[:, None] & (score >= score.max(1, keepdim=True)[0] - lead_tol)
    restart = torch.where(first, 1.0, 1.0 / run_n.clamp(min=1.0))[:, None]
    anew = (shift | first)[:, None] & ~lead
    start = torch.where(first, y, run_sum / run_n.clamp(min=1.0))[:, None]
    zero = torch.zeros_like(pred)
    # the bank's fields but the score, in BANK_STATE's order, and the values they restart at
    updated = torch.stack([level_new, slope_new, k_l, k_s, p_ss_new])
    restarted = torch.stack([start.expand_as(pred), zero, restart.expand_as(pred), zero, zero])
    bank = torch.where(anew, restarted, updated)
    sc = torch.where(lead, sc.min(1, keepdim=True)[0], sc)
    sc = torch.where(first[:, None], zero, sc)
    bank = torch.cat([bank, sc[None]])  # the whole bank, one row per field
    bank_state.copy_(torch.where(take[:, None], bank, bank_state))

    # Weighted about the first candidate, so candidates that agree (after a first observation
    # or a shift) give their common value exactly, not to within the rounding of Σ w = 1.
    w = torch.softmax(s["score"], 1)
    anchor = s["level"][:, :1]
    done = first | shift  # a shift uses up its run
    mix = anchor[:, 0] + (w * (s["level"] - anchor)).sum(1)
    # the per-slot fields, in the rows' order (SLOT_STATE, RUN_STATE)
    rows = torch.stack(
        [
            torch.where(pending, 0.5 * (mix + run_sum / run_n.clamp(min=1.0)), mix),  # mean
            torch.where(first, r_old, r_new),  # r
            y,  # prev_obs
            torch.where(done, 0.0, z),  # prev_z
            torch.where(done, 1.0, (w * k_l).sum(1)),  # alpha
            torch.where(done, 0.0, run_n),
            torch.where(done, 0.0, run_sum),
            torch.where(done, 0.0, run_d2),
            torch.where(done, float(quiet_steps), quiet),
        ]
    )
    rows_state.copy_(torch.where(take, rows, rows_state))
    s["count"].copy_(count)
    return s["mean"]
