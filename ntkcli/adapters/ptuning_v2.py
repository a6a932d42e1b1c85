"""P-Tuning v2 (deep prefix tuning): m learned key and value vectors per layer and head, attended
exactly together with the input: softmax(s·Q[P_K; K]ᵀ + [0, M])·[P_V; V]."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from .common import HeadShape, Options, module_device, random_prefix, repeat_kv

NAME = "ptuning-v2"
STATE = ("prefix_key", "prefix_value")


class PTuningOptions(Options):
    prefix_length: int = Field(10, ge=1, description="m, prefix vectors per layer and head")
    init: Literal["prefix", "normal"] = Field(
        "prefix", description="prefix: random hidden states through the layer's key/value projections; normal: N(0, 1)")
    seed: int = Field(0, ge=0, description="seed of the random init")


OPTIONS = PTuningOptions


def add_parameters(module: nn.Module, shape: HeadShape, opts: PTuningOptions, gen: torch.Generator,
                   adapter_name: str = "default") -> None:
    """Attach prefix_key and prefix_value [kv_heads, m, head_dim] to one attention module (one adapter)."""
    if adapter_name != "default":
        raise ValueError("ptuning-v2 holds one adapter per model, named 'default'")
    device = module_device(module)
    if opts.init == "prefix":
        keys, values = random_prefix(module, shape, opts.prefix_length, gen)
    else:
        keys, values = (torch.randn(shape.kv_heads, opts.prefix_length, shape.head_dim, generator=gen)
                        for _ in range(2))
    module.prefix_key = nn.Parameter(keys.float().to(device))
    module.prefix_value = nn.Parameter(values.float().to(device))


def footprint(opts: PTuningOptions, shape: HeadShape, layers: int, tokens: int, batch: int) -> int:
    """Bytes beyond the frozen model, roughly: the prefix keys and values with their gradients and AdamW's moments
    (float32), and every layer's scores over [prefix; input] kept for the backward."""
    trained = 2 * layers * shape.kv_heads * opts.prefix_length * shape.head_dim
    return 16 * trained + 2 * 4 * layers * batch * shape.heads * tokens * (tokens + opts.prefix_length)


def calibrate(model: nn.Module, batch: dict | None) -> None:
    """Nothing to calibrate: the prefix is drawn when it is added."""


def _with_prefix(mask: Tensor | None, m: int, L: int, S: int, is_causal: bool, device) -> Tensor | None:
    """The input's mask widened by m always-visible prefix columns (built when only is_causal says it)."""
    if mask is None and is_causal:
        mask = torch.ones(L, S, dtype=torch.bool, device=device).tril(S - L)
    if mask is None:
        return None
    visible = torch.ones if mask.dtype == torch.bool else torch.zeros
    return torch.cat([visible(*mask.shape[:-1], m, dtype=mask.dtype, device=device), mask], dim=-1)


def forward(module: nn.Module, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
            is_causal: bool) -> Tensor:
    """Exact attention over [prefix; input]."""
    B, H, L, _ = q.shape
    groups = H // module.prefix_key.shape[0]
    pk, pv = (repeat_kv(p, groups, 0).to(k.dtype).unsqueeze(0).expand(B, -1, -1, -1)
              for p in (module.prefix_key, module.prefix_value))
    keys, values = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
    mask = _with_prefix(mask, pk.shape[2], L, k.shape[2], is_causal, q.device)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
