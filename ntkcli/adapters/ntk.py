"""NTK-Attention as a fine-tuning method: a trainable (Z, k) per attention head (Algorithm 1).

Every attention module gets Z [kv_heads, dφ, d] and k [kv_heads, dφ] (dφ = d for the paper's elu
map, so d² + d per head) and a fixed log-scale; attention becomes
T = (A·V + φ(Q)Z) / (A·1 + φ(Q)k), which with Z = 0, k = 0 is the base model's attention exactly.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ..attention import FEATURE_MAPS, attention_lse, compress_prefix, feature_map, ntk_combine
from .common import HeadShape, Options, module_device, random_prefix, repeat_kv

NAME = "ntk"
STATE = ("ntk_Z", "ntk_k", "ntk_log_scale")  # what a saved adapter holds besides the trained tensors


class NTKOptions(Options):
    init: Literal["zeros", "paper", "prefix"] = Field(
        "zeros", description="zeros: starts as the base model; paper: the released code's randn/1e4; "
        "prefix: Eq. (4) from a random prefix through the layer's own key/value projections")
    feature_map: Literal[FEATURE_MAPS] = Field("elu", description="φ (elu is the paper's)")  # type: ignore[valid-type]
    num_features: int = Field(256, ge=1, description="random features of the favor map")
    prefix_length: int = Field(100, ge=1, description="m of the random prefix that init 'prefix' compresses")
    seed: int = Field(0, ge=0, description="seed of the random init and of the favor features")


OPTIONS = NTKOptions


def add_parameters(module: nn.Module, shape: HeadShape, opts: NTKOptions, gen: torch.Generator) -> None:
    """Attach Z, k (trainable) and log_scale (a buffer) to one attention module."""
    fmap = feature_map(opts.feature_map, shape.head_dim, opts.num_features, opts.seed)
    dphi = fmap(torch.zeros(1, shape.head_dim))[0].shape[-1]
    device = module_device(module)
    log_scale = torch.zeros(shape.kv_heads)
    if opts.init == "prefix":
        keys, values = random_prefix(module, shape, opts.prefix_length, gen)
        scale = getattr(module, "scaling", None) or 1.0 / math.sqrt(shape.head_dim)
        [(Z, k, log_scale)] = compress_prefix(keys, values, fmap, scale=scale)
    elif opts.init == "paper":
        Z = torch.randn(shape.kv_heads, dphi, shape.head_dim, generator=gen) / 1e4
        k = torch.randn(shape.kv_heads, dphi, generator=gen) / 1e4
    else:
        Z, k = torch.zeros(shape.kv_heads, dphi, shape.head_dim), torch.zeros(shape.kv_heads, dphi)
    module.ntk_Z = nn.Parameter(Z.float().to(device))
    module.ntk_k = nn.Parameter(k.float().to(device))
    module.register_buffer("ntk_log_scale", log_scale.float().to(device))
    module.ntk_feature_map = fmap


def forward(module: nn.Module, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
            is_causal: bool) -> Tensor:
    """Algorithm 1 with this module's (Z, k), each key/value head's pair shared by its query heads."""
    groups = q.shape[1] // module.ntk_Z.shape[0]
    mean, lse = attention_lse(q, k, v, scale=scale, attn_mask=mask, is_causal=is_causal)
    f, c = module.ntk_feature_map(q.to(torch.promote_types(q.dtype, torch.float32)), math.sqrt(scale))
    out = ntk_combine(mean, lse, f, c, repeat_kv(module.ntk_Z, groups, 0), repeat_kv(module.ntk_k, groups, 0),
                      repeat_kv(module.ntk_log_scale, groups, 0))
    # a padded query (no visible input key) is zero, as SDPA gives: its φ(Q)Z/φ(Q)k is unbounded once k is
    # trained (φ(Q)k can cross zero), and in half precision an overflowed row reaches the next layer's
    # visible rows through its values
    return out.masked_fill((lse == -math.inf).unsqueeze(-1), 0.0)
