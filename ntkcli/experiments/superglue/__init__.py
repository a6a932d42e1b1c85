"""Paper 1, Table 2 at small scale on real SuperGLUE: every method's learning rate chosen fairly, several seeds,
and the task with few rows (CB) scored by k-fold cross-validation as well.

A task is scored on one or more folds: the official split (train → validation, fold "val", every seed) and, with
data.folds, k folds over train ∪ validation (fold "cv<i>", the first seed). In every fold, each (method, grid
point) trains on the fold's train minus a held-out share and is scored on that share (the selection split); the
best point is chosen there, and a point at its grid's edge grows the grid. Then every seed trains on the fold's
whole train at the chosen point and at the paper's (train.lr for every PEFT method) and is scored on the fold's
evaluation rows. results.csv has one row per (stage, task, fold, method, variant, lr, seed); predictions.csv every
run's predictions (the selection split's too: the report's floor and comparability read them); points.csv the
chosen and the paper's point per (task, fold, method); summary.csv the scores per (evaluation, view, task,
method), where evaluation "val" is the official split and "cv" the k folds pooled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ...executors import Failed
from ...models import load_tokenizer, model_config
from ...runs import Results, Run, is_main_process, resolve_device
from ..finetune import Inputs, checks, optimizer_steps, quiet, train_method
from ..finetune.data import tokenize
from . import tasks
from .claims import COMMAND, TITLE, assess, headline, report, sections  # noqa: F401 — the experiment contract
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
SCALE = ("seeds", "train")
KEYS = ["stage", "task", "fold", "method", "variant", "lr", "seed"]
METRICS = ["accuracy", "f1_macro", "f1a", "em"]
RESUMABLE = ("methods", "seeds", "data.tasks")
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
        folds[f"cv{i}"] = _fold(cfg, pool, np.setdiff1d(ids, held), held, list(cfg.seeds[:1]))
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


def _grown(lrs: list[float], score, grow: int) -> list[float]:
    """A variant's step grid, grown past an edge while its best measured step sits there: one point at a time, at
    the grid's own ratio, at most `grow` per edge. Stops where a point is not measured yet. `score(lr)` is the
    held-out accuracy (None: not measured; -1: the run failed)."""
    lrs, low, high = list(lrs), 0, 0
    while len(lrs) > 1 and all(score(lr) is not None for lr in lrs):
        best = max(lrs, key=lambda lr: (score(lr), -lrs.index(lr)))
        if best == lrs[0] and low < grow:
            lrs, low = [float(f"{lrs[0] ** 2 / lrs[1]:.3g}"), *lrs], low + 1
        elif best == lrs[-1] and high < grow:
            lrs, high = [*lrs, float(f"{lrs[-1] ** 2 / lrs[-2]:.3g}")], high + 1
        else:
            break
    return lrs


def _scorer(selected: pd.DataFrame, task: str, fold: str, label: str):
    """(variant, lr) → held-out accuracy of one (task, fold, method)'s selection runs (None: not run; -1: failed)."""
    rows = selected[(selected.stage == "select") & (selected.task == task) & (selected.fold == fold) &
                    (selected.method == label)]
    table = {(r.variant, float(r.lr)): (-1.0 if np.isnan(r.accuracy) else r.accuracy) for r in rows.itertuples()}
    return lambda variant, lr: table.get((variant, lr))


def candidates(cfg: SuperGlueRecipe, method: TunedMethod, score) -> list[tuple[str, float]]:
    """A method's (variant, lr) grid points, each variant's grid grown past an edge where its best step sits."""
    out = []
    for variant in map(variant_name, method.variants):
        out += [(variant, lr) for lr in _grown(cfg.lrs(method), lambda lr, v=variant: score(v, lr),
                                              cfg.selection.grow)]
    return out


def selection_points(cfg: SuperGlueRecipe, prep: Prepared, selected: pd.DataFrame) -> list[tuple]:
    """Every selection run known so far: per task, fold and method, its (grown) grid and the paper's point (whose
    held-out score decides whether the method learned at that step), with the fold's first seed; and the majority
    control. A grown point appears once the points before it are measured."""
    points = []
    for task, data in prep.tasks.items():
        for fold, f in data.folds.items():
            points.append(("select", task, fold, CONTROL, "default", 0.0, f.seeds[0]))
            for m in cfg.methods:
                grid = candidates(cfg, m, _scorer(selected, task, fold, m.label))
                points += [("select", task, fold, m.label, *p, f.seeds[0])
                           for p in dict.fromkeys([*grid, paper_point(cfg, m)])]
    return points


def choose(cfg: SuperGlueRecipe, prep: Prepared, selected: pd.DataFrame) -> pd.DataFrame:
    """The chosen and the paper's point per (task, fold, method): the chosen one is the grid point with the best
    held-out accuracy (the first in grid order on a tie), `edge` when it sits at its variant's grid edge even after
    growing. Reads only the selection runs."""
    out = []
    for task, data in prep.tasks.items():
        for fold in data.folds:
            out += [{"view": view, "task": task, "fold": fold, "method": CONTROL, "variant": "default", "lr": 0.0,
                     "edge": False} for view in VIEWS]
            for m in cfg.methods:
                score = _scorer(selected, task, fold, m.label)
                grid = candidates(cfg, m, score)
                best = max(grid, key=lambda p: (score(*p) if score(*p) is not None else -2.0, -grid.index(p)))
                lrs = [lr for v, lr in grid if v == best[0]]
                out.append({"view": "chosen", "task": task, "fold": fold, "method": m.label, "variant": best[0],
                            "lr": best[1], "edge": len(lrs) > 1 and best[1] in (lrs[0], lrs[-1])})
                out.append({"view": "paper", "task": task, "fold": fold, "method": m.label,
                            **dict(zip(("variant", "lr"), paper_point(cfg, m))), "edge": False})
    return pd.DataFrame(out)


def final_points(prep: Prepared, points: pd.DataFrame) -> list[tuple]:
    """Every seed of its fold at every view's point, each point once."""
    out = [("final", r.task, r.fold, r.method, r.variant, r.lr, seed) for r in points.itertuples()
           for seed in prep.tasks[r.task].folds[r.fold].seeds]
    return list(dict.fromkeys(out))


def plan(cfg: SuperGlueRecipe) -> list[tuple[str, str]]:
    """What a run trains, before any selection run: the grids, then the final seeds (at most two points per
    (task, fold, method)); a grid that grows adds selection runs."""
    folds = {t: 1 + cfg.data.folds.get(t, 0) for t in cfg.data.tasks}
    grid = sum(len({*((variant_name(v), lr) for v in m.variants for lr in cfg.lrs(m)), paper_point(cfg, m)})
               for m in cfg.methods)
    seeds = sum(len(cfg.seeds) + cfg.data.folds.get(t, 0) for t in cfg.data.tasks)
    return [("tasks", ", ".join(f"{t} ({folds[t] - 1} folds + val)" if folds[t] > 1 else t for t in cfg.data.tasks)),
            ("methods", ", ".join(m.label for m in cfg.methods)),
            ("selection runs (grid points × folds)", str(grid * sum(folds.values()))),
            ("final runs (at most)", str(len(cfg.methods) * len(VIEWS) * seeds)),
            ("epochs per run", ", ".join(f"{t} {cfg.epochs(t)}" for t in cfg.data.tasks)),
            ("tokens per text field", ", ".join(f"{t} {cfg.data.length(t)}" for t in cfg.data.tasks)),
            ("non-inferiority margin", f"{cfg.selection.margin:g} points"),
            ("model", cfg.model.name_or_path or "from config"),
            ("data", cfg.data.path or cfg.data.name)]


def _splits(prep: Prepared, stage: str, task: str, fold: str) -> tuple[Split, Split]:
    """(trained on, scored on): a selection run's fit and held-out parts of the fold's train, or a final run's train
    and evaluation rows."""
    f = prep.tasks[task].folds[fold]
    return (f.fit, f.held) if stage == "select" else (f.train, f.eval)


def _majority(train: Split, scored: Split) -> tuple[np.ndarray, dict]:
    """The control: the train split's most frequent label predicted for every scored row; nothing trained."""
    predicted = np.full(len(scored.labels), np.bincount(train.labels).argmax())
    return predicted, {"kind": CONTROL, "train_loss": np.nan, "train_seconds": 0.0, "examples_per_s": np.nan,
                       "peak_mem_mb": 0.0, "trainable_params": 0, "total_params": 0}


def _trained(cfg: SuperGlueRecipe, prep: Prepared, point: tuple, train: Split, scored: Split,
             advance) -> tuple[np.ndarray | None, dict]:
    """One method trained at one grid point: its predictions on the scored split and its run's numbers; a run that
    fails (a non-finite loss) gives no predictions and says why in `failed`."""
    stage, task, fold, label, variant, lr, seed = point
    method = _method(cfg, label)
    spec = method.candidates()[[variant_name(v) for v in method.variants].index(variant)]
    inputs = Inputs(prep.device, train.rows, scored.rows, prep.collator)
    try:
        trained = train_method(cfg, spec, seed, lr, inputs, advance, num_labels=len(tasks.TASKS[task].labels),
                               per_epoch=False, epochs=cfg.epochs(task))
    except MethodFailed as err:
        return None, {"kind": method.kind, "failed": str(err)}
    last = trained.rows.iloc[-1]
    return np.argmax(trained.evaluation.logits, axis=-1), {
        "kind": method.kind, "train_loss": last.train_loss, "train_seconds": last.train_seconds,
        "examples_per_s": len(train.labels) * cfg.epochs(task) / last.train_seconds, "peak_mem_mb": last.peak_mem_mb,
        "trainable_params": last.trainable_params, "total_params": last.total_params}


def _fit(shared: tuple[SuperGlueRecipe, Prepared], point: tuple, advance) -> tuple[dict, pd.DataFrame | None]:
    """One run (or the majority control): its results row, and each scored example's prediction (a pure function of
    the point: any executor's worker may run it)."""
    cfg, prep = shared
    stage, task, fold, label = point[:4]
    train, scored = _splits(prep, stage, task, fold)
    predicted, numbers = _majority(train, scored) if label == CONTROL else \
        _trained(cfg, prep, point, train, scored, advance)
    row = _row(prep, point) | numbers
    if predicted is None:
        return row, None
    row |= tasks.metrics(task, scored.labels, predicted, scored.groups)
    return row, pd.DataFrame({**dict(zip(KEYS, point)), "row": scored.index, "group": scored.groups,
                              "label": scored.labels, "prediction": predicted})


def _row(prep: Prepared, point: tuple) -> dict:
    """A run's results row before its numbers: its keys, no metrics, not failed, the split sizes."""
    train, scored = _splits(prep, *point[:3])
    return dict(zip(KEYS, point)) | {m: np.nan for m in METRICS} | {"failed": ""} | {
        "train_rows": len(train.labels), "scored_rows": len(scored.labels)}


def _train_all(cfg: SuperGlueRecipe, prep: Prepared, folder: Run, results: Results, predictions: Results,
               points: list[tuple], what: str) -> None:
    """Every point not measured yet, by the run's executor; each saved as it finishes (a run that raised or whose
    worker died is a failed row naming why)."""
    todo = results.todo(points)

    def steps(p: tuple) -> int:
        return 0 if p[3] == CONTROL else \
            optimizer_steps(len(_splits(prep, *p[:3])[0].labels), cfg.train.batch_size, cfg.epochs(p[1]))

    for point, outcome in folder.measure(f"{what}: {len(todo)} runs", _fit, todo, (cfg, prep), steps):
        row, predicted = (_row(prep, point) | {"kind": _kind(cfg, point[3]), "failed": outcome.reason}, None) \
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


def summarize(prep: Prepared, finals: pd.DataFrame, predictions: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Per evaluation ("val", or "cv": the folds pooled), view, task and method: the point (the most frequent one
    over the folds, every fold's in `steps`), the scores, the number of runs and of failed runs, parameters and
    speed."""
    out = []
    for task, data in prep.tasks.items():
        for evaluation, folds in evaluations(data).items():
            for (view, method), chosen in points[(points.task == task) & points.fold.isin(folds)].groupby(
                    ["view", "method"], sort=False):
                runs, picked = _picked(finals, chosen), _picked(predictions[predictions.stage == "final"], chosen)
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
                            "examples_per_s": runs.examples_per_s.mean()})
    return pd.DataFrame(out)


def run(cfg: SuperGlueRecipe, folder: Run, prep: Prepared) -> dict[str, pd.DataFrame]:
    """Selection runs, then final runs, each resumable; summary, comparisons, figure and run.json."""
    results = Results(folder, KEYS, write=is_main_process(), ordered=True)
    predictions = Results(folder, KEYS, name="predictions.csv", write=is_main_process(), done=results.done,
                          ordered=True)
    points = _select(cfg, prep, folder, results, predictions)
    finals = final_points(prep, points)
    _train_all(cfg, prep, folder, results, predictions, finals, "final seeds")
    summary = summarize(prep, results.table(finals), predictions.table(), points)
    assessed = assess(points, predictions.table(), summary, cfg.selection.bootstrap, cfg.seed, cfg.selection.margin)
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
