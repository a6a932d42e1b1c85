"""The report section of `ntk superglue`: Table 2 at MiniLM scale in both views (the step chosen on held-out
train; the paper's one step with the paper's budget), with its controls, and the paper's comparisons as paired
bootstrap verdicts whose intervals carry every variance a rerun changes (folds, training seeds, rows).

Two rules decide what is compared, and both read only the selection split (each fold's held-out part of its own
train, pooled over the folds of an evaluation), never an evaluation row:
- the floor: a task is big enough to tell where full fine-tuning (which no claim compares) beats the majority
  class there with a 95% interval above 0; otherwise it is "too small to tell", with the smallest gain the split
  could have detected;
- comparability: a comparison counts only where both of its methods learned there: beat the majority class the
  same way (and, in the paper's view, the head-alone control too); otherwise it is "not comparable at this scale:
  <method> did not learn".
The verdicts are per task, then averaged over the paper's Table 2 tasks that pass both rules; WiC and WSC are
"beyond Table 2" and in no average. "NTK-Attention matches or beats X" is one graded verdict: superior,
non-inferior (margin δ), inconclusive or inferior. The A/A control (a method against itself retrained with other
seeds, by the same rule) measures the rule's false-positive rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...claims import INCONCLUSIVE, NO_SIGNAL, NOT_COMPARABLE, NOT_RUN, REFUTED, REPRODUCED, Claim, Section
from ...runs import Run
from ..finetune.claims import TABLE2, TASKS as PAPER_TASKS
from .stats import (INCONCLUSIVE as SPANS, INFERIOR, NONINFERIOR, REFUTED as BELOW, REPRODUCED as ABOVE,
                    SUPERIOR, Difference, Fold, difference, matches_or_beats)
from .recipe import CONTROL

COMMAND, TITLE = "superglue", "Table 2 at MiniLM scale (paper 1, §5, on real SuperGLUE)"
RISES, BEATS = "rises", "matches or beats"  # the two rules: a − b > 0; a ≥ b − δ graded
# the paper's comparisons: (what, method a, method b, rule)
COMPARISONS = (("P-Tuning v2 rises with m (m=100 − m=1)", "ptuning-v2 m=100", "ptuning-v2 m=1", RISES),
               ("NTK-Attention matches or beats P-Tuning v2 m=100", "ntk", "ptuning-v2 m=100", BEATS),
               ("NTK-Attention matches or beats LoRA r=8", "ntk", "lora r=8", BEATS))
FLOOR = "fft"  # the kind whose win over the majority class shows that a task is big enough to tell
HEAD = "head"  # the kind of the head-alone control
HEADLINE = "headline"  # the evaluation of the averages and claims: each task's k folds where it has them, else val
VERDICT = {ABOVE: (REPRODUCED, ""), BELOW: (REFUTED, ""), SPANS: (INCONCLUSIVE, ""),
           SUPERIOR: (REPRODUCED, "superior"), NONINFERIOR: (REPRODUCED, "non-inferior"),
           INFERIOR: (REFUTED, "inferior")}  # a rule's outcome → the claim's verdict and its grade
EXTRA = (("cb", "f1_macro", "CB F1"), ("multirc", "f1a", "MultiRC F1a"), ("multirc", "em", "MultiRC EM"))
EVALUATIONS = {"val": "official validation split", "cv": "k-fold cross-validation over train ∪ validation"}
VIEW_WORDS = {"chosen": "step chosen on held-out train", "paper": "the paper's step"}
MIN_SEEDS = 3  # training seeds per fold a chosen-step verdict needs (fewer: its grade is shown, not concluded)


@dataclass
class Design:
    """What the comparisons need of a run's recipe: the seeds of each view and of the A/A control, the paper
    view's budget, the bootstrap and the margin."""

    seeds: list[int]
    paper_seeds: list[int]
    aa_seeds: list[int]
    paper_own: bool  # the paper view trains with its own budget, at stages of its own
    paper_run: bool
    paper_budget: str
    replicates: int
    seed: int
    margin: float

    @classmethod
    def of(cls, config: dict) -> "Design":
        """From a recipe's fields (a run folder's config.yaml, or the recipe being run)."""
        seeds, paper, sel = list(config.get("seeds", [0])), config.get("paper") or {}, config.get("selection") or {}
        train = config.get("train") or {}
        own = paper.get("epochs") is not None or paper.get("batch_size") is not None
        budget = f"{paper.get('epochs') or train.get('epochs', '?')} epochs at batch " \
                 f"{paper.get('batch_size') or train.get('batch_size', '?')}"
        return cls(seeds, seeds[:paper.get("seeds") or len(seeds)], list(sel.get("aa_seeds", [])), own,
                   bool(paper.get("run", True)), budget, int(sel.get("bootstrap", 2000)), int(config.get("seed", 0)),
                   float(sel.get("margin", 2.0)))

    def stage(self, view: str, kind: str, method: str) -> str:
        return f"paper-{kind}" if view == "paper" and self.paper_own and method != CONTROL else kind

    def view_seeds(self, view: str, kind: str) -> list[int]:
        """The seeds a view's runs of one kind use: the first alone on the selection split."""
        return self.seeds[:1] if kind == "select" else self.paper_seeds if view == "paper" else self.seeds


def _paper(method: str, task: str | None = None) -> float | None:
    """The paper's ChatGLM3-6B number for a method (its average, or one task's; None where Table 2 has none)."""
    row = TABLE2.get(method)
    if row is None or (task is not None and task not in PAPER_TASKS):
        return None
    return row[-1] if task is None else row[PAPER_TASKS.index(task)]


def paper_gap(a: str, b: str, tasks: list[str] | None = None) -> str:
    """The paper's own a − b: on the given Table 2 tasks (their mean), or its 5-task average."""
    if not tasks:
        return f"{_paper(a) - _paper(b):+.2f} points (ChatGLM3-6B, 5-task average)"
    gap = np.mean([_paper(a, t) - _paper(b, t) for t in tasks])
    return f"{gap:+.2f} points on {', '.join(t.upper() for t in tasks)} (ChatGLM3-6B)"


def headline(summary: pd.DataFrame, view: str) -> pd.DataFrame:
    """The rows of one view in each task's headline evaluation: its k folds where it has them, else val."""
    rows = summary[summary.view == view]
    best = rows.groupby("task", sort=False).evaluation.transform(lambda e: "cv" if (e == "cv").any() else "val")
    return rows[rows.evaluation == best]


def _column(task: str, rows: pd.DataFrame, signal: set[str] | None) -> str:
    name = task + ("" if task in PAPER_TASKS else " (beyond Table 2)")
    if rows.evaluation.iloc[0] == "cv":
        name += f" (CV, {rows.runs.max()} runs, {rows.scored_rows.max()} rows)"
    return name if signal is None or task in signal else f"{name} (too small to tell)"


def table2(summary: pd.DataFrame, view: str, signal: set[str] | None = None, evaluation: str = HEADLINE
           ) -> pd.DataFrame:
    """Methods × tasks: accuracy % mean ± spread (over seeds and folds), the paper's ChatGLM3-6B value in brackets,
    the average over the Table 2 tasks big enough to tell, the official metrics besides accuracy, and the costs
    (trainable parameters, adapter size on disk, training time, peak memory). Table 2 tasks first."""
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
        line["avg (Table 2 tasks big enough to tell)"] = (f"{100 * by.accuracy_mean[done].mean():.1f}" if done
                                                          else "–") + \
            ("" if _paper(method) is None else f" ({_paper(method):.1f})")
        for t, metric, name in EXTRA:
            if t in by.index:
                line[name] = f"{100 * by.loc[t, f'{metric}_mean']:.1f}"
        line |= _costs(by, method == CONTROL)
        out.append(line)
    return pd.DataFrame(out)


def _costs(by: pd.DataFrame, control: bool) -> dict:
    """A method's costs over its tasks' runs: what a PEFT comparison reports beside accuracy."""
    def col(name: str, fmt) -> str:
        return "–" if control or name not in by or not np.isfinite(by[name]).any() else fmt(by[name])

    return {"trainable params": f"{int(by.trainable_params.max()):,}",
            "adapter on disk": col("adapter_bytes", lambda c: f"{c.max() / 2**20:.2f} MiB"),
            "train s/run": col("train_seconds", lambda c: f"{c.mean():.0f}"),
            "peak MiB": col("peak_mem_mb", lambda c: f"{c.max():.0f}"),
            "train ex/s": col("examples_per_s", lambda c: f"{c.mean():.0f}")}


def chosen(summary: pd.DataFrame) -> pd.DataFrame:
    """Methods × (task, evaluation): the steps (and variants) the selection chose, and how many sit at their grid's
    edge."""
    rows = summary[(summary.view == "chosen") & (summary.method != CONTROL)]
    cell = [s + (f"; {e} at the grid's edge" if e else "") for s, e in zip(rows.steps, rows.edge)]
    rows = rows.assign(cell=cell, where=rows.task + " " + rows.evaluation)
    return rows.pivot(index="method", columns="where", values="cell").loc[
        list(dict.fromkeys(rows.method)), list(dict.fromkeys(rows["where"]))].reset_index()


class Judge:
    """Paired bootstrap differences between two methods' predictions, at the points of one view, on one kind of
    rows (the selection split or the evaluation rows) of one evaluation's folds."""

    def __init__(self, points: pd.DataFrame, predictions: pd.DataFrame, design: Design):
        self.points, self.predictions, self.design = points, predictions, design

    def views(self, task: str, folds: list[str]) -> list[str]:
        """The views with points in these folds of a task (the paper's may run on the official split alone)."""
        at = self.points[(self.points.task == task) & self.points.fold.isin(folds)]
        return [v for v in VIEW_WORDS if (at.view == v).any()]

    def headline(self, folds: dict[tuple[str, str], list[str]], task: str, view: str) -> str:
        """A task's headline evaluation in a view: "cv" where the view ran on its k folds, else "val"."""
        return "cv" if ("cv", task) in folds and view in self.views(task, folds["cv", task]) else "val"

    def scores(self, kind: str, view: str, task: str, fold: str, method: str, seeds: list[int]):
        """[seeds × rows] right (1) / wrong (0) of one fold, with each row's group, the seeds in the given order;
        None when the method has no predictions there (its run failed)."""
        keys = ["task", "fold", "method", "variant", "lr"]
        at = self.points[(self.points.view == view) & (self.points.task == task) & (self.points.fold == fold) &
                         (self.points.method == method)][keys]
        p = self.predictions
        mine = p[(p.stage == self.design.stage(view, kind, method)) & p.seed.isin(seeds)].merge(at, on=keys)
        if mine.empty:
            return None
        mine = mine.assign(right=(mine.prediction == mine.label) * 1.0)
        table = mine.pivot_table(index="seed", columns="row", values="right")
        return table.reindex([s for s in seeds if s in table.index]), mine.drop_duplicates("row").set_index("row").group

    def pair(self, kind: str, view: str, task: str, folds: list[str], a: str, b: str,
             seeds_b: list[int] | None = None) -> list[Fold] | None:
        """Per fold (a's scores, b's scores, groups) on the rows both have, row i of a's seeds paired with row i of
        b's (b's own seeds for the A/A control, else the same seeds); None when either failed everywhere."""
        seeds = self.design.view_seeds(view, kind)
        out = []
        for fold in folds:
            sa = self.scores(kind, view, task, fold, a, seeds)
            sb = self.scores(kind, view, task, fold, b, seeds_b or seeds if b != CONTROL else self.design.seeds[:1])
            if sa is None or sb is None:
                continue
            units = sa[0].columns.intersection(sb[0].columns)
            if b == CONTROL:  # one prediction for every seed of a
                A, B = sa[0][units].to_numpy(), np.repeat(sb[0][units].to_numpy()[:1], len(sa[0]), 0)
            elif seeds_b:
                n = min(len(sa[0]), len(sb[0]))
                A, B = sa[0][units].to_numpy()[:n], sb[0][units].to_numpy()[:n]
            else:
                both = sa[0].index.intersection(sb[0].index)
                A, B = sa[0].loc[both, units].to_numpy(), sb[0].loc[both, units].to_numpy()
            if len(A) and len(units):
                out.append((A, B, sa[1].loc[units].to_numpy()))
        return out or None

    def difference(self, tasks: list[list[Fold]]) -> Difference:
        return difference(tasks, self.design.replicates, self.design.seed)


def floor(judge: Judge, folds: dict[tuple[str, str], list[str]], methods: pd.DataFrame) -> pd.DataFrame:
    """Every method − the majority class on the selection split, per (evaluation, view, task), in accuracy points
    with its 95% interval (over folds and rows); `learned` when the interval lies above 0 (and, in the paper's view,
    the method also beats the head-alone control there); `diverged` when the run failed (a non-finite loss) and so
    predicted nothing. Reads only the selection runs' predictions."""
    out = []
    for (evaluation, task), fs in folds.items():
        for view in judge.views(task, fs):
            mine = methods[methods.task == task][["method", "kind"]].drop_duplicates()
            heads = list(mine[mine.kind == HEAD].method)
            control = [judge.scores("select", view, task, f, CONTROL, judge.design.seeds[:1]) for f in fs]
            right = np.concatenate([c[0].to_numpy()[0] for c in control if c is not None] or [np.zeros(0)])
            for method, kind in mine.itertuples(index=False):
                pair = judge.pair("select", view, task, fs, method, CONTROL)
                d = None if pair is None else judge.difference([pair])
                over_head = [judge.pair("select", view, task, fs, method, h) for h in heads
                             if view == "paper" and h != method]
                beats_head = all(p is not None and judge.difference([p]).low > 0 for p in over_head)
                out.append({"evaluation": evaluation, "view": view, "task": task, "method": method, "kind": kind,
                            "difference": np.nan if d is None else 100 * d.mean,
                            "low": np.nan if d is None else 100 * d.low, "high": np.nan if d is None else 100 * d.high,
                            "learned": d is not None and d.low > 0 and beats_head, "diverged": d is None,
                            "below_head": d is not None and d.low > 0 and not beats_head,
                            "rows": len(right), "majority": right.mean() if len(right) else np.nan})
    return pd.DataFrame(out, columns=["evaluation", "view", "task", "method", "kind", "difference", "low", "high",
                                      "learned", "diverged", "below_head", "rows", "majority"])


def signal_tasks(floors: pd.DataFrame, evaluation: str, view: str) -> set[str]:
    """The tasks big enough to tell: full fine-tuning beats the majority class on the selection split."""
    rows = floors[(floors.evaluation == evaluation) & (floors.view == view) & (floors.kind == FLOOR)]
    return set(rows[rows.learned.astype(bool)].task)


def detectable(majority: float, rows: int) -> float:
    """The smallest gain over the majority class (accuracy points) a split of `rows` rows could tell from chance:
    1.96 standard errors of an accuracy at the majority class's level p, 1.96·√(p(1−p)/rows)."""
    return 100 * 1.96 * np.sqrt(majority * (1 - majority) / rows) if rows else np.nan


def too_small(floors: pd.DataFrame, evaluation: str, view: str, task: str) -> str:
    """"Too small to tell", with fft − majority on the selection split and the smallest gain that split could have
    detected."""
    rows = floors[(floors.evaluation == evaluation) & (floors.view == view) & (floors.task == task) &
                  (floors.kind == FLOOR)]
    if rows.empty or not np.isfinite(rows.low.iloc[0]):
        return f"{NO_SIGNAL} (no full fine-tuning run to set the floor)"
    r = rows.iloc[0]
    return (f"{NO_SIGNAL} (fft − majority {r.difference:+.1f} [{r.low:+.1f}, {r.high:+.1f}] points on the "
            f"{int(r.rows)}-row selection split; the smallest gain it could detect ≈ "
            f"{detectable(r.majority, int(r.rows)):.1f} points)")


def _status(floors: pd.DataFrame, evaluation: str, view: str, task: str, a: str, b: str) -> str | None:
    """Why a comparison is not scored (too small to tell, or a method that did not learn), or None when it is."""
    if task not in signal_tasks(floors, evaluation, view):
        return too_small(floors, evaluation, view, task)
    rows = floors[(floors.evaluation == evaluation) & (floors.view == view) & (floors.task == task)]
    learned, diverged, below = (dict(zip(rows.method, rows[c].astype(bool))) for c in ("learned", "diverged",
                                                                                        "below_head"))
    lost = [m + (" diverged (lr too large?)" if diverged.get(m) else " did not beat the head alone"
                 if below.get(m) else " did not learn") for m in dict.fromkeys((a, b)) if not learned.get(m, False)]
    return f"{NOT_COMPARABLE}: {' and '.join(lost)}" if lost else None


def _verdict(d: Difference, rule: str, margin: float) -> str:
    return matches_or_beats(d, margin / 100) if rule == BEATS else d.verdict


def _row(evaluation: str, view: str, what: str, task: str, d: Difference | None, status: str | None,
         rule: str, margin: float, pairs: dict[str, list[Fold]], evaluations: dict[str, str]) -> dict:
    return {"evaluation": evaluation, "view": view, "comparison": what, "task": task,
            "difference": np.nan if d is None else 100 * d.mean, "low": np.nan if d is None else 100 * d.low,
            "high": np.nan if d is None else 100 * d.high,
            "verdict": status if d is None else _verdict(d, rule, margin), "basis": basis(pairs, evaluations),
            "seeds": min((len(a) for folds in pairs.values() for a, _, _ in folds), default=0)}


def basis(pairs: dict[str, list[Fold]], evaluations: dict[str, str]) -> str:
    """The tasks, folds and seeds a difference rests on, in words (each task in its evaluation: "val" or "cv")."""
    def one(task: str, folds: list[Fold]) -> str:
        seeds = "/".join(map(str, sorted({len(a) for a, _, _ in folds})))
        where = "official split" if evaluations[task] == "val" else f"{len(folds)} CV fold(s)"
        return f"{task.upper()}: {where} × {seeds} seed(s)"
    return ("; ".join(one(t, f) for t, f in pairs.items()) + ("" if len(pairs) > 1 else " only")) if pairs else ""


def differences(judge: Judge, folds: dict[tuple[str, str], list[str]], floors: pd.DataFrame) -> pd.DataFrame:
    """Every comparison per (evaluation, view, task), scored on the evaluation rows where both rules pass; then
    per view the average over the Table 2 tasks scored, in the official split ("val") and in each task's headline
    evaluation (its folds where it has them)."""
    tasks = list(dict.fromkeys(t for _, t in folds))
    run, margin = set(judge.points.method), judge.design.margin
    out, scored = [], {}
    for (evaluation, task), fs in folds.items():
        for view in judge.views(task, fs):
            for what, a, b, rule in (c for c in COMPARISONS if {c[1], c[2]} <= run):
                status = _status(floors, evaluation, view, task, a, b)
                pair = None if status else judge.pair("final", view, task, fs, a, b)
                if pair is not None:
                    scored[evaluation, view, what, task] = pair
                out.append(_row(evaluation, view, what, task, None if pair is None else judge.difference([pair]),
                                status or (None if pair is not None else f"{NOT_COMPARABLE}: a run failed"), rule,
                                margin, {task: pair} if pair else {}, {task: evaluation}))
    best = {(t, v): judge.headline(folds, t, v) for t in tasks for v in VIEW_WORDS}
    for evaluation, which in (("val", lambda t, v: "val"), (HEADLINE, lambda t, v: best[t, v])):
        for view in VIEW_WORDS:
            for what, _, _, rule in COMPARISONS:
                pairs = {t: scored[key] for t in tasks if t in PAPER_TASKS
                         and (key := (which(t, view), view, what, t)) in scored}
                if pairs:
                    out.append(_row(evaluation, view, what, "average", judge.difference(list(pairs.values())), None,
                                    rule, margin, pairs, {t: which(t, view) for t in pairs}) | {"tasks": ", ".join(pairs)})
    frame = pd.DataFrame(out, columns=["evaluation", "view", "comparison", "task", "difference", "low", "high",
                                       "verdict", "basis", "seeds", "tasks"])
    return frame.assign(width=frame.high - frame.low)


def aa_control(judge: Judge, folds: dict[tuple[str, str], list[str]], floors: pd.DataFrame) -> pd.DataFrame:
    """The A/A control: every method that learned, at its chosen point, against itself retrained with the A/A
    seeds, by the superiority rule the claims use, per (evaluation, task); `false_positive` when the interval
    excludes 0."""
    out, design = [], judge.design
    if not design.aa_seeds:
        return pd.DataFrame(columns=["evaluation", "task", "method", "difference", "low", "high", "verdict",
                                     "false_positive", "basis"])
    for (evaluation, task), fs in folds.items():
        for method in floors[(floors.task == task) & (floors.view == "chosen")].method.unique():
            if _status(floors, evaluation, "chosen", task, method, method):
                continue
            pair = judge.pair("final", "chosen", task, fs, method, method, design.aa_seeds)
            if pair is None:
                continue
            d = judge.difference([pair])
            out.append({"evaluation": evaluation, "task": task, "method": method, "difference": 100 * d.mean,
                        "low": 100 * d.low, "high": 100 * d.high, "verdict": d.verdict,
                        "false_positive": d.verdict != SPANS, "basis": basis({task: pair}, {task: evaluation})})
    return pd.DataFrame(out, columns=["evaluation", "task", "method", "difference", "low", "high", "verdict",
                                      "false_positive", "basis"])


def per_fold(judge: Judge, folds: dict[tuple[str, str], list[str]], diffs: pd.DataFrame) -> pd.DataFrame:
    """The scored comparisons' a − b fold by fold (accuracy points, mean over seeds): what the intervals resample."""
    out = []
    for r in diffs[(diffs.task != "average") & diffs.difference.notna()].itertuples():
        _, a, b, _ = next(c for c in COMPARISONS if c[0] == r.comparison)
        fs = folds[r.evaluation, r.task]
        for fold, pair in zip(fs, judge.pair("final", r.view, r.task, fs, a, b) or []):
            out.append({"evaluation": r.evaluation, "view": r.view, "comparison": r.comparison, "task": r.task,
                        "fold": fold, "seeds": len(pair[0]), "a − b (points)": round(100 * np.mean(pair[0] - pair[1]), 2)})
    return pd.DataFrame(out)


def assess(points: pd.DataFrame, predictions: pd.DataFrame, summary: pd.DataFrame, design: Design) -> dict:
    """The floor (every method against the majority class on the selection split), the tasks big enough to tell
    (the headline evaluation, chosen step), every comparison, fold by fold too, and the A/A control."""
    judge = Judge(points, predictions, design)
    fold_names = points.drop_duplicates(["task", "fold"])
    folds = {}
    for task, fold in fold_names[["task", "fold"]].itertuples(index=False):
        folds.setdefault(("val" if fold == "val" else "cv", task), []).append(fold)
    floors = floor(judge, folds, summary[summary.method != CONTROL])
    best = {t: judge.headline(folds, t, "chosen") for t in summary.task.unique()}
    signal = {t for t, evaluation in best.items() if t in signal_tasks(floors, evaluation, "chosen")}
    diffs = differences(judge, folds, floors)
    return {"floor": floors, "headline": best, "signal": signal, "differences": diffs,
            "per_fold": per_fold(judge, folds, diffs), "aa": aa_control(judge, folds, floors)}


def _blank(view: str, what: str, a: str, b: str, margin: float, design: Design | None = None) -> Claim:
    """One comparison's claim in one view, not measured yet."""
    claim = Claim(f"Table 2: {what}, average over Table 2 tasks (MiniLM-L6, {VIEW_WORDS[view]})",
                  paper_gap(a, b) + (f"; margin δ = {margin:g}" if BEATS in what else ""))
    if view == "paper" and design is not None and not design.paper_run:
        claim.measured = "not run: the recipe's `paper.run` is false"
    return claim


def _claims(diffs: pd.DataFrame, source: str, design: Design, trained: set[str] | None = None) -> list[Claim]:
    """One verdict per claim and view: the headline average, named by the tasks, folds and seeds it rests on and
    set against the paper's own gap on those tasks; none for a comparison whose two methods the run does
    not both train (a run of the floor alone)."""
    claims = []
    for view in VIEW_WORDS:
        for what, a, b, _ in COMPARISONS:
            if trained is not None and not {a, b} <= trained:
                continue
            claim = _blank(view, what, a, b, design.margin, design)
            claim.source = source
            got = diffs[(diffs.evaluation == HEADLINE) & (diffs.view == view) & (diffs.comparison == what) &
                        (diffs.task == "average")]
            if view == "paper" and not design.paper_run:
                claim.verdict = NOT_RUN
            elif len(got):
                g = got.iloc[0]
                tasks = g.tasks.split(", ")
                claim.paper = paper_gap(a, b, tasks) + (f"; margin δ = {design.margin:g}" if BEATS in what else "")
                claim.measured = f"{g.difference:+.2f} [{g.low:+.2f}, {g.high:+.2f}] points" + (
                    "" if view == "chosen" else f", trained {design.paper_budget}" if design.paper_own else
                    ", trained at the chosen view's budget (not the paper's 30 epochs at batch 32)")
                word, grade = VERDICT[g.verdict]
                if view == "chosen" and g.seeds < MIN_SEEDS and word != INCONCLUSIVE:  # a lucky run
                    word, grade = INCONCLUSIVE, f"would read {grade or g.verdict}, but {g.seeds} seed(s) in a " \
                                                f"fold is fewer than the {MIN_SEEDS} a verdict needs"
                claim.verdict = f"{word} ({'; '.join(filter(None, (grade, g.basis)))})"
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


def false_positive_rate(aa: pd.DataFrame) -> str:
    """The A/A control's measured false-positive rate, in words."""
    if aa.empty:
        return "no A/A pair (the recipe has no selection.aa_seeds, or no method learned)"
    hits = int(aa.false_positive.sum())
    return f"{hits} of {len(aa)} A/A pairs ({100 * hits / len(aa):.0f}%) have an interval that excludes 0"


def sections(summary: pd.DataFrame, assessed: dict, source: str) -> list[tuple[str, pd.DataFrame]]:
    """The tables of a run: Table 2 in the headline evaluation (both views) and in the official split, the steps,
    the floor, every comparison, the differences fold by fold, and the A/A control."""
    signal, floors, diffs, aa = assessed["signal"], assessed["floor"], assessed["differences"], assessed["aa"]
    out = [(f"{source}: accuracy %, {VIEW_WORDS[view]}, each task by its folds where it has them (paper's "
            "ChatGLM3-6B value in brackets), and each method's costs", table2(summary, view, signal))
           for view in VIEW_WORDS if (summary.view == view).any()]
    if (summary.evaluation == "cv").any():
        out.append((f"{source}: accuracy %, chosen step, official validation split",
                    table2(summary, "chosen", signal, "val")))
    out.append((f"{source}: the steps (and variants) chosen on held-out train", chosen(summary)))
    out.append((f"{source}: floor and comparability, method − majority class on the selection split (points)",
                _shown(floors, ["evaluation", "view", "task", "method"]).assign(
                    learned=np.where(floors.diverged.astype(bool), "diverged",
                                     np.where(floors.below_head.astype(bool), "no (not above the head alone)",
                                              floors.learned.map({True: "yes", False: "no"}))))))
    out.append((f"{source}: paired differences on the evaluation rows (bootstrap over folds, seeds and rows)",
                _shown(diffs, ["evaluation", "view", "comparison", "task"]).assign(
                    width=diffs.width.round(2), verdict=diffs.verdict, basis=diffs.basis)))
    if len(assessed["per_fold"]):
        out.append((f"{source}: the scored differences fold by fold (a − b, points, mean over seeds)",
                    assessed["per_fold"]))
    out.append((f"{source}: A/A control, each method against itself retrained with other seeds, by the claims' "
                f"rule: {false_positive_rate(aa)}",
                _shown(aa, ["evaluation", "task", "method"]).assign(verdict=aa.verdict, basis=aa.basis)))
    return out


def _section(section: Section, run: Run, summary: pd.DataFrame, predictions: pd.DataFrame,
             points: pd.DataFrame) -> None:
    design = Design.of(run.config() or {})
    assessed = assess(points, predictions, summary, design)
    section.claims += _claims(assessed["differences"], run.source, design, set(points.method))
    section.tables += sections(summary, assessed, run.source)
    quiet = sorted(set(summary.task) - assessed["signal"])
    if quiet:
        floors = assessed["floor"]
        said = "; ".join(f"{t}: " + too_small(floors, assessed["headline"][t], "chosen", t) for t in quiet)
        section.notes.append(f"`{run.source}`: full fine-tuning does not beat the majority class on the selection "
                             f"split with a 95% interval above 0 ({said}): shown, left out of the verdicts and "
                             "averages")
    edges = summary[(summary.view == "chosen") & (summary.edge > 0)]
    if len(edges):
        section.notes.append(f"`{run.source}`: a chosen step sits at its grid's edge even after growing the grid: " +
                             "; ".join(f"{r.method} on {r.task} ({r.evaluation}, {r.edge}×)" for r in edges.itertuples()))


def report(runs: list[Run]) -> Section:
    """Per run: Table 2 in both views, the floor, the per-task differences, the claims (both views, average)."""
    section, read = Section(COMMAND, TITLE), []
    for run, summary in section.readable(runs, "summary.csv", ("accuracy_mean", "trainable_params", "lr", "runs"),
                                         ("evaluation", "view", "task", "method", "kind", "variant", "steps"),
                                         figure="table2.png"):
        with section.reading(run):
            predictions = run.csv("predictions.csv", ("prediction", "label", "seed", "lr", "row"))
            points = run.csv("points.csv", ("lr",))
            if predictions is None or points is None:
                section.skip(run, "has no readable predictions.csv or points.csv")
                continue
            _section(section, run, summary.astype({"steps": str}), predictions.astype({"fold": str, "group": str}),
                     points.astype({"fold": str}))
            read.append(run.source)
    if not section.claims:
        section.claims = [_blank(view, what, a, b, 2.0) for view in VIEW_WORDS for what, a, b, _ in COMPARISONS]
        for claim in section.claims if read else []:  # runs of the floor's methods alone
            claim.measured = f"no run trains both compared methods ({', '.join(read)}: the floor's alone)"
    section.notes.append("Verdicts: \"P-Tuning v2 rises with m\" is reproduced when the 95% interval of a − b lies "
                         "above 0, refuted when below, inconclusive when it contains 0; \"matches or beats\" is one "
                         "graded verdict: superior (interval above 0), non-inferior (above −δ), inferior (below −δ), "
                         "else inconclusive. The interval resamples folds, then training seeds and rows inside each "
                         "fold. Only where full fine-tuning and both compared methods beat the majority class on the "
                         "selection split; a 22M-parameter encoder on small splits, not ChatGLM3-6B.")
    return section
