"""Figure 1's style for `ntk approx-error`: error against log2 m, m = ∞ at the right."""

from __future__ import annotations

import math

import pandas as pd

from . import legend, pyplot

METRICS = (("eq6_error", "Eq. (6) error"), ("relative_error", "relative error"))


def _panel(ax, rows: pd.DataFrame, metric: str, x_inf: float) -> None:
    """One line per method with its std shaded (the null baseline black, dashed); m = ∞ as a star at x_inf."""
    for method, grp in rows.groupby("method", sort=False):
        grp = grp.sort_values("m")
        x = grp.log2m.where(grp.m != math.inf, x_inf).to_numpy()
        mean, std = grp[f"{metric}_mean"].to_numpy(), grp[f"{metric}_std"].fillna(0).to_numpy()
        fin = grp.m.to_numpy() != math.inf
        style = dict(color="k", ls="--", label="no-prefix (null: Z = k = 0)") if method == "no-prefix" else dict(label=method)
        (line,) = ax.plot(x[fin], mean[fin], marker="o", ms=3, **style)
        ax.fill_between(x[fin], (mean - std)[fin].clip(min=mean[fin] * 1e-3), (mean + std)[fin],
                        color=line.get_color(), alpha=0.18)
        if (~fin).any():
            ax.errorbar(x[~fin], mean[~fin], yerr=std[~fin], fmt="*", ms=9, color=line.get_color())


def figure(summary: pd.DataFrame, cfg):
    """Rows: Eq. (6) and relative error; columns: regimes (entry std of W)."""
    plt = pyplot()
    regimes = list(dict.fromkeys(summary.weight_std))
    fig, axes = plt.subplots(2, len(regimes), figsize=(6.2 * len(regimes), 8), squeeze=False)
    x_inf = cfg.max_log2m + 1.5
    ticks = list(range(1, cfg.max_log2m + 1, max(1, cfg.max_log2m // 9)))
    for col, w in enumerate(regimes):
        for row, (metric, label) in enumerate(METRICS):
            ax = axes[row][col]
            _panel(ax, summary[summary.weight_std == w], metric, x_inf)
            ax.set_yscale("log")
            ax.set(xlabel="log2 m  (★ at right: m = ∞)", ylabel=label,
                   title=f"W entry std {w:g}, s = {cfg.scale:.4g}, {cfg.protocol} protocol")
            ax.set_xticks(ticks + [x_inf], [str(t) for t in ticks] + ["∞"])
            ax.grid(alpha=0.3, which="both")
        legend(axes[0][col], fontsize=8)
    fig.suptitle("NTK-Attention vs exact attention with an m-long prefix (d = %d, L = %d)" % (cfg.d, cfg.seq_len))
    fig.tight_layout()
    return fig
