"""`ntk finetune`'s NTK-Attention runs as a figure: the prefix's share of attention mass per layer after every epoch
(mean over heads and seeds), one panel per ntk method, and the size of its (Z, k)."""

from __future__ import annotations

import pandas as pd

from . import pyplot


def shares(table: pd.DataFrame):
    """table: shares.csv (method, seed, epoch, layer, head, share, z_norm, k_norm, log_scale)."""
    plt = pyplot()
    methods = list(dict.fromkeys(table.method))
    fig, axes = plt.subplots(2, len(methods), figsize=(4.2 * len(methods), 6.4), squeeze=False, sharex=True)
    for col, method in enumerate(methods):
        rows = table[table.method == method]
        mean = rows.groupby(["layer", "epoch"])[["share", "z_norm", "k_norm"]].mean().reset_index()
        for i, (layer, g) in enumerate(mean.groupby("layer")):
            axes[0][col].plot(g.epoch, 100 * g.share, marker="o", ms=3, color=f"C{i % 10}", label=f"layer {layer}")
            axes[1][col].plot(g.epoch, g.k_norm, marker="o", ms=3, color=f"C{i % 10}")
        axes[0][col].axhline(0, color="k", lw=0.6)
        axes[0][col].set(title=method, ylabel="prefix's share of attention mass (%)")
        axes[1][col].set(xlabel="epoch", ylabel="|k| per head (mean)")
        for ax in axes[:, col]:
            ax.grid(True, alpha=0.25)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig
