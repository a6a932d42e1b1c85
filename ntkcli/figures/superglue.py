"""Table 2 at small scale as a figure: accuracy against trainable parameters per task, the Pareto front marked."""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import pyplot


def front(points: pd.DataFrame) -> pd.DataFrame:
    """The Pareto front: the methods no other beats with as few trainable parameters or fewer."""
    ordered = points.sort_values(["trainable_params", "accuracy_mean"], ascending=[True, False])
    return ordered[ordered.accuracy_mean > ordered.accuracy_mean.cummax().shift(fill_value=-1.0)]


def pareto(summary: pd.DataFrame, signal: set[str] | None = None):
    """One panel per task: each method's accuracy (mean ± std over seeds) at its trainable parameters (log axis);
    the majority-class control as a horizontal line; a task without signal says so in its title."""
    plt = pyplot()
    tasks = list(dict.fromkeys(summary.task))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 4.2), squeeze=False)
    colors = {m: f"C{i % 10}" for i, m in enumerate(dict.fromkeys(summary.method))}
    for ax, task in zip(axes[0], tasks):
        rows = summary[summary.task == task]
        control = rows[rows.trainable_params == 0]
        rows = rows[rows.trainable_params > 0]
        for r in control.itertuples():
            ax.axhline(100 * r.accuracy_mean, color="grey", ls=":", lw=1.2, label=f"{r.method} class")
        for r in rows.itertuples():
            ax.errorbar(r.trainable_params, 100 * r.accuracy_mean, yerr=100 * np.nan_to_num(r.accuracy_std),
                        fmt="o", capsize=3, color=colors[r.method], label=r.method)
        best = front(rows)
        ax.plot(best.trainable_params, 100 * best.accuracy_mean, "k--", lw=1, drawstyle="steps-post", label="Pareto front")
        ax.scatter(best.trainable_params, 100 * best.accuracy_mean, s=160, facecolors="none", edgecolors="k")
        ax.set_xscale("log")
        quiet = signal is not None and task not in signal
        ax.set(title=f"{task} (no signal at this scale)" if quiet else task, xlabel="trainable parameters", ylabel="accuracy % (evaluation split)")
        ax.grid(True, alpha=0.25)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig
