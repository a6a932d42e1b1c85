"""Paper 2's N-layer transformer (Eq. 1, §3.2) and its layer kernels H_(ν) (§4.2), closed form and ours.

F(X) = ε·F_N(…F_1(X + E)…),  F_ν(X) = (ω/√m)·ReLU(Softmax(κ·X U_ν Xᵀ + M)·X W_ν)·A_ν + X,
U_ν ∈ R^{d×d} and W_ν ∈ R^{d×m} trained (N(0, 1) init), A_ν ∈ {±1}^{m×d} frozen, κ = 1/√m by default,
M the causal mask. The layer's output μ_ν = (ω/√m)·ReLU(o W_ν) A_ν, o = Softmax(·)·X.

Kernels of layer ν w.r.t. (W_ν, U_ν), with its input Λ = Λ_(ν−1) held fixed:
- `layer_kernel_full`: the exact one, indexed ((token p, output k), (q, k')), [nLd × nLd];
- `layer_kernel_paper`: §4.2's H_(ν) = ⟨β, β⟩ + ⟨γ, γ⟩, [nL × nL], which Lemma 4.1 uses as H ⊗ I_d.
  β keeps only Σ_r a_{r,k} a_{r,k'} = m·δ_{kk'} on average, and γ drops the signs a_{r,k} entirely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Shape:
    """Sizes and scaling coefficients of the model (every coefficient a recipe field)."""

    d: int
    m: int
    depth: int
    seq_len: int
    epsilon: float = 1.0
    omega: float = 1.0
    kappa: float | None = None  # None: 1/√m, as Definition 5.2
    causal: bool = True

    @property
    def k(self) -> float:
        return self.kappa if self.kappa is not None else 1.0 / math.sqrt(self.m)

    @property
    def size(self) -> int:
        """Model size M = N(md + d²): the trainable parameters."""
        return self.depth * (self.m * self.d + self.d * self.d)


def init(shape: Shape, seed: int, dtype=torch.float64) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(trainable {U, W}, frozen {A, E}): U, W ~ N(0, 1); A ~ Uniform{±1}; positional E ~ N(0, 1/d)."""
    g = torch.Generator().manual_seed(seed)
    N, d, m, L = shape.depth, shape.d, shape.m, shape.seq_len
    params = {"U": torch.randn(N, d, d, generator=g, dtype=dtype), "W": torch.randn(N, d, m, generator=g, dtype=dtype)}
    frozen = {"A": (torch.randint(0, 2, (N, m, d), generator=g) * 2 - 1).to(dtype),
              "E": torch.randn(L, d, generator=g, dtype=dtype) / math.sqrt(d)}
    return params, frozen


def _mask(L: int, causal: bool, like: Tensor) -> Tensor:
    if not causal:
        return like.new_zeros(L, L)
    return like.new_zeros(L, L).masked_fill(torch.ones(L, L, dtype=torch.bool, device=like.device).triu(1), -math.inf)


def attention_weights(X: Tensor, U: Tensor, shape: Shape) -> Tensor:
    """σ = Softmax(κ·X U Xᵀ + M) for X [..., L, d]."""
    return torch.softmax(shape.k * X @ U @ X.transpose(-1, -2) + _mask(X.shape[-2], shape.causal, X), dim=-1)


def block_mlp(X: Tensor, U: Tensor, W: Tensor, A: Tensor, shape: Shape) -> Tensor:
    """μ = (ω/√m)·ReLU(σ X W) A: the block's output before the residual (ω/√m applied last, on [.., L, d])."""
    return (torch.relu(attention_weights(X, U, shape) @ X @ W) @ A) * (shape.omega / math.sqrt(shape.m))


def hidden_states(params: dict[str, Tensor], frozen: dict[str, Tensor], X: Tensor, shape: Shape,
                  rows: Tensor | None = None) -> list[Tensor]:
    """Λ_0 = X + E, Λ_ν = μ_ν + Λ_{ν−1}, for ν = 1 … N. With `rows` (packed students), X is [R, L, d], U and W
    are [S, N, ...] for S students, and row r uses student rows[r]'s U and W (A is given per row, [R, N, m, d])."""
    states = [X + frozen["E"]]
    layers = zip(*(t.unbind(-3) for t in (params["U"], params["W"], frozen["A"])))  # (U_ν, W_ν, A_ν), ν = 1 … N
    for U, W, A in layers:
        if rows is not None:
            U, W = U.index_select(0, rows), W.index_select(0, rows)
        states.append(block_mlp(states[-1], U, W, A, shape) + states[-1])
    return states


def forward(params: dict[str, Tensor], frozen: dict[str, Tensor], X: Tensor, shape: Shape,
            rows: Tensor | None = None) -> Tensor:
    """Eq. (1): F(X) = ε·Λ_N."""
    return shape.epsilon * hidden_states(params, frozen, X, shape, rows)[-1]


def _layer_parts(params, frozen, X, shape, nu):
    lam = hidden_states(params, frozen, X, shape)[nu]  # Λ_(ν−1): [n, L, d]
    U, W, A = params["U"][nu], params["W"][nu], frozen["A"][nu]
    sigma = attention_weights(lam, U, shape)  # [n, L, L]
    o = sigma @ lam  # [n, L, d]
    on = (o @ W > 0).to(o.dtype)  # [n, L, m]
    jac_sigma = torch.diag_embed(sigma) - sigma.unsqueeze(-1) * sigma.unsqueeze(-2)  # [n, L, L, L]

    def attention_grad(g: Tensor) -> Tensor:
        """u = Λᵀ (diag σ − σσᵀ) Λ g for g [n, L, ..., d]: ∂(gᵀo)/∂U = κ·Λ_ℓ ⊗ u."""
        lg = torch.einsum("njd,nl...d->nl...j", lam, g)  # Λ g per token: [n, L, ..., L]
        c = torch.einsum("nljk,nl...k->nl...j", jac_sigma, lg)
        return torch.einsum("njd,nl...j->nl...d", lam, c)

    return lam, o, on, A, W, attention_grad


def layer_kernel_full(params, frozen, X: Tensor, shape: Shape, nu: int) -> Tensor:
    """The exact NTK of μ_ν w.r.t. (W_ν, U_ν), [nLd × nLd] indexed (i, ℓ, k) (ours; equals autodiff)."""
    lam, o, on, A, W, attention_grad = _layer_parts(params, frozen, X, shape, nu)
    n, L, d, m = *o.shape, shape.m
    c = shape.omega ** 2 / m
    kw = torch.einsum("pd,qd,pr,qr,rk,rl->pkql", o.reshape(-1, d), o.reshape(-1, d),
                      on.reshape(-1, m), on.reshape(-1, m), A, A)
    g = torch.einsum("nlr,rk,dr->nlkd", on, A, W)  # Σ_r a_{r,k} 1[o·w_r > 0] w_r
    u = attention_grad(g).reshape(n * L, d, d)
    x = lam.reshape(n * L, d)
    ku = shape.k ** 2 * torch.einsum("pa,qa,pkb,qlb->pkql", x, x, u, u)
    return (c * (kw + ku)).reshape(n * L * d, n * L * d)


def layer_kernel_paper(params, frozen, X: Tensor, shape: Shape, nu: int) -> tuple[Tensor, Tensor]:
    """§4.2: (H_(ν), H'_(ν)) with H = ⟨β, β⟩ + ⟨γ, γ⟩ and H' = ⟨β, β⟩ (Assumption 5.1), [nL × nL]."""
    lam, o, on, A, W, attention_grad = _layer_parts(params, frozen, X, shape, nu)
    n, L, d, m = *o.shape, shape.m
    c = shape.omega ** 2 / m
    o2, on2, x = o.reshape(-1, d), on.reshape(-1, m), lam.reshape(-1, d)
    h_beta = c * (o2 @ o2.T) * (on2 @ on2.T)
    g = torch.einsum("nlr,dr->nld", on, W)  # Σ_r 1[o·w_r > 0] w_r, the paper's γ has no a_r
    u = attention_grad(g).reshape(n * L, d)
    h_gamma = c * shape.k ** 2 * (x @ x.T) * (u @ u.T)
    return h_beta + h_gamma, h_beta
