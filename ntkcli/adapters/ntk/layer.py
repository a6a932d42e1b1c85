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

import torch
import torch.nn.functional as F
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import Tensor, nn

from ...attention import attention_lse, compress_prefix, feature_map, ntk_combine
from ..common import LR_OVERRIDE, HeadShape, module_device, random_prefix, repeat_kv
from .config import NTKOptions

NAME = "ntk"  # the attention implementation's name, and the method's in recipes
STATE = ("ntk_Z", "ntk_k", "ntk_log_scale")  # the tensors of one adapter on every layer
SQUARE_START = 1e-3  # κ where a square key map starts at k = 0 (κ² has no gradient at 0): k = 1e-6
OPTIONS = NTKOptions


class NTKAttentionLayer(nn.Module, BaseTunerLayer):
    """The NTK-Attention tensors of one attention module (its child `ntk_attention`), per adapter name as peft's
    layers keep theirs: Z, κ and g in ParameterDicts (g frozen unless the adapter's option gate), and each
    adapter's options and feature map. The attention module itself is not replaced: transformers' attention
    interface calls `forward` below with it, which reads the active adapter here."""

    adapter_layer_names = STATE
    other_param_names = ("ntk_options", "ntk_feature_map")

    def __init__(self, device: torch.device):
        super().__init__()
        self.home = device  # where the first adapter's tensors go: the attention module's device
        self.ntk_Z, self.ntk_k, self.ntk_log_scale = nn.ParameterDict(), nn.ParameterDict(), nn.ParameterDict()
        self.ntk_options: dict[str, NTKOptions] = {}
        self.ntk_feature_map: dict = {}
        self.frozen_peft_weight_names: dict[str, tuple[str, ...]] = {}
        self.pending: set[str] = set()  # adapters whose options read a batch that `calibrate` has not given yet
        self.merged_adapters = []
        self.probe = None

    @property
    def adapter(self) -> str:
        """The one active adapter (NTK-Attention runs one at a time)."""
        active = self.active_adapters
        if len(active) != 1:
            raise ValueError(f"NTK-Attention runs one adapter at a time; active: {active}")
        if active[0] in self.pending:
            raise ValueError(f"adapter {active[0]!r} has options that read training inputs (init 'text' or scale "
                             "'calibrated'): call ntkcli.calibrate(model, batch) before using it")
        return active[0]

    def tensors(self, name: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(Z, k(κ), g) of an adapter (the active one by default), as the attention uses them."""
        name = name or self.adapter
        return self.ntk_Z[name], key_map(self.ntk_options[name].k_map, self.ntk_k[name]), self.ntk_log_scale[name]

    def set(self, name: str, Z: Tensor, k: Tensor, g: Tensor) -> None:
        """Store an adapter's (Z, k, g): the trained tensors are Z and κ with k(κ) = k; g trains only with gate."""
        opts, device = self.ntk_options[name], next((p.device for p in self.parameters()), self.home)
        self.ntk_Z[name] = nn.Parameter(Z.float().to(device))
        self.ntk_k[name] = nn.Parameter(_kappa(opts.k_map, k.float()).to(device))
        self.ntk_log_scale[name] = nn.Parameter(g.float().to(device), requires_grad=opts.gate)
        self.frozen_peft_weight_names[name] = () if opts.gate else ("ntk_log_scale",)
        for p in (self.ntk_Z[name], self.ntk_k[name], self.ntk_log_scale[name]):
            if opts.prefix_lr is not None and p.requires_grad:
                setattr(p, LR_OVERRIDE, opts.prefix_lr)


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


def add_parameters(module: nn.Module, shape: HeadShape, opts: NTKOptions, gen: torch.Generator,
                   adapter_name: str = "default") -> None:
    """Give one attention module the adapter `adapter_name`: its layer (made on first use) gets Z, κ, g and the
    options."""
    if not isinstance(getattr(module, "ntk_attention", None), NTKAttentionLayer):
        module.ntk_attention = NTKAttentionLayer(module_device(module))
    layer = module.ntk_attention
    if adapter_name in layer.ntk_options:
        raise ValueError(f"{type(module).__name__} has an NTK-Attention adapter named {adapter_name!r} already")
    fmap = feature_map(opts.feature_map, shape.head_dim, opts.num_features, opts.seed)
    dphi = fmap(torch.zeros(1, shape.head_dim))[0].shape[-1]
    layer.ntk_options[adapter_name], layer.ntk_feature_map[adapter_name] = opts, fmap
    layer.set(adapter_name, *_initial(module, shape, opts, fmap, dphi, gen))
    if opts.needs_batch:
        layer.pending.add(adapter_name)
    # the first adapter becomes the active one; a later one waits for set_adapter (peft's way), frozen till then
    layer.set_adapter(adapter_name if len(layer.ntk_options) == 1 else layer.active_adapters)


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
    """Algorithm 1 with the active adapter's (Z, k, g), each key/value head's tensors shared by its query heads;
    softmax attention alone while the layer's adapters are disabled."""
    mean, lse = attention_lse(q, k, v, scale=scale, attn_mask=mask, is_causal=is_causal)
    if module.ntk_attention.disable_adapters:
        return mean
    return with_state(module, q, k, v, mean, lse, mask=mask, scale=scale)


def with_state(module: nn.Module, q: Tensor, k: Tensor, v: Tensor, mean: Tensor, lse: Tensor, *,
               mask: Tensor | None, scale: float) -> Tensor:
    """Algorithm 1's last step: the softmax attention of q over its keys, as (mean, lse), combined with the
    active adapter's (Z, k, g) on this attention module. `attending` passes the attention over [context; input]
    here."""
    layer = module.ntk_attention
    name = layer.adapter
    Z, kvec, g = layer.tensors(name)
    groups = q.shape[1] // Z.shape[0]
    f, c = layer.ntk_feature_map[name](q.to(torch.promote_types(q.dtype, torch.float32)), math.sqrt(scale))
    dropout = layer.ntk_options[name].phi_dropout
    f = F.dropout(f, dropout, layer.training) if dropout else f
    kvec, g = repeat_kv(kvec, groups, 0), repeat_kv(g, groups, 0)
    if layer.probe is not None:  # what calibrate and statistics read (k and v: one query head per group)
        rows = _real_rows(mask, q.shape[0], q.shape[2], k.shape[2], q.device)
        layer.probe.append({"lse": lse.detach(), "f": f.detach(), "c": c.detach(), "k": k[:, ::groups].detach(),
                            "v": v[:, ::groups].detach(), "rows": rows, "share": share(lse, f, c, kvec, g).detach(),
                            "groups": groups, "scale": scale})
    out = ntk_combine(mean, lse, f, c, repeat_kv(Z, groups, 0), kvec, g)
    # a padded query (no visible input key) is zero, as SDPA gives: its φ(Q)Z/φ(Q)k is unbounded once k is
    # trained (φ(Q)k can cross zero), and in half precision an overflowed row reaches the next layer's
    # visible rows through its values
    return out.masked_fill((lse == -math.inf).unsqueeze(-1), 0.0)


def modules_of(model: nn.Module) -> list[NTKAttentionLayer]:
    """The NTK-Attention layers of a model, in its order."""
    return [m for m in model.modules() if isinstance(m, NTKAttentionLayer)]


def probe(model: nn.Module, batch: dict) -> list[dict]:
    """One forward of `batch` (no gradient, the model's mode kept) recording, per NTK layer, what its attention
    saw: lse, φ(Q) as (f, c), the key/value heads' keys and values, the real query rows and the prefix's share."""
    layers = modules_of(model)
    for layer in layers:
        layer.probe = []
    try:
        with torch.no_grad():
            model(**batch)
        return [layer.probe[0] for layer in layers]
    finally:
        for layer in layers:
            layer.probe = None


def _per_kv_head(x: Tensor, rows: Tensor, groups: int) -> list[Tensor]:
    """x [B, H, L] → per key/value head, its query heads' values at the real rows."""
    B, H, L = x.shape
    picked = x.view(B, H // groups, groups, L).permute(1, 0, 2, 3)  # [kv, B, groups, L]
    keep = rows.unsqueeze(1).expand(B, groups, L)
    return [head[keep] for head in picked]


def calibrate(model: nn.Module, batch: dict | None) -> None:
    """What the active adapter's options read from training inputs: init text fills (Z, k) by Eq. (4) from each
    layer's keys and values of the batch's real tokens (the first prefix_length of them), through the model as it
    stands (the base model: Z = k = 0); scale calibrated sets g per key/value head to the median over real query
    rows of lse − c − log Σφ̃(q), so that k = 1 would hold half that row's mass. The function at init is unchanged
    by the scale: Z and k are divided by e^g."""
    layers = modules_of(model)
    name = layers[0].active_adapters[0] if layers else None
    if not layers or name not in layers[0].pending:
        return
    if batch is None:
        raise ValueError("init 'text' and scale 'calibrated' read a batch of training inputs; none was given")
    opts = layers[0].ntk_options[name]
    for layer in layers:
        layer.pending.discard(name)
    for layer, seen in zip(layers, probe(model, batch)):
        Z, k, g = (t.detach() for t in layer.tensors(name))
        if opts.init == "text":
            Z, k, g = _text_prefix(layer, seen, opts.prefix_length)
        if opts.scale == "calibrated":
            target = _calibrated(seen)
            Z, k, g = Z * torch.exp(g - target)[:, None, None], k * torch.exp(g - target)[:, None], target
        layer.set(name, Z, k, g)


def _text_prefix(layer: NTKAttentionLayer, seen: dict, m: int) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. (4) over the first m real tokens of the batch at this layer: keys and values [kv_heads, m, d]."""
    keys, values, rows = seen["k"], seen["v"], seen["rows"]  # [B, kv, S, d]; rows [B, L] (S = L)
    pick = lambda t: t.permute(1, 0, 2, 3)[:, rows][:, :m].float()  # noqa: E731 — [kv, tokens, d]
    fmap = layer.ntk_feature_map[layer.adapter]
    return compress_prefix(pick(keys), pick(values), fmap, scale=seen["scale"])[0]


def _calibrated(seen: dict) -> Tensor:
    """g per key/value head: the median over its real query rows of lse − c − log Σ_i f_i."""
    gap = seen["lse"] - seen["c"] - torch.log(seen["f"].sum(-1).clamp_min(1e-30))
    return torch.stack([h[torch.isfinite(h)].median() for h in _per_kv_head(gap, seen["rows"], seen["groups"])])


def mean_share(seen: dict) -> list[float]:
    """Per key/value head: the prefix's share averaged over the real query rows (of all its query heads) that see
    a key."""
    return [float(s[torch.isfinite(s)].mean()) for s in _per_kv_head(seen["share"], seen["rows"], seen["groups"])]


def statistics(model: nn.Module, batch: dict) -> list[dict]:
    """Per NTK layer and key/value head: the prefix's share of attention mass averaged over the batch's real query
    rows, |Z|, |k(κ)| and g (the effective tensors are e^g·Z and e^g·k)."""
    out = []
    for index, (layer, seen) in enumerate(zip(modules_of(model), probe(model, batch))):
        Z, k, g = (t.detach() for t in layer.tensors())
        for head, s in enumerate(mean_share(seen)):
            out.append({"layer": index, "head": head, "share": s, "z_norm": float(Z[head].norm()),
                        "k_norm": float(k[head].norm()), "log_scale": float(g[head])})
    return out
