"""A learned feature map for Eq. (4): Hedgehog's φ(x) = [exp(xW), exp(−xW)] with a trained W per head, fitted so
that φ(q)·φ(k) matches exp(s q·k) of a frozen model: normalised over the keys (Hedgehog's attention distillation,
the cross-entropy of the softmax weights against the map's) and in total mass (see distillation_loss).

Like the fixed maps it is called as φ(x, r) → (f, c) with φ(r·x) = exp(c)·f; x is [..., H, L, d] (its heads third
from the end), so one map serves a layer's queries [B, H, L, d] and its context keys [(B,) H, m, d].
"""

from __future__ import annotations

import torch
from torch import Tensor


class Hedgehog:
    """φ(x) = [exp(x W_h), exp(−x W_h)] for the head h of x, W [H, d, F]; 2F features per head."""

    def __init__(self, weight: Tensor):
        self.weight = weight

    @classmethod
    def initial(cls, heads: int, dim: int, features: int) -> "Hedgehog":
        """W_h = the d × F identity (zero-padded when F > d): the map before any training."""
        return cls(torch.eye(dim, features).expand(heads, dim, features).clone())

    def log_features(self, x: Tensor, root_scale: float = 1.0) -> Tensor:
        """log φ(r·x) = [u, −u] with u = r·x W_h, [..., H, L, 2F]."""
        u = torch.einsum("...hld,hdf->...hlf", x * root_scale, self.weight.to(x.dtype))
        return torch.cat([u, -u], dim=-1)

    def __call__(self, x: Tensor, root_scale: float = 1.0) -> tuple[Tensor, Tensor]:
        logs = self.log_features(x, root_scale)
        c = logs.amax(-1)
        return torch.exp(logs - c.unsqueeze(-1)), c


def distillation_loss(fmap: Hedgehog, q: Tensor, k: Tensor, real: Tensor, scale: float) -> Tensor:
    """Hedgehog's loss and a mass term, averaged over real query rows: −Σ_j A_ij log P_ij, with A the softmax
    attention weights over the real keys and P = φ(√s q_i)·φ(√s k_j) normalised over them, plus
    (log Σ_j φ(√s q_i)·φ(√s k_j) − log Σ_j exp(s q_i·k_j))². The mass term is ours: in Eq. (4)'s use the compressed
    context's φ(q)·k competes with the question's own exp(s q·k) terms, so φ must match exp in size, not only in
    shape. In log space throughout (the features' shifts enter as logs). q, k [N, H, L, d]; real [N, L]."""
    root = scale ** 0.5
    keep = real[:, None, None, :]
    scores = (scale * q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf"))
    fq, cq = fmap(q, root)
    fk, ck = fmap(k, root)
    logits = (torch.log((fq @ fk.transpose(-1, -2)).clamp_min(1e-30)) + ck.unsqueeze(-2) + cq.unsqueeze(-1))
    logits = logits.masked_fill(~keep, float("-inf"))
    rows = real[:, None, :].expand(q.shape[:-1])
    shape = -(torch.softmax(scores, -1) * torch.log_softmax(logits, -1).masked_fill(~keep, 0.0)).sum(-1)
    mass = (torch.logsumexp(logits, -1) - torch.logsumexp(scores, -1)) ** 2
    return (shape + mass)[rows].mean()


def fit_hedgehog(q: Tensor, k: Tensor, real: Tensor, *, scale: float, features: int, steps: int, lr: float,
                 ) -> tuple[Hedgehog, list[float]]:
    """One layer's map fitted by Adam on its queries and keys (every head at once, each its own W), from the identity
    start; with steps = 0 the start itself. Returns the map and the loss before each step and after the last."""
    start = Hedgehog.initial(q.shape[1], q.shape[-1], features)
    weight = start.weight.clone().requires_grad_(True)
    fmap = Hedgehog(weight)
    opt = torch.optim.Adam([weight], lr=lr)
    q, k = q.float(), k.float()
    losses = []
    for _ in range(steps):
        loss = distillation_loss(fmap, q, k, real, scale)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        losses.append(float(distillation_loss(fmap, q, k, real, scale)))
    return Hedgehog(weight.detach()), losses
