"""What every adapter shares: finding attention modules, head shapes, freezing, the random prefix."""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

KEY_PROJ = ("key", "k_proj")
VALUE_PROJ = ("value", "v_proj")
HEAD_MODULES = ("classifier", "score", "classifier_head")  # task heads' usual names, for models built from a config
TASK_HEAD = "ntk_task_head"  # the attribute where the loader records the head's parameter names
LR_OVERRIDE = "lr_override"  # a parameter carrying this attribute trains at that step, not the method's


class Options(BaseModel):
    """An adapter's options: unknown keys, wrong types, NaN and ±inf are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


@dataclass(frozen=True)
class HeadShape:
    """Query heads, key/value heads (fewer under grouped/multi-query attention), head dimension."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int


def head_shape(config) -> HeadShape:
    config = getattr(config, "text_config", None) or config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or getattr(config, "kv_channels", None) or config.hidden_size // heads
    return HeadShape(heads, kv_heads, head_dim, config.hidden_size)


def _child(module: nn.Module, names: tuple[str, ...]) -> nn.Linear | None:
    return next((getattr(module, n) for n in names if isinstance(getattr(module, n, None), nn.Linear)), None)


@functools.cache
def _calls_attention(cls: type) -> bool:
    """Whether a module class's forward calls transformers' attention interface (its source names it)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source or "attention_interface" in source


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that call the attention interface, found by that call, whatever their projections (separate
    q/k/v, a fused c_attn, query_key_value or qkv_proj); outermost only, since a wrapper (peft) may repeat it."""
    found = [m for m in model.modules() if _calls_attention(type(m))]
    inner = {id(c) for m in found for c in m.modules() if c is not m}
    return [m for m in found if id(m) not in inner]


def missing_modules(model: nn.Module, targets) -> list[str]:
    """The target names (peft's matching: a module's full name or its last parts) that no module of the model has;
    a regular expression (one string) is peft's to match."""
    if targets is None or isinstance(targets, str):
        return []
    names = [name for name, _ in model.named_modules()]
    return [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]


def module_device(module: nn.Module) -> torch.device:
    return next(module.parameters(), torch.empty(0)).device


def repeat_kv(x: Tensor, groups: int, dim: int = 1) -> Tensor:
    """Grouped/multi-query attention: each key/value head serves `groups` query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=dim)


def random_prefix(module: nn.Module, shape: HeadShape, m: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """An m-long prefix through the layer's own key and value projections: hidden states with
    N(0, 1) entries (unit RMS, like layer-normed inputs) → (keys, values) [kv_heads, m, head_dim]."""
    k_proj, v_proj = _child(module, KEY_PROJ), _child(module, VALUE_PROJ)
    if k_proj is None or v_proj is None:
        raise ValueError(f"init 'prefix' needs key/value projections named {KEY_PROJ}/{VALUE_PROJ}; "
                         f"{type(module).__name__} has none")
    w = k_proj.weight
    x = torch.randn(m, shape.hidden, generator=gen, dtype=torch.float32).to(w.device, w.dtype)
    with torch.no_grad():
        keys, values = k_proj(x), v_proj(x)
    return tuple(t.view(m, shape.kv_heads, shape.head_dim).transpose(0, 1).float() for t in (keys, values))


def _to_head_dtype(module: nn.Module, args: tuple) -> tuple:
    dtype = next(module.parameters()).dtype
    return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def set_task_head(model: nn.Module, names: list[str] | None) -> None:
    """Record the task head: the parameters `names` that the pretrained checkpoint lacked (None for a model
    built from a config: the modules named classifier, score or classifier_head). A half-precision head is
    made float32 and its inputs are cast to it, so that a half-precision backbone trains a float32 head."""
    own = dict(model.named_parameters())
    names = [n for n in names or () if n in own] or [n for n in own if set(n.split(".")) & set(HEAD_MODULES)]
    setattr(model, TASK_HEAD, sorted(names))
    for module_name in head_modules(model):
        module = model.get_submodule(module_name)
        if any(p.dtype in (torch.float16, torch.bfloat16) for p in module.parameters(recurse=False)):
            module.float()
        module.register_forward_pre_hook(_to_head_dtype)


def task_head(model: nn.Module) -> list[str]:
    """The task head's parameter names (see set_task_head)."""
    recorded = getattr(model, TASK_HEAD, None)
    if recorded is None:
        set_task_head(model, None)
    return getattr(model, TASK_HEAD)


def head_modules(model: nn.Module) -> list[str]:
    """The names of the modules holding the task head's parameters."""
    return sorted({name.rpartition(".")[0] for name in task_head(model)})


def freeze_backbone(model: nn.Module) -> None:
    """Freeze every weight but the task head, which stays trainable."""
    head = set(task_head(model))
    for name, p in model.named_parameters():
        p.requires_grad_(name in head)


def peft_trainable(model: nn.Module) -> set[str]:
    """The trainable parameters of peft's adapters already in `model` (LoRA's lora_A, lora_B, …, and the task head
    peft trains as a copy): what an attention-level method added on top of a peft model must leave trainable."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    keep = set()
    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            for attr in module.adapter_layer_names:
                sub = getattr(module, attr, None)
                if isinstance(sub, nn.Module):
                    keep |= {n for n, p in sub.named_parameters(prefix=f"{name}.{attr}") if p.requires_grad}
    # and the trained copies of the modules peft saves whole (modules_to_save: the task head)
    return keep | {n for n, p in model.named_parameters() if p.requires_grad and ".modules_to_save." in n}


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


class Adapter(Protocol):
    """An attention-level method (ntk.py, ptuning_v2.py): what it is called, what a saved adapter holds, how it
    adds trainable tensors to one attention module, and the attention it computes with them."""

    NAME: str
    STATE: tuple[str, ...]  # the module attributes a saved adapter holds besides the trainable parameters
    OPTIONS: type[Options]

    def add_parameters(self, module: nn.Module, shape: HeadShape, opts: Options, gen: torch.Generator,
                       adapter_name: str = "default") -> None:
        """Attach the method's tensors (under `adapter_name`) to one attention module."""

    def calibrate(self, model: nn.Module, batch: dict | None) -> None:
        """Whatever the active adapter's options read from a batch of training inputs, once every module has its
        tensors."""

    def footprint(self, opts: Options, shape: HeadShape, layers: int, tokens: int, batch: int) -> int:
        """Roughly the bytes a training run needs beyond the frozen model (its tensors, their optimizer state and
        what its attention keeps for the backward), computed without building anything."""

    def forward(self, module: nn.Module, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
                is_causal: bool) -> Tensor:
        """Attention [B, H, L, d] of q over (k, v), k/v already repeated to every query head; `mask` is a boolean
        keep-mask or an additive one. Attention-probability dropout is not applied."""


def interface_call(adapter: Adapter) -> Callable:
    """The adapter's forward as a transformers attention-interface function."""

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        is_causal = attention_mask is None and bool(getattr(module, "is_causal", False)) and query.shape[2] > 1
        out = adapter.forward(module, query, repeat_kv(key, groups), repeat_kv(value, groups), mask=attention_mask,
                              scale=scale, is_causal=is_causal)
        return out.transpose(1, 2).contiguous(), None

    return forward


def inject_attention(model: nn.Module, adapter: Adapter, opts: Options, adapter_name: str = "default") -> list[nn.Module]:
    """Give every attention module the adapter's tensors (seeded by opts.seed) and route attention through it;
    returns the modules."""
    shape = head_shape(model.config)
    gen = torch.Generator().manual_seed(opts.seed)
    modules = attention_modules(model)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention modules with key/value projections to adapt")
    for module in modules:
        adapter.add_parameters(module, shape, opts, gen, adapter_name)
    register(adapter)
    model.set_attn_implementation(adapter.NAME)
    return modules


def register(adapter: Adapter) -> None:
    """Register an attention implementation and its mask (always materialised: True = attend)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(adapter.NAME, interface_call(adapter))
    AttentionMaskInterface.register(adapter.NAME, partial(sdpa_mask, allow_is_causal_skip=False))
