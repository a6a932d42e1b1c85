"""Paired differences between two methods with a bootstrap over evaluation examples and seeds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPRODUCED, REFUTED, INCONCLUSIVE = "reproduced", "refuted", "inconclusive"


def paired_draws(a: np.ndarray, b: np.ndarray, groups, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of mean(a) − mean(b), where a and b are [seeds, examples] scores (1 = right) of two
    methods on the same examples, row i of each trained with seed i. Each replicate redraws the seeds and the
    examples (whole groups: MultiRC's questions), the same draw for both methods."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    _, group = np.unique(np.asarray(groups), return_inverse=True)
    sums = np.zeros((d.shape[0], group.max() + 1))
    np.add.at(sums, (slice(None), group), d)
    counts = np.bincount(group).astype(np.float64)
    s, g = sums.shape
    seeds = rng.multinomial(s, np.full(s, 1 / s), size=replicates)
    drawn = rng.multinomial(g, np.full(g, 1 / g), size=replicates)
    return ((seeds @ sums) * drawn).sum(1) / (s * (drawn @ counts))


@dataclass
class Difference:
    mean: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """Reproduced when the interval lies above 0, refuted below it, inconclusive when it contains 0."""
        return REPRODUCED if self.low > 0 else REFUTED if self.high < 0 else INCONCLUSIVE


def difference(pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], replicates: int, seed: int,
               level: float = 0.95) -> Difference:
    """The mean over tasks of the paired difference (one (a, b, groups) per task), with its percentile interval;
    each task is redrawn independently."""
    rng = np.random.default_rng(seed)
    draws = np.mean([paired_draws(a, b, g, replicates, rng) for a, b, g in pairs], axis=0)
    mean = float(np.mean([np.mean(a) - np.mean(b) for a, b, _ in pairs]))
    tail = 100 * (1 - level) / 2
    return Difference(mean, float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail)))


NONINFERIOR, INFERIOR = "non-inferior", "inferior"


def noninferiority(d: Difference, margin: float) -> str:
    """a ≥ b − δ (δ = `margin`, in the differences' own unit): non-inferior when the interval lies above −δ,
    inferior when it lies below −δ, inconclusive when it contains −δ."""
    return NONINFERIOR if d.low > -margin else INFERIOR if d.high < -margin else INCONCLUSIVE
