"""NTK-Attention as a fine-tuning method: a trainable (Z, k) per attention head (Algorithm 1).

Every attention module gets Z [kv_heads, dφ, d], k [kv_heads, dφ] (dφ = d for the paper's elu map, so d² + d per
head) and a log-scale g [kv_heads]; attention becomes

    T = (e^lse·mean + e^g·φ(Q)Z) / (e^lse + e^g·φ(Q)·k(κ)),

where (mean, lse) is softmax attention over the input and k(κ) the key map of the trained κ. With Z = 0 and
k(κ) = 0 it is the base model's attention exactly. The prefix's share of the attention mass of a query row,
e^g·φ(q)k / (e^lse + e^g·φ(q)k), is what training has to move; g sets how far one step of Adam moves it.

Options (each documented on NTKOptions): the init of (Z, k) (zeros, the released randn/1e4, Eq. (4) from a
random prefix or from the keys and values of real training text), the key map (signed, |κ| as released, κ²),
the scale (fixed, or calibrated on training inputs), a trainable g (gate), dropout on φ(Q), and a step of its own
for Z, k and g (prefix_lr).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from ..attention import FEATURE_MAPS, attention_lse, compress_prefix, feature_map, ntk_combine
from .common import LR_OVERRIDE, HeadShape, Options, module_device, random_prefix, repeat_kv

NAME = "ntk"
STATE = ("ntk_Z", "ntk_k", "ntk_log_scale")  # what a saved adapter holds besides the trained tensors
SQUARE_START = 1e-3  # κ where a square key map starts at k = 0 (κ² has no gradient at 0): k = 1e-6


class NTKOptions(Options):
    init: Literal["zeros", "paper", "prefix", "text"] = Field(
        "zeros", description="zeros: starts as the base model; paper: the released ChatGLM script's randn/1e4; "
        "prefix: Eq. (4) from a random prefix through the layer's own key/value projections; text: Eq. (4) from "
        "the keys and values of real training inputs through the frozen model (prefix_length tokens per layer)")
    feature_map: Literal[FEATURE_MAPS] = Field("elu", description="φ (elu is the paper's)")  # type: ignore[valid-type]
    num_features: int = Field(256, ge=1, description="random features of the favor map")
    prefix_length: int = Field(100, ge=1, description="m: the prefix that init 'prefix' draws, the tokens init 'text' "
                               "compresses")
    k_map: Literal["signed", "abs", "square"] = Field(
        "signed", description="k as a function of the trained κ: signed (k = κ), abs (|κ|, the released code: with a "
        "zero init it never moves), square (κ², never negative, so the denominator stays positive for φ ≥ 0)")
    scale: Literal["fixed", "calibrated"] = Field(
        "fixed", description="fixed: g is the init's own log-scale (0 for zeros and paper); calibrated: g per head "
        "from a batch of training inputs, so that k = 1 in every entry would hold half the attention mass of the "
        "median real query row (a unit step then moves the share visibly)")
    gate: bool = Field(False, description="train g too (its gradient needs a nonzero Z or k at init)")
    phi_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on φ(Q) while training (the released ViT "
                               "script's 0.2)")
    prefix_lr: float | None = Field(None, gt=0, description="AdamW step of Z, k and g; the task head keeps the "
                                    "method's step")
    seed: int = Field(0, ge=0, description="seed of the random init and of the favor features")

    @property
    def needs_batch(self) -> bool:
        """Whether the adapter reads training inputs when it is added (init text, calibrated scale)."""
        return self.init == "text" or self.scale == "calibrated"


OPTIONS = NTKOptions


def feature_dim(opts: NTKOptions, head_dim: int) -> int:
    """dφ of the options' feature map (without building it: favor's random matrix can be large)."""
    return {"taylor2": 1 + head_dim + head_dim * (head_dim + 1) // 2, "favor": opts.num_features}.get(
        opts.feature_map, head_dim)


def footprint(opts: NTKOptions, shape: HeadShape, layers: int, tokens: int, batch: int) -> int:
    """Bytes beyond the frozen model, roughly: Z and k with their gradients and AdamW's two moments (float32), φ(Q)
    kept for the backward at every layer, favor's random matrix per module (float64), and the init's prefix."""
    dphi = feature_dim(opts, shape.head_dim)
    trained = layers * shape.kv_heads * dphi * (shape.head_dim + 1)
    features = 3 * 4 * layers * batch * shape.heads * tokens * dphi
    omega = 8 * layers * opts.num_features * shape.head_dim if opts.feature_map == "favor" else 0
    prefix = 4 * 3 * opts.prefix_length * max(shape.hidden, shape.kv_heads * dphi) if opts.init in ("prefix", "text") else 0
    return 16 * trained + features + omega + prefix


def key_map(kind: str, kappa: Tensor) -> Tensor:
    """k(κ): signed κ, |κ| or κ²."""
    return kappa if kind == "signed" else kappa.abs() if kind == "abs" else kappa * kappa


def _kappa(kind: str, k: Tensor) -> Tensor:
    """A κ with k(κ) = k; a square map has no κ for k < 0 and no gradient at κ = 0, so there κ starts at
    SQUARE_START."""
    if kind != "square":
        return k
    return torch.where(k > 0, k.clamp_min(0).sqrt(), torch.full_like(k, SQUARE_START))


def _initial(module: nn.Module, shape: HeadShape, opts: NTKOptions, fmap, dphi: int,
             gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """(Z, k, g) of the init, before any calibration (init text starts from zeros, filled by `calibrate`)."""
    zeros = (torch.zeros(shape.kv_heads, dphi, shape.head_dim), torch.zeros(shape.kv_heads, dphi),
             torch.zeros(shape.kv_heads))
    if opts.init == "prefix":
        keys, values = random_prefix(module, shape, opts.prefix_length, gen)
        return compress_prefix(keys, values, fmap, scale=_scale(module, shape))[0]
    if opts.init == "paper":
        return (torch.randn(shape.kv_heads, dphi, shape.head_dim, generator=gen) / 1e4,
                torch.randn(shape.kv_heads, dphi, generator=gen) / 1e4, zeros[2])
    return zeros


def _scale(module: nn.Module, shape: HeadShape) -> float:
    return getattr(module, "scaling", None) or 1.0 / math.sqrt(shape.head_dim)


def _set(module: nn.Module, Z: Tensor, k: Tensor, g: Tensor) -> None:
    """Store (Z, k, g): the trained tensors are Z and κ with k(κ) = k, g a buffer or (gate) a parameter."""
    device = module_device(module)
    module.ntk_Z = nn.Parameter(Z.float().to(device))
    module.ntk_k = nn.Parameter(_kappa(module.ntk_k_map, k.float()).to(device))
    if module.ntk_gate:
        module.ntk_log_scale = nn.Parameter(g.float().to(device))
    else:
        module.register_buffer("ntk_log_scale", g.float().to(device))
    for p in (module.ntk_Z, module.ntk_k, module.ntk_log_scale):
        if isinstance(p, nn.Parameter) and module.ntk_step is not None:
            setattr(p, LR_OVERRIDE, module.ntk_step)


def add_parameters(module: nn.Module, shape: HeadShape, opts: NTKOptions, gen: torch.Generator) -> None:
    """Attach Z, κ (trainable), g (a buffer, or trainable with gate) and the options to one attention module."""
    fmap = feature_map(opts.feature_map, shape.head_dim, opts.num_features, opts.seed)
    dphi = fmap(torch.zeros(1, shape.head_dim))[0].shape[-1]
    module.ntk_feature_map, module.ntk_k_map, module.ntk_gate = fmap, opts.k_map, opts.gate
    module.ntk_phi_dropout, module.ntk_step, module.ntk_probe = opts.phi_dropout, opts.prefix_lr, None
    _set(module, *_initial(module, shape, opts, fmap, dphi, gen))


def _real_rows(mask: Tensor | None, B: int, L: int, S: int, device) -> Tensor:
    """[B, L]: the query rows of real tokens. Under self-attention a token is real where it may see its own key
    (padding masks it out, a causal mask never does); without a mask every row is real."""
    if mask is None or L != S:
        return torch.ones(B, L, dtype=torch.bool, device=device)
    diagonal = mask.diagonal(dim1=-2, dim2=-1)[:, 0]  # [B, L] of the first head (masks broadcast over heads)
    visible = diagonal if diagonal.dtype == torch.bool else diagonal == 0
    return visible.expand(B, L)


def share(lse: Tensor, f: Tensor, c: Tensor, k: Tensor, g: Tensor) -> Tensor:
    """The prefix's share of each query row's attention mass, e^g·φ(q)k / (e^lse + e^g·φ(q)k), with φ(q) = e^c·f;
    shifted by max(lse, g + c) so nothing overflows. k, g per query head; NaN where the row sees no key."""
    k, g = k.to(f.dtype), g.to(f.dtype)
    gc = c + g.view(1, -1, 1)
    top = torch.maximum(lse, gc)
    a, b = torch.exp(lse - top), torch.exp(gc - top) * (f @ k.unsqueeze(-1)).squeeze(-1)
    return (b / (a + b)).masked_fill(lse == -math.inf, math.nan)


def forward(module: nn.Module, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
            is_causal: bool) -> Tensor:
    """Algorithm 1 with this module's (Z, k, g), each key/value head's tensors shared by its query heads."""
    mean, lse = attention_lse(q, k, v, scale=scale, attn_mask=mask, is_causal=is_causal)
    return with_state(module, q, k, v, mean, lse, mask=mask, scale=scale)


def with_state(module: nn.Module, q: Tensor, k: Tensor, v: Tensor, mean: Tensor, lse: Tensor, *,
               mask: Tensor | None, scale: float) -> Tensor:
    """Algorithm 1's last step: the softmax attention of q over its keys, as (mean, lse), combined with this
    module's (Z, k, g). `attending` passes the attention over [context; input] here."""
    groups = q.shape[1] // module.ntk_Z.shape[0]
    f, c = module.ntk_feature_map(q.to(torch.promote_types(q.dtype, torch.float32)), math.sqrt(scale))
    f = F.dropout(f, module.ntk_phi_dropout, module.training) if module.ntk_phi_dropout else f
    kvec = repeat_kv(key_map(module.ntk_k_map, module.ntk_k), groups, 0)
    g = repeat_kv(module.ntk_log_scale, groups, 0)
    if module.ntk_probe is not None:  # what calibrate and statistics read (k and v: one query head per group)
        rows = _real_rows(mask, q.shape[0], q.shape[2], k.shape[2], q.device)
        module.ntk_probe.append({"lse": lse.detach(), "f": f.detach(), "c": c.detach(), "k": k[:, ::groups].detach(),
                                 "v": v[:, ::groups].detach(), "rows": rows, "share": share(lse, f, c, kvec, g).detach(),
                                 "groups": groups, "scale": scale})
    out = ntk_combine(mean, lse, f, c, repeat_kv(module.ntk_Z, groups, 0), kvec, g)
    # a padded query (no visible input key) is zero, as SDPA gives: its φ(Q)Z/φ(Q)k is unbounded once k is
    # trained (φ(Q)k can cross zero), and in half precision an overflowed row reaches the next layer's
    # visible rows through its values
    return out.masked_fill((lse == -math.inf).unsqueeze(-1), 0.0)


def modules_of(model: nn.Module) -> list[nn.Module]:
    """The attention modules that carry NTK-Attention tensors, in the model's order."""
    return [m for m in model.modules() if hasattr(m, "ntk_Z")]


def probe(model: nn.Module, batch: dict) -> list[dict]:
    """One forward of `batch` (no gradient, the model's mode kept) recording, per NTK module, what its attention
    saw: lse, φ(Q) as (f, c), the key/value heads' keys and values, the real query rows and the prefix's share."""
    modules = modules_of(model)
    for m in modules:
        m.ntk_probe = []
    try:
        with torch.no_grad():
            model(**batch)
        return [m.ntk_probe[0] for m in modules]
    finally:
        for m in modules:
            m.ntk_probe = None


def _per_kv_head(x: Tensor, rows: Tensor, groups: int) -> list[Tensor]:
    """x [B, H, L] → per key/value head, its query heads' values at the real rows."""
    B, H, L = x.shape
    picked = x.view(B, H // groups, groups, L).permute(1, 0, 2, 3)  # [kv, B, groups, L]
    keep = rows.unsqueeze(1).expand(B, groups, L)
    return [head[keep] for head in picked]


def calibrate(model: nn.Module, opts: NTKOptions, batch: dict | None) -> None:
    """What the options read from training inputs: init text fills (Z, k) by Eq. (4) from each layer's keys and
    values of the batch's real tokens (the first prefix_length of them), through the model as it stands (the base
    model: Z = k = 0); scale calibrated sets g per key/value head to the median over real query rows of
    lse − c − log Σφ̃(q), so that k = 1 would hold half that row's mass. The function at init is unchanged by the
    scale: Z and k are divided by e^g."""
    if not opts.needs_batch:
        return
    if batch is None:
        raise ValueError("init 'text' and scale 'calibrated' read a batch of training inputs; none was given")
    for module, seen in zip(modules_of(model), probe(model, batch)):
        Z, k = module.ntk_Z.detach(), key_map(module.ntk_k_map, module.ntk_k.detach())
        g = module.ntk_log_scale.detach()
        if opts.init == "text":
            Z, k, g = _text_prefix(module, seen, opts.prefix_length)
        if opts.scale == "calibrated":
            target = _calibrated(seen)
            Z, k, g = Z * torch.exp(g - target)[:, None, None], k * torch.exp(g - target)[:, None], target
        _set(module, Z, k, g)


def _text_prefix(module: nn.Module, seen: dict, m: int) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. (4) over the first m real tokens of the batch at this layer: keys and values [kv_heads, m, d]."""
    keys, values, rows = seen["k"], seen["v"], seen["rows"]  # [B, kv, S, d]; rows [B, L] (S = L)
    pick = lambda t: t.permute(1, 0, 2, 3)[:, rows][:, :m].float()  # noqa: E731 — [kv, tokens, d]
    return compress_prefix(pick(keys), pick(values), module.ntk_feature_map, scale=seen["scale"])[0]


def _calibrated(seen: dict) -> Tensor:
    """g per key/value head: the median over its real query rows of lse − c − log Σ_i f_i."""
    gap = seen["lse"] - seen["c"] - torch.log(seen["f"].sum(-1).clamp_min(1e-30))
    return torch.stack([h[torch.isfinite(h)].median() for h in _per_kv_head(gap, seen["rows"], seen["groups"])])


def mean_share(seen: dict) -> list[float]:
    """Per key/value head: the prefix's share averaged over the real query rows (of all its query heads) that see
    a key."""
    return [float(s[torch.isfinite(s)].mean()) for s in _per_kv_head(seen["share"], seen["rows"], seen["groups"])]


def statistics(model: nn.Module, batch: dict) -> list[dict]:
    """Per NTK module and key/value head: the prefix's share of attention mass averaged over the batch's real query
    rows, |Z|, |k(κ)| and g (the effective tensors are e^g·Z and e^g·k)."""
    out = []
    for layer, (module, seen) in enumerate(zip(modules_of(model), probe(model, batch))):
        k = key_map(module.ntk_k_map, module.ntk_k.detach())
        for head, s in enumerate(mean_share(seen)):
            out.append({"layer": layer, "head": head, "share": s,
                        "z_norm": float(module.ntk_Z[head].detach().norm()), "k_norm": float(k[head].norm()),
                        "log_scale": float(module.ntk_log_scale[head].detach())})
    return out
