"""The deflated Sharpe ratio (Bailey & López de Prado 2014): the expected best Sharpe of N null
trials and the DSR match values worked by hand from the equations and the paper's own example,
and the DSR of a fixed best Sharpe falls as the trials it was picked from grow in number."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from trimtab.rl.backtest.selection import deflated_sharpe, expected_max_sharpe, per_bar


def _trials_with_variance(best: float, n: int, var: float) -> list[float]:
    """``n`` Sharpe ratios (``n`` even) of sample variance ``var`` whose largest is ``best``:
    ``best``, ``c = best - d`` and (n - 2) / 2 pairs ``c ± d``; their variance is
    d^2 (1/n + (n - 2)/(n - 1))."""
    d = math.sqrt(var / (1 / n + (n - 2) / (n - 1)))
    trials = [best, best - d] + [best, best - 2 * d] * ((n - 2) // 2)
    assert len(trials) == n and max(trials) == best
    assert math.isclose(statistics.variance(trials), var, rel_tol=1e-9)
    return trials


def test_expected_max_sharpe_by_hand():
    # N = 10, V = 0.04: Z^-1(1 - 1/10) = 1.2815516, Z^-1(1 - 1/(10 e)) = 1.7892418, so
    # sqrt(V) ((1 - g) 1.2815516 + g 1.7892418) = 0.2 (0.5418188 + 1.0327795) = 0.3149197
    assert expected_max_sharpe(10, 0.04) == pytest.approx(0.3149197, abs=1e-6)
    # N = 2, V = 1: Z^-1(1/2) = 0, so it is g Z^-1(1 - 1/(2 e)) = 0.5772157 * 0.9004526
    assert expected_max_sharpe(2, 1.0) == pytest.approx(0.5197553, abs=1e-6)
    assert expected_max_sharpe(1, 0.04) == 0.0  # one trial: nothing selected
    assert expected_max_sharpe(50, 0.0) == 0.0  # trials that do not differ: no luck to pick


def test_deflated_sharpe_by_hand_and_the_papers_example():
    # one trial (SR_0 = 0), SR = 0.1 per bar over T = 101 bars, normal returns:
    # Z(0.1 sqrt(100) / sqrt(1 - 0 + (3 - 1)/4 * 0.01)) = Z(1 / sqrt(1.005)) = Z(0.9975093)
    assert deflated_sharpe(0.1, [0.1], 101) == pytest.approx(0.8407413, abs=1e-6)
    assert deflated_sharpe(0.1, [0.1], 101, None, None) == deflated_sharpe(0.1, [0.1], 101)
    # the paper's numerical example (section 4): N = 100 trials of annualised variance 1/2,
    # best annualised SR 2.5, T = 1250 daily bars (250 a year), skew -3, kurtosis 10:
    # SR_0 = 0.1132 per bar and DSR = 0.9004
    ppy, best = 250, per_bar(2.5, 250)
    trials = _trials_with_variance(best, 100, 0.5 / ppy)
    assert expected_max_sharpe(100, 0.5 / ppy) == pytest.approx(0.1132, abs=5e-5)
    assert deflated_sharpe(best, trials, 1250, -3.0, 10.0) == pytest.approx(0.9004, abs=5e-5)
    # negative skew and fat tails make the same Sharpe less convincing
    assert deflated_sharpe(best, trials, 1250) > deflated_sharpe(best, trials, 1250, -3.0, 10.0)
    assert per_bar(math.sqrt(252.0), 252.0) == pytest.approx(1.0)


def test_dsr_falls_as_the_trials_grow_with_the_best_fixed():
    best, var = per_bar(1.5, 252), 0.5 / 252
    counts = [2, 4, 10, 30, 100, 1000]
    sr0 = [expected_max_sharpe(n, var) for n in counts]
    dsr = [deflated_sharpe(best, _trials_with_variance(best, n, var), 756) for n in counts]
    assert all(a < b for a, b in itertools.pairwise(sr0)), sr0
    assert all(a > b for a, b in itertools.pairwise(dsr)), dsr
    assert dsr[0] > 0.9 and dsr[-1] < 0.5  # from convincing to luck, the same Sharpe


BAD = [
    (lambda: expected_max_sharpe(0, 1.0), r"n_trials=0 must be an integer >= 1"),
    (lambda: expected_max_sharpe(2.0, 1.0), r"n_trials=2\.0 must be an integer"),
    (lambda: expected_max_sharpe(3, -1.0), r"var_sharpe=-1\.0 must be finite and >= 0"),
    (lambda: expected_max_sharpe(3, math.nan), r"var_sharpe=nan must be finite"),
    (lambda: deflated_sharpe(0.1, [], 100), r"needs the Sharpe ratios of the trials"),
    (lambda: deflated_sharpe(0.1, [0.1], 1), r"n_obs=1 must be an integer >= 2"),
    (lambda: deflated_sharpe(0.1, [0.1, math.inf], 100), r"must be finite"),
]


@pytest.mark.parametrize(("call", "pattern"), BAD)
def test_bad_inputs_raise(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()
