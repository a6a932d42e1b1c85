"""The empirical neural tangent kernel J·Jᵀ by torch.func (vmap of jacrev: the jacobian contraction)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from torch.func import jacrev, vmap


def empirical_ntk(fn: Callable[[dict[str, Tensor], Tensor], Tensor], params: dict[str, Tensor], X: Tensor) -> Tensor:
    """K[(i,a),(j,b)] = Σ_θ ∂fn(θ, X_i)_a/∂θ · ∂fn(θ, X_j)_b/∂θ, flattened to [n·out, n·out].

    fn maps (params, one input) to an output of any shape; the Jacobian of every input is taken at
    once with vmap(jacrev), then contracted over all parameters.
    """
    jac = vmap(jacrev(fn), in_dims=(None, 0))(params, X)  # each leaf: [n, *out, *param]
    n = X.shape[0]
    flat = torch.cat([j.reshape(n, -1, params[name].numel()) for name, j in jac.items()], dim=-1)
    flat = flat.reshape(-1, flat.shape[-1])  # [n·out, P]
    return flat @ flat.T
