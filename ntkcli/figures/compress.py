"""`ntk compress` as a figure: the compressed context's error against m per feature map, through the layers, its
embedding's cosine to exact and retrieval, with none (no context) as the reference."""

from __future__ import annotations

import pandas as pd

from . import legend, log_log, pyplot


def _band(ax, rows: pd.DataFrame, name: str, **kw) -> None:
    ax.plot(rows.m, rows[f"{name}_mean"], marker="o", ms=3, **kw)
    ax.fill_between(rows.m, rows[f"{name}_low"], rows[f"{name}_high"], alpha=0.15, color=kw.get("color"))


def figure(summary: pd.DataFrame):
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    methods = list(dict.fromkeys(summary.method))
    top = summary.m.max()
    for i, method in enumerate(methods):
        rows = summary[summary.method == method].sort_values("m")
        style = {"color": "grey", "ls": "--"} if method == "none" else {"color": f"C{i % 10}"}
        _band(axes[0], rows, "error", label=method, **style)
        last = rows[rows.m == top].iloc[0]
        layers = sorted(c for c in rows.columns if c.startswith("mean_error_layer_"))
        axes[1].plot(range(1, len(layers) + 1), [last[c] for c in layers], marker="o", ms=3, label=method, **style)
        _band(axes[2], rows, "cosine", label=method, **style)
        _band(axes[3], rows, "hit", label=method, **style)
    log_log(axes[0])
    axes[0].set(title="question's last hidden states vs exact", xlabel="context length m (tokens)",
                ylabel="relative error (95% interval)")
    axes[1].set(title=f"through the layers at m = {top:.0f}", xlabel="layer", ylabel="relative error", yscale="log")
    axes[2].axhline(1.0, color="k", lw=0.8, label="exact")
    axes[2].set(title="sentence embedding", xlabel="context length m (tokens)", ylabel="cosine to exact", xscale="log")
    axes[3].set(title="retrieval among the question's candidate passages", xlabel="context length m (tokens)",
                ylabel="hit@1 (exact: 1)", xscale="log", ylim=(-0.02, 1.02))
    for ax in axes:
        ax.grid(True, alpha=0.25)
    legend(axes[0], fontsize=7)
    fig.tight_layout()
    return fig
