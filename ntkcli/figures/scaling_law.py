"""`ntk scaling-law`: each law's points with its fitted curve, the compute frontiers, C*(N), the verdicts."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from . import errorbars, legend, log_log, pyplot


def _time(ax, cfg, df: pd.DataFrame, fits) -> None:
    exp, power = fits
    t = df[(df.n == cfg.base_n) & (df.width == cfg.base_width) & (df.depth == cfg.base_depth) & (df.step > 0)]
    errorbars(ax, t, "step", color="C0", label="excess risk (mean ± std over seeds)")
    xs = np.geomspace(1, cfg.steps, 200)
    ax.plot(xs, exp.predict(xs), "k-", label=f"E + A·exp(−rT), r = {exp.params['r']:.2g}")
    ax.plot(xs, power.predict(xs), "C3--", label=f"power law, α = {power.params['alpha']:.2g}")
    ax.set(title=f"time law (N = {cfg.base_n}, m = {cfg.base_width})", xlabel="SGD steps T", ylabel="excess risk")


def _data(ax, cfg, final: pd.DataFrame, fit) -> None:
    d = final[(final.width == cfg.base_width) & (final.depth == cfg.base_depth)]
    errorbars(ax, d, "n", color="C0", label="final excess risk")
    xs = np.geomspace(d.n.min(), d.n.max(), 100)
    ax.plot(xs, fit.predict(xs), "k-", label=f"fit α = {fit.interval('alpha')}")
    ax.plot(xs, d.excess_risk.mean() * (xs / xs.mean()) ** -1.0, "C3:", label="slope −1 (the bound)")
    ax.set(title=f"data law (m = {cfg.base_width}, T = {cfg.steps})", xlabel="data size N")


def _model(ax, cfg, final: pd.DataFrame, fit) -> None:
    d = final[final.n == cfg.base_n]
    for i, depth in enumerate(sorted(d.depth.unique())):
        errorbars(ax, d[d.depth == depth], "model_size", color=f"C{i}", label=f"depth {depth}")
    xs = np.geomspace(d.model_size.min(), d.model_size.max(), 100)
    ax.plot(xs, fit.predict(xs), "k-", label=f"fit α = {fit.interval('alpha')}")
    ax.set(title=f"model law (N = {cfg.base_n}, T = {cfg.steps})", xlabel="model size M = N(md + d²)")


def _compute(ax, cfg, df: pd.DataFrame, front: pd.DataFrame, curves: dict) -> None:
    for i, n in enumerate(cfg.n_values):
        color = f"C{i % 10}"
        pts = df[(df.n == n) & (df.depth == cfg.base_depth) & (df.step > 0)]
        ax.scatter(pts.compute, pts.excess_risk, s=3, alpha=0.15, color=color)
        f = front[front.n == n]
        ax.plot(f.compute, f.excess_risk, "o", ms=3, color=color, label=f"N = {n} frontier")
        fit = curves.get(f"compute N={n}")
        if fit is not None:
            xs = np.geomspace(f.compute.min(), f.compute.max(), 200)
            ax.plot(xs, fit.predict(xs), "-", color=color, lw=1)
            ax.axvline(fit.params["xstar"], color=color, ls=":", lw=0.8)
    ax.set(title="compute frontier: exp stage, then power law (dotted: C*)", xlabel="compute C = M·T·|B|",
           ylabel="excess risk")


def _breakpoint(ax, ns: np.ndarray, cs: np.ndarray, fit) -> None:
    def line(slope):
        return np.exp(np.log(cs).mean()) * (ns / np.exp(np.log(ns).mean())) ** slope

    ax.plot(ns, cs, "o", label="fitted C*(N)")
    ax.plot(ns, line(fit.params["slope"]), "k-", label=f"least squares, slope {fit.interval('slope')}")
    ax.plot(ns, line(6.0), "C3:", label="slope 6 (Eq. 3), same centre")
    ax.set(title="breakpoint C* vs data size", xlabel="data size N", ylabel="C*")


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
    curves, final = laws["curves"], df[df.step == cfg.steps]
    for ax in axes.flat[:5]:
        log_log(ax)
    if "time" in curves:
        _time(a_time, cfg, df, curves["time"])
    if "data" in curves:
        _data(a_data, cfg, final, curves["data"])
    if "model" in curves:
        _model(a_model, cfg, final, curves["model"])
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
