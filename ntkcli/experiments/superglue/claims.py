"""The report section of `ntk superglue`: Table 2 at MiniLM scale in both views (the step chosen on held-out
train; the paper's one step), with its controls, and the paper's comparisons as paired bootstrap verdicts.

Two rules decide what is compared, and both read only the selection split (each fold's held-out part of its own
train, pooled over the folds of an evaluation), never an evaluation row:
- the floor: a task has signal where full fine-tuning (which no claim compares) beats the majority class there
  with a 95% interval above 0;
- comparability: a comparison counts only where both of its methods beat the majority class there the same way;
  otherwise it is "not comparable at this scale: <method> did not learn".
The verdicts are per task, then averaged over the paper's Table 2 tasks that pass both rules; WiC and WSC are
"beyond Table 2" and in no average. "NTK-Attention matches LoRA" is judged as non-inferiority with the recipe's
margin δ, beside the superiority test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...claims import INCONCLUSIVE, NO_SIGNAL, NOT_COMPARABLE, REFUTED, REPRODUCED, Claim, Section
from ...runs import Run
from ..finetune.claims import TABLE2, TASKS as PAPER_TASKS
from .stats import (INCONCLUSIVE as SPANS, INFERIOR, NONINFERIOR, REFUTED as BELOW, REPRODUCED as ABOVE,
                    Difference, difference, noninferiority)
from .recipe import CONTROL

COMMAND, TITLE = "superglue", "Table 2 at MiniLM scale (paper 1, §5, on real SuperGLUE)"
# the paper's comparisons: (what, method a, method b); a − b > 0 is the claim, except non-inferiority: a ≥ b − δ
NONINFERIORITY = "NTK-Attention matches LoRA r=8 (non-inferiority)"
COMPARISONS = (("P-Tuning v2 rises with m (m=100 − m=1)", "ptuning-v2 m=100", "ptuning-v2 m=1"),
               ("NTK-Attention ≥ P-Tuning v2 m=100", "ntk", "ptuning-v2 m=100"),
               ("NTK-Attention ≥ LoRA r=8", "ntk", "lora r=8"),
               (NONINFERIORITY, "ntk", "lora r=8"))
FLOOR = "fft"  # the kind whose win over the majority class shows that a task is learnable at this scale
HEADLINE = "headline"  # the evaluation of the averages and claims: each task's k folds where it has them, else val
VERDICT = {ABOVE: REPRODUCED, BELOW: REFUTED, SPANS: INCONCLUSIVE, NONINFERIOR: REPRODUCED, INFERIOR: REFUTED}
EXTRA = (("cb", "f1_macro", "CB F1"), ("multirc", "f1a", "MultiRC F1a"), ("multirc", "em", "MultiRC EM"))
EVALUATIONS = {"val": "official validation split", "cv": "k-fold cross-validation over train ∪ validation"}


def _paper(method: str, task: str | None = None) -> float | None:
    """The paper's ChatGLM3-6B number for a method (its average, or one task's; None where Table 2 has none)."""
    row = TABLE2.get(method)
    if row is None or (task is not None and task not in PAPER_TASKS):
        return None
    return row[-1] if task is None else row[PAPER_TASKS.index(task)]


def headline(summary: pd.DataFrame, view: str) -> pd.DataFrame:
    """The rows of one view in each task's headline evaluation: its k folds where it has them, else val."""
    rows = summary[summary.view == view]
    best = rows.groupby("task", sort=False).evaluation.transform(lambda e: "cv" if (e == "cv").any() else "val")
    return rows[rows.evaluation == best]


def _column(task: str, rows: pd.DataFrame, signal: set[str] | None) -> str:
    name = task + ("" if task in PAPER_TASKS else " (beyond Table 2)")
    if rows.evaluation.iloc[0] == "cv":
        name += f" ({rows.runs.max()}-fold CV, {rows.scored_rows.max()} rows)"
    return name if signal is None or task in signal else f"{name} (no signal)"


def table2(summary: pd.DataFrame, view: str, signal: set[str] | None = None, evaluation: str = HEADLINE
           ) -> pd.DataFrame:
    """Methods × tasks: accuracy % mean ± spread (over seeds, or folds), the paper's ChatGLM3-6B value in brackets,
    the average over the Table 2 tasks with signal, the official metrics besides accuracy, trainable parameters
    and training speed. Table 2 tasks first; a task below the floor is marked "no signal"."""
    rows = headline(summary, view) if evaluation == HEADLINE else \
        summary[(summary.view == view) & (summary.evaluation == evaluation)]
    tasks = sorted(dict.fromkeys(rows.task), key=lambda t: t not in PAPER_TASKS)
    counted = [t for t in tasks if t in PAPER_TASKS and (signal is None or t in signal)]
    names = {t: _column(t, rows[rows.task == t], signal) for t in tasks}
    out = []
    for method, grp in rows.groupby("method", sort=False):
        by = grp.set_index("task")
        line = {"method": method}
        for t in tasks:
            paper = _paper(method, t)
            line[names[t]] = "–" if t not in by.index else \
                f"{100 * by.accuracy_mean[t]:.1f} ± {100 * np.nan_to_num(by.accuracy_std[t]):.1f}" + \
                ("" if paper is None else f" ({paper:.1f})")
        done = [t for t in counted if t in by.index]
        line["avg (Table 2 tasks with signal)"] = (f"{100 * by.accuracy_mean[done].mean():.1f}" if done else "–") + \
            ("" if _paper(method) is None else f" ({_paper(method):.1f})")
        for t, metric, name in EXTRA:
            if t in by.index:
                line[name] = f"{100 * by.loc[t, f'{metric}_mean']:.1f}"
        line["trainable params"] = f"{int(by.trainable_params.max()):,}"
        line["train ex/s"] = "–" if method == CONTROL else f"{by.examples_per_s.mean():.0f}"
        out.append(line)
    return pd.DataFrame(out)


def chosen(summary: pd.DataFrame) -> pd.DataFrame:
    """Methods × (task, evaluation): the steps (and variants) the selection chose, and how many sit at their grid's
    edge."""
    rows = summary[(summary.view == "chosen") & (summary.method != CONTROL)]
    cell = [s + (f"; {e} at the grid's edge" if e else "") for s, e in zip(rows.steps, rows.edge)]
    rows = rows.assign(cell=cell, where=rows.task + " " + rows.evaluation)
    return rows.pivot(index="method", columns="where", values="cell").loc[
        list(dict.fromkeys(rows.method)), list(dict.fromkeys(rows["where"]))].reset_index()


class Judge:
    """Paired bootstrap differences between two methods' predictions, at the points of one view, on one stage's
    rows (the selection split or the evaluation rows) of one evaluation's folds."""

    def __init__(self, points: pd.DataFrame, predictions: pd.DataFrame, replicates: int, seed: int):
        self.points, self.predictions, self.replicates, self.seed = points, predictions, replicates, seed

    def scores(self, stage: str, view: str, task: str, folds: list[str], method: str):
        """[seeds × rows] right (1) / wrong (0), rows named fold:row, and each row's group; None when the method
        has no predictions there (its run failed)."""
        keys = ["task", "fold", "method", "variant", "lr"]
        at = self.points[(self.points.view == view) & (self.points.task == task) & self.points.fold.isin(folds) &
                         (self.points.method == method)][keys]
        mine = self.predictions[self.predictions.stage == stage].merge(at, on=keys)
        if mine.empty:
            return None
        mine = mine.assign(unit=mine.fold + ":" + mine.row.astype(str), right=(mine.prediction == mine.label) * 1.0)
        table = mine.pivot_table(index="seed", columns="unit", values="right")
        return table, mine.drop_duplicates("unit").set_index("unit").group

    def pair(self, stage: str, view: str, task: str, folds: list[str], a: str, b: str):
        """(a's scores, b's scores, groups) on the seeds and rows both have; None when either has none."""
        sa, sb = (self.scores(stage, view, task, folds, m) for m in (a, b))
        if sa is None or sb is None:
            return None
        seeds, units = sa[0].index.intersection(sb[0].index), sa[0].columns.intersection(sb[0].columns)
        return sa[0].loc[seeds, units].to_numpy(), sb[0].loc[seeds, units].to_numpy(), sa[1].loc[units].to_numpy()

    def difference(self, pairs: list) -> Difference:
        return difference(pairs, self.replicates, self.seed)


def floor(judge: Judge, folds: dict[tuple[str, str], list[str]], methods: pd.DataFrame) -> pd.DataFrame:
    """Every method − the majority class on the selection split, per (evaluation, view, task), in accuracy points
    with its 95% interval; `learned` when the interval lies above 0; `diverged` when the run failed (a non-finite
    loss) and so predicted nothing. Reads only the selection runs' predictions."""
    out = []
    for (evaluation, task), fs in folds.items():
        for view in ("chosen", "paper"):
            for method, kind in methods[methods.task == task][["method", "kind"]].drop_duplicates().itertuples(
                    index=False):
                pair = judge.pair("select", view, task, fs, method, CONTROL)
                d = None if pair is None else judge.difference([pair])
                out.append({"evaluation": evaluation, "view": view, "task": task, "method": method, "kind": kind,
                            "difference": np.nan if d is None else 100 * d.mean,
                            "low": np.nan if d is None else 100 * d.low, "high": np.nan if d is None else 100 * d.high,
                            "learned": d is not None and d.low > 0, "diverged": d is None})
    return pd.DataFrame(out, columns=["evaluation", "view", "task", "method", "kind", "difference", "low", "high",
                                      "learned", "diverged"])


def signal_tasks(floors: pd.DataFrame, evaluation: str, view: str) -> set[str]:
    """The tasks where full fine-tuning beats the majority class on the selection split."""
    rows = floors[(floors.evaluation == evaluation) & (floors.view == view) & (floors.kind == FLOOR)]
    return set(rows[rows.learned.astype(bool)].task)


def _status(floors: pd.DataFrame, evaluation: str, view: str, task: str, a: str, b: str) -> str | None:
    """Why a comparison is not scored (no signal, or a method that did not learn), or None when it is."""
    if task not in signal_tasks(floors, evaluation, view):
        return NO_SIGNAL
    rows = floors[(floors.evaluation == evaluation) & (floors.view == view) & (floors.task == task)]
    learned = dict(zip(rows.method, rows.learned.astype(bool)))
    diverged = dict(zip(rows.method, rows.diverged.astype(bool)))
    lost = [m + (" diverged (lr too large?)" if diverged.get(m) else " did not learn") for m in (a, b)
            if not learned.get(m, False)]
    return f"{NOT_COMPARABLE}: {' and '.join(lost)}" if lost else None


def _row(evaluation: str, view: str, what: str, task: str, d: Difference | None, status: str | None,
         margin: float) -> dict:
    verdict = status if d is None else \
        noninferiority(d, margin / 100) if what == NONINFERIORITY else d.verdict
    return {"evaluation": evaluation, "view": view, "comparison": what, "task": task,
            "difference": np.nan if d is None else 100 * d.mean, "low": np.nan if d is None else 100 * d.low,
            "high": np.nan if d is None else 100 * d.high, "verdict": verdict}


def differences(judge: Judge, folds: dict[tuple[str, str], list[str]], floors: pd.DataFrame, margin: float
                ) -> pd.DataFrame:
    """Every comparison per (evaluation, view, task), scored on the evaluation rows where both rules pass; then
    per view the average over the Table 2 tasks scored, in the official split ("val") and in each task's headline
    evaluation (its folds where it has them)."""
    tasks = list(dict.fromkeys(t for _, t in folds))
    run = set(judge.points.method)
    out, scored = [], {}
    for (evaluation, task), fs in folds.items():
        for view in ("chosen", "paper"):
            for what, a, b in (c for c in COMPARISONS if {c[1], c[2]} <= run):
                status = _status(floors, evaluation, view, task, a, b)
                pair = None if status else judge.pair("final", view, task, fs, a, b)
                if pair is not None:
                    scored[evaluation, view, what, task] = pair
                out.append(_row(evaluation, view, what, task, None if pair is None else judge.difference([pair]),
                                status or (None if pair is not None else f"{NOT_COMPARABLE}: a run failed"), margin))
    best = {t: "cv" if ("cv", t) in folds else "val" for t in tasks}
    for evaluation, which in (("val", lambda t: "val"), (HEADLINE, best.get)):
        for view in ("chosen", "paper"):
            for what, _, _ in COMPARISONS:
                pairs = [scored[key] for t in tasks if t in PAPER_TASKS
                         and (key := (which(t), view, what, t)) in scored]
                if pairs:
                    out.append(_row(evaluation, view, what, "average", judge.difference(pairs), None, margin) |
                               {"tasks": len(pairs)})
    frame = pd.DataFrame(out, columns=["evaluation", "view", "comparison", "task", "difference", "low", "high",
                                       "verdict", "tasks"])
    return frame.assign(width=frame.high - frame.low)


def assess(points: pd.DataFrame, predictions: pd.DataFrame, summary: pd.DataFrame, replicates: int, seed: int,
           margin: float) -> dict:
    """The floor (every method against the majority class on the selection split), the tasks with signal (the
    headline evaluation, chosen step) and every comparison."""
    judge = Judge(points, predictions, replicates, seed)
    fold_names = points.drop_duplicates(["task", "fold"])
    folds = {}
    for task, fold in fold_names[["task", "fold"]].itertuples(index=False):
        folds.setdefault(("val" if fold == "val" else "cv", task), []).append(fold)
    floors = floor(judge, folds, summary[summary.method != CONTROL])
    signal = {t for t in summary.task.unique()
              if t in signal_tasks(floors, "cv" if ("cv", t) in folds else "val", "chosen")}
    return {"floor": floors, "signal": signal, "differences": differences(judge, folds, floors, margin)}


VIEW_WORDS = {"chosen": "step chosen on held-out train", "paper": "the paper's step"}


def _blank(view: str, what: str, a: str, b: str, margin: float) -> Claim:
    """One comparison's claim in one view, not measured yet."""
    paper = f"{_paper(a) - _paper(b):+.2f} points (ChatGLM3-6B, 5 tasks)" + \
        (f"; margin δ = {margin:g}" if what == NONINFERIORITY else "")
    return Claim(f"Table 2: {what}, average over Table 2 tasks (MiniLM-L6, {VIEW_WORDS[view]})", paper)


def _claims(diffs: pd.DataFrame, source: str, margin: float) -> list[Claim]:
    claims = []
    for view in VIEW_WORDS:
        for what, a, b in COMPARISONS:
            claim = _blank(view, what, a, b, margin)
            claim.source = source
            got = diffs[(diffs.evaluation == HEADLINE) & (diffs.view == view) & (diffs.comparison == what) &
                        (diffs.task == "average")]
            if len(got):
                g = got.iloc[0]
                claim.measured = f"{g.difference:+.2f} [{g.low:+.2f}, {g.high:+.2f}] over {int(g.tasks)} task(s)"
                claim.verdict = VERDICT[g.verdict]
            else:
                why = diffs[(diffs.view == view) & (diffs.comparison == what) & (diffs.task != "average")]
                cv = set(why[why.evaluation == "cv"].task)  # each task in its headline evaluation
                why = why[(why.evaluation == "cv") | ~why.task.isin(cv)]
                claim.measured = "; ".join(sorted({f"{t}: {v}" for t, v in zip(why.task, why.verdict)})) or "no task"
                claim.verdict = NOT_COMPARABLE if why.verdict.str.startswith(NOT_COMPARABLE).any() else NO_SIGNAL
            claims.append(claim)
    return claims


def _shown(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Differences with their intervals as text."""
    return frame.assign(**{"a − b (points)": frame.difference.map(lambda x: "–" if np.isnan(x) else f"{x:+.2f}"),
                           "95% interval": ["–" if np.isnan(lo) else f"[{lo:+.2f}, {hi:+.2f}]"
                                            for lo, hi in zip(frame.low, frame.high)]})[
        [*columns, "a − b (points)", "95% interval"]]


def sections(summary: pd.DataFrame, assessed: dict, source: str) -> list[tuple[str, pd.DataFrame]]:
    """The tables of a run: Table 2 in the headline evaluation (both views) and in the official split, the steps,
    the floor and every comparison."""
    signal, floors, diffs = assessed["signal"], assessed["floor"], assessed["differences"]
    out = [(f"{source}: accuracy %, {view} step, each task by its folds where it has them (paper's ChatGLM3-6B value "
            "in brackets)", table2(summary, view, signal)) for view in ("chosen", "paper")]
    if (summary.evaluation == "cv").any():
        out.append((f"{source}: accuracy %, chosen step, official validation split",
                    table2(summary, "chosen", signal, "val")))
    out.append((f"{source}: the steps (and variants) chosen on held-out train", chosen(summary)))
    out.append((f"{source}: floor and comparability, method − majority class on the selection split (points)",
                _shown(floors, ["evaluation", "view", "task", "method"]).assign(
                    learned=np.where(floors.diverged.astype(bool), "diverged",
                                     floors.learned.map({True: "yes", False: "no"})))))
    out.append((f"{source}: paired differences on the evaluation rows (bootstrap over rows and seeds)",
                _shown(diffs, ["evaluation", "view", "comparison", "task"]).assign(
                    width=diffs.width.round(2), verdict=diffs.verdict)))
    return out


def _section(section: Section, run: Run, summary: pd.DataFrame, predictions: pd.DataFrame,
             points: pd.DataFrame) -> None:
    config = run.config() or {}
    chosen_settings = config.get("selection", {})
    margin = float(chosen_settings.get("margin", 2.0))
    assessed = assess(points, predictions, summary, int(chosen_settings.get("bootstrap", 2000)),
                      int(config.get("seed", 0)), margin)
    section.claims += _claims(assessed["differences"], run.source, margin)
    section.tables += sections(summary, assessed, run.source)
    quiet = sorted(set(summary.task) - assessed["signal"])
    if quiet:
        section.notes.append(f"`{run.source}`: no signal at this scale on {', '.join(quiet)} (full fine-tuning does "
                             "not beat the majority class on the selection split with a 95% interval above 0): "
                             "shown, left out of the verdicts and averages")
    edges = summary[(summary.view == "chosen") & (summary.edge > 0)]
    if len(edges):
        section.notes.append(f"`{run.source}`: a chosen step sits at its grid's edge even after growing the grid: " +
                             "; ".join(f"{r.method} on {r.task} ({r.evaluation}, {r.edge}×)" for r in edges.itertuples()))


def report(runs: list[Run]) -> Section:
    """Per run: Table 2 in both views, the floor, the per-task differences, the claims (both views, average)."""
    section = Section(COMMAND, TITLE)
    for run, summary in section.readable(runs, "summary.csv", ("accuracy_mean", "trainable_params", "lr", "runs"),
                                         ("evaluation", "view", "task", "method", "kind", "variant", "steps"),
                                         figure="table2.png"):
        with section.reading(run):
            predictions = run.csv("predictions.csv", ("prediction", "label", "seed", "lr", "row"))
            points = run.csv("points.csv", ("lr",))
            if predictions is None or points is None:
                section.skip(run, "has no readable predictions.csv or points.csv")
                continue
            _section(section, run, summary, predictions.astype({"fold": str, "group": str}),
                     points.astype({"fold": str}))
    if not section.claims:
        section.claims = [_blank(view, what, a, b, 2.0) for view in VIEW_WORDS for what, a, b in COMPARISONS]
    section.notes.append("Verdicts: reproduced when the 95% interval of a − b lies above 0, refuted when below, "
                         "inconclusive when it contains 0; non-inferiority: reproduced (non-inferior) when the interval "
                         "lies above −δ, refuted (inferior) when below, else inconclusive. Only where full fine-tuning "
                         "and both compared methods beat the majority class on the selection split; a 22M-parameter "
                         "encoder on small splits, not ChatGLM3-6B.")
    return section
