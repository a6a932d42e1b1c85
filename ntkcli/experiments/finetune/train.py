"""One fine-tuning run with the Hugging Face Trainer: accuracy per epoch, training time, peak memory."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from typing import Callable, Iterator

import numpy as np
import torch

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


def _precision(spec: TrainSpec, device: torch.device) -> dict:
    mode = spec.precision
    if mode == "auto":
        mode = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return {"bf16": mode == "bf16", "fp16": mode == "fp16"}


class TrainingFailed(Exception):
    """Training produced nothing worth recording (a non-finite loss, or no optimizer step taken)."""


def train(model, train_ds, eval_ds, collator, *, spec: TrainSpec, lr: float, epochs: int, seed: int,
          device: torch.device, advance: Callable[[float], None], per_epoch: bool = True) -> tuple[list[dict], np.ndarray]:
    """Train with AdamW and evaluate after every epoch (or, per_epoch=False, once at the end): one dict per
    evaluation (accuracy, losses, seconds, memory), and the last evaluation's logits in eval_ds's order.
    Text batches are grouped by length (less padding)."""
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    seconds: list[float] = []
    skipped: list[int] = []
    logits: list[np.ndarray] = []

    def accuracy(prediction) -> dict:
        out = prediction.predictions
        logits[:] = [out[0] if isinstance(out, tuple) else out]
        return {"accuracy": float((np.argmax(logits[0], axis=-1) == prediction.label_ids).mean())}

    class CheckedTrainer(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            if not torch.isfinite(loss):
                raise TrainingFailed(f"the training loss is {loss.item()} at step {self.state.global_step + 1}")
            return loss

    class Clock(TrainerCallback):
        """Training time per epoch (evaluation excluded), steps the fp16 grad scaler skipped, the progress bar."""

        def on_epoch_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kw):
            seconds.append(time.perf_counter() - self.t0)

        def on_step_end(self, args, state, control, **kw):
            skipped.extend([state.global_step] if trainer.accelerator.optimizer_step_was_skipped else [])
            advance(1)

    text = "input_ids" in train_ds.column_names
    with tempfile.TemporaryDirectory(prefix="ntk-trainer-") as scratch:
        args = TrainingArguments(
            output_dir=scratch, num_train_epochs=epochs, learning_rate=lr, weight_decay=spec.weight_decay,
            warmup_steps=spec.warmup_ratio, per_device_train_batch_size=spec.batch_size,
            per_device_eval_batch_size=spec.eval_batch_size, eval_strategy="epoch" if per_epoch else "no",
            logging_strategy="epoch", train_sampling_strategy="group_by_length" if text else "random",
            save_strategy="no", report_to=[], seed=seed, data_seed=seed, use_cpu=device.type == "cpu",
            disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0, **_precision(spec, device))
        trainer = CheckedTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          data_collator=collator, compute_metrics=accuracy, callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)  # our progress bar and tables report instead
        with peak_memory(device) as peak:
            trainer.train()
        if not per_epoch:
            trainer.evaluate()
    if skipped and len(skipped) == trainer.state.global_step:
        raise TrainingFailed(f"the fp16 grad scaler skipped all {len(skipped)} optimizer steps (overflowing "
                             "gradients), so the weights never changed; use precision bf16 or fp32")
    evals = [h for h in trainer.state.log_history if "eval_accuracy" in h]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    epoch_of = range(1, len(evals) + 1) if per_epoch else [epochs]  # the epoch after which each evaluation ran
    return [{"epoch": n, "accuracy": e["eval_accuracy"], "eval_loss": e["eval_loss"],
             "train_loss": losses[n - 1] if n <= len(losses) else float("nan"),
             "train_seconds": float(np.sum(seconds[:n])), "peak_mem_mb": peak[0]}
            for n, e in zip(epoch_of, evals)], logits[0]
