"""Every verdict rule passes on a planted input that satisfies its claim, fails on one that violates it, and says
"outside the theorem's regime" on one outside the regime it assumes."""

from __future__ import annotations

import numpy as np
import pytest

from ntkcli import rules
from ntkcli.claims import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, OUTSIDE, REPRODUCED

RATES = np.geomspace(1e-5, 1e-1, 512)  # a kernel's spectrum: the loss of gradient flow is a sum of exponentials


def steps(T: float, count: int = 60) -> np.ndarray:
    return np.unique(np.r_[0, np.geomspace(1, T, count).round()])


def sum_of_exponentials(t: np.ndarray, floor: float = 0.1) -> np.ndarray:
    return floor + np.exp(-np.outer(t, RATES)).mean(1)


# --- decay_to_floor: the time law ------------------------------------------------------------------------------

def judged(t, curves, conditions=()):
    return rules.decay_to_floor(t, curves, n_boot=100).verdict(float(np.max(t)), list(conditions))


def test_an_exponential_decay_to_a_floor_is_reproduced():
    t = steps(6000)
    rng = np.random.default_rng(0)
    curves = (0.1 + 2 * np.exp(-3e-3 * t)) * np.exp(rng.normal(0, 0.01, (3, len(t))))
    test = rules.decay_to_floor(t, curves, n_boot=100)
    assert test.verdict(6000) == REPRODUCED
    assert test.floor_lower <= test.floor <= test.floor_upper and abs(test.floor - 0.1) < 0.01
    assert abs(test.rates[0] - 3e-3) / 3e-3 < 0.15 and 0.8 < test.ratio < 1.2


def test_a_decay_that_speeds_up_is_not_an_exponential():
    """Rate 2.5e-3 until the excess is e^−1 of its start, then 1e-2: no positive sum of exponentials speeds up."""
    t = np.linspace(0, 6000, 200)
    excess = np.where(t < 400, np.exp(-2.5e-3 * t), np.exp(-1 - 1e-2 * (t - 400)))
    test = rules.decay_to_floor(t, 0.1 + 2 * excess)
    assert test.ratio > rules.RATE_BAND[1] and judged(t, 0.1 + 2 * excess) == NOT_REPRODUCED


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_a_power_law_is_not_an_exponential(alpha):
    t = steps(1e6)
    test = rules.decay_to_floor(t, 0.1 + (1 + t / 10) ** -alpha)
    assert test.ratio < rules.RATE_BAND[0] and judged(t, 0.1 + (1 + t / 10) ** -alpha) == NOT_REPRODUCED


def test_a_risk_that_rises_after_its_minimum_leaves_its_floor():
    """The committed full run's shape: down to a minimum, then up by 18% of the drop in every seed."""
    t = np.linspace(0, 1e4, 300)
    rise = 0.18 * np.clip(np.log1p(t / 500) / np.log1p(20), 0, 1)
    curves = np.array([1 + 2 * np.exp(-t / 100) + 2 * rise * k for k in (0.95, 1.0, 1.05)])
    test = rules.decay_to_floor(t, curves)
    assert test.left_floor() and test.rise > 0.1
    assert judged(t, curves) == NOT_REPRODUCED


def test_a_rise_within_the_seeds_noise_is_no_rise():
    t = np.linspace(0, 1e4, 300)
    rng = np.random.default_rng(1)
    curves = (1 + 2 * np.exp(-t / 100)) * np.exp(rng.normal(0, 0.003, (3, len(t))))
    assert not rules.decay_to_floor(t, curves).left_floor()


def test_a_curve_still_falling_at_T_is_outside_not_refuted():
    t = steps(400)
    verdict = judged(t, sum_of_exponentials(t))
    assert verdict.startswith(OUTSIDE) and "flattened" in verdict


def test_the_sweeps_unmet_conditions_are_named_before_the_rule():
    t = np.linspace(0, 6000, 100)
    unmet = rules.Condition("ε = ξ/N", False, "ε = 1 for every N")
    verdict = judged(t, 0.1 + 2 * np.exp(-3e-3 * t), [unmet])
    assert verdict.startswith(OUTSIDE) and "ε = ξ/N: ε = 1 for every N" in verdict


# --- kernel_convergence: paper 2 Thm 5.5 ------------------------------------------------------------------------

@pytest.mark.parametrize("loss_ratio, late, predicted, steps_, drift, expected", [
    (1e-8, 0.011, 0.010, 3000, 0.02, REPRODUCED),  # converges at the kernel's rate
    (0.4, 1e-5, 0.010, 3000, 0.02, NOT_REPRODUCED),  # stalls at a floor the bound forbids
    (1e-8, 0.05, 0.010, 3000, 0.02, INCONCLUSIVE),  # converges, but 5× faster than the kernel says
    (0.2, 1e-4, 1e-4, 3000, 0.02, OUTSIDE),  # T·rate = 0.3: too short for the kernel's own rate
    (1e-8, 0.011, 0.010, 3000, 0.6, OUTSIDE),  # the kernel moved: not the kernel regime
])
def test_kernel_convergence(loss_ratio, late, predicted, steps_, drift, expected):
    assert rules.kernel_convergence(loss_ratio, late, predicted, steps_, drift).startswith(expected)


@pytest.mark.parametrize("verdicts, expected", [
    ([REPRODUCED, REPRODUCED], REPRODUCED), ([REPRODUCED, NOT_REPRODUCED], NOT_REPRODUCED),
    ([REPRODUCED, f"{OUTSIDE} (x)"], REPRODUCED), ([f"{OUTSIDE} (x)"], OUTSIDE),
    ([REPRODUCED, INCONCLUSIVE], INCONCLUSIVE), ([], NOT_RUN)])
def test_all_of(verdicts, expected):
    assert rules.all_of(verdicts) == expected


# --- exponents and intervals: data law, frontier, breakpoint ----------------------------------------------------

@pytest.mark.parametrize("lower, upper, expected", [
    (0.8, 1.3, REPRODUCED),  # α ≥ 1 within the interval
    (0.3, 0.7, NOT_REPRODUCED),  # the risk falls slower than the bound's 1/N
    (-0.2, 1.5, NOT_REPRODUCED),  # no decay excluded
    (np.nan, np.nan, INCONCLUSIVE)])
def test_an_exponent_bounded_below(lower, upper, expected):
    assert rules.interval(lower, upper, at_least=1.0) == expected


@pytest.mark.parametrize("lower, upper, expected", [(0.7, 1.4, REPRODUCED), (0.2, 0.4, NOT_REPRODUCED),
                                                    (1.5, 3.0, NOT_REPRODUCED)])
def test_an_interval_covers_the_theorys_value(lower, upper, expected):
    assert rules.covers(lower, upper, 1.0) == expected


# --- model law -------------------------------------------------------------------------------------------------

def test_the_model_law_needs_the_theorems_exponent_and_no_rise():
    m = np.array([128, 512, 4096, 32768])
    falling = 3 * m ** -0.3
    assert rules.model_law(0.2, 0.4, falling, 0.01 * falling, zeta=0.25) == REPRODUCED
    assert rules.model_law(0.01, 0.05, falling, 0.01 * falling, zeta=0.25) == NOT_REPRODUCED  # M^−0.02: a sign only
    rising = falling.copy()
    rising[2] = falling[1] * 1.3  # depth 2 of the old sweep: 0.62 → 0.70 from M = 1152 to 4224
    assert rules.rises(rising, 0.01 * rising)
    assert rules.model_law(0.2, 0.4, rising, 0.01 * rising, zeta=0.25) == NOT_REPRODUCED
    assert not rules.rises(rising, 0.5 * rising)  # a rise inside the seeds' noise is no rise
    assert rules.model_law(-0.1, 0.2, falling, 0.01 * falling, zeta=0.25) == NOT_REPRODUCED


# --- Figure 1 --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("growth, relative, null, expected", [
    (37, 0.13, 0.9, REPRODUCED),
    (37, 0.89, 0.9, NOT_REPRODUCED),  # grows like the paper's, but is no better than the input alone
    (37, 0.99, 1.0, NOT_REPRODUCED),
    (1e4, 0.13, 0.9, NOT_REPRODUCED)])
def test_figure1_growth_beside_the_null(growth, relative, null, expected):
    assert rules.growth(growth, relative, null) == expected


def test_figure1_beats_the_null_at_every_large_m():
    m = 2.0 ** np.arange(1, 19)
    null = np.minimum(1.0, m / 2 ** 8)
    assert rules.beats_null(m, 0.1 * null, null) == REPRODUCED
    worse = 0.1 * null
    worse[-1] = 0.8 * null[-1]
    assert rules.beats_null(m, worse, null) == NOT_REPRODUCED
    assert rules.beats_null(m[:5], 0.1 * null[:5], null[:5]) == NOT_RUN  # no m ≥ 2^10


def test_figure1_premise_reads_the_largest_logit_against_ln_m():
    m = 2.0 ** 18  # ln m = 12.48
    assert rules.bounded_logits(7.3, m).met  # W std 0.125, measured
    assert not rules.bounded_logits(526.0, m).met  # W std 1: the premise fails
    assert not rules.bounded_logits(12.5, m).met and rules.bounded_logits(12.4, m).met
    failed = rules.judge([rules.bounded_logits(526.0, m)], lambda: REPRODUCED)
    assert failed.startswith(OUTSIDE) and "526 > ln m = 12.5" in failed


def test_approx_error_measures_the_largest_logit_the_test_queries_meet():
    """Second path: the naive full logit matrix of the test queries against the inputs' and the first m prefix keys."""
    import math
    import torch
    from ntkcli.experiments import approx_error as ae
    from ntkcli.runs import seed_for

    cfg = ae.ApproxErrorRecipe(d=8, seq_len=4, max_log2m=6, n_test=2, n_train=2, chunk=5, dtype="float64")
    dr = ae._draw(cfg, 0.5, seed_for(0, 0.5, 0), 64, "cpu", torch.float64)
    got = {ex.m: ex.largest_logit for ex in ae._text_protocol(cfg, dr, [2, 16, 64], infinity=True)}
    q = dr.x[:2] @ dr.w_q
    for m in (2, 16, 64):
        keys = torch.cat([dr.x[:2] @ dr.w_k, (dr.prefix[:m] @ dr.w_k).expand(2, m, 8)], dim=1)
        naive = (q @ keys.transpose(1, 2)).abs().max().item() * cfg.scale
        assert got[m] == pytest.approx(naive, rel=1e-12)
    assert got[2] <= got[16] <= got[64] and math.isinf(got[math.inf])


# --- paper 1 Thm 3.10 ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("loss_ratio, ratios, slope, expected", [
    (1e-6, [1.1, 0.9], (-0.7, -0.4), REPRODUCED),
    (1e-6, [1.1, 0.9], (-0.3, -0.1), NOT_REPRODUCED),  # drift falls slower than m^(−1/2)
    (1e-6, [3.0, 0.9], (-0.7, -0.4), NOT_REPRODUCED),  # rate far from the kernel's
    (0.1, [1.1, 0.9], (-0.7, -0.4), NOT_REPRODUCED),  # did not converge
    (1e-6, [1.1, 0.9], (np.nan, np.nan), INCONCLUSIVE)])  # one seed: no interval
def test_prefix_convergence(loss_ratio, ratios, slope, expected):
    assert rules.prefix_convergence(loss_ratio, ratios, *slope) == expected


def test_the_ratio_interval_covers_a_planted_ratio_about_95_percent_of_the_time():
    """Paired replicates whose true ratio of means is 40: the bootstrap interval covers 40 in 88–99% of 200 draws of
    20 replicates (a percentile bootstrap runs a little narrow at n = 20), and one replicate has no interval."""
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(200):
        bottom = rng.lognormal(0, 0.5, 20)
        top = 40 * bottom * rng.lognormal(0, 0.3, 20) / np.exp(0.3**2 / 2)  # E[top] = 40·E[bottom]
        _, lower, upper = rules.ratio_interval(top, bottom, n_boot=500, seed=int(rng.integers(1 << 30)))
        covered += lower <= 40 <= upper
    assert 0.88 <= covered / 200 <= 0.99, covered
    assert np.isnan(rules.ratio_interval([4.0], [2.0])[1]) and rules.ratio_interval([4.0], [2.0])[0] == 2


def test_the_mean_interval_is_students_t():
    mean, lower, upper = rules.mean_interval([-0.5, -0.4, -0.6])
    assert mean == pytest.approx(-0.5) and lower == pytest.approx(-0.5 - 4.303 * 0.1 / np.sqrt(3), rel=1e-3)
    assert np.isnan(rules.mean_interval([-0.5])[1])


# --- ntk compress (Eq. (4) on a real model) ---------------------------------------------------------------------

def compress_summary(gain: tuple[float, float, float], growth: float, vs_cache: tuple[float, float, float]):
    """A planted summary.csv of ntk compress: one map beside none and an exact cache of its bytes at m = 16 … 4096,
    its error ∝ m^growth, its paired cosine difference against that cache `vs_cache`."""
    import pandas as pd

    from ntkcli.experiments import compress

    ms = [16, 256, 4096]
    common = {"depth": 0.0, "budget_of": "", "cache_tokens": 0}
    rows = [{"m": m, "method": "favor-64", "cache": "", "error_mean": 0.1 * (m / 16) ** growth, "gain_mean": gain[0],
             "gain_low": gain[1], "gain_high": gain[2], "hit_mean": 0.5, "cosine_mean": 0.8, "vs_cache":
             "strided@favor-64", "vs_cache_cosine_mean": vs_cache[0], "vs_cache_cosine_low": vs_cache[1],
             "vs_cache_cosine_high": vs_cache[2], "vs_cache_hit_mean": 0.0, "vs_cache_hit_low": -0.1,
             "vs_cache_hit_high": 0.1, **common} for m in ms]
    rows += [{"m": m, "method": "strided@favor-64", "cache": "strided", "error_mean": 0.5, "gain_mean": 0.1,
              "gain_low": 0.0, "gain_high": 0.2, "hit_mean": 0.4, "cosine_mean": 0.7, **common,
              "budget_of": "favor-64", "cache_tokens": 33} for m in ms]
    rows += [{"m": m, "method": compress.NONE, "cache": "", "error_mean": 1.0, "gain_mean": 0.0, "gain_low": 0.0,
              "gain_high": 0.0, "hit_mean": 0.1, "cosine_mean": 0.5, **common} for m in ms]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("gain, growth, vs_cache, expected", [
    ((0.3, 0.2, 0.4), 0.1, (0.05, 0.02, 0.08), (REPRODUCED, REPRODUCED, REPRODUCED)),
    ((-0.3, -0.4, -0.2), 0.1, (-0.03, -0.05, -0.01), ("refuted at this scale", REPRODUCED, "refuted at this scale")),
    ((0.01, -0.1, 0.1), 0.1, (0.0, -0.02, 0.02), (INCONCLUSIVE, REPRODUCED, INCONCLUSIVE)),
    ((0.3, 0.2, 0.4), 1.0, (0.05, 0.02, 0.08), (REPRODUCED, "refuted at this scale", REPRODUCED))])
def test_the_compress_claims_pass_and_fail_on_planted_summaries(gain, growth, vs_cache, expected):
    """Worse than no context at all, an error that grows like m itself, a map that loses to an exact cache of its
    bytes: each fails its claim; the cache claim is judged on the paired interval alone."""
    from ntkcli.experiments import compress

    got = tuple(c.verdict for c in compress.claims(compress_summary(gain, growth, vs_cache), "planted"))
    assert got == expected
