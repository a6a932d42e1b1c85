"""Fine-tuning methods on Hugging Face models: `inject(model, method, **options)`.

ntk and ptuning-v2 live on the attention modules and run through transformers' AttentionInterface
(ChatGLM3 too, loaded as transformers' native GLM); lora and any other peft method come from peft; fft trains
all; head trains the task head alone (a linear probe of the frozen backbone, the control every method must beat).
Adapters save as safetensors + JSON and load back onto the base model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from . import lora, lora_ntk, ntk, peft_any, ptuning_v2
from .common import (LR_OVERRIDE, Adapter, Options, attention_modules, count_parameters, freeze_backbone, head_shape,
                     inject_attention, peft_trainable, task_head)

INTERFACE_METHODS: dict[str, Adapter] = {ntk.NAME: ntk, ptuning_v2.NAME: ptuning_v2}
OPTIONS: dict[str, type[Options]] = {**{name: m.OPTIONS for name, m in INTERFACE_METHODS.items()},
                                     lora.NAME: lora.LoraOptions, lora_ntk.NAME: lora_ntk.LoraNTKOptions,
                                     peft_any.NAME: peft_any.PeftOptions, "fft": Options, "head": Options}
METHODS = tuple(OPTIONS)


@dataclass
class Injected:
    model: nn.Module
    method: str
    options: dict
    trainable: int
    total: int


def inject(model: nn.Module, method, calibration: dict | None = None, **options) -> Injected:
    """Freeze the backbone (the task head stays trainable) and add `method`'s trainable parameters. `method` is a
    name (its options as keywords), an options object (`ntk.NTKOptions(...)`) or an `NTKAttentionConfig` (ntk's
    layers are the ones `get_peft_model` injects). `calibration`, a batch of training inputs (the model's keyword
    arguments), is what options that read real inputs use (ntk's init 'text' and scale 'calibrated')."""
    if isinstance(method, Options):
        name = next((n for n, kind in OPTIONS.items() if type(method) is kind and kind is not Options), None)
        if name is None:
            raise ValueError(f"{type(method).__name__} names no method; pass the method's name")
        method, options = name, {**method.model_dump(), **options}
    elif isinstance(method, ntk.NTKAttentionConfig):
        method, options = ntk.NAME, {**method.options().model_dump(), **options}
    if not isinstance(method, str) or method not in OPTIONS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)} (by name, an options "
                         "object or an NTKAttentionConfig; a peft config of another method goes to peft's "
                         "get_peft_model)")
    opts = OPTIONS[method](**options)
    if method == "fft":
        model.requires_grad_(True)
    elif method == "head":
        freeze_backbone(model)
    elif method == lora.NAME:
        model = lora.inject(model, opts)
    elif method == peft_any.NAME:
        model = peft_any.inject(model, opts)
    elif method == lora_ntk.NAME:
        under, over = opts.parts()
        model = inject(lora.inject(model, under), ntk.NAME, calibration, **over).model
    else:
        peft_adapters = peft_trainable(model)  # a peft model's own adapters stay trainable beside the method's
        freeze_backbone(model)
        for name, p in model.named_parameters():
            p.requires_grad_(p.requires_grad or name in peft_adapters)
        inject_attention(model, INTERFACE_METHODS[method], opts)
        INTERFACE_METHODS[method].calibrate(model, calibration)
    return Injected(model, method, opts.model_dump(), *count_parameters(model))


def requirements(build, method: str, *, image: bool, tokens: int, batch: int, **options) -> int:
    """What `inject` and training would fail on, found on a model that `build()` makes on the meta device (no
    weights): lora's and peft's target modules, a text-only peft method on an image model. Returns roughly the bytes
    the method needs beyond the frozen model: its trainable tensors with their gradients and AdamW's moments
    (float32), and what its attention keeps for the backward. A bad option is a ValueError."""
    opts = OPTIONS[method](**options)
    model = build()
    head = sum(p.numel() for n, p in model.named_parameters() if n in set(task_head(model)))
    if method == lora_ntk.NAME:  # the two parts, each on its own meta model
        under, over = opts.parts()
        return sum(requirements(build, name, image=image, tokens=tokens, batch=batch, **part)
                   for name, part in ((lora.NAME, under.model_dump()), (ntk.NAME, over)))
    if method in INTERFACE_METHODS:
        layers = len(attention_modules(model))
        return 16 * head + INTERFACE_METHODS[method].footprint(opts, head_shape(model.config), layers, tokens, batch)
    from accelerate import init_empty_weights

    with init_empty_weights():  # peft's new tensors on the meta device too, whatever their size
        if method == lora.NAME:
            lora.check(model, opts)
        elif method == peft_any.NAME:
            peft_any.check(model, opts, image)
        elif method == "head":
            return 16 * head
        trainable = model if method == "fft" else inject(build(), method, **options).model
    return 16 * sum(p.numel() for p in trainable.parameters() if p.requires_grad)


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a saved adapter holds: every trainable parameter and the methods' buffers."""
    state = {name for m in INTERFACE_METHODS.values() for name in m.STATE}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {n: t.detach().cpu().contiguous() for n, t in model.state_dict().items()
            if n in trainable or state & set(n.split("."))}


def save_adapter(injected: Injected, directory: str | Path) -> Path:
    """adapter.safetensors + adapter_config.json in `directory`."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(adapter_state(injected.model), directory / "adapter.safetensors")
    (directory / "adapter_config.json").write_text(json.dumps({"method": injected.method, "options": injected.options}))
    return directory


def load_adapter(model: nn.Module, directory: str | Path) -> Injected:
    """Inject the saved method into a fresh base model and load its tensors."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config = json.loads((directory / "adapter_config.json").read_text())
    options = config["options"]
    if config["method"] == ntk.NAME:  # the saved tensors replace what the init and the calibration computed
        options = {**options, "init": "zeros", "scale": "fixed"}
    injected = inject(model, config["method"], **options)
    state = load_file(directory / "adapter.safetensors")
    missing = sorted(set(state) - set(injected.model.state_dict()))
    if missing:
        raise ValueError(f"adapter in {directory} does not fit this model (no {missing[0]})")
    injected.model.load_state_dict(state, strict=False)
    return injected


__all__ = ["LR_OVERRIDE", "METHODS", "OPTIONS", "Injected", "inject", "requirements", "save_adapter", "load_adapter",
           "adapter_state"]
