"""§5, Tables 1–2: NTK-Attention vs P-Tuning v2 vs LoRA vs full fine-tuning on a Hugging Face model.

For every method and seed: load the base model, `inject` the method, train with the Trainer,
evaluate accuracy after each epoch. results.csv has one row per (method, seed, epoch); summary.csv
the final-epoch accuracy mean ± std over seeds, trainable parameters, training time and peak memory.
A recipe with `pretrain` first trains its architecture from scratch on other classes (digits 0–4)
and fine-tunes that checkpoint (cached in the run folder).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...adapters import adapter_state, inject, lora_ntk, ntk
from ...errors import UserError
from ...models import load_model, load_tokenizer, model_config
from ...runs import Results, Run, is_main_process, process_rank, resolve_device, seed_for
from . import checks, data
from .claims import COMMAND, TITLE, report  # noqa: F401 — the experiment contract
from .recipe import DataSpec, FFTMethod, FinetuneRecipe, method_label, method_options
from .protocol import MethodFailed
from .train import ROW, Trained, TrainingFailed, train

HELP = ("Tables 1–2 (§5): NTK-Attention vs P-Tuning v2 vs LoRA vs full fine-tuning, several seeds.\n\n"
        "Loads the recipe's Hugging Face model and data (hub, local files, or the offline digits), injects each method, "
        "trains with the Trainer and evaluates accuracy after every epoch. Writes results.csv (method, seed, epoch), "
        "summary.csv (accuracy mean ± std, trainable parameters, time, memory), claims.csv and run.json to "
        "outputs/finetune/<recipe>/; re-running skips finished (method, seed) pairs. Under torchrun only rank 0 "
        "writes and prints.")
NEEDS_RECIPE, FLAGS, DEVICES = True, {}, ("cpu", "cuda")
POINTS = False  # its methods share a pretraining step and a per-epoch probe; superglue runs the grids
SCALE = ("seeds", "train")  # the fields that set a run's scale, shown beside its claims
KEYS = ["method", "seed"]
COLUMNS = ["method", "kind", "seed", "epoch", "accuracy", "eval_loss", "train_loss", "train_seconds", "peak_mem_mb",
           "lr", "trainable_params", "total_params"]
SHARE_COLUMNS = ["method", "kind", "seed", "epoch", "layer", "head", "share", "z_norm", "k_norm", "log_scale"]
RESUMABLE = ("methods", "seeds")
FILES = ("results.csv", "summary.csv", "shares.csv", "shares.png", "pretrain.csv", "pretrained", "claims.csv")
RECIPE = FinetuneRecipe
NTK_KINDS = (ntk.NAME, lora_ntk.NAME)  # the methods with NTK-Attention's (Z, k): calibrated, and probed each epoch


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


def optimizer_steps(n: int, batch: int, epochs: int) -> int:
    """Optimizer steps per process (the Trainer shards each batch of batch × world size examples)."""
    return math.ceil(n / (batch * process_rank()[1])) * epochs


def pretrain(cfg: FinetuneRecipe, folder: Run, device: torch.device) -> tuple[Path, pd.DataFrame]:
    """Train model.config from scratch on pretrain.classes (once; cached as run folder/pretrained)."""
    from transformers import set_seed

    cache, spec = folder.path("pretrained"), cfg.pretrain
    done = folder.load_csv("pretrain.csv")
    if done is not None and (cache / "config.json").exists():
        return cache, done
    set_seed(cfg.seed)
    model = load_model(cfg.model, cfg.data.image_field is not None, len(spec.classes)).to(device)
    train_ds, eval_ds, collator = _datasets(cfg, model.config,
                                            None if cfg.data.image_field else load_tokenizer(cfg.model), spec.classes)
    tspec = cfg.train.model_copy(update={"batch_size": spec.batch_size})
    steps = optimizer_steps(len(train_ds), spec.batch_size, spec.epochs)
    with folder.task(f"pretrain on classes {spec.classes}", steps) as adv:
        try:
            rows = train(model, train_ds, eval_ds, collator, spec=tspec, lr=spec.lr, epochs=spec.epochs,
                         seed=cfg.seed, device=device, advance=adv).rows
        except TrainingFailed as err:
            raise UserError(f"pretraining: {err}") from None
    table = pd.DataFrame(rows).assign(classes=" ".join(map(str, spec.classes)))
    if is_main_process():
        tmp = folder.path(".pretrained-tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.base_model.save_pretrained(tmp)  # the backbone only: fine-tuning gets a fresh head
        shutil.rmtree(cache, ignore_errors=True)
        tmp.rename(cache)
        folder.save_csv("pretrain.csv", table)
    _wait_for_main()
    return cache, table


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


def quiet() -> None:
    """No logging, progress bars or FutureWarnings from transformers, datasets, the hub client and peft: ours report
    instead, and a failure is one line (the hub's retries and datasets' parse errors log lines of their own)."""
    import datasets
    from huggingface_hub.utils import logging as hub_logging
    from transformers import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub_logging.set_verbosity(hub_logging.CRITICAL)
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers|peft")


def _check(cfg: FinetuneRecipe, config) -> None:
    """Every method (and the pretraining, full fine-tuning of model.config) on the meta model: targets, memory."""
    image = cfg.data.image_field is not None
    tokens = checks.tokens_per_row(config, image, cfg.data.max_length, len(cfg.data.text_fields) == 2)
    size = checks.dtype_bytes(cfg.model.dtype)
    checks.check_methods(config, cfg.methods, cfg.train, image=image, num_labels=cfg.data.num_labels, tokens=tokens,
                         device=cfg.device, dtype_bytes=size)
    if cfg.pretrain is not None:
        checks.check_methods(config, [FFTMethod(method="fft", label="pretrain")],
                             cfg.train.model_copy(update={"batch_size": cfg.pretrain.batch_size}), image=image,
                             num_labels=len(cfg.pretrain.classes), tokens=tokens, device=cfg.device, dtype_bytes=size)


def prepare(cfg: FinetuneRecipe) -> Inputs:
    """The device, the model's configuration (its location probed without loading weights), every method checked on
    the model built on the meta device, the tokenizer and the data."""
    quiet()
    device = resolve_device(cfg.device)
    image = cfg.data.image_field is not None
    config = model_config(cfg.model)
    _check(cfg, config)
    tokenizer = None if image else load_tokenizer(cfg.model)
    return Inputs(device, *_datasets(cfg, config if image else None, tokenizer))


def plan(cfg: FinetuneRecipe) -> list[tuple[str, str]]:
    """What a run trains: every (method, seed) pair, each for train.epochs."""
    return [("methods", ", ".join(method_label(m) for m in cfg.methods)), ("seeds", str(len(cfg.seeds))),
            ("training runs", str(len(points(cfg)))), ("epochs per run", str(cfg.train.epochs)),
            ("model", cfg.model.name_or_path or f"from config ({cfg.model.config.get('model_type')})"),
            ("data", cfg.data.path or f"{cfg.data.name} {cfg.data.config or ''}".strip())]


def points(cfg: FinetuneRecipe) -> list[tuple[str, int]]:
    """Every (method label, seed) pair of the recipe, in the order they are trained."""
    return [(method_label(spec), seed) for spec in cfg.methods for seed in cfg.seeds]


CALIBRATION_ROWS = 32  # training rows that ntk's options which read real inputs see, and its share probe


def calibration_batch(train_ds, collator, seed: int, device: torch.device) -> dict:
    """A seeded batch of CALIBRATION_ROWS training rows as the model's keyword arguments (no labels)."""
    picked = np.random.default_rng(seed).permutation(len(train_ds))[:CALIBRATION_ROWS]
    batch = collator([{k: v for k, v in train_ds[int(i)].items() if k not in ("label", ROW)} for i in picked])
    return {k: v.to(device) for k, v in batch.items() if k not in ("labels", "label")}


def adapter_bytes(model) -> int:
    """What a user keeps of a trained method, on disk: the tensors save_adapter writes (trainable parameters and
    the methods' buffers; for full fine-tuning, the whole model), as safetensors."""
    from safetensors.torch import save_file

    tensors = {n: t.clone() for n, t in adapter_state(model).items()}  # clones: tied weights share no storage
    with tempfile.TemporaryDirectory(prefix="ntk-adapter-") as scratch:
        save_file(tensors, f"{scratch}/adapter.safetensors")
        return os.path.getsize(f"{scratch}/adapter.safetensors")


def train_method(cfg, spec, seed: int, lr: float, inputs: Inputs, advance, *, num_labels: int, image: bool = False,
                 source: str | None = None, per_epoch: bool = True, epochs: int | None = None) -> Trained:
    """One method (`spec`) with one seed at step `lr` on a recipe's model and train settings (`cfg.model`,
    `cfg.train`): its rows per evaluation (a DataFrame), the last evaluation (logits and labels in the evaluation
    set's order) and, for ntk, the prefix's share of attention before training and after every epoch. A
    non-finite loss, or predictions that do not line up with their rows, is an error."""
    from transformers import set_seed

    quiet()  # in an executor's worker too: no load report or warning per run
    set_seed(seed)
    options = method_options(spec)
    if "seed" in options:  # the method's own seed, varied with the run's
        options["seed"] = seed_for(options["seed"], seed) % 2**31
    batch = calibration_batch(inputs.train, inputs.collator, seed, inputs.device) if spec.method in NTK_KINDS else None
    try:
        injected = inject(load_model(cfg.model, image, num_labels, source).to(inputs.device), spec.method,
                          calibration=batch, **options)
    except ValueError as err:
        raise UserError(f"method {method_label(spec)}: {err}") from None
    probe = None if batch is None else lambda model: ntk.statistics(model, batch)
    try:
        trained = train(injected.model, inputs.train, inputs.eval, inputs.collator, spec=cfg.train, lr=lr,
                        epochs=epochs or cfg.train.epochs, seed=seed, device=inputs.device, advance=advance,
                        per_epoch=per_epoch, probe=probe)
    except TrainingFailed as err:
        raise MethodFailed(f"method {method_label(spec)}, seed {seed}: {err}; nothing recorded for this run") from None
    label = dict(method=method_label(spec), kind=spec.method, seed=seed)
    trained.rows = pd.DataFrame(trained.rows).assign(**label, lr=lr, trainable_params=injected.trainable,
                                                      total_params=injected.total,
                                                      adapter_bytes=adapter_bytes(injected.model))
    trained.probes = pd.DataFrame(trained.probes, columns=SHARE_COLUMNS[3:]).assign(**label)[SHARE_COLUMNS]
    return trained


def _train_one(cfg: FinetuneRecipe, spec, seed: int, inputs: Inputs, source: str | None, advance) -> Trained:
    """One method with one seed: its rows per epoch and, for ntk, its shares of attention per epoch."""
    lr = spec.lr or (cfg.train.fft_lr if spec.method == "fft" else cfg.train.lr)
    trained = train_method(cfg, spec, seed, lr, inputs, advance, num_labels=cfg.data.num_labels,
                           image=cfg.data.image_field is not None, source=source)
    trained.rows = trained.rows[COLUMNS]
    return trained


def run(cfg: FinetuneRecipe, folder: Run, inputs: Inputs) -> dict[str, pd.DataFrame]:
    """Train every (method, seed) pair not yet in results.csv; write results, summary and run.json."""
    source, pre = pretrain(cfg, folder, inputs.device) if cfg.pretrain is not None else (None, None)
    results = Results(folder, KEYS, write=is_main_process())
    shares = Results(folder, KEYS, name="shares.csv", write=is_main_process(), done=results.done)
    todo = set(results.todo(points(cfg)))
    pairs = [(spec, seed) for spec in cfg.methods for seed in cfg.seeds if (method_label(spec), seed) in todo]
    total = len(pairs) * optimizer_steps(len(inputs.train), cfg.train.batch_size, cfg.train.epochs)
    with folder.task(f"fine-tune {len(pairs)} runs", total) as advance:
        for spec, seed in pairs:
            trained = _train_one(cfg, spec, seed, inputs, None if source is None else str(source), advance)
            shares.add(trained.probes)  # before its results: a run is done once results.csv has it
            results.add(trained.rows)
    order = [method_label(s) for s in cfg.methods]
    table = results.table()
    table = table[table.method.isin(order)]
    summary = summarize(table)
    summary = summary.set_index("method").loc[[m for m in order if m in set(summary.method)]].reset_index()
    if is_main_process():
        folder.save_csv("summary.csv", summary)
        probed = shares.table()
        probed = probed[probed.method.isin(order)]
        if len(probed):
            from ...figures.finetune import shares as share_figure

            folder.save_figure("shares.png", share_figure(probed))
        folder.finish(methods=order, seeds=cfg.seeds, train_examples=len(inputs.train),
                      pretrain_accuracy=None if pre is None else float(pre.accuracy.iloc[-1]))
    return {"summary": summary, "results": table}


def tables(cfg: FinetuneRecipe, result: dict[str, pd.DataFrame]) -> list[tuple[str, pd.DataFrame]]:
    s = result["summary"]
    shown = pd.DataFrame({
        "method": s.method,
        "accuracy % (mean ± std)": [f"{100 * m:.2f} ± {100 * d:.2f}" for m, d in zip(s.accuracy_mean, s.accuracy_std)],
        "best epoch %": 100 * s.best_epoch_accuracy_mean, "seeds": s.seeds,
        "trainable params": s.trainable_params, "trainable %": s.trainable_pct,
        "train s": s.train_seconds, "peak MiB": s.peak_mem_mb})
    return [(f"finetune '{cfg.name}': final-epoch accuracy on {cfg.data.eval_split}", shown)]
