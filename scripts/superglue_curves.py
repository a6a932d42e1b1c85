"""Learning curves that size the Table 2 suite: for every task of a superglue recipe, fft, LoRA and the head alone
trained on the selection split (train minus the held-out share), at the full size and at part of it, scored on
the held-out share after every epoch. The evaluation split is never read. Resumable: finished curves are kept.

Run: .venv/bin/python scripts/superglue_curves.py recipes/superglue_minilm.yaml [--set key=value ...]
      [--rows 0.5,1] [--kinds fft,lora,head] [--out outputs] [--plot-only]
Writes <out>/superglue-curves/<recipe>/curves.csv (task, method, precision, rows, epoch, accuracy, seconds) and
curves.png.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ntkcli.experiments.finetune import Inputs, train_method  # noqa: E402
from ntkcli.experiments.superglue import OFFICIAL, Prepared, Split, prepare  # noqa: E402
from ntkcli.experiments.superglue.recipe import SuperGlueRecipe  # noqa: E402
from ntkcli.experiments.superglue.tasks import TASKS, carve  # noqa: E402
from ntkcli.figures import pyplot  # noqa: E402
from ntkcli.recipes import load_recipe, parse_overrides  # noqa: E402
from ntkcli.runs import Results, Run, tune_malloc  # noqa: E402

KEYS = ["task", "method", "precision", "rows"]


def subset(split: Split, n: int, seed: int) -> Split:
    """About n rows of a split (whole groups, stratified by label), seeded; all of it when n covers it."""
    if n >= len(split.labels):
        return split
    keep = carve(split.labels, split.groups, n, seed)[1]
    return Split(split.rows.select(keep), split.labels[keep], split.groups[keep], split.index[keep])


def curve(cfg: SuperGlueRecipe, prep: Prepared, task: str, method, fit: Split) -> pd.DataFrame:
    """One method's held-out accuracy after every epoch, trained on `fit`, at the middle step of its grid."""
    lrs = cfg.lrs(method)
    inputs = Inputs(prep.device, fit.rows, prep.tasks[task].folds[OFFICIAL].held.rows, prep.collator)
    lr = lrs[len(lrs) // 2]
    rows = train_method(cfg, method.candidates()[0], cfg.seeds[0], lr, inputs, lambda n=1: None,
                        num_labels=len(TASKS[task].labels), epochs=cfg.epochs(task)).rows
    return rows[["epoch", "accuracy", "train_seconds", "lr"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--rows", default="0.5,1", help="shares of the selection split to train on")
    parser.add_argument("--kinds", default="fft,lora,head", help="the methods of the recipe to trace, by kind")
    parser.add_argument("--out", default="outputs")
    parser.add_argument("--plot-only", action="store_true", help="redraw curves.png from curves.csv, train nothing")
    args = parser.parse_args()
    tune_malloc()
    cfg = load_recipe(SuperGlueRecipe, args.recipe, parse_overrides(args.sets))
    prep = prepare(cfg)
    folder = Run(Path(args.out) / "superglue-curves" / cfg.name)
    folder.dir.mkdir(parents=True, exist_ok=True)
    results = Results(folder, KEYS, name="curves.csv")
    kinds = args.kinds.split(",")
    missing = [k for k in kinds if k not in {m.kind for m in cfg.methods}]
    if missing:
        raise SystemExit(f"the recipe has no {missing[0]} method")
    methods = [next(m for m in cfg.methods if m.kind == kind) for kind in kinds]  # the first of each kind
    for task in [] if args.plot_only else cfg.data.tasks:
        fit = prep.tasks[task].folds[OFFICIAL].fit
        for share in map(float, args.rows.split(",")):
            part = subset(fit, max(2, round(share * len(fit.labels))), cfg.seed)
            for method in methods:
                point = (task, method.label, cfg.train.precision, len(part.labels))
                if point in results.done:
                    continue
                print(f"{task}: {method.label} on {len(part.labels)} rows ({cfg.epochs(task)} epochs)", flush=True)
                results.add(curve(cfg, prep, task, method, part).assign(**dict(zip(KEYS, point))))
    table = results.table()
    folder.save_figure("curves.png", figure(table[table.task.isin(cfg.data.tasks)], prep))
    print(f"wrote {folder.dir}/curves.csv and curves.png")


def figure(table: pd.DataFrame, prep: Prepared):
    """One panel per task: held-out accuracy against epochs, a line per (method, rows), the majority class dotted."""
    plt = pyplot()
    tasks = list(dict.fromkeys(table.task))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        fold = prep.tasks[task].folds[OFFICIAL]
        val = fold.held.labels
        ax.axhline(100 * np.mean(val == np.bincount(fold.fit.labels).argmax()), color="grey", ls=":",
                   label="majority class")
        for i, ((method, rows), g) in enumerate(table[table.task == task].groupby(["method", "rows"], sort=False)):
            ax.plot(g.epoch, 100 * g.accuracy, "o-", ms=3, color=f"C{list(dict.fromkeys(table.method)).index(method)}",
                    alpha=0.45 + 0.55 * (rows == table[table.task == task].rows.max()), label=f"{method}, {rows} rows")
        ax.set(title=task, xlabel="epoch", ylabel="accuracy % (held-out train)")
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
