"""An m-long attention prefix: exact streamed attention over it, and the ways to turn it into (Z, k).

Every (Z, k) producer returns (Z, k, log_scale): the true tensors are exp(log_scale)·Z and
exp(log_scale)·k, so a prefix whose exp-weights overflow float32 still compresses to finite numbers.
Streaming functions accept `ends`, a sorted list of prefix lengths, and report their result after the
first m rows for each m in it: one pass over 2^18 rows gives every m = 2^1 … 2^18.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
from torch import Tensor

from .core import NEG_INF, attention_lse, merge, ntk_combine
from .features import FeatureMap


def _spans(ends: list[int], chunk: int) -> Iterator[tuple[int, int, bool]]:
    """(start, stop, is_end) chunks of at most `chunk` rows that stop at every length in `ends`."""
    start = 0
    for end in ends:
        while start < end:
            stop = min(end, start + chunk)
            yield start, stop, stop == end
            start = stop


def prefix_stats(q: Tensor, pk: Tensor, pv: Tensor, *, scale: float, ends: list[int] | None = None,
                 chunk: int = 4096) -> Iterator[tuple[Tensor, Tensor]]:
    """Yields the exact softmax attention of q over the first m prefix rows as (mean, lse), for each m in ends.

    q [..., L, d]; pk [..., m, d], pv [..., m, dv] broadcast against q's leading dims. Memory is
    O(L·chunk) whatever m is: the rows stream through a running max, sum and weighted sum.
    """
    ends = ends or [pk.shape[-2]]
    top = torch.full(q.shape[:-1], NEG_INF, dtype=q.dtype, device=q.device)
    total = torch.zeros_like(top)
    acc = q.new_zeros(*q.shape[:-1], pv.shape[-1])
    for start, stop, is_end in _spans(ends, chunk):
        s = (q @ pk[..., start:stop, :].transpose(-1, -2)) * scale
        new_top = torch.maximum(top, s.amax(-1))
        shrink = torch.exp(top - new_top)
        w = torch.exp(s - new_top.unsqueeze(-1))
        total = total * shrink + w.sum(-1)
        acc = acc * shrink.unsqueeze(-1) + w @ pv[..., start:stop, :]
        top = new_top
        if is_end:
            yield acc / total.unsqueeze(-1), top + torch.log(total)


def prefix_attention_lse(q: Tensor, k: Tensor, v: Tensor, pk: Tensor, pv: Tensor, *, scale: float | None = None,
                         attn_mask: Tensor | None = None, is_causal: bool = False, chunk: int = 4096
                         ) -> tuple[Tensor, Tensor]:
    """Exact attention of q over [prefix; input] keys (Def 2.1), the prefix seen by every query, streamed: (mean,
    lse)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mean_x, lse_x = attention_lse(q, k, v, scale=scale, attn_mask=attn_mask, is_causal=is_causal)
    if pk.shape[-2] == 0:
        return mean_x, lse_x
    mean_p, lse_p = next(prefix_stats(q, pk, pv, scale=scale, chunk=chunk))
    return merge(mean_x, lse_x, mean_p.to(mean_x.dtype), lse_p.to(lse_x.dtype))


def prefix_attention(q: Tensor, k: Tensor, v: Tensor, pk: Tensor, pv: Tensor, *, scale: float | None = None,
                     attn_mask: Tensor | None = None, is_causal: bool = False, chunk: int = 4096) -> Tensor:
    """Exact attention of q over [prefix; input] keys (Def 2.1), the prefix seen by every query, streamed."""
    return prefix_attention_lse(q, k, v, pk, pv, scale=scale, attn_mask=attn_mask, is_causal=is_causal,
                                chunk=chunk)[0]


def compress_prefix(pk: Tensor, pv: Tensor, feature_map: FeatureMap, *, scale: float,
                    ends: list[int] | None = None, chunk: int = 4096) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Eq. 4: Z = Σ_r φ(√s k_r) v_rᵀ, k = Σ_r φ(√s k_r), for the first m rows for each m in ends.

    Streamed with one offset shared by all rows (the running maximum of the features' exponents);
    Z and k come back with entries in [-1, 1] and their common size as log_scale, so they stay
    finite for any m and any feature map, in any dtype.
    """
    ends = ends or [pk.shape[-2]]
    top = torch.full(pk.shape[:-2], NEG_INF, dtype=pk.dtype, device=pk.device)
    Z = kvec = None
    out = []
    for start, stop, is_end in _spans(ends, chunk):
        f, c = feature_map(pk[..., start:stop, :], math.sqrt(scale))
        new_top = torch.maximum(top, c.amax(-1))
        shrink = torch.exp(top - new_top)
        fw = f * torch.exp(c - new_top.unsqueeze(-1)).unsqueeze(-1)
        z_add, k_add = fw.transpose(-1, -2) @ pv[..., start:stop, :], fw.sum(-2)
        Z = z_add if Z is None else Z * shrink[..., None, None] + z_add
        kvec = k_add if kvec is None else kvec * shrink.unsqueeze(-1) + k_add
        top = new_top
        if is_end:  # also divide out the largest entry, so Z and k fit even float16
            size = torch.maximum(Z.abs().amax((-1, -2)), kvec.abs().amax(-1)).clamp_min(torch.finfo(Z.dtype).tiny)
            out.append((Z / size[..., None, None], kvec / size.unsqueeze(-1), top + torch.log(size)))
    return out


def _targets(c: Tensor, lse_p: Tensor) -> tuple[Tensor, Tensor]:
    """The denominator φ(q)·k must reach, exp(lse_p − c − G), and the shared offset G that makes it ≤ 1
    (G = 0 and a zero target when there is no prefix, lse_p = -inf)."""
    gap = lse_p - c
    offset = gap.max()
    if not torch.isfinite(offset):
        return torch.zeros_like(gap), torch.zeros_like(offset)
    return torch.exp(gap - offset), offset


def fit_prefix_lstsq(f: Tensor, c: Tensor, mean_p: Tensor, lse_p: Tensor, *, ridge: float = 1e-6
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Ridge least squares for fixed φ: φ(q)·k ≈ Σ_r e^{s q·k_r} and φ(q)Z ≈ Σ_r e^{s q·k_r} v_r on training queries.

    f, c: features of N queries [N, dφ], [N]; mean_p, lse_p: their exact prefix attention [N, dv], [N].
    Solved in float64 in closed form; the exact optimum of both squared errors for this φ.
    """
    f64 = f.double()
    den, offset = _targets(c.double(), lse_p.double())
    rhs = torch.cat([den.unsqueeze(-1), den.unsqueeze(-1) * mean_p.double()], dim=-1)
    gram = f64.T @ f64
    lam = ridge * gram.diagonal().mean().clamp_min(1e-300)
    sol = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype), f64.T @ rhs)
    return sol[:, 1:].to(f.dtype), sol[:, 0].to(f.dtype), offset.to(f.dtype)


def fit_prefix_adam(f: Tensor, c: Tensor, mean_x: Tensor, lse_x: Tensor, target: Tensor, lse_p: Tensor, *,
                    steps: int = 300, lr: float = 1e-2, batch: int = 1024, seed: int = 0
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """The released code's protocol: Adam on Z and k (init randn·1e-4) to match the exact attention output.

    f, c: features of N training queries; (mean_x, lse_x): their attention over the input;
    target: the exact output with the prefix [N, dv]; lse_p sets the shared offset so that the
    trained tensors are O(1) (the true Z, k are exp(log_scale) times them).
    """
    gen = torch.Generator().manual_seed(seed)
    _, offset = _targets(c, lse_p)
    Z = (torch.randn(f.shape[-1], target.shape[-1], generator=gen, dtype=f.dtype) * 1e-4).requires_grad_()
    kvec = (torch.randn(f.shape[-1], generator=gen, dtype=f.dtype) * 1e-4).requires_grad_()
    opt = torch.optim.Adam([Z, kvec], lr=lr)
    n = f.shape[0]
    for _ in range(steps):
        idx = torch.randint(n, (min(batch, n),), generator=gen)
        pred = ntk_combine(mean_x[idx], lse_x[idx], f[idx], c[idx], Z, kvec, offset)
        loss = (pred - target[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return Z.detach(), kvec.detach(), offset


def infinite_prefix_limit(q: Tensor, w_k: Tensor, w_v: Tensor, *, sigma: float, scale: float,
                          m: float) -> tuple[Tensor, Tensor]:
    """The prefix's (mean, lse) for m Gaussian rows P_r ~ N(0, σ²I) as m → ∞ (ours, not in the paper).

    With a = s·σ·q W_Kᵀ: Σ_r e^{s q·k_r} → m·e^{‖a‖²/2} and Σ_r e^{s q·k_r} v_r → m·e^{‖a‖²/2}·σ a W_V,
    so mean = σ a W_V and lse = log m + ‖a‖²/2 (keys k_r = P_r W_K, values v_r = P_r W_V).
    """
    a = scale * sigma * (q @ w_k.T)
    return sigma * (a @ w_v), math.log(m) + 0.5 * (a * a).sum(-1)
