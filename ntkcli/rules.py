"""Verdict rules as code: each turns measured numbers into one of `claims.VERDICTS`, after checking the regime its
theorem assumes. Pure functions of arrays and fits, so that each is tested on planted inputs that satisfy the
claim, violate it, and fall outside its regime (tests/test_rules.py). docs/theory-verdicts.md states each rule
beside the paper's sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .claims import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, OUTSIDE, REPRODUCED, verdict

LEVELS = (0.5, 0.01)  # decay_to_floor: the fall is read from 50% down to 1% of the drop to the floor …
RATE_BAND = (0.6, 1.2)  # … its late local rate between 0.6 and 1.2× the early one: an exponential's ratio is 1, a
# positive sum of exponentials' (the kernel regime's loss) at most 1; 1.2 leaves room for the seeds' noise
FLAT = 0.05  # the tail (t ≥ T/2) may fall by at most 5% of the whole drop: the curve has flattened
RISE = 0.02  # R(T) may sit above the curve's minimum by at most 2% of the drop (or two standard errors)
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


# --- an exponential decay to a floor it does not leave (Thm 7.2 time law) ------------------------------------------

@dataclass
class FloorTest:
    """The seed-mean risk R(t) against its floor R_min (its own minimum, at t_min): how it falls to it, whether it
    leaves it, and the local decay rate of R − R_min over two consecutive stretches of the fall."""

    floor: float  # R_min, the seed-mean curve's minimum …
    floor_lower: float  # … with a 95% interval over resampled seeds
    floor_upper: float
    at: float  # t_min
    tail_drop: float  # how much the curve still falls over t ≥ T/2, as a share of its whole drop R(0) − R_min
    rise: float  # R(T) − R_min, as a share of the drop …
    rise_se: float  # … and its standard error over the seeds (0 for one seed)
    deep: float  # the first t at which R − R_min is LEVELS[1] of the drop (NaN: never)
    rates: tuple[float, float]  # −d log(R − R_min)/dt over each stretch
    ratio: float  # rates[1] / rates[0]: 1 for an exponential, ≪ 1 for a power law, > 1 for a speed-up
    lower: float  # 95% interval of the ratio over resampled seeds (the point estimate for one seed)
    upper: float

    def conditions(self, horizon: float) -> list[Condition]:
        if not np.isfinite(self.tail_drop):
            return [Condition("the risk falls from its start", False, "R(0) is the curve's minimum")]
        return [Condition("T long enough that R(T) has flattened", self.tail_drop <= FLAT,
                          f"still falling {self.tail_drop:.0%} of its drop over the last half of T"),
                Condition(f"the excess decays to {LEVELS[1]:g} of its drop before T/2",
                          bool(self.deep <= horizon / 2), "it does not" if not np.isfinite(self.deep) else
                          f"only at t = {fmt_t(self.deep)} of T = {fmt_t(horizon)}")]

    def left_floor(self) -> bool:
        """Does R(T) sit above the floor by more than RISE of the drop and more than two standard errors?"""
        return self.rise > RISE and self.rise > 2 * self.rise_se

    def verdict(self, horizon: float, conditions: list[Condition] = ()) -> str:
        """The rule, after the sweep's `conditions` and the curve's own (flattened; decayed deep enough before
        T/2). A curve that leaves its floor (rises after its minimum) is no decay to a floor: NOT_REPRODUCED.
        Else the late rate must equal the early one: the ratio's interval wholly outside RATE_BAND is
        NOT_REPRODUCED (below: a power law's slowing decay; above: a speed-up, which no
        positive sum of exponentials, the kernel regime's loss, can show); else the ratio inside it is REPRODUCED,
        outside it INCONCLUSIVE."""
        def rule():
            if self.left_floor():
                return NOT_REPRODUCED
            if not np.isfinite(self.ratio):
                return INCONCLUSIVE
            slow, fast = RATE_BAND
            if self.upper < slow or self.lower > fast:
                return NOT_REPRODUCED
            return REPRODUCED if slow <= self.ratio <= fast else INCONCLUSIVE
        return judge([*conditions, *self.conditions(horizon)], rule)


def fmt_t(t: float) -> str:
    return f"{t:,.0f}" if t >= 10 else f"{t:.3g}"


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


def _fall(t: np.ndarray, mean: np.ndarray) -> tuple[float, float, float, tuple[float, float]]:
    """(R_min, tail drop, first t at LEVELS[1] of the drop, (rate over the first stretch, over the second)). The
    rates are read against the tail's mean R∞ (t ≥ T/2), not against R_min, which the seeds' noise biases low:
    a curve that leaves its floor has failed before its rates are read."""
    floor, tail = float(mean.min()), t >= t[-1] / 2
    drop = mean[0] - floor
    if not drop > 0:
        return floor, float("inf"), float("nan"), (float("nan"), float("nan"))
    share = (mean - mean[tail].mean()) / (mean[0] - mean[tail].mean())
    tail_drop = float((mean[tail][0] - mean[tail].min()) / drop)
    top, bottom = LEVELS
    times = [_crossing(t, share, q) for q in (top, np.sqrt(top * bottom), bottom)]
    half = np.log(top / bottom) / 2
    rates = (half / (times[1] - times[0]) if times[1] > times[0] else float("nan"),
             half / (times[2] - times[1]) if times[2] > times[1] else float("nan"))
    return floor, tail_drop, times[2], rates


def decay_to_floor(t, curves, *, n_boot: int = 200, seed: int = 0) -> FloorTest:
    """Does R(t) decay exponentially to a floor it does not leave? `curves`: [seeds, len(t)] risks at the times t
    (t[0] the start). The floor is the seed-mean curve's minimum; the rates come from the times at which the
    excess over the tail's mean (t ≥ T/2) crosses 50%, 7% and 1% of the drop; the intervals resample seeds."""
    t, curves = np.asarray(t, float), np.atleast_2d(np.asarray(curves, float))
    mean = curves.mean(0)
    floor, tail_drop, deep, rates = _fall(t, mean)
    j, drop = int(np.argmin(mean)), mean[0] - floor
    rises = (curves[:, -1] - curves[:, j]) / drop if drop > 0 else np.full(len(curves), np.inf)
    rise_se = float(rises.std(ddof=1) / np.sqrt(len(rises))) if len(rises) > 1 else 0.0
    ratio = rates[1] / rates[0]
    lower = upper = ratio
    floor_lower = floor_upper = floor
    if len(curves) > 1:
        rng = np.random.default_rng(seed)
        draws = [_fall(t, curves[rng.integers(0, len(curves), len(curves))].mean(0)) for _ in range(n_boot)]
        ratios = np.array([d[3][1] / d[3][0] for d in draws])
        ratios = ratios[np.isfinite(ratios)]
        lower, upper = ((np.percentile(ratios, 2.5), np.percentile(ratios, 97.5)) if len(ratios) >= n_boot / 2
                        else (float("nan"), float("nan")))
        floor_lower, floor_upper = np.percentile([d[0] for d in draws], [2.5, 97.5])
    return FloorTest(floor, float(floor_lower), float(floor_upper), float(t[j]), max(tail_drop, 0.0),
                     float(rises.mean()), rise_se, deep, rates, float(ratio), float(lower), float(upper))


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


def ratio_interval(top, bottom, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean(top)/mean(bottom), lower, upper) over paired replicates (a repeat's two values stay together): a
    percentile bootstrap interval that resamples the replicates (NaN bounds for one)."""
    top, bottom = np.asarray(top, float), np.asarray(bottom, float)
    ratio = float(top.mean() / bottom.mean())
    if len(top) < 2:
        return ratio, float("nan"), float("nan")
    pick = np.random.default_rng(seed).integers(0, len(top), size=(n_boot, len(top)))
    draws = top[pick].mean(1) / bottom[pick].mean(1)
    tail = 100 * (1 - level) / 2
    return ratio, float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))


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


RISE_SE = 1.5  # rises: a step up of more than 1.5 standard errors of a difference is a rise (batteries.py: a falling
# M^(−ζ) at the committed grids never triggers it; a 30% rise at the largest M almost always does)


# --- monotone risk (Thm 7.2 model law) --------------------------------------------------------------------------

def rises(means, ses) -> bool:
    """Does a curve of positive means (ordered by the swept variable) rise anywhere by more than RISE_SE standard
    errors of a step? Judged in log space with the relative standard error pooled over the points (root mean
    square): a few seeds' per-point errors are too noisy to judge one step by."""
    means, ses = np.asarray(means, float), np.asarray(ses, float)
    relative = np.sqrt(np.mean((ses / means) ** 2))
    return bool(np.any(np.diff(np.log(means)) > RISE_SE * np.sqrt(2) * relative))


def model_law(lower: float, upper: float, means, ses, zeta: float) -> str:
    """One depth's risk against M, the bound ξ²·M^(−ζ): REPRODUCED when the fitted exponent's interval reaches ζ
    and excludes 0 (`interval`) and the risk never rises with M; NOT_REPRODUCED otherwise."""
    if not (np.isfinite(lower) and np.isfinite(upper)):
        return INCONCLUSIVE
    return verdict(interval(lower, upper, at_least=zeta) == REPRODUCED and not rises(means, ses))


# --- Figure 1 (paper 1) -----------------------------------------------------------------------------------------

def bounded_logits(largest: float, m: float) -> Condition:
    """Thm 4.1's premise ‖Q‖∞, ‖K‖∞ ≤ o(√log m) read at a finite m: it bounds every logit by ‖Q‖∞‖K‖∞ = o(log m)
    (Alman–Song's A = exp(QKᵀ/d)), so we ask that the largest logit |s·qᵀk| the queries meet be at most ln m."""
    met = bool(largest <= math.log(m))
    return Condition("‖Q‖∞, ‖K‖∞ ≤ o(√log m), read as every logit |s·qᵀk| ≤ ln m", met,
                     f"largest logit {largest:.3g} {'≤' if met else '>'} ln m = {math.log(m):.3g} at m = {m:,.0f}")


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

