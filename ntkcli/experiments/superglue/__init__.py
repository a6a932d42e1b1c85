"""Paper 1, Table 2 at small scale on real SuperGLUE: every method's learning rate chosen fairly, several seeds,
and the task with few rows (CB) scored by k-fold cross-validation as well.

A task is scored on one or more folds: the official split (train → validation, fold "val") and, with data.folds,
k folds over train ∪ validation (fold "cv<i>"), every seed in each. In every fold, each (method, grid point)
trains on the fold's train minus a held-out share and is scored on that share (the selection split); the point
with the best mean log-likelihood of the true labels there is chosen (ties by a rule that favours neither end of
the grid), and a point at its grid's edge grows the grid. Then every seed trains on the fold's whole train at the
chosen point, and at the paper's (train.lr for every PEFT method, with the paper's budget when `paper` gives one),
and is scored on the fold's evaluation rows; the A/A control retrains the chosen points with other seeds.
results.csv has one row per (stage, task, fold, method, variant, lr, seed); predictions.csv every run's
predictions (the selection split's too: the report's floor and comparability read them); points.csv the chosen
and the paper's point per (task, fold, method), with the ties; summary.csv the scores per (evaluation, view, task,
method), where evaluation "val" is the official split and "cv" the k folds pooled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...errors import UserError
from ...executors import Failed
from ...models import load_tokenizer, model_config
from ...runs import Results, Run, is_main_process, resolve_device, seed_for
from ..finetune import Inputs, checks, optimizer_steps, quiet, train_method
from ..finetune.data import tokenize
from . import tasks
from .claims import COMMAND, TITLE, Design, assess, headline, report, sections  # noqa: F401 — the experiment contract
from ..finetune.protocol import MethodFailed
from .recipe import CONTROL, SuperGlueRecipe, TunedMethod, variant_name

HELP = ("Table 2 (paper 1, §5) on real SuperGLUE with a real pretrained model: NTK-Attention vs P-Tuning v2 vs "
        "LoRA vs full fine-tuning vs any peft method, each learning rate chosen on held-out train.\n\n"
        "Reads the hub's aps/super_glue, or the official JSONL files with --set data.path=DIR. Writes results.csv "
        "(selection and final runs), predictions.csv, summary.csv (both views: chosen step and the paper's), "
        "claims.csv (paired bootstrap verdicts), table2.png (accuracy against trainable parameters) and run.json "
        "to outputs/superglue/<recipe>/; re-running skips finished runs.")
NEEDS_RECIPE, FLAGS, DEVICES = True, {}, ("cpu", "cuda")
POINTS = True  # a training run per (stage, task, fold, method, step, seed)
SCALE = ("seeds",)  # epochs differ by task and view: each table names its own
KEYS = ["stage", "task", "fold", "method", "variant", "lr", "seed"]
METRICS = ["accuracy", "f1_macro", "f1a", "em"]
RESUMABLE = ("methods", "seeds", "data.tasks", "data.folds", "paper.run", "paper.folds", "selection.aa_seeds",
             "selection.aa_methods")
FILES = ("results.csv", "predictions.csv", "points.csv", "summary.csv", "claims.csv", "table2.png")
RECIPE = SuperGlueRecipe
VIEWS = ("chosen", "paper")  # the step chosen on held-out train; the paper's one step for every PEFT method
OFFICIAL = "val"  # the fold of the official split (train → validation); the k-fold ones are cv0, cv1, …


@dataclass
class Split:
    """Tokenized rows for the Trainer and, in the same order, what scoring needs."""

    rows: object
    labels: np.ndarray
    groups: np.ndarray
    index: np.ndarray  # each row's id in its task's pool (train rows, then evaluation rows, as read)


@dataclass
class Pool:
    """A task's labelled rows, tokenized once: train then evaluation rows, every group unique to its split."""

    tokens: object
    labels: np.ndarray
    groups: np.ndarray
    lengths: np.ndarray

    def split(self, ids, by_length: bool = False) -> Split:
        """The rows `ids`; evaluation rows sorted by length (less padding), their ids kept in `index`."""
        ids = np.asarray(ids)
        if by_length:
            ids = ids[np.argsort(self.lengths[ids], kind="stable")]
        return Split(self.tokens.select(ids).remove_columns("group"), self.labels[ids], self.groups[ids], ids)


@dataclass
class Fold:
    train: Split
    eval: Split
    fit: Split  # the fold's train minus the held-out share: the selection runs train here …
    held: Split  # … and are scored here (the selection split)
    seeds: list[int]


@dataclass
class TaskData:
    folds: dict[str, Fold]  # "val" (the official split), then "cv0" … with data.folds
    sizes: dict


@dataclass
class Prepared:
    device: object
    collator: object
    tasks: dict[str, TaskData]


def evaluations(data: TaskData) -> dict[str, list[str]]:
    """evaluation → its folds: "val" the official split; "cv" the k folds, pooled (when the task has them)."""
    cv = [f for f in data.folds if f != OFFICIAL]
    return {OFFICIAL: [OFFICIAL], **({"cv": cv} if cv else {})}


def _read(cfg: SuperGlueRecipe, name: str):
    """The task's train and evaluation rows (evaluation carved from validation when there is no train), limited
    as the recipe says, and whether the evaluation was carved."""
    root = None if cfg.data.path is None else Path(cfg.data.path).expanduser()
    folder = None if root is None else tasks.task_folder(root, name, len(cfg.data.tasks) == 1)
    dspec = tasks.spec(name, folder, cfg.data.name, cfg.data.length(name))
    carved = not tasks.has_train(dspec)
    if carved:
        whole = tasks.read(name, dspec, "validation")
        kept, held = tasks.carve(whole["label"], whole["group"], cfg.data.carve_eval, cfg.seed)
        train, evaluation = whole.select(kept), whole.select(held)
    else:
        train, evaluation = tasks.read(name, dspec, "train"), tasks.read(name, dspec, "validation")
    return (tasks.limit(train, cfg.data.max_train.get(name), cfg.seed),
            tasks.limit(evaluation, cfg.data.max_eval.get(name), cfg.seed), carved)


def _fold(cfg: SuperGlueRecipe, pool: Pool, train: np.ndarray, evaluation: np.ndarray, seeds: list[int]) -> Fold:
    fit, held = tasks.carve(pool.labels[train], pool.groups[train], cfg.selection.val_fraction, cfg.seed)
    return Fold(pool.split(train), pool.split(evaluation, True), pool.split(train[fit]), pool.split(train[held], True),
                seeds)


def _task(cfg: SuperGlueRecipe, name: str, tokenizer) -> TaskData:
    """The task's pool, its official fold and, with data.folds, its k folds over train ∪ validation."""
    from datasets import concatenate_datasets

    train, evaluation, carved = _read(cfg, name)
    both = concatenate_datasets([part.map(lambda r, p=prefix: {"group": p + r["group"]})
                                 for part, prefix in ((train, "train:"), (evaluation, "eval:"))])
    tokens = tokenize(both, tokenizer, cfg.data.length(name))
    pool = Pool(tokens, np.asarray(tokens["label"]), np.asarray(tokens["group"]),
                np.asarray([len(r) for r in tokens["input_ids"]]))
    ids = np.arange(len(both))
    folds = {OFFICIAL: _fold(cfg, pool, ids[:len(train)], ids[len(train):], list(cfg.seeds))}
    k = cfg.data.folds.get(name)
    for i, held in enumerate(tasks.folds(pool.labels, pool.groups, k, cfg.seed) if k else []):
        folds[f"cv{i}"] = _fold(cfg, pool, np.setdiff1d(ids, held), held, list(cfg.seeds))
    return TaskData(folds, {"train": len(train), "eval": len(evaluation), "carved": carved, "folds": k or 0,
                            "rows": len(both)})


def _checked_task(cfg: SuperGlueRecipe, name: str, tokenizer) -> TaskData:
    """_task, its data errors naming the task."""
    try:
        return _task(cfg, name, tokenizer)
    except UserError as err:
        raise UserError(f"task {name}: {err}") from None


def prepare(cfg: SuperGlueRecipe) -> Prepared:
    """Device, tokenizer and every task's folds, read before the run folder exists."""
    from transformers import DataCollatorWithPadding

    quiet()
    device = resolve_device(cfg.device)
    config = model_config(cfg.model)
    for task in cfg.data.tasks:  # every variant of every method on the meta model, at the task's length
        checks.check_methods(config, [spec for m in cfg.methods for spec in m.candidates()], cfg.train, image=False,
                             num_labels=len(tasks.TASKS[task].labels), tokens=2 * cfg.data.length(task),
                             device=cfg.device, dtype_bytes=checks.dtype_bytes(cfg.model.dtype))
    tokenizer = load_tokenizer(cfg.model)
    return Prepared(device, DataCollatorWithPadding(tokenizer),
                    {t: _checked_task(cfg, t, tokenizer) for t in cfg.data.tasks})


def paper_point(cfg: SuperGlueRecipe, method: TunedMethod) -> tuple[str, float]:
    """The paper's protocol: one step for every PEFT method (train.lr), train.fft_lr for full fine-tuning; the first
    variant."""
    return variant_name(method.variants[0]), cfg.train.fft_lr if method.spec.method == "fft" else cfg.train.lr


TIE = 1e-9  # selection scores this close are tied


def best(points: list, score, lr, coin: int) -> tuple[object, list]:
    """The point with the highest selection score, and the points tied with it (empty without a tie). A tie goes to
    the tied point nearest the tied steps' middle in log-step; two equally near, to `coin` (a seed of the task,
    fold and method): neither end of the grid is favoured."""
    scores = {p: score(p) for p in points}
    top = max(scores.values())
    tied = [p for p in points if scores[p] >= top - TIE]
    if len(tied) == 1:
        return tied[0], []
    logs = {p: np.log(lr(p)) for p in tied}
    middle = (min(logs.values()) + max(logs.values())) / 2
    near = min(abs(v - middle) for v in logs.values())
    nearest = [p for p in tied if abs(logs[p] - middle) <= near + TIE]
    return nearest[coin % len(nearest)], tied


def _grown(lrs: list[float], score, grow: int, coin: int = 0) -> list[float]:
    """A variant's step grid, grown past an edge while its best measured step sits there: one point at a time, at
    the grid's own ratio, at most `grow` per edge. Stops where a point is not measured yet. `score(lr)` is the
    selection score (None: not measured; -inf: the run failed)."""
    lrs, low, high = list(lrs), 0, 0
    while len(lrs) > 1 and all(score(lr) is not None for lr in lrs):
        top = best(lrs, score, float, coin)[0]
        if top == lrs[0] and low < grow:
            lrs, low = [float(f"{lrs[0] ** 2 / lrs[1]:.3g}"), *lrs], low + 1
        elif top == lrs[-1] and high < grow:
            lrs, high = [*lrs, float(f"{lrs[-1] ** 2 / lrs[-2]:.3g}")], high + 1
        else:
            break
    return lrs


def _scorer(selected: pd.DataFrame, task: str, fold: str, label: str, column: str = "loglik"):
    """(variant, lr) → the selection split's mean log-likelihood (or `column`) of one (task, fold, method)'s
    selection runs (None: not run; -inf: failed)."""
    rows = selected[(selected.stage == "select") & (selected.task == task) & (selected.fold == fold) &
                    (selected.method == label)]
    if len(rows) and column not in rows:
        raise UserError("this run folder's selection runs were scored by accuracy alone (before steps were chosen by "
                        "log-likelihood): rerun with --fresh, or with another --out")
    table = {(r.variant, float(r.lr)): (-np.inf if np.isnan(getattr(r, column)) else getattr(r, column))
             for r in rows.itertuples()}
    return lambda variant, lr: table.get((variant, lr))


def coin(cfg: SuperGlueRecipe, task: str, fold: str, label: str) -> int:
    """The tie-break's seed of one (task, fold, method)."""
    return seed_for(cfg.seed, "tie", task, fold, label)


def candidates(cfg: SuperGlueRecipe, method: TunedMethod, score, tie: int = 0) -> list[tuple[str, float]]:
    """A method's (variant, lr) grid points, each variant's grid grown past an edge where its best step sits."""
    out = []
    for variant in map(variant_name, method.variants):
        out += [(variant, lr) for lr in _grown(cfg.lrs(method), lambda lr, v=variant: score(v, lr),
                                              cfg.selection.grow, tie)]
    return out


def views(cfg: SuperGlueRecipe, fold: str = OFFICIAL) -> tuple[str, ...]:
    """The views a fold trains: the paper's too where the recipe runs it (the official split, or every fold)."""
    return VIEWS if cfg.paper.run and (fold == OFFICIAL or cfg.paper.folds) else VIEWS[:1]


def selection_points(cfg: SuperGlueRecipe, prep: Prepared, selected: pd.DataFrame) -> list[tuple]:
    """Every selection run known so far: per task, fold and method, its (grown) grid and the paper's point (whose
    selection score decides whether the method learned at that step), with the fold's first seed; and the majority
    control. A grown point appears once the points before it are measured."""
    points, design = [], Design.of(cfg.model_dump())
    for task, data in prep.tasks.items():
        for fold, f in data.folds.items():
            points.append(("select", task, fold, CONTROL, "default", 0.0, f.seeds[0]))
            for m in cfg.methods:
                grid = candidates(cfg, m, _scorer(selected, task, fold, m.label), coin(cfg, task, fold, m.label))
                paper = [(design.stage("paper", "select", m.label), *paper_point(cfg, m))] \
                    if "paper" in views(cfg, fold) else []
                points += [(s, task, fold, m.label, v, lr, f.seeds[0])
                           for s, v, lr in dict.fromkeys([*(("select", *p) for p in grid), *paper])]
    return points


def choose(cfg: SuperGlueRecipe, prep: Prepared, selected: pd.DataFrame) -> pd.DataFrame:
    """The chosen and the paper's point per (task, fold, method): the chosen one is the grid point with the best
    mean log-likelihood on the selection split (its accuracy beside it; a tie broken by `best`, the tied steps in
    `ties`), `edge` when it sits at its variant's grid edge even after growing. Reads only the selection runs."""
    out = []
    for task, data in prep.tasks.items():
        for fold in data.folds:
            out += [{"view": view, "task": task, "fold": fold, "method": CONTROL, "variant": "default", "lr": 0.0,
                     "edge": False, "ties": ""} for view in views(cfg, fold)]
            for m in cfg.methods:
                score, tie = _scorer(selected, task, fold, m.label), coin(cfg, task, fold, m.label)
                grid = candidates(cfg, m, score, tie)
                point, tied = best(grid, lambda p: score(*p) if score(*p) is not None else -np.inf,
                                   lambda p: p[1], tie)
                lrs = [lr for v, lr in grid if v == point[0]]
                accuracy = _scorer(selected, task, fold, m.label, "accuracy")
                out.append({"view": "chosen", "task": task, "fold": fold, "method": m.label, "variant": point[0],
                            "lr": point[1], "edge": len(lrs) > 1 and point[1] in (lrs[0], lrs[-1]),
                            "loglik": score(*point), "select_accuracy": accuracy(*point),
                            "ties": "; ".join(f"{lr:g}" + (f" ({v})" if v != "default" else "") for v, lr in tied)})
                if "paper" in views(cfg, fold):
                    out.append({"view": "paper", "task": task, "fold": fold, "method": m.label,
                                **dict(zip(("variant", "lr"), paper_point(cfg, m))), "edge": False, "ties": ""})
    return pd.DataFrame(out)


def final_points(cfg: SuperGlueRecipe, points: pd.DataFrame) -> list[tuple]:
    """Each view's seeds at its point, and the A/A control's seeds at the chosen points of its methods; each run
    once."""
    design = Design.of(cfg.model_dump())
    out = [(design.stage(r.view, "final", r.method), r.task, r.fold, r.method, r.variant, r.lr, seed)
           for r in points.itertuples() for seed in design.view_seeds(r.view, "final")]
    aa = points[(points.view == "chosen") & points.method.isin(cfg.aa_labels())]
    out += [("final", r.task, r.fold, r.method, r.variant, r.lr, seed) for r in aa.itertuples()
            for seed in cfg.selection.aa_seeds]
    return list(dict.fromkeys(out))


def plan(cfg: SuperGlueRecipe) -> list[tuple[str, str]]:
    """What a run trains, before any selection run: the grids, then the final seeds (at most two points per
    (task, fold, method)); a grid that grows adds selection runs."""
    folds = {t: [OFFICIAL, *(f"cv{i}" for i in range(cfg.data.folds.get(t, 0)))] for t in cfg.data.tasks}
    design = Design.of(cfg.model_dump())

    def runs(fold: str) -> tuple[int, int]:
        """(selection, final) runs of one fold."""
        paper = [(design.stage("paper", "select", m.label), m.label, *paper_point(cfg, m)) for m in cfg.methods] \
            if "paper" in views(cfg, fold) else []
        grid = len({*(("select", m.label, variant_name(v), lr) for m in cfg.methods for v in m.variants
                      for lr in cfg.lrs(m)), *paper})
        seeds = sum(len(design.view_seeds(v, "final")) for v in views(cfg, fold)) * len(cfg.methods) + \
            len(cfg.selection.aa_seeds) * len(cfg.aa_labels())
        return grid, seeds

    counts = [runs(f) for fs in folds.values() for f in fs]
    epochs, batch = cfg.budget("paper-final", cfg.data.tasks[0])
    return [("tasks", ", ".join(f"{t} ({len(fs) - 1} folds + val)" if len(fs) > 1 else t for t, fs in folds.items())),
            ("methods", ", ".join(m.label for m in cfg.methods)),
            ("selection runs (grid points × folds)", str(sum(c[0] for c in counts))),
            ("final runs (at most: views' seeds + the A/A control's, × folds)", str(sum(c[1] for c in counts))),
            ("epochs per run", ", ".join(f"{t} {cfg.epochs(t)}" for t in cfg.data.tasks)),
            ("the paper's step", "not run" if not cfg.paper.run else
             (f"{epochs} epochs at batch {batch}" if cfg.paper.own else "the chosen view's budget") +
             ("" if cfg.paper.folds or not cfg.data.folds else ", on the official split only")),
            ("tokens per text field", ", ".join(f"{t} {cfg.data.length(t)}" for t in cfg.data.tasks)),
            ("non-inferiority margin", f"{cfg.selection.margin:g} points"),
            ("model", cfg.model.name_or_path or "from config"),
            ("data", cfg.data.path or cfg.data.name)]


def _splits(prep: Prepared, stage: str, task: str, fold: str) -> tuple[Split, Split]:
    """(trained on, scored on): a selection run's fit and held-out parts of the fold's train, or a final run's train
    and evaluation rows."""
    f = prep.tasks[task].folds[fold]
    return (f.fit, f.held) if stage.endswith("select") else (f.train, f.eval)


def _majority(train: Split, scored: Split, classes: int) -> tuple[np.ndarray, dict]:
    """The control: the train split's label frequencies as every scored row's probabilities (so it predicts the most
    frequent label); nothing trained."""
    counts = np.bincount(train.labels, minlength=classes) + 1.0  # add-one: no label has probability 0
    return np.tile(np.log(counts / counts.sum()), (len(scored.labels), 1)), {
        "kind": CONTROL, "train_loss": np.nan, "train_seconds": 0.0, "examples_per_s": np.nan, "peak_mem_mb": 0.0,
        "trainable_params": 0, "total_params": 0, "adapter_bytes": 0}


def _trained(cfg: SuperGlueRecipe, prep: Prepared, point: tuple, train: Split, scored: Split,
             advance) -> tuple[np.ndarray | None, dict]:
    """One method trained at one grid point with its stage's budget: each scored row's log-probabilities and the
    run's numbers; a run that fails (a non-finite loss) gives none and says why in `failed`."""
    stage, task, fold, label, variant, lr, seed = point
    method = _method(cfg, label)
    spec = method.candidates()[[variant_name(v) for v in method.variants].index(variant)]
    inputs = Inputs(prep.device, train.rows, scored.rows, prep.collator)
    epochs, batch = cfg.budget(stage, task)
    budget = cfg.model_copy(update={"train": cfg.train.model_copy(update={"batch_size": batch})})
    try:
        trained = train_method(budget, spec, seed, lr, inputs, advance, num_labels=len(tasks.TASKS[task].labels),
                               per_epoch=False, epochs=epochs)
    except MethodFailed as err:
        return None, {"kind": method.kind, "failed": str(err)}
    last = trained.rows.iloc[-1]
    logp = torch.log_softmax(torch.as_tensor(np.asarray(trained.evaluation.logits), dtype=torch.float64), -1)
    return logp.numpy(), {
        "kind": method.kind, "train_loss": last.train_loss, "train_seconds": last.train_seconds,
        "examples_per_s": len(train.labels) * epochs / last.train_seconds, "peak_mem_mb": last.peak_mem_mb,
        "trainable_params": last.trainable_params, "total_params": last.total_params,
        "adapter_bytes": last.adapter_bytes}


def _fit(shared: tuple[SuperGlueRecipe, Prepared], point: tuple, advance) -> tuple[dict, pd.DataFrame | None]:
    """One run (or the majority control): its results row, and each scored example's prediction (a pure function of
    the point: any executor's worker may run it)."""
    cfg, prep = shared
    stage, task, fold, label = point[:4]
    train, scored = _splits(prep, stage, task, fold)
    logp, numbers = _majority(train, scored, len(tasks.TASKS[task].labels)) if label == CONTROL else \
        _trained(cfg, prep, point, train, scored, advance)
    row = _row(cfg, prep, point) | numbers
    if logp is None:
        return row, None
    predicted, loglik = np.argmax(logp, axis=-1), logp[np.arange(len(scored.labels)), scored.labels]
    row |= tasks.metrics(task, scored.labels, predicted, scored.groups) | {"loglik": float(loglik.mean())}
    return row, pd.DataFrame({**dict(zip(KEYS, point)), "row": scored.index, "group": scored.groups,
                              "label": scored.labels, "prediction": predicted, "loglik": loglik})


def _row(cfg: SuperGlueRecipe, prep: Prepared, point: tuple) -> dict:
    """A run's results row before its numbers: its keys, no metrics, not failed, the split sizes, its budget."""
    train, scored = _splits(prep, *point[:3])
    epochs, batch = (0, 0) if point[3] == CONTROL else cfg.budget(*point[:2])
    return dict(zip(KEYS, point)) | {m: np.nan for m in METRICS} | {"loglik": np.nan, "failed": ""} | {
        "train_rows": len(train.labels), "scored_rows": len(scored.labels), "epochs": epochs, "batch_size": batch}


def _train_all(cfg: SuperGlueRecipe, prep: Prepared, folder: Run, results: Results, predictions: Results,
               points: list[tuple], what: str) -> None:
    """Every point not measured yet, by the run's executor; each saved as it finishes (a run that raised or whose
    worker died is a failed row naming why)."""
    todo = results.todo(points)

    def steps(p: tuple) -> int:
        epochs, batch = cfg.budget(p[0], p[1])
        return 0 if p[3] == CONTROL else optimizer_steps(len(_splits(prep, *p[:3])[0].labels), batch, epochs)

    for point, outcome in folder.measure(f"{what}: {len(todo)} runs", _fit, todo, (cfg, prep), steps):
        row, predicted = (_row(cfg, prep, point) | {"kind": _kind(cfg, point[3]), "failed": outcome.reason}, None) \
            if isinstance(outcome, Failed) else outcome
        if predicted is not None:
            predictions.add(predicted)
        results.add([row])


def _kind(cfg: SuperGlueRecipe, label: str) -> str:
    return CONTROL if label == CONTROL else _method(cfg, label).kind


def _method(cfg: SuperGlueRecipe, label: str) -> TunedMethod:
    return next(m for m in cfg.methods if m.label == label)


def _select(cfg: SuperGlueRecipe, prep: Prepared, folder: Run, results: Results, predictions: Results) -> pd.DataFrame:
    """The selection runs, round after round while grids grow; the chosen points."""
    while todo := results.todo(selection_points(cfg, prep, results.table())):
        _train_all(cfg, prep, folder, results, predictions, todo, "choose the steps")
    return choose(cfg, prep, results.table())  # choose reads the selection rows of each grid point itself


def _replicates(runs: pd.DataFrame, picked: pd.DataFrame, task: str) -> dict:
    """Scores of one (evaluation, view, task, method): each metric on the predictions pooled over the folds, the
    mean over seeds; its spread over the runs (seeds of the official split, folds of the k-fold one)."""
    pooled = [tasks.metrics(task, g.label, g.prediction, g.group) for _, g in picked.groupby("seed")]
    return {f"{m}_{f}": (np.mean([p[m] for p in pooled]) if pooled and m in pooled[0] else np.nan) if f == "mean"
            else runs[m].std() for m in METRICS for f in ("mean", "std")}


def _picked(frame: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """The rows of `frame` (results or predictions) at the given (task, fold, method, variant, lr) points."""
    keys = ["task", "fold", "method", "variant", "lr"]
    return frame.merge(points[keys].drop_duplicates(), on=keys)


def _view(frame: pd.DataFrame, design: Design, view: str, method: str) -> pd.DataFrame:
    """The final rows (results or predictions) of one view's runs of a method: its stage, its seeds (not the A/A
    control's)."""
    return frame[(frame.stage == design.stage(view, "final", method)) &
                 frame.seed.isin(design.view_seeds(view, "final"))]


def summarize(cfg: SuperGlueRecipe, prep: Prepared, finals: pd.DataFrame, predictions: pd.DataFrame,
              points: pd.DataFrame) -> pd.DataFrame:
    """Per evaluation ("val", or "cv": the folds pooled), view, task and method: the point (the most frequent one
    over the folds, every fold's in `steps`), the scores, the number of runs and of failed runs, and the costs
    (parameters, adapter size, training time, peak memory, speed)."""
    out, design = [], Design.of(cfg.model_dump())
    for task, data in prep.tasks.items():
        for evaluation, folds in evaluations(data).items():
            for (view, method), chosen in points[(points.task == task) & points.fold.isin(folds)].groupby(
                    ["view", "method"], sort=False):
                runs = _picked(_view(finals, design, view, method), chosen)
                picked = _picked(_view(predictions, design, view, method), chosen)
                step = chosen.groupby(["variant", "lr"]).size().sort_values(ascending=False, kind="stable")
                out.append({"evaluation": evaluation, "view": view, "task": task, "method": method,
                            "kind": runs.kind.iloc[0] if len(runs) else CONTROL,
                            "variant": step.index[0][0], "lr": step.index[0][1],
                            "steps": ", ".join(f"{lr:g}" + (f" ({v})" if v != "default" else "") +
                                               (f" ×{n}" if len(folds) > 1 else "") for (v, lr), n in step.items()),
                            "edge": int(chosen.edge.sum()), **_replicates(runs, picked, task),
                            "runs": len(runs), "failed": int(runs.failed.astype("string").fillna("").ne("").sum()),
                            "scored_rows": picked.drop_duplicates(["fold", "row"]).shape[0],
                            "trainable_params": runs.trainable_params.max(), "total_params": runs.total_params.max(),
                            "adapter_bytes": runs.adapter_bytes.max(), "train_seconds": runs.train_seconds.mean(),
                            "peak_mem_mb": runs.peak_mem_mb.max(), "train_loss": runs.train_loss.mean(),
                            "examples_per_s": runs.examples_per_s.mean()})
    return pd.DataFrame(out)


def run(cfg: SuperGlueRecipe, folder: Run, prep: Prepared) -> dict[str, pd.DataFrame]:
    """Selection runs, then final runs, each resumable; summary, comparisons, figure and run.json."""
    results = Results(folder, KEYS, write=is_main_process(), ordered=True)
    predictions = Results(folder, KEYS, name="predictions.csv", write=is_main_process(), done=results.done,
                          ordered=True)
    points = _select(cfg, prep, folder, results, predictions)
    finals = final_points(cfg, points)
    _train_all(cfg, prep, folder, results, predictions, finals, "final seeds")
    summary = summarize(cfg, prep, results.table(finals), predictions.table(), points)
    assessed = assess(points, predictions.table(), summary, Design.of(cfg.model_dump()))
    if is_main_process():
        from ...figures.superglue import pareto

        folder.save_csv("points.csv", points)
        folder.save_csv("summary.csv", summary)
        folder.save_figure("table2.png", pareto(headline(summary, "chosen"), assessed["signal"]))
        folder.finish(tasks={t: d.sizes for t, d in prep.tasks.items()},
                      edges=points[points.edge].drop(columns=["view", "edge"]).to_dict("records"))
    return {"summary": summary, **assessed}


def tables(cfg: SuperGlueRecipe, result: dict) -> list[tuple[str, pd.DataFrame]]:
    return sections(result["summary"], result, f"superglue '{cfg.name}'")
