"""The SuperGLUE tasks of Table 2 (and RTE, WiC, WSC): where their files are, how the official JSONL becomes
the hub's layout (`aps/super_glue`), how each example becomes one or two texts, the splits a run trains and
evaluates on, and the official metrics.

Local files are cast as the hub casts them: MultiRC's nested passage → questions → answers becomes one row
per answer option (paragraph, question, answer, label; its question is the group that exact match scores);
WSC's nested `target` becomes span1_index, span2_index, span1_text, span2_text; boolean labels become 0/1
and CB's / RTE's label strings their index. COPA is already flat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import UserError
from ..finetune import data
from ..finetune.recipe import DataSpec


@dataclass(frozen=True)
class Task:
    folder: str  # the official zip's folder name
    text_fields: tuple[str, ...]  # names, alternatives or templates (see finetune.data)
    labels: tuple[str, ...]  # label names in the hub's class order
    metrics: tuple[str, ...] = ("accuracy",)


TASKS = {
    "boolq": Task("BoolQ", ("question", "passage"), ("false", "true")),
    "cb": Task("CB", ("premise", "hypothesis"), ("entailment", "contradiction", "neutral"), ("accuracy", "f1_macro")),
    "copa": Task("COPA", ("{premise} What was the {question}?", "1: {choice1} 2: {choice2}"), ("choice1", "choice2")),
    "multirc": Task("MultiRC", ("{paragraph}", "{question} {answer}"), ("false", "true"), ("accuracy", "f1a", "em")),
    "rte": Task("RTE", ("premise|sentence1", "hypothesis|sentence2"), ("entailment", "not_entailment")),
    "wic": Task("WiC", ("{word}: {sentence1}", "{sentence2}"), ("false", "true")),
    "wsc": Task("WSC", ("{text}", "Does '{span2_text}' refer to '{span1_text}'?"), ("false", "true")),
}


def task_folder(root: Path, name: str, only: bool) -> Path:
    """<root>/<Task>/, or root itself when it is the one task's own folder (e.g. GLUE's RTE TSV files)."""
    folder = root / TASKS[name].folder
    if folder.is_dir():
        return folder
    if only and root.is_dir() and any(root.glob("train.*")):
        return root
    raise UserError(f"no folder {folder} for task {name} (data.path should hold one folder per task, "
                    f"{', '.join(t.folder for t in TASKS.values())})")


def spec(name: str, path: Path | None, hub: str, max_length: int) -> DataSpec:
    """The finetune data spec of a task: local folder or hub configuration, its text fields and labels."""
    task = TASKS[name]
    where = {"path": str(path)} if path is not None else {"name": hub, "config": name}
    return DataSpec(**where, text_fields=list(task.text_fields), label_names=list(task.labels),
                    num_labels=len(task.labels), max_length=max_length)


def _multirc_rows(ds) -> list[dict]:
    """Official MultiRC (one row per passage) → one row per answer option, as on the hub."""
    return [{"paragraph": p["passage"]["text"], "question": q["question"], "answer": a["text"],
             "group": f"{p['idx']}-{q['idx']}", "label": a["label"]}
            for p in ds for q in p["passage"]["questions"] for a in q["answers"]]


def _wsc_rows(ds) -> list[dict]:
    return [{"text": r["text"], **r["target"], "idx": r["idx"], "label": r["label"]} for r in ds]


def hub_layout(name: str, ds):
    """The official layout → the hub's (flat rows, 0/1 labels) with a `group` column: MultiRC's question,
    every other task's row."""
    from datasets import Dataset

    if "passage" in ds.column_names and name == "multirc":
        ds = Dataset.from_list(_multirc_rows(ds))
    elif "target" in ds.column_names and name == "wsc":
        ds = Dataset.from_list(_wsc_rows(ds))
    if "group" not in ds.column_names:
        groups = [f"{i['paragraph']}-{i['question']}" for i in ds["idx"]] if name == "multirc" else range(len(ds))
        ds = ds.add_column("group", [str(g) for g in groups])
    if len(ds) and isinstance(ds[0]["label"], bool):
        ds = ds.map(lambda r: {"label": int(r["label"])})
    return ds


def has_train(dspec: DataSpec) -> bool:
    """Whether the task has a train split (the shared BoolQ has validation only)."""
    return dspec.path is None or bool(data.split_files(Path(dspec.path), "train"))


def _labelled(name: str, ds, split: str) -> None:
    """Every row (every MultiRC answer) has a label: the official files' test splits, or a file cut by hand, do not."""
    rows = ([a for p in ds["passage"] for q in p["questions"] for a in q["answers"]] if name == "multirc" and
            "passage" in ds.column_names else ds.to_list() if "label" in ds.column_names else [{}])
    missing = next((i for i, r in enumerate(rows) if r.get("label") is None), None)
    if missing is not None:
        raise UserError(f"{name} {split}: {'answer' if name == 'multirc' else 'row'} {missing + 1} has no label "
                        "(test splits are unlabelled; use train and val)")


def read(name: str, dspec: DataSpec, split: str):
    """One official split in the hub's layout, its labels checked against the task's."""
    raw = data.read(dspec, split)
    _labelled(name, raw, split)
    return data.cast(hub_layout(name, raw), dspec, split, keep=("group",))


def carve(labels, groups, size: float | int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of rows into (kept, held), `size` held (a share, or a number of rows): stratified by
    label, or, when rows share groups (MultiRC's questions), by whole groups."""
    from sklearn.model_selection import GroupShuffleSplit, train_test_split

    labels, groups, rows = np.asarray(labels), np.asarray(groups), np.arange(len(labels))
    if isinstance(size, int):
        size = size / len(rows)
    units = len(set(groups))
    if math.ceil(size * units) < 1 or math.floor((1 - size) * units) < 1:  # scikit-learn's rounding of the shares
        raise UserError(f"{len(rows)} rows ({units} groups) cannot be split into a kept and a held share of "
                        f"{size:.3g}: both would need a row; use more rows or another share")
    if len(set(groups)) == len(groups):
        counts = np.bincount(labels)
        strat = labels if counts[counts > 0].min() >= 2 and size * len(rows) >= len(counts) else None
        kept, held = train_test_split(rows, test_size=size, random_state=seed, stratify=strat)
    else:
        kept, held = next(GroupShuffleSplit(n_splits=1, test_size=size, random_state=seed).split(rows, groups=groups))
    return np.sort(kept), np.sort(held)


def folds(labels, groups, k: int, seed: int) -> list[np.ndarray]:
    """k seeded folds of the rows (each fold's rows, sorted): disjoint, covering every row, stratified by label, or
    by whole groups when rows share them (MultiRC's questions)."""
    from sklearn.model_selection import GroupKFold, KFold, StratifiedKFold

    labels, groups = np.asarray(labels), np.asarray(groups)
    units = len(set(groups))
    if k > units:
        raise UserError(f"{k} folds need at least {k} rows (groups), but there are {units}; lower data.folds")
    if units == len(groups):
        counts = np.bincount(labels)
        splitter = (StratifiedKFold if counts[counts > 0].min() >= k else KFold)(k, shuffle=True, random_state=seed)
        parts = splitter.split(np.zeros(len(labels)), labels)
    else:
        parts = GroupKFold(k, shuffle=True, random_state=seed).split(np.zeros(len(labels)), labels, groups)
    return [np.sort(held) for _, held in parts]


def limit(ds, n: int | None, seed: int):
    """At most about n rows (whole groups), seeded; all of ds when n is None or larger."""
    if n is None or n >= len(ds):
        return ds
    return ds.select(carve(ds["label"], ds["group"], n, seed)[1])


def metrics(name: str, labels, preds, groups) -> dict[str, float]:
    """The task's official metrics: accuracy; CB macro-F1; MultiRC F1 over all answers (F1a) and exact match
    over questions (every answer of the question right)."""
    from sklearn.metrics import f1_score

    labels, preds, groups = np.asarray(labels), np.asarray(preds), np.asarray(groups)
    out = {"accuracy": float((labels == preds).mean())}
    if "f1_macro" in TASKS[name].metrics:
        out["f1_macro"] = float(f1_score(labels, preds, average="macro", labels=range(len(TASKS[name].labels))))
    if "f1a" in TASKS[name].metrics:
        right = labels == preds
        out["f1a"] = float(f1_score(labels, preds, average="binary", zero_division=0.0))
        out["em"] = float(np.mean([right[groups == g].all() for g in np.unique(groups)]))
    return out
