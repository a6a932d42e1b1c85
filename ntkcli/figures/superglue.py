"""Table 2 at small scale as a figure: accuracy against each cost (trainable parameters, training time) per task,
the Pareto front marked."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from . import pyplot


COSTS = {"trainable_params": "trainable parameters", "train_seconds": "training seconds per run"}


def front(points: pd.DataFrame, cost: str = "trainable_params") -> pd.DataFrame:
    """The Pareto front: the methods no other beats at the same cost or less."""
    ordered = points.sort_values([cost, "accuracy_mean"], ascending=[True, False])
    return ordered[ordered.accuracy_mean > ordered.accuracy_mean.cummax().shift(fill_value=-1.0)]


def pareto(summary: pd.DataFrame, signal: set[str] | None = None):
    """A panel per task and cost: each method's accuracy (mean ± std over runs) at its trainable parameters (top)
    and its training time (bottom), log axes; the majority-class control as a horizontal line; a task too small to
    tell says so in its title."""
    plt = pyplot()
    tasks = list(dict.fromkeys(summary.task))
    costs = [c for c in COSTS if c in summary and summary[c].notna().any()]
    fig, axes = plt.subplots(len(costs), len(tasks), figsize=(4.6 * len(tasks), 4.2 * len(costs)), squeeze=False)
    colors = {m: f"C{i % 10}" for i, m in enumerate(dict.fromkeys(summary.method))}
    for row, cost in enumerate(costs):
        for ax, task in zip(axes[row], tasks):
            _panel(ax, summary[summary.task == task], cost, colors, signal is not None and task not in signal)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3 * len(tasks), 6), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.12 / len(costs), 1, 1))
    return fig


def _panel(ax, rows: pd.DataFrame, cost: str, colors: dict, quiet: bool) -> None:
    """One task's methods at one cost, the front marked."""
    task = rows.task.iloc[0]
    control = rows[rows.trainable_params == 0]
    rows = rows[rows.trainable_params > 0]
    for r in control.itertuples():
        ax.axhline(100 * r.accuracy_mean, color="grey", ls=":", lw=1.2, label=f"{r.method} class")
    for r in rows.itertuples():
        ax.errorbar(getattr(r, cost), 100 * r.accuracy_mean, yerr=100 * np.nan_to_num(r.accuracy_std),
                    fmt="o", capsize=3, color=colors[r.method], label=r.method)
    best = front(rows, cost)
    ax.plot(best[cost], 100 * best.accuracy_mean, "k--", lw=1, drawstyle="steps-post", label="Pareto front")
    ax.scatter(best[cost], 100 * best.accuracy_mean, s=160, facecolors="none", edgecolors="k")
    ax.set_xscale("log")
    low, high = ax.get_xlim()  # labels at 1-2-5 over a narrow range, at decades over a wide one (no overlap)
    ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5) if high / low < 100 else (1,)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(title=f"{task} (too small to tell)" if quiet else task, xlabel=COSTS[cost],
           ylabel="accuracy % (evaluation split)")
    ax.grid(True, alpha=0.25)
