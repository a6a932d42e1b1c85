"""The experiments' figures, one module each. pyplot is imported on first use, with the Agg backend set
once: figures are written to files, never shown."""

from __future__ import annotations

import pandas as pd


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log_log(ax) -> None:
    """Log axes with a light grid and no minor tick labels."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.25)


def legend(ax, **kw) -> None:
    """A legend, where something on the axes is labelled."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def errorbars(ax, df: pd.DataFrame, x: str, y: str = "excess_risk", **kw) -> None:
    """Mean ± std over seeds of `y` at each `x`."""
    g = df.groupby(x)[y].agg(["mean", "std"]).reset_index()
    ax.errorbar(g[x], g["mean"], yerr=g["std"].fillna(0), fmt="o", capsize=3, **kw)
