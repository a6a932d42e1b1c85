"""Paper 1, Table 2 at small scale on real SuperGLUE: every method's learning rate chosen fairly, several seeds.

For every (task, method): train once per grid point (learning rate × variant, the first seed) on train minus
a held-out share and score that share; choose the best point; then train every seed on all of train at the
chosen point and at the paper's protocol (train.lr for every PEFT method) and score the evaluation split,
keeping each example's prediction for the paired bootstrap of the report (claims.py).
results.csv has one row per (stage, task, method, variant, lr, seed); predictions.csv the final runs'
predictions; summary.csv mean ± std per (view, task, method).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ...models import load_tokenizer, model_config
from ...runs import Results, Run, is_main_process, resolve_device
from ..finetune import Inputs, checks, optimizer_steps, quiet, train_method
from ..finetune.data import tokenize
from . import tasks
from .claims import COMMAND, TITLE, assess, report, table2  # noqa: F401 — the experiment contract
from .recipe import CONTROL, SuperGlueRecipe, TunedMethod, variant_name

HELP = ("Table 2 (paper 1, §5) on real SuperGLUE with a real pretrained model: NTK-Attention vs P-Tuning v2 vs "
        "LoRA vs full fine-tuning vs any peft method, each learning rate chosen on held-out train.\n\n"
        "Reads the hub's aps/super_glue, or the official JSONL files with --set data.path=DIR. Writes results.csv "
        "(selection and final runs), predictions.csv, summary.csv (both views: chosen step and the paper's), "
        "claims.csv (paired bootstrap verdicts), table2.png (accuracy against trainable parameters) and run.json "
        "to outputs/superglue/<recipe>/; re-running skips finished runs.")
NEEDS_RECIPE, FLAGS, DEVICES = True, {}, ("cpu", "cuda")
SCALE = ("seeds", "train")
KEYS = ["stage", "task", "method", "variant", "lr", "seed"]
METRICS = ["accuracy", "f1_macro", "f1a", "em"]
RESUMABLE = ("methods", "seeds")
FILES = ("results.csv", "predictions.csv", "summary.csv", "claims.csv", "table2.png")
RECIPE = SuperGlueRecipe
VIEWS = ("chosen", "paper")  # the step chosen on held-out train; the paper's one step for every PEFT method


@dataclass
class Split:
    """Tokenized rows for the Trainer and, in the same order, what scoring needs."""

    rows: object
    labels: np.ndarray
    groups: np.ndarray
    index: np.ndarray  # each row's position in the split as read (for predictions.csv)


@dataclass
class TaskSplits:
    train: Split
    eval: Split
    fit: Split  # train minus the held-out share: the selection runs train here …
    val: Split  # … and are scored here
    carved: bool  # whether the evaluation split was carved out of the validation file


@dataclass
class Prepared:
    device: object
    collator: object
    tasks: dict[str, TaskSplits]


def _split(ds, tokenizer, max_length: int, by_length: bool = False) -> Split:
    """Tokenize; evaluation rows sorted by length (less padding), the order kept in `index`."""
    rows = tokenize(ds, tokenizer, max_length)
    order = np.argsort([len(r) for r in rows["input_ids"]], kind="stable") if by_length else np.arange(len(rows))
    rows = rows.select(order)
    return Split(rows.remove_columns("group"), np.asarray(rows["label"]), np.asarray(rows["group"]), order)


def subset(split: Split, n: int, seed: int) -> Split:
    """About n rows of a split (whole groups, stratified by label), seeded; all of it when n covers it."""
    if n >= len(split.labels):
        return split
    keep = tasks.carve(split.labels, split.groups, n, seed)[1]
    return Split(split.rows.select(keep), split.labels[keep], split.groups[keep], split.index[keep])


def _task(cfg: SuperGlueRecipe, name: str, tokenizer) -> TaskSplits:
    """The task's train and evaluation splits (carved from validation when it has no train), limited as the
    recipe says, and the selection split carved from train."""
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
    train = tasks.limit(train, cfg.data.max_train.get(name), cfg.seed)
    evaluation = tasks.limit(evaluation, cfg.data.max_eval.get(name), cfg.seed)
    fit, val = tasks.carve(train["label"], train["group"], cfg.selection.val_fraction, cfg.seed)
    n = cfg.data.length(name)
    return TaskSplits(_split(train, tokenizer, n), _split(evaluation, tokenizer, n, True),
                      _split(train.select(fit), tokenizer, n), _split(train.select(val), tokenizer, n, True), carved)


def _checked_task(cfg: SuperGlueRecipe, name: str, tokenizer) -> TaskSplits:
    """_task, its data errors naming the task."""
    try:
        return _task(cfg, name, tokenizer)
    except UserError as err:
        raise UserError(f"task {name}: {err}") from None


def prepare(cfg: SuperGlueRecipe) -> Prepared:
    """Device, tokenizer and every task's splits, read before the run folder exists."""
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


def grid(method: TunedMethod) -> list[tuple[str, float]]:
    """A method's (variant, lr) grid points, in order."""
    return [(variant_name(v), lr) for v in method.variants for lr in method.lrs]


def selection_points(cfg: SuperGlueRecipe) -> list[tuple]:
    """Every grid point of every (task, method) that has a choice to make (a grid of one point needs no selection
    run), trained with the first seed on the selection split."""
    return [("select", task, m.label, *point, cfg.seeds[0])
            for task in cfg.data.tasks for m in cfg.methods if len(grid(m)) > 1 for point in grid(m)]


def paper_lr(cfg: SuperGlueRecipe, method: TunedMethod) -> float:
    """The paper's protocol: one step for every PEFT method (train.lr), train.fft_lr for full fine-tuning."""
    return cfg.train.fft_lr if method.spec.method == "fft" else cfg.train.lr


def choose(cfg: SuperGlueRecipe, selected: pd.DataFrame) -> dict[tuple[str, str, str], tuple[str, float]]:
    """(view, task, method) → (variant, lr): the grid point with the best held-out accuracy (the first in grid
    order on a tie), and the paper's step with the first variant. Reads only the selection runs."""
    views = {}
    for task in cfg.data.tasks:
        for m in cfg.methods:
            points = grid(m)
            score = {(r.variant, r.lr): r.accuracy for r in selected[(selected.task == task) &
                                                                     (selected.method == m.label)].itertuples()}
            views["chosen", task, m.label] = max(points, key=lambda p: (score.get(p, -1.0), -points.index(p)))
            views["paper", task, m.label] = (variant_name(m.variants[0]), paper_lr(cfg, m))
        for view in VIEWS:
            views[view, task, CONTROL] = ("default", 0.0)
    return views


def final_points(cfg: SuperGlueRecipe, views: dict) -> list[tuple]:
    """Every seed at every view's point, each point once."""
    points = [("final", task, method, *views[view, task, method], seed)
              for task in cfg.data.tasks for method in [CONTROL, *(m.label for m in cfg.methods)] for view in VIEWS
              for seed in cfg.seeds]
    return list(dict.fromkeys(points))


def plan(cfg: SuperGlueRecipe) -> list[tuple[str, str]]:
    """What a run trains: the selection grid, then the final seeds (at most two points per (task, method))."""
    grid = len(selection_points(cfg))
    most = len(cfg.data.tasks) * len(cfg.methods) * len(VIEWS) * len(cfg.seeds)
    return [("tasks", ", ".join(cfg.data.tasks)), ("methods", ", ".join(m.label for m in cfg.methods)),
            ("selection runs (grid points × tasks)", str(grid)), ("final runs (at most)", str(most)),
            ("epochs per run", ", ".join(f"{t} {cfg.epochs(t)}" for t in cfg.data.tasks)),
            ("tokens per text field", ", ".join(f"{t} {cfg.data.length(t)}" for t in cfg.data.tasks)),
            ("model", cfg.model.name_or_path or "from config"),
            ("data", cfg.data.path or cfg.data.name)]


def _splits(prep: Prepared, stage: str, task: str) -> tuple[Split, Split]:
    """(trained on, scored on): a selection run's held-out split of train, or a final run's train and evaluation."""
    splits = prep.tasks[task]
    return (splits.fit, splits.val) if stage == "select" else (splits.train, splits.eval)


def _majority(train: Split, scored: Split) -> tuple[np.ndarray, dict]:
    """The control: the train split's most frequent label predicted for every scored row; nothing trained."""
    predicted = np.full(len(scored.labels), np.bincount(train.labels).argmax())
    return predicted, {"kind": CONTROL, "train_loss": np.nan, "train_seconds": 0.0, "examples_per_s": np.nan,
                       "peak_mem_mb": 0.0, "trainable_params": 0, "total_params": 0}


def _trained(cfg: SuperGlueRecipe, prep: Prepared, point: tuple, train: Split, scored: Split,
             advance) -> tuple[np.ndarray, dict]:
    """One method trained at one grid point: its predictions on the scored split and its run's numbers."""
    stage, task, label, variant, lr, seed = point
    method = next(m for m in cfg.methods if m.label == label)
    spec = method.candidates()[[variant_name(v) for v in method.variants].index(variant)]
    inputs = Inputs(prep.device, train.rows, scored.rows, prep.collator)
    trained = train_method(cfg, spec, seed, lr, inputs, advance, num_labels=len(tasks.TASKS[task].labels),
                           per_epoch=False, epochs=cfg.epochs(task))
    last = trained.rows.iloc[-1]
    return np.argmax(trained.evaluation.logits, axis=-1), {
        "kind": method.kind, "train_loss": last.train_loss, "train_seconds": last.train_seconds,
        "examples_per_s": len(train.labels) * cfg.epochs(task) / last.train_seconds, "peak_mem_mb": last.peak_mem_mb,
        "trainable_params": last.trainable_params, "total_params": last.total_params}


def _fit(cfg: SuperGlueRecipe, prep: Prepared, point: tuple, advance) -> tuple[dict, pd.DataFrame | None]:
    """One run (or the majority control): its results row, and for a final run each evaluation example's
    prediction."""
    stage, task, label = point[:3]
    train, scored = _splits(prep, stage, task)
    predicted, numbers = _majority(train, scored) if label == CONTROL else \
        _trained(cfg, prep, point, train, scored, advance)
    row = dict(zip(KEYS, point)) | {m: np.nan for m in METRICS} | \
        tasks.metrics(task, scored.labels, predicted, scored.groups) | numbers | {
        "train_rows": len(train.labels), "scored_rows": len(scored.labels)}
    if stage == "select":
        return row, None
    return row, pd.DataFrame({**dict(zip(KEYS, point)), "row": scored.index, "group": scored.groups,
                              "label": scored.labels, "prediction": predicted})


def _train_all(cfg: SuperGlueRecipe, prep: Prepared, folder: Run, results: Results, predictions: Results,
               points: list[tuple], what: str) -> None:
    todo = results.todo(points)
    steps = sum(optimizer_steps(len(_splits(prep, p[0], p[1])[0].labels), cfg.train.batch_size, cfg.epochs(p[1]))
                for p in todo if p[2] != CONTROL)
    with folder.task(f"{what}: {len(todo)} runs", steps) as advance:
        for point in todo:
            row, predicted = _fit(cfg, prep, point, advance)
            if predicted is not None:
                predictions.add(predicted)
            results.add([row])


def summarize(cfg: SuperGlueRecipe, finals: pd.DataFrame, views: dict) -> pd.DataFrame:
    """Per view, task and method: the point, its metrics' mean ± std over seeds, parameters and speed."""
    out = []
    for (view, task, method), (variant, lr) in views.items():
        runs = finals[(finals.task == task) & (finals.method == method) & (finals.variant == variant) &
                      (finals.lr == lr)]
        stats = {f"{m}_{f}": getattr(runs[m], f)() for m in METRICS for f in ("mean", "std")}
        out.append({"view": view, "task": task, "method": method, "kind": runs.kind.iloc[0] if len(runs) else "",
                    "variant": variant, "lr": lr, **stats,
                    "seeds": runs.seed.nunique(), "trainable_params": runs.trainable_params.max(),
                    "total_params": runs.total_params.max(), "examples_per_s": runs.examples_per_s.mean()})
    return pd.DataFrame(out)


def run(cfg: SuperGlueRecipe, folder: Run, prep: Prepared) -> dict[str, pd.DataFrame]:
    """Selection runs, then final runs, each resumable; summary, figure and run.json."""
    results = Results(folder, KEYS, write=is_main_process())
    predictions = Results(folder, KEYS, name="predictions.csv", write=is_main_process(), done=results.done)
    _train_all(cfg, prep, folder, results, predictions, selection_points(cfg), "choose the steps")
    views = choose(cfg, results.table(selection_points(cfg)))
    finals = final_points(cfg, views)
    _train_all(cfg, prep, folder, results, predictions, finals, "final seeds")
    summary = summarize(cfg, results.table(finals), views)
    floors, signal, diffs = assess(summary, predictions.table(finals), cfg.selection.bootstrap, cfg.seed)
    if is_main_process():
        from ...figures.superglue import pareto

        folder.save_csv("summary.csv", summary)
        folder.save_figure("table2.png", pareto(summary[summary.view == "chosen"], signal))
        folder.finish(tasks={t: {"train": len(s.train.labels), "eval": len(s.eval.labels), "carved": s.carved}
                             for t, s in prep.tasks.items()})
    return {"summary": summary, "floor": floors, "differences": diffs, "signal": signal}


def tables(cfg: SuperGlueRecipe, result: dict) -> list[tuple[str, pd.DataFrame]]:
    shown = [(f"superglue '{cfg.name}': accuracy % on the evaluation split ({view} step; avg over the tasks with "
              "signal)", table2(result["summary"], view, result["signal"])) for view in VIEWS]
    floors = result["floor"].assign(signal=result["floor"].signal.map({True: "yes", False: "no"}))
    return shown + [(f"superglue '{cfg.name}': learnability floor, method − majority class (points, 95% interval)",
                     floors.round(2))]
