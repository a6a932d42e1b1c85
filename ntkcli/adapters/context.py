"""A real context as a prefix of every attention layer of a Hugging Face model: its exact keys and values, or their
compression into per-layer (Z, k) by Eq. (4) — paper 1, §4: NTK-Attention stands in for an m-long prefix.

    memory = context_memory(model, tokenizer, passage)              # the exact keys and values, per layer
    state = compress(memory, feature_map("taylor2", head_dim))       # Eq. (4): (Z, k, log_scale) per layer
    with attending(model, state):                                    # or attending(model, memory): exact
        out = model(**tokenizer(question, return_tensors="pt"))

The context runs through the frozen model alone (in chunks of at most the model's positions, each with the
tokenizer's own special tokens); at every layer its keys and values are what an exact prefix adds to that layer's
attention, seen by every query row. A query then attends over [context; its own keys] (exact), through
Algorithm 1 with the layer's (Z, k) (compressed), or over its own keys alone (no memory). The state is
dφ·(d + 1) numbers per head and layer, against 2·m·d for the exact keys and values.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Iterator, Literal

import torch
from torch import Tensor, nn

from ..attention import attention_lse, compress_prefix, ntk_attention
from ..attention.prefix import prefix_attention_lse
from ..attention.features import FeatureMap
from . import ntk
from .common import attention_modules, register, repeat_kv


@dataclass
class Memory:
    """What every attention layer attends to besides its input. exact: (K, V) per layer, [..., kv_heads, m, d];
    compressed: (Z, k, log_scale) per layer (the true tensors are e^log_scale·Z and e^log_scale·k), with the φ
    that made them. A leading batch dimension, when present, gives every batch row its own memory."""

    kind: Literal["exact", "compressed"]
    layers: list[tuple[Tensor, ...]]
    feature_map: FeatureMap | list[FeatureMap] | None = None  # compressed: one φ, or one per layer (learned maps)
    positions: int = 0  # the positions the context's keys took (its longest sequence): where new text starts

    def map_at(self, layer: int) -> FeatureMap | None:
        """The φ of one layer."""
        return self.feature_map[layer] if isinstance(self.feature_map, list) else self.feature_map

    @property
    def tokens(self) -> int:
        """m, the context's length (exact memories)."""
        return self.layers[0][0].shape[-2] if self.kind == "exact" else 0

    def nbytes(self) -> int:
        """The memory's size in bytes (per batch row when it has a batch dimension)."""
        rows = self.layers[0][0].shape[0] if self.layers[0][0].dim() == 4 else 1
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer) // rows


class _Capture:
    """An attention function that records each module's keys and values (repeated to every query head, as they
    arrive) and which keys are real, then attends as the model does."""

    NAME = "ntk-capture"

    @staticmethod
    def forward(module, q, k, v, *, mask, scale, is_causal):
        module.ntk_captured = (k.detach(), v.detach(), _key_mask(mask, k), q.detach())
        if _adapted(module):  # an injected NTK-Attention adapter runs as it would on the context
            return ntk.forward(module, q, k, v, mask=mask, scale=scale, is_causal=is_causal)
        return attention_lse(q, k, v, scale=scale, attn_mask=mask, is_causal=is_causal)[0]


class _Attend:
    """An attention function that attends to each module's memory (module.ntk_memory) besides its input."""

    NAME = "ntk-context"

    @staticmethod
    def forward(module, q, k, v, *, mask, scale, is_causal):
        memory, kind, fmap = module.ntk_memory
        groups = q.shape[1] // memory[0].shape[-3]
        if kind == "exact":
            pk, pv = (repeat_kv(t, groups, t.dim() - 3) for t in memory)
            mean, lse = prefix_attention_lse(q, k, v, pk, pv, scale=scale, attn_mask=mask, is_causal=is_causal)
            if _adapted(module):  # an injected NTK-Attention adapter: its (Z, k) on top of [context; input]
                return ntk.with_state(module, q, k, v, mean, lse, mask=mask, scale=scale)
            return mean
        if _adapted(module):
            raise ValueError("a compressed memory on a model with NTK-Attention injected is not supported: attend "
                             "to the exact memory (context_memory), or to the compressed one on the base model")
        Z, kvec, log_scale = (repeat_kv(t, groups, t.dim() - d) for t, d in zip(memory, (3, 2, 1)))
        return ntk_attention(q, k, v, Z, kvec, feature_map=fmap, scale=scale, attn_mask=mask, is_causal=is_causal,
                             log_scale=log_scale)


def _adapted(module: nn.Module) -> bool:
    """Whether an attention module carries an enabled NTK-Attention adapter."""
    return hasattr(module, "ntk_attention") and not module.ntk_attention.disable_adapters


def base_of(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a peft model (NTK-Attention's layers stay in it), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _key_mask(mask: Tensor | None, k: Tensor) -> Tensor:
    """[B, S]: the keys a row may see (all of them without a mask; from a padding mask's first query row)."""
    if mask is None:
        return torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device)
    row = mask[:, 0, 0]
    return row if row.dtype == torch.bool else row == 0


@contextlib.contextmanager
def _implementation(model: nn.Module, fn) -> Iterator[list[nn.Module]]:
    """The model's attention through `fn` (a registered attention function) while inside; restored after."""
    before = model.config._attn_implementation
    register(fn)
    model.set_attn_implementation(fn.NAME)
    try:
        yield attention_modules(model)
    finally:
        model.set_attn_implementation(before)


def chunks(tokenizer, texts: list[str], width: int, tokens: int | None = None) -> list[list[int]]:
    """Texts as sequences of at most `width` token ids, each with the tokenizer's own special tokens (for BERT:
    [CLS] … [SEP]); with `tokens`, the first that many ids of them (the last sequence cut short)."""
    out, left = [], math.inf if tokens is None else tokens
    for text in texts:
        for ids in tokenizer(text, truncation=True, max_length=width, return_overflowing_tokens=True)["input_ids"]:
            if left <= 0:
                return out
            out.append(ids[:left] if left < len(ids) else ids)
            left -= len(out[-1])
    return out


def context_memory(model: nn.Module, tokenizer, context: str | list[list[int]], *, batch: int = 16) -> Memory:
    """The exact memory of a context: every layer's keys and values of all its real tokens, from the frozen model
    run on the context alone (a text, cut into sequences of the model's positions, or such sequences of ids)."""
    model = base_of(model)
    pieces = chunks(tokenizer, [context], model.config.max_position_embeddings) if isinstance(context, str) else context
    per_layer: list[list[tuple[Tensor, Tensor]]] = []
    device = next(model.parameters()).device
    with _implementation(model, _Capture) as modules, torch.no_grad():
        for start in range(0, len(pieces), batch):
            padded = tokenizer.pad({"input_ids": pieces[start:start + batch]}, return_tensors="pt")
            model(**{k: t.to(device) for k, t in padded.items()})
            for layer, module in enumerate(modules):
                keys, values, real, _ = module.ntk_captured
                per_layer.extend([] for _ in range(layer + 1 - len(per_layer)))
                per_layer[layer].extend((keys[r][:, real[r]], values[r][:, real[r]]) for r in range(keys.shape[0]))
                del module.ntk_captured
    return Memory("exact", [(torch.cat([k for k, _ in rows], 1), torch.cat([v for _, v in rows], 1))
                            for rows in per_layer], positions=max(map(len, pieces)))


def compress(memory: Memory, feature_map: FeatureMap | list[FeatureMap], scale: float | None = None) -> Memory:
    """Eq. (4) at every layer: Z = Σ_r φ(√s k_r) v_rᵀ, k = Σ_r φ(√s k_r) over the context's keys and values
    (s = 1/√d unless given), as (Z, k, log_scale); φ is one map, or one per layer."""
    d = memory.layers[0][0].shape[-1]
    s = d ** -0.5 if scale is None else scale
    wide = torch.promote_types(memory.layers[0][0].dtype, torch.float32)  # half memories compress in float32
    maps = feature_map if isinstance(feature_map, list) else [feature_map] * len(memory.layers)
    return Memory("compressed", [compress_prefix(k.to(wide), v.to(wide), fmap, scale=s)[0]
                                 for (k, v), fmap in zip(memory.layers, maps)], feature_map, memory.positions)


CACHES = ("first", "last", "strided", "sink", "pooled")


def cache(memory: Memory, kind: str, tokens: int, sink: int = 4) -> Memory:
    """An exact memory of `tokens` slots of the context's m (all of it when tokens ≥ m), what a user keeps instead
    of a compressed state of the same bytes: the first tokens, the last, evenly strided ones, `sink` first tokens
    and the most recent (attention sinks), or every slot the mean keys and values of one of `tokens` contiguous
    segments (pooled)."""
    m = memory.tokens
    K = min(tokens, m)
    device = memory.layers[0][0].device
    if kind == "pooled":
        segment = torch.arange(m, device=device) * K // m  # slot of each token: contiguous, sizes differing by ≤ 1
        count = torch.bincount(segment, minlength=K).unsqueeze(-1)

        def pool(t: Tensor) -> Tensor:
            return t.new_zeros(*t.shape[:-2], K, t.shape[-1]).index_add_(-2, segment, t) / count

        return Memory("exact", [tuple(pool(t) for t in layer) for layer in memory.layers], None, memory.positions)
    head = min(sink, K)
    index = {"first": torch.arange(K), "last": torch.arange(m - K, m),
             "strided": torch.linspace(0, m - 1, K).round().long(),
             "sink": torch.cat([torch.arange(head), torch.arange(m - (K - head), m)])}[kind].to(device)
    return Memory("exact", [tuple(t.index_select(-2, index) for t in layer) for layer in memory.layers], None,
                  memory.positions)


def attention_inputs(model: nn.Module, tokenizer, texts: list[str], tokens: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per layer, the queries and keys of texts run through the frozen model alone (each cut to `tokens` tokens),
    [N, H, L, d] each, and which tokens are real [N, L]: what a learned feature map is fitted on."""
    model = base_of(model)
    device = next(model.parameters()).device
    batch = {k: t.to(device) for k, t in tokenizer(texts, truncation=True, max_length=tokens, padding=True,
                                                   return_tensors="pt").items()}
    with _implementation(model, _Capture) as modules, torch.no_grad():
        model(**batch)
        out = [(module.ntk_captured[3], module.ntk_captured[0], module.ntk_captured[2]) for module in modules]
        for module in modules:
            del module.ntk_captured
    return out


def compress_context(model: nn.Module, tokenizer, context: str, feature_map: FeatureMap) -> Memory:
    """A context text turned into per-layer (Z, k) (Eq. 4): its exact memory, compressed."""
    return compress(context_memory(model, tokenizer, context), feature_map)


def rotary(model: nn.Module) -> bool:
    """Whether the model encodes positions by rotating queries and keys (RoPE: Llama, Qwen2, Mistral, …)."""
    return any("rotary" in type(m).__name__.lower() for m in model.modules())


@contextlib.contextmanager
def _shifted(model: nn.Module, offset: int) -> Iterator[None]:
    """The model's forward with every position moved on by `offset` (derived from the attention mask, as generate()
    does, when the caller gives none), so that new text sits after a context whose keys took positions 0 … offset−1;
    generate() goes through it too. The forward keeps its signature (generate reads it)."""
    plain, own = model.forward, "forward" in vars(model)  # a model may carry a forward of its own

    @functools.wraps(plain)
    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        length = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
        positions = kwargs.get("position_ids")
        if positions is None:
            mask = kwargs.get("attention_mask")
            positions = (torch.arange(length, device=model.device)[None] if mask is None else
                         (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:])
        kwargs["position_ids"] = positions + offset
        return plain(*args, **kwargs)

    model.forward = forward
    try:
        yield
    finally:
        if own:
            model.forward = plain
        else:
            del model.forward


@contextlib.contextmanager
def attending(model: nn.Module, memory: Memory) -> Iterator[nn.Module]:
    """Inside, every attention layer of `model` attends to its layer of `memory` besides its input; on a RoPE model
    the new text's positions start after the context's (memory.positions), in forward and generate() alike. An
    injected NTK-Attention adapter adds its trained (Z, k) on top (with an exact memory)."""
    model = base_of(model)
    shift = _shifted(model, memory.positions) if memory.positions and rotary(model) else contextlib.nullcontext()
    with _implementation(model, _Attend) as modules, shift:
        if len(modules) != len(memory.layers):
            raise ValueError(f"the memory has {len(memory.layers)} layers, the model {len(modules)}")
        for index, (module, layer) in enumerate(zip(modules, memory.layers)):
            module.ntk_memory = (layer, memory.kind, memory.map_at(index))
        try:
            yield model
        finally:
            for module in modules:
                del module.ntk_memory


def stack(memories: list[Memory]) -> Memory:
    """Memories of equal shape as one batched memory: batch row r attends to memories[r]."""
    first = memories[0]
    return Memory(first.kind, [tuple(torch.stack([m.layers[i][j] for m in memories]) for j in range(len(layer)))
                               for i, layer in enumerate(first.layers)], first.feature_map,
                  max(m.positions for m in memories))


def state_numbers(head_dim: int, features: int, m: int) -> tuple[int, int]:
    """(compressed, exact) numbers per head and layer: dφ·(d + 1) + 1 for (Z, k, log_scale), 2·m·d for (K, V)."""
    return features * (head_dim + 1) + 1, 2 * m * head_dim


