"""Fits of scaling laws with honest uncertainty: Huber loss in log space, many starts, bootstrap.

- `fit_power_law`: y = E + A·x^(−α) (or E = 0), the Chinchilla / Epoch AI procedure: parameters
  (log E, log A, α), residuals log y − log ŷ, Huber loss with δ = 1e-3, L-BFGS from a grid of starts.
- `fit_two_stage`: log y linear in x below a breakpoint x* (exponential decay in compute) and linear
  in log x above it (a power law), continuous at x* (Theorem 7.1's two stages).
- `bootstrap`: resample the points with replacement, refit, report 2.5/97.5 percentiles.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber

DELTA = 1e-3
FORMS = {"power": "E + A·{x}^(−α)", "power0": "A·{x}^(−α)", "exponential": "E + A·exp(−r·{x})",
         "two_stage": "two-stage: exp(−r·{x}), then {x}^(−β)", "line": "log C* = c + slope·log {x}"}


@dataclass
class Fit:
    """A fitted law (`law`, one of FORMS): parameter estimates by name, the Huber objective, and (after
    bootstrap) intervals. `predict` and `form` are the one place each law's formula is written."""

    params: dict[str, float]
    loss: float
    lower: dict[str, float] | None = None
    upper: dict[str, float] | None = None
    draws: list[dict[str, float]] | None = None
    law: str = "power"

    def form(self, x: str) -> str:
        """The law as text in the variable `x`."""
        return FORMS[self.law].format(x=x)

    def predict(self, x) -> np.ndarray:
        """The fitted law's value at x."""
        x, p = np.asarray(x, float), self.params
        if self.law in ("power", "power0"):
            return p.get("E", 0.0) + p["A"] * x ** -p["alpha"]
        if self.law == "exponential":
            return p["E"] + p["A"] * np.exp(-p["r"] * x)
        if self.law == "two_stage":
            return np.exp(np.where(x < p["xstar"], p["log_ystar"] - p["r"] * (x - p["xstar"]),
                                   p["log_ystar"] - p["beta"] * np.log(x / p["xstar"])))
        raise ValueError(f"no formula for law {self.law!r}")

    def interval(self, key: str) -> str:
        """'estimate [lower, upper]' of one parameter."""
        return f"{self.params[key]:.3g} [{self.lower[key]:.3g}, {self.upper[key]:.3g}]"

    def rows(self, **labels) -> list[dict]:
        return [{**labels, "parameter": k, "estimate": v,
                 "lower": np.nan if self.lower is None else self.lower[k],
                 "upper": np.nan if self.upper is None else self.upper[k]} for k, v in self.params.items()]


def _best(objective: Callable[[np.ndarray], float], starts) -> tuple[np.ndarray, float]:
    best_x, best_f = None, np.inf
    for start in starts:
        with np.errstate(over="ignore", invalid="ignore"):
            res = minimize(objective, np.asarray(start, float), method="L-BFGS-B", jac=True)
        if np.isfinite(res.fun) and res.fun < best_f:
            best_x, best_f = res.x, float(res.fun)
    if best_x is None:
        raise ValueError("no start gave a finite fit")
    return best_x, best_f


def _objective(model: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], logy: np.ndarray):
    """Σ Huber_δ(log y − log ŷ(θ)) and its gradient, from model(θ) = (log ŷ, ∂ log ŷ/∂θ)."""
    def value_and_grad(theta):
        logyhat, jac = model(theta)
        r = logy - logyhat
        return float(huber(DELTA, r).sum()), -(np.clip(r, -DELTA, DELTA) @ jac)
    return value_and_grad


def _offset_sum(log_e: float, log_term: np.ndarray, d_term: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log(e^log_e + e^log_term) and its Jacobian [∂/∂log_e, ∂/∂(term params)…] (d_term: ∂log_term/∂θ)."""
    total = np.logaddexp(log_e, log_term)
    w = np.exp(log_term - total)
    return total, np.column_stack([1 - w, w[:, None] * d_term])


def _log_power(theta: np.ndarray, logx: np.ndarray, offset: bool) -> tuple[np.ndarray, np.ndarray]:
    log_e, log_a, alpha = theta
    power, d_power = log_a - alpha * logx, np.column_stack([np.ones_like(logx), -logx])
    if offset:
        return _offset_sum(log_e, power, d_power)
    return power, np.column_stack([np.zeros_like(logx), d_power])


def huber_lines(u: np.ndarray, v: np.ndarray, iters: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Per row, (a, s) minimising Σ Huber_δ(v − a − s·u) over u, v [B, n], by iteratively reweighted least squares
    (weights min(1, δ/|r|), a majorise–minimise step, so the objective never rises): the offset-free power law's
    fit in log space, for every bootstrap resample at once."""
    w = np.ones_like(v)
    for _ in range(iters):
        sw, su, sv, suu, suv = (w.sum(1), (w * u).sum(1), (w * v).sum(1), (w * u * u).sum(1), (w * u * v).sum(1))
        s = (sw * suv - su * sv) / (sw * suu - su * su)
        a = (sv - s * su) / sw
        w = DELTA / np.maximum(np.abs(v - a[:, None] - s[:, None] * u), DELTA)
    return a, s


def fit_power_law(x, y, *, offset: bool = True, start: Fit | None = None) -> Fit:
    """y ≈ E + A·x^(−α); `offset=False` fits A·x^(−α) (a Huber line in log space). `start`: refit from an
    earlier fit only."""
    logx, logy = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    if not offset:
        a, s = huber_lines(logx[None], logy[None])
        if not (np.isfinite(a[0]) and np.isfinite(s[0])):
            raise ValueError("no finite power law fits these points")
        return Fit({"alpha": float(-s[0]), "A": float(np.exp(a[0]))}, float(huber(DELTA, logy - a[0] - s[0] * logx).sum()),
                   law="power0")
    lo, hi = logy.min(), logy.max()
    if start is not None:
        p = start.params
        starts = [(np.log(p["E"]), np.log(p["A"]), p["alpha"])]
    else:
        starts = itertools.product(np.linspace(lo - 2, lo, 3), np.linspace(lo, hi + 4, 4), [0.0, 0.25, 0.5, 1.0, 2.0])
    x_best, f = _best(_objective(lambda t: _log_power(t, logx, True), logy), starts)
    return Fit({"alpha": x_best[2], "A": np.exp(x_best[1]), "E": np.exp(x_best[0])}, f, law="power")


def _two_stage(theta: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log ŷ at u = x / x_max and its Jacobian: log y* − r·(u − u*) below u*, log y* − β·(log u − log u*)
    above (r = exp ρ)."""
    log_ystar, rho, beta, log_ustar = theta
    rate, ustar, logu = np.exp(min(rho, 50.0)), np.exp(log_ustar), np.log(u)
    low = logu < log_ustar
    value = np.where(low, log_ystar - rate * (u - ustar), log_ystar - beta * (logu - log_ustar))
    one, zero = np.ones_like(u), np.zeros_like(u)
    jac = np.column_stack([one, np.where(low, -rate * (u - ustar), zero), np.where(low, zero, -(logu - log_ustar)),
                           np.where(low, rate * ustar, beta)])
    return value, jac


def fit_two_stage(x, y, *, grid: int = 24, start: Fit | None = None) -> Fit:
    """Exponential decay in x, then a power law, continuous at the breakpoint x* (scanned on a grid,
    then refined). `start`: scan 7 points within a factor 10 of its x* only."""
    x = np.asarray(x, float)
    scale, logy = x.max(), np.log(np.asarray(y, float))
    u = x / scale
    objective = _objective(lambda t: _two_stage(t, u), logy)
    if start is None:
        candidates = np.linspace(np.log(u.min()), 0.0, grid)[1:-1]
        betas = (0.1, 0.5, 1.0)
    else:
        centre = np.log(start.params["xstar"] / scale)
        candidates = np.clip(centre + np.linspace(-np.log(10), np.log(10), 7), np.log(u.min()), 0.0)
        betas = (start.params["beta"],)
    best_t, best_f = None, np.inf
    for log_ustar in candidates:
        ystar = np.median(logy[np.abs(np.log(u) - log_ustar) <= np.abs(np.log(u) - log_ustar).min() + 1e-12])
        for beta0 in betas:
            fixed = _objective(lambda t, lu=log_ustar: (lambda v, j: (v, j[:, :3]))(*_two_stage(np.append(t, lu), u)),
                               logy)
            t, f = _best(fixed, [(ystar, -log_ustar, beta0)])
            if f < best_f:
                best_t, best_f = np.array([*t, log_ustar]), f
    t, f = _best(objective, [best_t])
    if f > best_f:
        t, f = best_t, best_f
    return Fit({"log_ystar": t[0], "r": np.exp(min(t[1], 50.0)) / scale, "beta": t[2], "xstar": np.exp(t[3]) * scale}, f,
               law="two_stage")


def bootstrap(fit: Callable[..., Fit], x, y, *, n: int = 200, seed: int = 0, level: float = 0.95, **kw) -> Fit:
    """`fit(x, y)` with percentile intervals from `n` resamples of the points (a resample with fewer than 3
    distinct x is skipped). The offset-free power law fits every resample at once."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    point = fit(x, y, **kw)
    rng = np.random.default_rng(seed)
    samples = [idx for idx in (rng.integers(0, len(x), len(x)) for _ in range(n)) if len(np.unique(x[idx])) >= 3]
    if point.law == "power0" and samples:
        idx = np.array(samples)
        a, s = huber_lines(np.log(x[idx]), np.log(y[idx]))
        draws = [{"alpha": -si, "A": np.exp(ai)} for ai, si in zip(a, s) if np.isfinite(ai) and np.isfinite(si)]
    else:
        draws = []
        for idx in samples:
            try:
                draws.append(fit(x[idx], y[idx], **kw, start=point).params)
            except ValueError:
                continue
    if not draws:
        raise ValueError("every bootstrap resample failed to fit")
    tail = 100 * (1 - level) / 2
    point.lower = {k: float(np.percentile([d[k] for d in draws], tail)) for k in point.params}
    point.upper = {k: float(np.percentile([d[k] for d in draws], 100 - tail)) for k in point.params}
    point.draws = draws
    return point
