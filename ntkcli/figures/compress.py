"""`ntk compress` as figures: the compressed context's error against m per feature map, through the layers, its
embedding's cosine to exact and retrieval, with none (no context) as the reference (compress.png); and quality
against state bytes at the largest m for every method, compressed states and exact caches of their bytes, one
column per depth of the question's passage (frontier.png)."""

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


def frontier(summary: pd.DataFrame):
    """Cosine to exact (top) and retrieval hit@1 (bottom) against the state's bytes at the largest m: a marker per
    compressed method, a line per cache kind over the budgets, none and exact as references; a column per depth."""
    plt = pyplot()
    top = summary[summary.m == summary.m.max()]
    depths = list(dict.fromkeys(top.depth))
    fig, axes = plt.subplots(2, len(depths), figsize=(5.2 * len(depths), 7.5), squeeze=False, sharey="row")
    kinds = [k for k in dict.fromkeys(top.cache) if k]
    for col, depth in enumerate(depths):
        rows = top[top.depth == depth]
        for r, name in enumerate(("cosine", "hit")):
            ax = axes[r, col]
            for i, kind in enumerate(kinds):
                line = rows[rows.cache == kind].sort_values("state_bytes")
                ax.errorbar(line.state_bytes, line[f"{name}_mean"], yerr=[line[f"{name}_mean"] - line[f"{name}_low"],
                            line[f"{name}_high"] - line[f"{name}_mean"]], marker="s", ms=3, lw=1, capsize=2,
                            color=f"C{i}", label=f"exact cache: {kind}")
            own = rows[(rows.cache == "") & (rows.method != "none")]
            for j, (_, row) in enumerate(own.iterrows()):
                ax.errorbar([row.state_bytes], [row[f"{name}_mean"]], yerr=[[row[f"{name}_mean"] - row[f"{name}_low"]],
                            [row[f"{name}_high"] - row[f"{name}_mean"]]], marker="*ovD^<>P"[j % 8],
                            ms=9, ls="none", color="k" if row.method.startswith("learned") else f"C{len(kinds) + j}",
                            label=f"Eq. (4): {row.method}")
            none = rows[rows.method == "none"]
            if len(none):
                ax.axhline(none[f"{name}_mean"].iloc[0], color="grey", ls="--", lw=1, label="none")
            ax.axhline(1.0, color="k", lw=0.8, label="exact")
            ax.axvline(rows.exact_bytes.iloc[0], color="k", lw=0.5, ls=":")
            ax.set(xscale="log", xlabel="state bytes (dotted: the exact context's)",
                   ylabel="cosine to exact" if name == "cosine" else "retrieval hit@1",
                   title=f"m = {top.m.iloc[0]:.0f}, passage at depth {depth:g}" if r == 0 else None)
            ax.grid(True, alpha=0.25)
    legend(axes[0, 0], fontsize=7)
    fig.tight_layout()
    return fig
