"""Feature maps φ for NTK-Attention, each called as φ(x, r) and returning φ(r·x) as (f, c) with
φ(r·x) = exp(c)[..., None] · f.

The exponent c lets positive random features (whose raw values overflow for large inputs) stay
finite; maps that need no such shift return c = 0. NTK-Attention calls them with r = √s, so the
exp-approximating maps satisfy φ(√s q)·φ(√s k) ≈ exp(s q·k) (Eq. 3); each map folds r into its
first operation instead of spending a pass over x on the product.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

FeatureMap = Callable[..., tuple[Tensor, Tensor]]  # φ(x, root_scale=1.0) → (f, c)
FEATURE_MAPS = ("elu", "taylor2", "favor", "identity")


def _no_shift(x: Tensor) -> Tensor:
    return x.new_zeros(x.shape[:-1])


def identity(x: Tensor, root_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """φ(x) = x."""
    return x * root_scale, _no_shift(x)


def elu(x: Tensor, root_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """φ(x) = ELU(x) + 1, the paper's released code (its ELU(x/d^¼) + 1 is this map at s = 1/√d).

    ATen's elu takes the input's scale itself: elu(x, α, scale, input_scale) is scale·x for x > 0 and
    α·scale·(exp(input_scale·x) − 1) below, so α = 1/r, scale = input_scale = r gives ELU(r·x) in one pass."""
    r = root_scale
    out = torch.ops.aten.elu(x, 1.0 / r, r, r) if r > 0 else F.elu(x * r)
    return out.add_(1.0), _no_shift(x)


def taylor2(x: Tensor, root_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """Second-order Taylor features: φ(x)·φ(y) = 1 + x·y + (x·y)²/2, dimension 1 + d + d(d+1)/2."""
    x = x * root_scale
    d = x.shape[-1]
    i, j = torch.triu_indices(d, d, device=x.device)
    weight = torch.ones(len(i), dtype=x.dtype, device=x.device).masked_fill(i == j, 0.5 ** 0.5)  # exact in x's dtype
    quad = x[..., i] * x[..., j] * weight
    return torch.cat([torch.ones_like(x[..., :1]), x, quad], dim=-1), _no_shift(x)


class Favor:
    """Positive orthogonal random features (Performer FAVOR+): φ(x)_i = exp(ω_i·x − ‖x‖²/2)/√r.

    E_ω[φ(x)·φ(y)] = exp(x·y) for every ω_i ~ N(0, I); orthogonal blocks keep that marginal and
    lower the variance. Returned as (exp(log φ − c), c) with c the row maximum of log φ.
    """

    def __init__(self, dim: int, num_features: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        blocks = []
        for _ in range(math.ceil(num_features / dim)):
            q, r = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
            blocks.append((q * torch.sign(r.diagonal())).T)  # sign fix: Haar-distributed rows
        norms = torch.randn(num_features, dim, generator=gen, dtype=torch.float64).norm(dim=-1, keepdim=True)
        self.omega = torch.cat(blocks)[:num_features] * norms  # [r, d]

    def __call__(self, x: Tensor, root_scale: float = 1.0) -> tuple[Tensor, Tensor]:
        omega = self.omega.to(dtype=x.dtype, device=x.device) * root_scale  # ω·(r x) = (r ω)·x
        r = omega.shape[0]
        logits = x @ omega.T - (0.5 * root_scale ** 2) * (x * x).sum(-1, keepdim=True) - 0.5 * math.log(r)
        c = logits.amax(dim=-1)
        return torch.exp(logits - c.unsqueeze(-1)), c


def feature_map(name: str, dim: int, num_features: int = 256, seed: int = 0) -> FeatureMap:
    """The feature map called `name` for inputs of dimension `dim`."""
    if name == "favor":
        return Favor(dim, num_features, seed)
    maps = {"elu": elu, "taylor2": taylor2, "identity": identity}
    if name not in maps:
        raise ValueError(f"unknown feature map {name!r}; choose one of {', '.join(FEATURE_MAPS)}")
    return maps[name]
