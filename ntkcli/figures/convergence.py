"""`ntk convergence`: loss curves of both papers' models, rate against depth, kernel drift against width."""

from __future__ import annotations

import math

import pandas as pd

from . import legend, pyplot


def _mean_curve(rows: pd.DataFrame) -> pd.Series:
    return rows.groupby("step").loss.mean()


def _not_run(ax, part: str) -> bool:
    """Say so on a panel whose part the recipe left out (True), instead of leaving it blank."""
    ax.text(0.5, 0.5, f"not run: the recipe's parts leave out '{part}'", ha="center", va="center",
            transform=ax.transAxes, color="0.4")
    ax.set(xticks=[], yticks=[])
    return True


def _prefix_losses(ax, curves: pd.DataFrame) -> None:
    ax.set(title="Paper 1, Thm 3.10: one-token prefix, gradient descent")
    if not (curves.part == "prefix").any() and _not_run(ax, "prefix"):
        return
    for m, grp in curves[curves.part == "prefix"].groupby("m"):
        g = _mean_curve(grp)
        ax.plot(g.index + 1, g.values, label=f"prefix m=2^{int(math.log2(m))}")
    for m, grp in curves[curves.part == "stand-in"].groupby("m"):
        g = _mean_curve(grp)
        ax.plot(g.index + 1, g.values, "k--", lw=2, label=f"NTK-Attention stand-in (Z, k from m=2^{int(math.log2(m))})")
    ax.set(xscale="log", yscale="log", xlabel="gradient-descent step", ylabel="loss ½Σ‖F−y‖²")


def _transformer_losses(ax, curves: pd.DataFrame) -> None:
    ax.set(title="Paper 2, Thm 5.5: transformer, gradient descent at 1/λ_max(K₀) (largest width)")
    tc = curves[curves.part == "transformer"]
    if tc.empty and _not_run(ax, "transformer"):
        return
    for (depth, m), grp in tc.groupby(["depth", "m"]):
        if m == tc.m.max():
            g = _mean_curve(grp)
            ax.plot(g.index + 1, g.values, label=f"N={depth}, m={m}")
    ax.set(xscale="log", yscale="log", xlabel="gradient-descent step", ylabel="training loss E‖F−Y‖²")


def _rates(ax, results: pd.DataFrame) -> None:
    ax.set(title="Paper 2, Lemma 5.3: convergence rate vs depth")
    if not (results.part == "transformer").any() and _not_run(ax, "transformer"):
        return
    tr = results[results.part == "transformer"].groupby(["depth", "m"]).rate_fit.mean().reset_index()
    for m, grp in tr.groupby("m"):
        ax.plot(grp.depth, grp.rate_fit, "o-", label=f"m={m}")
    ax.set(xscale="log", xlabel="depth N", ylabel="fitted rate (−d log loss / d step)")


def _drifts(ax, results: pd.DataFrame, fits: pd.DataFrame) -> None:
    def slope(fit: str) -> str:
        s = fits.loc[fits.fit == fit, "slope"]
        return f" (slope {s.iloc[0]:.2f})" if len(s) else ""

    pre = results[results.part == "prefix"].groupby("m").kernel_drift.mean()
    if len(pre):
        ax.plot(pre.index, pre.values, "ks-", label="prefix" + slope("kernel_drift ~ m^slope"))
    trd = results[results.part == "transformer"].groupby(["depth", "m"]).kernel_drift.mean().reset_index()
    for depth, grp in trd.groupby("depth"):
        ax.plot(grp.m, grp.kernel_drift, "o-", label=f"transformer N={depth}" + slope(f"kernel_drift ~ m^slope (N={depth})"))
    ax.set(xscale="log", yscale="log", xlabel="width m", ylabel="‖K(T) − K(0)‖_F / ‖K(0)‖_F",
           title="Lazy training: kernel drift vs width")


def figure(results: pd.DataFrame, curves: pd.DataFrame, fits: pd.DataFrame):
    """Loss vs step per m (prefix, stand-in dashed), transformer loss curves, rate vs N, drift vs m (log-log)."""
    fig, axes = pyplot().subplots(2, 2, figsize=(13, 9.5))
    _prefix_losses(axes[0][0], curves)
    _transformer_losses(axes[0][1], curves)
    _rates(axes[1][0], results)
    _drifts(axes[1][1], results, fits)
    for ax, size in zip(axes.flat, (7, 7, 8, 7)):
        legend(ax, fontsize=size)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
