"""`ntk scaling-law`: each law's points with its fitted curve, the compute frontiers, C*(N), the verdicts."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from . import errorbars, legend, log_log, pyplot


def _noise(ax, cfg) -> None:
    """The teacher's own risk ξ²·L·d: what "within 2× the noise level" compares the excess risk with."""
    ax.axhline(cfg.noise ** 2 * cfg.transformer.seq_len * cfg.transformer.d, color="C3", ls="--", lw=1,
               label="noise level ξ²Ld")


def _time(ax, clock: str, test, t: pd.DataFrame) -> None:
    n, width, eps = t.n.iloc[0], t.width.iloc[0], t.epsilon.iloc[0]
    t = t[t.step > 0]
    errorbars(ax, t, "time", color="C0", label="excess risk (mean ± std over seeds)")
    ax.axhline(test.floor, color="k", ls=":", lw=1, label=f"floor R_min = {test.floor:.3g} (at T = {test.at:.3g})")
    ratio = f"{test.ratio:.2f}" if np.isfinite(test.ratio) else "– (no fall)"
    ax.set(title=f"time law (N = {n}, m = {width}, ε = {eps:g}): local rate ratio {ratio}",
           xlabel=f"T ({clock})", ylabel="excess risk")


def _data(ax, cfg, fits: dict, d: pd.DataFrame) -> None:
    errorbars(ax, d, "n", color="C0", label="final excess risk")
    xs = np.geomspace(d.n.min(), d.n.max(), 100)
    ax.plot(xs, fits["data"].predict(xs), "k-", label=f"A·N^−α, α = {fits['data'].interval('alpha')}")
    ax.plot(xs, d.excess_risk.mean() * (xs / xs.mean()) ** -1.0, "C3:", label="slope −1 (the bound)")
    ax.set(title=f"data law ({'M ≥ N³' if cfg.width_rule == 'cube' else f'm = {cfg.base_width}'}, {cfg.steps:,} steps)",
           xlabel="data size N")


def _model(ax, cfg, fits: dict, d: pd.DataFrame) -> None:
    for i, (depth, fit) in enumerate(fits.items()):
        errorbars(ax, d[d.depth == depth], "model_size", color=f"C{i}", label=f"depth {depth}: α = {fit.interval('alpha')}")
        xs = np.geomspace(d[d.depth == depth].model_size.min(), d[d.depth == depth].model_size.max(), 100)
        ax.plot(xs, fit.predict(xs), "-", color=f"C{i}", lw=1)
    ax.set(title=f"model law (N = {cfg.base_n}, {cfg.steps:,} steps)", xlabel="model size M = N(md + d²)")


def _compute(ax, cfg, df: pd.DataFrame, front: pd.DataFrame, curves: dict) -> None:
    for i, n in enumerate(cfg.n_values):
        color = f"C{i % 10}"
        pts = df[(df.n == n) & (df.depth == cfg.base_depth) & (df.step > 0)]
        ax.scatter(pts.compute, pts.excess_risk, s=3, alpha=0.15, color=color)
        f = front[front.n == n]
        ax.plot(f.compute, f.excess_risk, "o", ms=2, color=color, label=f"N = {n} frontier")
        fit = curves.get(f"compute N={n}")
        if fit is not None:
            ax.axvline(fit.params["xstar"], color=color, ls=":", lw=0.8)
    env = curves.get("compute")
    if env is not None:
        ax.plot(env["envelope"].compute, env["envelope"].excess_risk, "k-", lw=1.2, label="envelope (best at each C)")
        xs = np.geomspace(env["envelope_points"].compute.min(), env["envelope_points"].compute.max(), 50)
        ax.plot(xs, env["envelope_fit"].predict(xs), "C3--", lw=1.5,
                label=f"envelope fit β = {env['envelope_fit'].interval('alpha')}")
    ax.set(title="compute: per-N frontiers (dotted: fitted C*), the envelope",
           xlabel=f"compute C = M·T·|B| (T in {'gradient-flow time' if cfg.clock == 'flow' else 'SGD steps'})",
           ylabel="excess risk")


def _breakpoint(ax, ns: np.ndarray, cs: np.ndarray, eq3: np.ndarray, fit) -> None:
    ax.plot(eq3, cs, "o", label="fitted C*(N)")
    for n, x, y in zip(ns, eq3, cs):
        ax.annotate(f"N={n}", (x, y), fontsize=7)
    line = np.exp(np.log(cs).mean()) * (eq3 / np.exp(np.log(eq3).mean())) ** fit.params["slope"]
    ax.plot(eq3, line, "k-", label=f"least squares, slope {fit.interval('slope')}")
    ax.plot(eq3, eq3, "C3:", label="C* = Eq. (3) (slope 1)")
    ax.set(title="breakpoint: fitted C* against Eq. (3)", xlabel="Eq. (3): N⁶·log(N·Ld/ξ²)/ξ²", ylabel="fitted C*")


def _verdicts(ax, verdicts: pd.DataFrame) -> None:
    ax.axis("off")
    lines = [f"{r.law}: {r.verdict}\n" + textwrap.fill(r.measured, 64, initial_indent="  ", subsequent_indent="  ")
             for r in verdicts.itertuples()]
    ax.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=8, wrap=True)
    ax.set_title("verdicts (95% bootstrap intervals)")


def figure(cfg, df: pd.DataFrame, laws: dict):
    """Time, data and model laws; compute frontiers and C*(N); the verdicts as text."""
    fig, axes = pyplot().subplots(2, 3, figsize=(17, 10))
    (a_time, a_data, a_model), (a_comp, a_star, a_text) = axes
    curves = laws["curves"]
    for ax in axes.flat[:5]:
        log_log(ax)
    if "time" in curves:
        _time(a_time, "gradient-flow time" if cfg.clock == "flow" else "SGD steps", *curves["time"])
        _noise(a_time, cfg)
    if "data" in curves:
        _data(a_data, cfg, *curves["data"])
        _noise(a_data, cfg)
    if "model" in curves:
        _model(a_model, cfg, *curves["model"])
    if "breakpoint" in curves:
        _breakpoint(a_star, *curves["breakpoint"])
    for ax in (a_time, a_data, a_model, a_star):
        legend(ax, fontsize=8)
    if not laws["frontier"].empty:
        _compute(a_comp, cfg, df, laws["frontier"], curves)
        legend(a_comp, fontsize=7, ncol=2)
    _verdicts(a_text, laws["verdicts"])
    fig.suptitle(f"paper 2 scaling laws, teacher–student ({cfg.teacher} teacher, d = {cfg.transformer.d}, L = {cfg.transformer.seq_len}, "
                 f"ξ = {cfg.noise}, {cfg.seeds} seeds)")
    fig.tight_layout()
    return fig
