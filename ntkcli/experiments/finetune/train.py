"""One fine-tuning run with the Hugging Face Trainer: accuracy per epoch, training time, peak memory, and the
last evaluation's logits in the evaluation set's order (carried there by row ids, never by position)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from .protocol import ROW, TrainingFailed, precision
from .recipe import TrainSpec



def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[list[float]]:
    """Yields a list that holds, afterwards, the peak memory rise in MiB: CUDA max allocated, or the
    resident set size sampled every 10 ms on the CPU (Linux)."""
    result: list[float] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield result
        result.append((torch.cuda.max_memory_allocated(device) - start) / 2**20)
        return
    if not os.path.exists("/proc/self/statm"):
        yield result
        result.append(float("nan"))
        return
    start, peak, done = _rss_bytes(), [0], threading.Event()

    def sample():
        while not done.wait(0.01):
            peak[0] = max(peak[0], _rss_bytes())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        done.set()
        thread.join()
        result.append(max(peak[0] - start, 0) / 2**20)


@dataclass
class Evaluation:
    """The last evaluation in the evaluation set's order: logits [rows, classes] and the labels they were scored
    against (those that came back with them, checked equal to the set's own)."""

    logits: np.ndarray
    labels: np.ndarray


@dataclass
class Trained:
    """One run: a row per evaluation (accuracy, losses, seconds, memory), the last evaluation, and what a probe
    recorded before training and after every epoch (each record with its `epoch`)."""

    rows: list[dict]
    evaluation: Evaluation
    probes: list[dict]


def labels_of(ds) -> np.ndarray:
    """A dataset's `label` column as stored (a transform that builds pixels on access is skipped)."""
    return np.asarray(ds.with_format(None)["label"])


def with_rows(ds):
    """The dataset with a `row` column 0 … n−1 (its order), unless it has one."""
    return ds if ROW in ds.column_names else ds.add_column(ROW, np.arange(len(ds)))


def aligned(scorer, eval_ds, accuracy: float) -> Evaluation:
    """The last evaluation, its alignment checked twice: the labels that came back with the predictions are the
    evaluation set's own, row for row, and the accuracy recomputed in the set's order is the Trainer's."""
    labels = labels_of(eval_ds)
    mine = float((np.argmax(scorer.logits, axis=-1) == labels).mean())
    if not np.array_equal(scorer.labels, labels) or abs(mine - accuracy) > 1e-9:
        raise TrainingFailed(f"the evaluation's predictions do not line up with its rows (accuracy {mine:.4f} in the "
                             f"set's order, {accuracy:.4f} by the Trainer's pairing)")
    return Evaluation(scorer.logits, labels)


def train(model, train_ds, eval_ds, collator, *, spec: TrainSpec, lr: float, epochs: int, seed: int,
          device: torch.device, advance: Callable[[float], None], per_epoch: bool = True,
          probe: Callable | None = None) -> Trained:
    """Train with AdamW and evaluate after every epoch (or, per_epoch=False, once at the end); `probe(model)`, a list
    of records, runs before training and after every epoch (in eval mode, no gradient)."""
    from .trainer import Clock, Scorer, make_trainer

    eval_ds = with_rows(eval_ds)
    clock, scorer = Clock(advance, probe), Scorer(len(eval_ds))
    with tempfile.TemporaryDirectory(prefix="ntk-trainer-") as scratch:
        trainer = make_trainer(model, train_ds, eval_ds, collator, scratch, clock=clock, scorer=scorer, spec=spec,
                               lr=lr, epochs=epochs, seed=seed, device=device, per_epoch=per_epoch)
        with peak_memory(device) as peak:
            trainer.train()
        if not per_epoch:
            trainer.evaluate()
    if clock.skipped and clock.skipped == trainer.state.global_step:
        raise TrainingFailed(f"the fp16 grad scaler skipped all {clock.skipped} optimizer steps (overflowing "
                             "gradients), so the weights never changed; use precision bf16 or fp32")
    evals = [h for h in trainer.state.log_history if "eval_accuracy" in h]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    epoch_of = range(1, len(evals) + 1) if per_epoch else [epochs]  # the epoch after which each evaluation ran
    rows = [{"epoch": n, "accuracy": e["eval_accuracy"], "eval_loss": e["eval_loss"],
             "train_loss": losses[n - 1] if n <= len(losses) else float("nan"),
             "train_seconds": float(np.sum(clock.seconds[:n])), "peak_mem_mb": peak[0]}
            for n, e in zip(epoch_of, evals)]
    return Trained(rows, aligned(scorer, eval_ds, evals[-1]["eval_accuracy"]), clock.probes)
