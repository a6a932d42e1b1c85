"""Verdict rules as code: each turns measured numbers into one of `claims.VERDICTS`, after checking the regime its
theorem assumes. Pure functions of arrays and fits, so that each is tested on planted inputs that satisfy the
claim, violate it, and fall outside its regime (tests/test_rules.py). docs/theory-verdicts.md states each rule
beside the paper's sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .claims import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, OUTSIDE, REPRODUCED, verdict

LEVELS = (0.3, 0.003)  # constant_rate: the decay is read from 30% down to 0.3% of the initial excess …
RATE_DROP = 0.5  # … and its local rate may not fall below half between the two stretches
FLAT = 0.05  # the tail (t ≥ T/2) may fall by at most 5% of the whole drop: the curve has flattened
LOSS_DROP = 1e-3  # kernel_convergence: L(T)/L(0) below this …
RATE_WITHIN = 2.0  # … with the late rate within this factor of the kernel's prediction
NULL_SHARE = 0.5  # beats_null: Eq. (4)'s relative error at most half the null's …
NULL_FROM_M = 2 ** 10  # … at every m from here on


@dataclass(frozen=True)
class Condition:
    """One condition a theorem assumes, and whether (and how) a sweep meets it."""

    name: str  # as the paper states it, e.g. "M ≥ N³"
    met: bool
    detail: str  # what the sweep has, e.g. "M = 576 < N³ = 262,144"

    def as_dict(self) -> dict:
        return {"condition": self.name, "met": bool(self.met), "sweep": self.detail}


def judge(conditions: list[Condition], rule) -> str:
    """OUTSIDE (naming every unmet condition) when the sweep misses the theorem's regime, else `rule()`."""
    unmet = [c for c in conditions if not c.met]
    if unmet:
        return f"{OUTSIDE} ({'; '.join(f'{c.name}: {c.detail}' for c in unmet)})"
    return rule()


def interval(lower: float, upper: float, *, at_least: float) -> str:
    """An exponent bounded below by the theory (a decay at least this fast): REPRODUCED when the interval reaches
    `at_least` and excludes no decay (lower > 0), NOT_REPRODUCED when it lies wholly below `at_least` or at or
    below 0; INCONCLUSIVE for a non-finite interval."""
    if not (np.isfinite(lower) and np.isfinite(upper)):
        return INCONCLUSIVE
    return REPRODUCED if upper >= at_least and lower > 0 else NOT_REPRODUCED


def covers(lower: float, upper: float, value: float) -> str:
    """REPRODUCED when the interval holds `value`, NOT_REPRODUCED when it excludes it."""
    if not (np.isfinite(lower) and np.isfinite(upper)):
        return INCONCLUSIVE
    return REPRODUCED if lower <= value <= upper else NOT_REPRODUCED


# --- decay at a local rate that does not slow (Thm 7.2 time law) -----------------------------------------------------

@dataclass
class RateTest:
    """The local decay rate of R(t) − R∞ over two consecutive stretches of the decay, and their ratio."""

    floor: float  # R∞: the mean risk over t ≥ T/2
    tail_drop: float  # how much the curve still falls over t ≥ T/2, as a share of its whole drop
    reached: float  # the smallest excess before T/2, as a share of the initial excess (< 0: below R∞)
    rates: tuple[float, float]  # −d log(R − R∞)/dt over each stretch
    ratio: float  # rates[1] / rates[0]: 1 for an exponential, ≪ 1 for a power law
    lower: float  # 95% interval of the ratio over resampled seeds (the point estimate for one seed)
    upper: float

    def conditions(self) -> list[Condition]:
        return [Condition("T long enough that R(T) has flattened", self.tail_drop <= FLAT,
                          f"still falling {self.tail_drop:.0%} of its drop over the last half of T"),
                Condition(f"the excess decays to {LEVELS[1]:g} of its start before T/2", self.reached <= LEVELS[1],
                          f"it reached {self.reached:.2g}")]

    def verdict(self, conditions: list[Condition] = ()) -> str:
        """The rule, after the sweep's `conditions` and the curve's own (flattened, decayed deep enough). A curve
        that dips below its own R∞ by more than FLAT of its drop rises again after its minimum: no decay to a
        floor, NOT_REPRODUCED. Else the rate may not slow down: the ratio's interval at or above RATE_DROP is
        REPRODUCED, wholly below it (a power law's slowing decay) NOT_REPRODUCED. One-sided, because the theorem
        is an upper bound exp(−cT) + floor: a decay that speeds up stays under it, one that slows down leaves it."""
        def rule():
            if self.reached < -FLAT:
                return NOT_REPRODUCED
            if not np.isfinite(self.lower):
                return INCONCLUSIVE
            if self.lower >= RATE_DROP:
                return REPRODUCED
            return NOT_REPRODUCED if self.upper < RATE_DROP else INCONCLUSIVE
        return judge([*conditions, *self.conditions()], rule)


def _crossing(t: np.ndarray, excess: np.ndarray, level: float) -> float:
    """The first t at which excess falls to `level`, interpolated linearly in log excess (NaN if never)."""
    below = np.flatnonzero(excess <= level)
    if not len(below):
        return float("nan")
    j = below[0]
    if j == 0:
        return float(t[0])
    hi, lo = np.log(max(excess[j - 1], 1e-300)), np.log(max(excess[j], 1e-300))
    w = (hi - np.log(level)) / (hi - lo) if hi > lo else 1.0
    return float(t[j - 1] + w * (t[j] - t[j - 1]))


def _rates(t: np.ndarray, mean: np.ndarray) -> tuple[float, float, float, tuple[float, float]]:
    """(R∞, tail drop, smallest excess share before T/2, (rate over the first stretch, over the second))."""
    tail = t >= t[-1] / 2
    floor = float(mean[tail].mean())
    drop = mean[0] - floor
    if not drop > 0:
        return floor, float("inf"), 1.0, (float("nan"), float("nan"))
    tail_drop = float((mean[tail][0] - mean[tail].min()) / drop)
    share = (mean - floor) / drop
    reached = float(np.min(share[~tail])) if (~tail).any() else 1.0
    top, bottom = LEVELS
    middle = float(np.sqrt(top * bottom))
    times = [_crossing(t, share, q) for q in (top, middle, bottom)]
    rates = (np.log(top / middle) / (times[1] - times[0]) if times[1] > times[0] else float("nan"),
             np.log(middle / bottom) / (times[2] - times[1]) if times[2] > times[1] else float("nan"))
    return floor, max(tail_drop, 0.0), reached, rates


def constant_rate(t, curves, *, n_boot: int = 200, seed: int = 0) -> RateTest:
    """Does R(t) − R∞ decay at a local rate that does not slow down? `curves`: [seeds, len(t)] risks at the
    times t (t[0] the start). R∞ is the mean over t ≥ T/2, checked by the tail's own drop; the rates come from the
    times at which the seed-mean excess crosses 30%, 3% and 0.3% of its start. The ratio's interval resamples
    seeds."""
    t, curves = np.asarray(t, float), np.atleast_2d(np.asarray(curves, float))
    floor, tail_drop, reached, rates = _rates(t, curves.mean(0))
    ratio = rates[1] / rates[0]
    lower = upper = ratio
    if len(curves) > 1:
        rng = np.random.default_rng(seed)
        draws = [_rates(t, curves[rng.integers(0, len(curves), len(curves))].mean(0))[3] for _ in range(n_boot)]
        ratios = np.array([b / a for a, b in draws])
        ratios = ratios[np.isfinite(ratios)]
        lower, upper = ((np.percentile(ratios, 2.5), np.percentile(ratios, 97.5)) if len(ratios) >= n_boot / 2
                        else (float("nan"), float("nan")))
    return RateTest(floor, tail_drop, reached, rates, float(ratio), float(lower), float(upper))


# --- convergence in the kernel regime (paper 2 Thm 5.5) ----------------------------------------------------------

LAZY = 0.1  # kernel_convergence: the whole-model NTK may move by at most this (relative) over training


def kernel_convergence(loss_ratio: float, late_rate: float, predicted: float, steps: int, drift: float) -> str:
    """One run of gradient descent in the kernel regime: REPRODUCED when L(T)/L(0) < LOSS_DROP and the late rate is
    within RATE_WITHIN× of the kernel's prediction; NOT_REPRODUCED when the loss stalls (late rate below the
    prediction / RATE_WITHIN, L(T)/L(0) above LOSS_DROP): a floor the bound forbids. OUTSIDE when T is too short for
    the kernel's own rate to reach LOSS_DROP, or when the kernel moved by more than LAZY (not the kernel regime)."""
    enough = predicted * steps >= np.log(1 / LOSS_DROP)
    conditions = [Condition("T ≥ ln(10³) / (kernel rate)", enough,
                            f"T·rate = {predicted * steps:.3g} < {np.log(1 / LOSS_DROP):.3g}"),
                  Condition(f"kernel regime (NTK drift ≤ {LAZY})", drift <= LAZY, f"drift {drift:.2g}")]

    def rule():
        ratio = late_rate / predicted
        if loss_ratio < LOSS_DROP and 1 / RATE_WITHIN <= ratio <= RATE_WITHIN:
            return REPRODUCED
        if loss_ratio >= LOSS_DROP and ratio < 1 / RATE_WITHIN:
            return NOT_REPRODUCED
        return INCONCLUSIVE
    return judge(conditions, rule)


def prefix_convergence(loss_ratio: float, rate_ratios, slope_lower: float, slope_upper: float) -> str:
    """Paper 1 Thm 3.10: L(T)/L(0) < LOSS_DROP at the largest m, the fitted rate within RATE_WITHIN× of the kernel's
    2ηλ_min at each of the largest m (`rate_ratios`), and the kernel drift's slope against m holding −1/2 (the NTK
    moves as m^(−1/2)). INCONCLUSIVE without a finite slope interval (one seed)."""
    if not (np.isfinite(slope_lower) and np.isfinite(slope_upper)):
        return INCONCLUSIVE
    rates_ok = all(1 / RATE_WITHIN <= r <= RATE_WITHIN for r in rate_ratios)
    return verdict(loss_ratio < LOSS_DROP and rates_ok and slope_lower <= -0.5 <= slope_upper)


def mean_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lower, upper): Student's t interval of the mean of a few independent values (NaN bounds for one)."""
    from scipy import stats

    values = np.asarray(values, float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf((1 + level) / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return mean, mean - half, mean + half


def all_of(verdicts: list[str]) -> str:
    """A claim judged on several points: NOT_REPRODUCED if any point is, REPRODUCED if every judged point is; the
    OUTSIDE points are left out (and all of them OUTSIDE gives OUTSIDE); NOT_RUN when there are none."""
    if not verdicts:
        return NOT_RUN
    judged = [v for v in verdicts if not v.startswith(OUTSIDE)]
    if not judged:
        return OUTSIDE
    if NOT_REPRODUCED in judged:
        return NOT_REPRODUCED
    return REPRODUCED if all(v == REPRODUCED for v in judged) else INCONCLUSIVE


# --- monotone risk (Thm 7.2 model law) --------------------------------------------------------------------------

def rises(means, ses) -> bool:
    """Does a curve of means (ordered by the swept variable) rise anywhere by more than two standard errors?"""
    means, ses = np.asarray(means, float), np.asarray(ses, float)
    return bool(np.any(np.diff(means) > 2 * np.sqrt(ses[1:] ** 2 + ses[:-1] ** 2)))


def model_law(lower: float, upper: float, means, ses) -> str:
    """One depth's risk against M: REPRODUCED when it falls (α > 0 with its interval) and never rises with M."""
    if not (np.isfinite(lower) and np.isfinite(upper)):
        return INCONCLUSIVE
    return verdict(lower > 0 and not rises(means, ses))


# --- Figure 1 (paper 1) -----------------------------------------------------------------------------------------

def growth(grow: float, relative: float, null_relative: float, low: float = 10, high: float = 1000) -> str:
    """Figure 1's trend: Eq. (6) grows by `low`–`high`× over the m range, and the plain relative error at the largest
    m is at most NULL_SHARE of the null baseline's (a method that collapsed to the input's attention alone fails)."""
    return verdict(low <= grow <= high and relative <= NULL_SHARE * null_relative)


def beats_null(m, relative, null_relative) -> str:
    """Eq. (4)'s relative error at most NULL_SHARE of the null's at every m ≥ NULL_FROM_M (NOT_RUN without such m)."""
    m, relative, null_relative = (np.asarray(a, float) for a in (m, relative, null_relative))
    big = m >= NULL_FROM_M
    if not big.any():
        return NOT_RUN
    return verdict(bool(np.all(relative[big] <= NULL_SHARE * null_relative[big])))

