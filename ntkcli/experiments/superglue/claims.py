"""The report section of `ntk superglue`: Table 2 at MiniLM scale in both views (the step chosen on held-out
train; the paper's one step), with its controls, and the paper's three comparisons as paired bootstrap verdicts.

A task counts only where the table can tell methods apart there: full fine-tuning or LoRA must beat the
majority-class control with a 95% interval above 0 (the learnability floor). A task below the floor is
"no signal at this scale": shown, but left out of the verdicts and the averages.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...claims import INCONCLUSIVE, NO_SIGNAL, REFUTED, REPRODUCED, Claim, Section
from ...runs import Run
from ..finetune.claims import TABLE2, TASKS as PAPER_TASKS
from .stats import difference, REPRODUCED as ABOVE, REFUTED as BELOW, INCONCLUSIVE as SPANS
from .recipe import CONTROL

COMMAND, TITLE = "superglue", "Table 2 at MiniLM scale (paper 1, §5, on real SuperGLUE)"
# the paper's comparisons: (what, method a, method b); a − b > 0 is the claim
COMPARISONS = (("P-Tuning v2 rises with m (m=100 − m=1)", "ptuning-v2 m=100", "ptuning-v2 m=1"),
               ("NTK-Attention ≥ P-Tuning v2 m=100", "ntk", "ptuning-v2 m=100"),
               ("NTK-Attention ≥ LoRA r=8", "ntk", "lora r=8"))
FLOOR = ("fft", "lora")  # the kinds whose win over the majority class shows that a task is learnable at this scale
VERDICT = {ABOVE: REPRODUCED, BELOW: REFUTED, SPANS: INCONCLUSIVE}
EXTRA = (("cb", "f1_macro", "CB F1"), ("multirc", "f1a", "MultiRC F1a"), ("multirc", "em", "MultiRC EM"))


def _paper(method: str, task: str | None = None) -> float | None:
    """The paper's ChatGLM3-6B number for a method (its average, or one task's; None where Table 2 has none)."""
    row = TABLE2.get(method)
    if row is None or (task is not None and task not in PAPER_TASKS):
        return None
    return row[-1] if task is None else row[PAPER_TASKS.index(task)]


def table2(summary: pd.DataFrame, view: str, signal: set[str] | None = None) -> pd.DataFrame:
    """Methods × tasks: accuracy % mean ± std over seeds (the paper's ChatGLM3-6B value in brackets), the average
    over the tasks with signal (all tasks when `signal` is None), the official metrics besides accuracy, trainable
    parameters and training speed. A task below the learnability floor is marked "no signal"."""
    rows = summary[summary.view == view]
    tasks = list(dict.fromkeys(rows.task))
    counted = [t for t in tasks if signal is None or t in signal]
    out = []
    for method, grp in rows.groupby("method", sort=False):
        by = grp.set_index("task")
        line = {"method": method}
        for t in tasks:
            paper = _paper(method, t)
            name = t if signal is None or t in signal else f"{t} (no signal)"
            line[name] = f"{100 * by.accuracy_mean[t]:.1f} ± {100 * np.nan_to_num(by.accuracy_std[t]):.1f}" + \
                ("" if paper is None else f" ({paper:.1f})")
        line["avg"] = (f"{100 * by.accuracy_mean[counted].mean():.1f}" if counted else "–") + \
            ("" if _paper(method) is None else f" ({_paper(method):.1f})")
        for t, metric, name in EXTRA:
            if t in tasks:
                line[name] = f"{100 * by.loc[t, f'{metric}_mean']:.1f}"
        line["trainable params"] = f"{int(by.trainable_params.max()):,}"
        line["train ex/s"] = "–" if method == CONTROL else f"{by.examples_per_s.mean():.0f}"
        out.append(line)
    return pd.DataFrame(out)


def chosen(summary: pd.DataFrame) -> pd.DataFrame:
    """Methods × tasks: the learning rate (and variant) the selection chose."""
    rows = summary[(summary.view == "chosen") & (summary.method != CONTROL)]
    cell = [f"{lr:g}" + ("" if v == "default" else f" ({v})") for lr, v in zip(rows.lr, rows.variant)]
    return rows.assign(cell=cell).pivot(index="method", columns="task", values="cell").loc[
        list(dict.fromkeys(rows.method)), list(dict.fromkeys(rows.task))].reset_index()


def _scores(predictions: pd.DataFrame, task: str, method: str, variant: str, lr: float):
    """[seeds, examples] right (1) / wrong (0) of one (task, method) at one point, the examples' groups, the seeds."""
    mine = predictions[(predictions.task == task) & (predictions.method == method) &
                       (predictions.variant == variant) & np.isclose(predictions.lr, lr)]
    table = mine.assign(right=(mine.prediction == mine.label).astype(float)).pivot_table(
        index="seed", columns="row", values="right")
    groups = mine.drop_duplicates("row").set_index("row").group.loc[table.columns]
    return table.to_numpy(), groups.to_numpy(), table.index.to_numpy()


def _pair(predictions: pd.DataFrame, points: pd.DataFrame, task: str, a: str, b: str):
    """(a's scores, b's scores, groups) on the seeds both have."""
    (sa, groups, seeds_a), (sb, _, seeds_b) = (
        _scores(predictions, task, m, points.loc[(task, m), "variant"], points.loc[(task, m), "lr"]) for m in (a, b))
    common = np.intersect1d(seeds_a, seeds_b)
    return sa[np.isin(seeds_a, common)], sb[np.isin(seeds_b, common)], groups


def floor(summary: pd.DataFrame, predictions: pd.DataFrame, replicates: int, seed: int) -> pd.DataFrame:
    """The learnability floor, per task: each fft and LoRA method (chosen step) minus the majority control, in
    accuracy points with its 95% interval; `signal` when the interval lies above 0."""
    rows = summary[summary.view == "chosen"]
    points = rows.set_index(["task", "method"])
    out = []
    for task in dict.fromkeys(rows.task):
        if (task, CONTROL) not in points.index:
            continue
        for method in rows[(rows.task == task) & rows.kind.isin(FLOOR)].method:
            d = difference([_pair(predictions, points, task, method, CONTROL)], replicates, seed)
            out.append({"task": task, "method": method, "difference": 100 * d.mean, "low": 100 * d.low,
                        "high": 100 * d.high, "signal": d.low > 0})
    return pd.DataFrame(out, columns=["task", "method", "difference", "low", "high", "signal"])


def signal_tasks(floors: pd.DataFrame) -> set[str]:
    """The tasks where fft or LoRA clears the floor."""
    return set(floors[floors.signal.astype(bool)].task)


def differences(summary: pd.DataFrame, predictions: pd.DataFrame, replicates: int, seed: int,
                tasks: set[str]) -> pd.DataFrame:
    """Every comparison, per task and averaged over tasks (only `tasks`, those with signal), in both views: a − b in
    accuracy points with its 95% bootstrap interval (over evaluation examples and seeds) and verdict."""
    out = []
    for view, rows in summary.groupby("view", sort=False):
        points = rows.set_index(["task", "method"])
        counted = [t for t in dict.fromkeys(rows.task) if t in tasks]
        for what, a, b in COMPARISONS:
            if not counted or not {(t, m) for t in counted for m in (a, b)} <= set(points.index):
                continue
            pairs = {t: _pair(predictions, points, t, a, b) for t in counted}
            for name, chosen_tasks in [*((t, [t]) for t in counted), ("average", counted)]:
                d = difference([pairs[t] for t in chosen_tasks], replicates, seed)
                out.append({"view": view, "comparison": what, "task": name, "difference": 100 * d.mean,
                            "low": 100 * d.low, "high": 100 * d.high, "verdict": d.verdict})
    return pd.DataFrame(out, columns=["view", "comparison", "task", "difference", "low", "high", "verdict"])


def _claims(diffs: pd.DataFrame, source: str, measured_tasks: bool) -> list[Claim]:
    claims = []
    for what, a, b in COMPARISONS:
        paper = _paper(a) - _paper(b)
        claim = Claim(f"Table 2: {what}, average over tasks with signal (MiniLM-L6, step chosen on held-out train)",
                      f"{paper:+.2f} points (ChatGLM3-6B, 5 tasks)")
        got = diffs[(diffs.view == "chosen") & (diffs.comparison == what) & (diffs.task == "average")]
        if len(got):
            g = got.iloc[0]
            claim.measured = f"{g.difference:+.2f} [{g.low:+.2f}, {g.high:+.2f}]"
            claim.source, claim.verdict = source, VERDICT[g.verdict]
        elif measured_tasks:
            claim.measured, claim.source, claim.verdict = "no task clears the floor", source, NO_SIGNAL
        claims.append(claim)
    return claims


def _shown(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Differences with their intervals as text."""
    return frame.assign(**{"a − b (points)": frame.difference.map("{:+.2f}".format),
                           "95% interval": [f"[{lo:+.2f}, {hi:+.2f}]" for lo, hi in zip(frame.low, frame.high)]})[
        [*columns, "a − b (points)", "95% interval"]]


def assess(summary: pd.DataFrame, predictions: pd.DataFrame, replicates: int, seed: int
           ) -> tuple[pd.DataFrame, set[str], pd.DataFrame]:
    """(the floor per task and method, the tasks with signal, the comparisons over those tasks)."""
    floors = floor(summary, predictions, replicates, seed)
    signal = signal_tasks(floors)
    return floors, signal, differences(summary, predictions, replicates, seed, signal)


def _section(section: Section, run: Run, summary: pd.DataFrame, predictions: pd.DataFrame) -> None:
    config = run.config() or {}
    floors, signal, diffs = assess(summary, predictions, int(config.get("selection", {}).get("bootstrap", 2000)),
                                   int(config.get("seed", 0)))
    section.claims += _claims(diffs, run.source, bool(len(floors)))
    for view in ("chosen", "paper"):
        section.tables.append((f"{run.source}: accuracy %, {view} step (paper's ChatGLM3-6B value in brackets; "
                               "avg over the tasks with signal)", table2(summary, view, signal)))
    section.tables.append((f"{run.source}: the step (and variant) chosen on held-out train", chosen(summary)))
    if len(floors):
        section.tables.append((f"{run.source}: learnability floor, method − majority class (chosen step)",
                               _shown(floors.assign(signal=floors.signal.map({True: "yes", False: "no"})),
                                      ["task", "method", "signal"])))
    quiet = sorted(set(summary.task) - signal)
    if quiet:
        section.notes.append(f"`{run.source}`: no signal at this scale on {', '.join(quiet)} (neither fft nor LoRA "
                             "beats the majority class with a 95% interval above 0): shown, left out of the verdicts "
                             "and averages")
    if len(diffs):
        section.tables.append((f"{run.source}: paired differences (bootstrap over examples and seeds)",
                               _shown(diffs, ["view", "comparison", "task"]).assign(verdict=diffs.verdict)))


def report(runs: list[Run]) -> Section:
    """Per run: Table 2 in both views, the floor, the per-task differences, the three claims (chosen view, average)."""
    section = Section(COMMAND, TITLE)
    for run, summary in section.readable(runs, "summary.csv", ("accuracy_mean", "trainable_params", "lr"),
                                         ("view", "task", "method", "kind", "variant"), figure="table2.png"):
        with section.reading(run):
            predictions = run.csv("predictions.csv", ("prediction", "label", "seed", "lr", "row"))
            if predictions is None:
                section.skip(run, "has no readable predictions.csv")
                continue
            _section(section, run, summary, predictions)
    if not section.claims:
        section.claims = [Claim(f"Table 2: {what}, average over tasks (MiniLM-L6)", f"{_paper(a) - _paper(b):+.2f} points")
                          for what, a, b in COMPARISONS]
    section.notes.append("Verdicts: reproduced when the 95% interval of a − b lies above 0, refuted when below, "
                         "inconclusive when it contains 0, each over the tasks where fft or LoRA beats the majority "
                         "class; a 22M-parameter encoder on small splits, not ChatGLM3-6B.")
    return section
