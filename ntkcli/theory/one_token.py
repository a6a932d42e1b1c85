"""Paper 1's one-token prefix model (Def 3.4; Def C.2 with signs a_r), its loss and kernels.

F(W, x) = m·Σ_r a_r S_r(x) w_r with S(x) = softmax(Wᵀx), W ∈ R^{d×m} (column w_r is prefix row r).
Its Jacobian has two paths (Claim D.12): ∂F_k/∂w_r = A_r e_k + B_{k,r} x with A_r = m·a_r·S_r and
B_{k,r} = m·⟨v_{k,r}, S⟩·S_r = m·(β_{k,r} − ⟨β_k, S⟩)·S_r, β_k = W_{k,*} ∘ a. Def 3.9's kernel keeps
only the B (softmax) path; `ntk_full` keeps both and equals the autodiff kernel.
Kernels are indexed (i, k) → i·d + k and normalised by 1/m, as Def 3.9.
"""

from __future__ import annotations

import torch
from torch import Tensor


def init(d: int, m: int, *, signs: bool, seed: int, dtype=torch.float64) -> tuple[Tensor, Tensor]:
    """W with N(0, 1) entries (Def 3.4, σ = 1) and a: all ones (Def 3.4) or random ±1 (Def C.2)."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(d, m, generator=g, dtype=dtype)
    a = (torch.randint(0, 2, (m,), generator=g) * 2 - 1).to(dtype) if signs else torch.ones(m, dtype=dtype)
    return W, a


def model(W: Tensor, x: Tensor, a: Tensor) -> Tensor:
    """Def C.2: F(W, x, a) = m·Σ_r a_r softmax(Wᵀx)_r w_r, for x [..., d] → [..., d]."""
    S = torch.softmax(x @ W, dim=-1)
    return W.shape[1] * (S * a) @ W.T


def _paths(W: Tensor, X: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    m = W.shape[1]
    S = torch.softmax(X @ W, dim=-1)  # [n, m]
    beta = W * a  # [d, m]
    A = m * a * S  # [n, m]
    B = m * (beta.unsqueeze(0) - (S @ beta.T).unsqueeze(-1)) * S.unsqueeze(1)  # [n, d, m]
    return A, B


def _kernel(W: Tensor, X: Tensor, a: Tensor, *, both_paths: bool) -> Tensor:
    """(1/m)·J Jᵀ from the closed-form Jacobian ∂F_k(x_i)/∂W_{c,r} = A_{i,r} δ_{kc} + B_{i,k,r} x_{i,c}."""
    n, d, m = X.shape[0], W.shape[0], W.shape[1]
    A, B = _paths(W, X, a)
    J = B.unsqueeze(2) * X[:, None, :, None]  # [n, k, c, r]
    if both_paths:
        J = J + A[:, None, None, :] * torch.eye(d, dtype=W.dtype, device=W.device)[None, :, :, None]
    J = J.reshape(n * d, d * m)
    return J @ J.T / m


def ntk_def39(W: Tensor, X: Tensor, a: Tensor) -> Tensor:
    """Def 3.9: [H_{k1,k2}]_{i,j} = (1/m) x_iᵀx_j Σ_r ⟨v_{k1,r}, S_i⟩ m S_{i,r} ⟨v_{k2,r}, S_j⟩ m S_{j,r}."""
    return _kernel(W, X, a, both_paths=False)


def ntk_full(W: Tensor, X: Tensor, a: Tensor) -> Tensor:
    """The full NTK (1/m)·Σ_r ⟨∂F_{k1}(x_i)/∂w_r, ∂F_{k2}(x_j)/∂w_r⟩, both paths of Claim D.12 (ours)."""
    return _kernel(W, X, a, both_paths=True)
