"""§5, Tables 1–2: NTK-Attention vs P-Tuning v2 vs LoRA vs full fine-tuning on a Hugging Face model.

For every method and seed: load the base model, `inject` the method, train with the Trainer,
evaluate accuracy after each epoch. results.csv has one row per (method, seed, epoch); summary.csv
the final-epoch accuracy mean ± std over seeds, trainable parameters, training time and peak memory.
A recipe with `pretrain` first trains its architecture from scratch on other classes (digits 0–4)
and fine-tunes that checkpoint (cached in the run folder).
"""

from __future__ import annotations

import math
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ...adapters import inject
from ...errors import UserError
from ...models import load_model, load_tokenizer, model_config
from ...recipes import DataSpec, FinetuneRecipe, method_label, method_options
from ...runs import Run, is_main_process, process_rank, resolve_device, resume, seed_for
from . import data
from .train import TrainingFailed, train

KEYS = ["method", "seed"]
COLUMNS = ["method", "kind", "seed", "epoch", "accuracy", "eval_loss", "train_loss", "train_seconds", "peak_mem_mb",
           "lr", "trainable_params", "total_params"]
RESUMABLE = ("methods", "seeds")
FILES = ("results.csv", "summary.csv", "pretrain.csv", "pretrained")


def _wait_for_main() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _datasets(cfg: FinetuneRecipe, config, tokenizer, classes=None):
    """(train, eval, collator) ready for the Trainer; `config` is the model's (image size, channels)."""
    from transformers import DataCollatorWithPadding, default_data_collator

    spec: DataSpec = cfg.data
    splits = [data.load_split(spec, split, cfg.seed, classes, limit)
              for split, limit in ((spec.train_split, spec.max_train_samples), (spec.eval_split, spec.max_eval_samples))]
    if tokenizer is None:
        size, channels = config.image_size, config.num_channels
        return *(data.with_pixels(s, size, channels) for s in splits), default_data_collator
    return *(data.tokenize(s, tokenizer, spec.max_length) for s in splits), DataCollatorWithPadding(tokenizer)


def _steps(n: int, batch: int, epochs: int) -> int:
    """Optimizer steps per process (the Trainer shards each batch of batch × world size examples)."""
    return math.ceil(n / (batch * process_rank()[1])) * epochs


def pretrain(cfg: FinetuneRecipe, run: Run, device: torch.device) -> tuple[Path, pd.DataFrame]:
    """Train model.config from scratch on pretrain.classes (once; cached as run folder/pretrained)."""
    from transformers import set_seed

    folder, spec = run.path("pretrained"), cfg.pretrain
    done = run.load_csv("pretrain.csv")
    if done is not None and (folder / "config.json").exists():
        return folder, done
    set_seed(cfg.seed)
    model = load_model(cfg.model, cfg.data.image_field is not None, len(spec.classes)).to(device)
    train_ds, eval_ds, collator = _datasets(cfg, model.config,
                                            None if cfg.data.image_field else load_tokenizer(cfg.model), spec.classes)
    tspec = cfg.train.model_copy(update={"batch_size": spec.batch_size})
    with run.task(f"pretrain on classes {spec.classes}", _steps(len(train_ds), spec.batch_size, spec.epochs)) as adv:
        try:
            rows = train(model, train_ds, eval_ds, collator, spec=tspec, lr=spec.lr, epochs=spec.epochs,
                         seed=cfg.seed, device=device, advance=adv)
        except TrainingFailed as err:
            raise UserError(f"pretraining: {err}") from None
    table = pd.DataFrame(rows).assign(classes=" ".join(map(str, spec.classes)))
    if is_main_process():
        tmp = run.path(".pretrained-tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.base_model.save_pretrained(tmp)  # the backbone only: fine-tuning gets a fresh head
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        run.save_csv("pretrain.csv", table)
    _wait_for_main()
    return folder, table


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Final-epoch accuracy mean ± std over seeds (and the best epoch's), parameters, time, memory."""
    final = results[results.epoch == results.groupby(["method", "seed"]).epoch.transform("max")]
    best = results.groupby(["method", "seed"]).accuracy.max().groupby("method").mean()
    table = final.groupby("method", sort=False).agg(
        accuracy_mean=("accuracy", "mean"), accuracy_std=("accuracy", "std"), seeds=("seed", "nunique"),
        trainable_params=("trainable_params", "first"), total_params=("total_params", "first"),
        train_seconds=("train_seconds", "mean"), peak_mem_mb=("peak_mem_mb", "mean")).reset_index()
    table["accuracy_std"] = table["accuracy_std"].fillna(0.0)
    table.insert(3, "best_epoch_accuracy_mean", table.method.map(best))
    table.insert(6, "trainable_pct", 100 * table.trainable_params / table.total_params)
    return table


@dataclass
class Inputs:
    """What the fine-tuning runs read, loaded (so checked) before the run folder exists: a missing model,
    tokenizer or data file is then one line with nothing written."""

    device: torch.device
    train: object
    eval: object
    collator: object


def prepare(cfg: FinetuneRecipe) -> Inputs:
    """The device, the model's configuration (its location probed without loading weights), tokenizer and data."""
    import datasets
    from transformers import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers|peft")
    device = resolve_device(cfg.device)
    image = cfg.data.image_field is not None
    config = model_config(cfg.model)
    tokenizer = None if image else load_tokenizer(cfg.model)
    return Inputs(device, *_datasets(cfg, config if image else None, tokenizer))


def run(cfg: FinetuneRecipe, run: Run, inputs: Inputs) -> dict[str, pd.DataFrame]:
    from transformers import set_seed

    device, image = inputs.device, cfg.data.image_field is not None
    source, pre = pretrain(cfg, run, device) if cfg.pretrain is not None else (None, None)
    source = str(source) if source is not None else None
    previous = run.load_csv("results.csv")
    done = resume(previous, KEYS)
    todo = [(spec, seed) for spec in cfg.methods for seed in cfg.seeds if (method_label(spec), seed) not in done]
    frames = [previous] if previous is not None else []
    if todo:
        total = len(todo) * _steps(len(inputs.train), cfg.train.batch_size, cfg.train.epochs)
        with run.task(f"fine-tune {len(todo)} runs", total) as advance:
            for spec, seed in todo:
                set_seed(seed)
                options = method_options(spec)
                if "seed" in options:  # the method's own seed, varied with the run's
                    options["seed"] = seed_for(options["seed"], seed) % 2**31
                try:
                    injected = inject(load_model(cfg.model, image, cfg.data.num_labels, source).to(device),
                                      spec.method, **options)
                except ValueError as err:
                    raise UserError(f"method {method_label(spec)}: {err}") from None
                lr = spec.lr or (cfg.train.fft_lr if spec.method == "fft" else cfg.train.lr)
                try:
                    rows = train(injected.model, inputs.train, inputs.eval, inputs.collator, spec=cfg.train, lr=lr,
                                 epochs=cfg.train.epochs, seed=seed, device=device, advance=advance)
                except TrainingFailed as err:
                    raise UserError(f"method {method_label(spec)}, seed {seed}: {err}; nothing recorded for this "
                                    "run") from None
                frames.append(pd.DataFrame(rows).assign(
                    method=method_label(spec), kind=spec.method, seed=seed, lr=lr,
                    trainable_params=injected.trainable, total_params=injected.total)[COLUMNS])
                if is_main_process():
                    run.save_csv("results.csv", pd.concat(frames, ignore_index=True))
    results = pd.concat(frames, ignore_index=True)
    order = [method_label(s) for s in cfg.methods]
    results = results[results.method.isin(order)]
    summary = summarize(results)
    summary = summary.set_index("method").loc[[m for m in order if m in set(summary.method)]].reset_index()
    if not is_main_process():
        return {"summary": summary, "results": results}
    run.save_csv("summary.csv", summary)
    run.finish(methods=order, seeds=cfg.seeds, train_examples=len(inputs.train),
               pretrain_accuracy=None if pre is None else float(pre.accuracy.iloc[-1]))
    return {"summary": summary, "results": results}
