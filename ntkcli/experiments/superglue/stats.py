"""Paired differences between two methods with a hierarchical bootstrap over folds, training seeds and evaluation
examples; the verdicts read from its interval."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPRODUCED, REFUTED, INCONCLUSIVE = "reproduced", "refuted", "inconclusive"
SUPERIOR, NONINFERIOR, INFERIOR = "superior", "non-inferior", "inferior"

Fold = tuple[np.ndarray, np.ndarray, np.ndarray]  # a, b: [seeds, examples] scores (1 = right); each example's group


def _fold_draws(fold: Fold, replicates: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One fold's bootstrap replicates of Σ(a − b) over its examples (mean over redrawn seeds) and of the number of
    examples: each replicate redraws the seeds and the examples (whole groups: MultiRC's questions), the same draw
    for both methods."""
    a, b, groups = fold
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    _, group = np.unique(np.asarray(groups), return_inverse=True)
    sums = np.zeros((d.shape[0], group.max() + 1))
    np.add.at(sums, (slice(None), group), d)
    counts = np.bincount(group).astype(np.float64)
    s, g = sums.shape
    seeds = rng.multinomial(s, np.full(s, 1 / s), size=replicates)
    drawn = rng.multinomial(g, np.full(g, 1 / g), size=replicates)
    return ((seeds @ sums) * drawn).sum(1) / s, drawn @ counts


def paired_draws(folds: list[Fold], replicates: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of a task's mean paired difference mean(a) − mean(b) over its folds' examples,
    hierarchically: each replicate redraws the folds, then inside every drawn fold its seeds and its examples."""
    sums, counts = map(np.stack, zip(*(_fold_draws(f, replicates, rng) for f in folds)))  # [folds, replicates]
    k = len(folds)
    picks = rng.multinomial(k, np.full(k, 1 / k), size=replicates).T if k > 1 else np.ones((1, replicates))
    return (picks * sums).sum(0) / (picks * counts).sum(0)


def _mean(folds: list[Fold]) -> float:
    """The task's difference: every fold's examples pooled, each example's difference the mean over seeds."""
    return float(sum((np.mean(a, 0) - np.mean(b, 0)).sum() for a, b, _ in folds) / sum(a.shape[1] for a, _, _ in folds))


@dataclass
class Difference:
    mean: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """Reproduced when the interval lies above 0, refuted below it, inconclusive when it contains 0."""
        return REPRODUCED if self.low > 0 else REFUTED if self.high < 0 else INCONCLUSIVE


def difference(tasks: list[list[Fold]], replicates: int, seed: int, level: float = 0.95) -> Difference:
    """The mean over tasks of the paired difference (each task a list of folds), with its percentile interval; each
    task is redrawn independently."""
    rng = np.random.default_rng(seed)
    draws = np.mean([paired_draws(folds, replicates, rng) for folds in tasks], axis=0)
    tail = 100 * (1 - level) / 2
    return Difference(float(np.mean([_mean(folds) for folds in tasks])), float(np.percentile(draws, tail)),
                      float(np.percentile(draws, 100 - tail)))


def matches_or_beats(d: Difference, margin: float) -> str:
    """a ≥ b − δ, graded (δ = `margin`, in the differences' own unit): superior when the interval lies above 0,
    non-inferior when it lies above −δ, inferior when it lies below −δ, inconclusive when it contains −δ."""
    return SUPERIOR if d.low > 0 else NONINFERIOR if d.low > -margin else INFERIOR if d.high < -margin \
        else INCONCLUSIVE

