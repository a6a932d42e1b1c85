"""The pieces of the Hugging Face Trainer that `train.train` assembles: the checked Trainer, the clock, the
collator that carries row ids, and the scorer that puts the evaluation back in the evaluation set's order.

This module imports transformers at the top; `train.py` imports it on first use, so that `ntk --help` and the
other commands do not pay for it.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

from ...adapters import LR_OVERRIDE
from .protocol import ROW, TrainingFailed, precision


class RowCollator:
    """A collator that lets each example's row id (`row`) travel beside its inputs, as batch['row']: the
    evaluation's predictions are then paired with their rows inside the same batches, whatever order a sampler
    (length grouping, a distributed shard) draws them in."""

    def __init__(self, inner: Callable):
        self.inner = inner

    def __call__(self, features: list[dict]) -> dict:
        rows = [f[ROW] for f in features if ROW in f]
        batch = self.inner([{k: v for k, v in f.items() if k != ROW} for f in features])
        if rows:
            batch[ROW] = torch.tensor(rows)
        return batch


class CheckedTrainer(Trainer):
    """The Trainer, stopping at a non-finite loss; the row ids leave each batch before the model sees it (the
    Trainer keeps them as a second label, so they come back with the predictions); a parameter that carries a step
    of its own (adapters.LR_OVERRIDE) trains in a parameter group at that step."""

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        groups = []
        for group in optimizer.param_groups:
            by_step: dict[float | None, list] = {}
            for p in group["params"]:
                by_step.setdefault(getattr(p, LR_OVERRIDE, None), []).append(p)
            groups += [{**group, "params": ps, **({} if lr is None else {"lr": lr})} for lr, ps in by_step.items()]
        optimizer.param_groups = groups
        return optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = {k: v for k, v in inputs.items() if k != ROW}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss):
            raise TrainingFailed(f"the training loss is {loss.item()} at step {self.state.global_step + 1}")
        return loss


class Clock(TrainerCallback):
    """Training time per epoch (evaluation and probes excluded), the steps the fp16 grad scaler skipped, the
    progress bar, and a probe of the model (`probe(model)` → records) before training and after every epoch."""

    def __init__(self, advance: Callable[[float], None], probe: Callable | None = None):
        self.advance, self.probe, self.seconds, self.skipped, self.probes = advance, probe, [], 0, []
        self.accelerator = None  # the trainer's, set once it exists

    def _probe(self, model, epoch: int) -> None:
        if self.probe is not None:
            training = model.training
            model.eval()
            self.probes += [{"epoch": epoch, **record} for record in self.probe(model)]
            model.train(training)

    def on_train_begin(self, args, state, control, model=None, **kw):
        self._probe(model, 0)

    def on_epoch_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, args, state, control, model=None, **kw):
        self.seconds.append(time.perf_counter() - self.t0)
        self._probe(model, len(self.seconds))

    def on_step_end(self, args, state, control, **kw):
        self.skipped += bool(self.accelerator.optimizer_step_was_skipped)
        self.advance(1)


class Scorer:
    """compute_metrics: each evaluation's accuracy from predictions and labels paired in the same batches (the
    Trainer's own pairing), and the last evaluation's logits and labels put in the evaluation set's order by the
    row ids that came back with them. Every row must come back exactly once (a torchrun shard's padded repeats
    are dropped)."""

    def __init__(self, rows: int):
        self.rows = rows
        self.logits = self.labels = None

    def __call__(self, prediction) -> dict:
        out = prediction.predictions
        logits = out[0] if isinstance(out, tuple) else out
        labels, rows = prediction.label_ids
        kept, first = np.unique(rows, return_index=True)
        if not np.array_equal(kept, np.arange(self.rows)):
            raise TrainingFailed(f"the evaluation returned {len(kept)} distinct rows of {self.rows}")
        self.logits, self.labels = logits[first], labels[first]
        return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def make_trainer(model, train_ds, eval_ds, collator, scratch: str, *, clock: Clock, scorer: Scorer, spec, lr: float,
                 epochs: int, seed: int, device: torch.device, per_epoch: bool) -> CheckedTrainer:
    """The Trainer of one run: AdamW at `lr`, the row ids as a second label, text batches grouped by length (less
    padding), accuracy after every epoch (or none: the caller evaluates once), our progress bar instead of its log."""
    text = "input_ids" in train_ds.column_names
    args = TrainingArguments(
        output_dir=scratch, num_train_epochs=epochs, learning_rate=lr, weight_decay=spec.weight_decay,
        warmup_steps=spec.warmup_ratio, per_device_train_batch_size=spec.batch_size,
        per_device_eval_batch_size=spec.eval_batch_size, eval_strategy="epoch" if per_epoch else "no",
        logging_strategy="epoch", train_sampling_strategy="group_by_length" if text else "random",
        label_names=["labels", ROW], save_strategy="no", report_to=[], seed=seed, data_seed=seed,
        use_cpu=device.type == "cpu", disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
        **precision(spec, device))
    trainer = CheckedTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                             data_collator=RowCollator(collator), compute_metrics=scorer, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # our progress bar and tables report instead
    clock.accelerator = trainer.accelerator
    return trainer
