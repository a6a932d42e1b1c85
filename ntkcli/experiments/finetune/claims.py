"""The report section of `ntk finetune`: paper 1's Tables 1–2 against the runs of the paper's recipes, and
every other run (CPU stand-ins) as a table of its own."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...claims import Claim, Section, verdict
from ...runs import Run

COMMAND, TITLE = "finetune", "NTK-Attention as a fine-tuning method (paper 1, §5, Tables 1–2)"
# Table 1 and Table 2 of paper 1 (accuracy %, mean over its seeds), by recipe name and method label
TABLE1 = {("vit_cifar100", "FFT-ViT"): 85.15, ("vit_cifar100", "NTK-ViT"): 91.69,
          ("vit_food101", "FFT-ViT"): 84.76, ("vit_food101", "NTK-ViT"): 89.70}
TASKS = ("boolq", "cb", "copa", "multirc", "rte")
TABLE2 = {"ptuning-v2 m=1": (65.69, 67.06, 52.00, 53.59, 65.97, 60.86),
          "ptuning-v2 m=10": (66.67, 74.07, 54.00, 54.17, 66.55, 63.10),
          "ptuning-v2 m=100": (69.42, 74.54, 64.50, 61.62, 76.77, 69.37),
          "lora r=8": (76.52, 90.23, 86.50, 65.09, 87.76, 81.24),
          "ntk": (75.06, 96.04, 88.00, 65.85, 86.59, 82.31)}
TOLERANCE = 3.0  # accuracy points within which a table entry counts as reproduced


def accuracy(run: Run) -> dict[str, float]:
    """Final-epoch accuracy % per method of one run ({} when its summary.csv is unreadable)."""
    summary = run.csv("summary.csv", ("accuracy_mean",))
    if summary is None or "method" not in summary:
        return {}
    return dict(zip(summary.method.astype(str), 100 * summary.accuracy_mean))


def _table1(runs: dict[str, Run]) -> list[Claim]:
    claims = []
    for (recipe, method), paper in TABLE1.items():
        run = runs.get(recipe)
        got = accuracy(run).get(method) if run else None
        claim = Claim(f"Table 1: {method} on {'CIFAR-100' if 'cifar' in recipe else 'Food-101'}", f"{paper:.2f}%")
        if got is not None:
            claim.measured, claim.source, claim.verdict = f"{got:.2f}%", run.source, verdict(abs(got - paper) <= TOLERANCE)
        claims.append(claim)
    return claims


def _table2(runs: dict[str, Run]) -> list[Claim]:
    claims = []
    for method, row in TABLE2.items():
        measured = {t: accuracy(runs[f"chatglm_{t}"]).get(method) for t in TASKS if f"chatglm_{t}" in runs}
        measured = {t: v for t, v in measured.items() if v is not None}
        claim = Claim(f"Table 2: ChatGLM3-6B + {method} (BoolQ / CB / COPA / MultiRC / RTE, average)",
                      " / ".join(f"{v:.2f}" for v in row[:5]) + f" (avg {row[5]:.2f})")
        if measured:
            claim.measured = " / ".join(f"{measured[t]:.2f}" if t in measured else "–" for t in TASKS) + \
                (f" (avg {np.mean(list(measured.values())):.2f})" if len(measured) == len(TASKS) else "")
            claim.source = ", ".join(runs[f"chatglm_{t}"].source for t in measured)
            close = all(abs(measured[t] - row[TASKS.index(t)]) <= TOLERANCE for t in measured)
            claim.verdict = verdict(close) + ("" if len(measured) == len(TASKS) else f" ({len(measured)}/5 tasks run)")
        claims.append(claim)
    return claims


def _stand_in(run: Run) -> pd.DataFrame | None:
    """A run that is no paper setting, as a table."""
    summary = run.csv("summary.csv", ("accuracy_mean", "accuracy_std", "trainable_params", "trainable_pct",
                                      "train_seconds"))
    if summary is None or "method" not in summary:
        return None
    return pd.DataFrame({"method": summary.method,
                         "accuracy %": [f"{100 * m:.2f} ± {100 * d:.2f}"
                                        for m, d in zip(summary.accuracy_mean, summary.accuracy_std)],
                         "trainable params": summary.trainable_params.map("{:,}".format),
                         "trainable %": summary.trainable_pct.map("{:.2f}".format),
                         "train s": summary.train_seconds.map("{:.1f}".format)})


def report(runs: list[Run]) -> Section:
    """Tables 1–2 claims from the paper recipes' runs (by recipe name), other runs as tables."""
    section = Section(COMMAND, TITLE)
    readable = {}
    for run in runs:
        if accuracy(run):
            readable[run.name] = run
        else:
            section.skip(run, "has no readable summary.csv")
    section.claims = _table1(readable) + _table2(readable)
    paper = {r for r, _ in TABLE1} | {f"chatglm_{t}" for t in TASKS}
    for name, run in readable.items():
        table = None if name in paper or name.startswith("chatglm_") else _stand_in(run)
        if table is not None:
            section.tables.append((f"Not a paper setting (a CPU stand-in): {run.source}", table))
    section.notes.append(f"A table entry counts as reproduced within ±{TOLERANCE:g} accuracy points of the paper.")
    return section
