"""ChatGLM3 (remote code) does not call the attention interface: wrap its `core_attention` modules.

Its SelfAttention calls core_attention(query, key, value, attention_mask) with [seq, batch, heads,
head_dim] tensors and a boolean mask (True = masked out; None = causal) and expects
[seq, batch, heads·head_dim] back. `CoreAttention` keeps that contract and runs one of our methods
on the tensors, holding that method's parameters itself.
"""

from __future__ import annotations

import math
from typing import Callable

from torch import Tensor, nn

from .common import repeat_kv


class CoreAttention(nn.Module):
    """A drop-in core_attention running `method_forward` (ntk or ptuning-v2) on its own parameters."""

    def __init__(self, method_forward: Callable):
        super().__init__()
        self.method_forward = method_forward

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None) -> Tensor:
        L, B, H, d = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [B, H, L, d]
        groups = H // k.shape[1]
        keep = None if attention_mask is None else ~attention_mask
        out = self.method_forward(self, q, repeat_kv(k, groups), repeat_kv(v, groups), keep, 1.0 / math.sqrt(d),
                                  attention_mask is None and L > 1, 0.0)
        return out.permute(2, 0, 1, 3).reshape(L, B, H * d)


def core_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The modules holding a ChatGLM-style core_attention child."""
    return [m for m in model.modules() if isinstance(getattr(m, "core_attention", None), nn.Module)]
