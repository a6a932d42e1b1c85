"""Softmax attention that also returns its row log-sum-exp, and NTK-Attention (Algorithm 1) built on it.

Everything here works in log space: an attention row is carried as (mean, lse), where mean is the
softmax-weighted average of the values and lse = log Σ_j exp(s·q·k_j). Two such pairs over disjoint
key sets merge exactly (`merge`), and NTK-Attention is the merge of the input's pair with the
compressed prefix φ(q)Z / φ(q)k, so no score is ever exponentiated un-shifted.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .features import FeatureMap, elu

NEG_INF = float("-inf")


def additive_mask(attn_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A boolean keep-mask (True = attend, as in SDPA) or an additive float mask, as an additive mask."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return None if attn_mask is None else attn_mask.to(dtype)
    return torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill(~attn_mask, NEG_INF)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half inputs are combined in float32; float32/float64 stay as they are."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


BACKWARD_BLOCK = 1 << 16  # score entries per (batch, head) that the recomputing backward holds at once
FUSED_BACKWARD = True  # on the CPU, the flash kernel's own backward; False: the blocked recomputation


def _scores(q: Tensor, k: Tensor, scale: float, mask: Tensor | None, is_causal: bool, first_row: int = 0) -> Tensor:
    """s·QKᵀ + M for the query rows first_row … first_row + len(q) − 1 (the causal mask is top-left, as SDPA's)."""
    s = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool, device=s.device).triu(1 + first_row), NEG_INF)
    return s if mask is None else s + mask


def _softmax_weights(s: Tensor, lse: Tensor) -> Tensor:
    """exp(s - lse), with rows that see no key (lse = -inf) set to zero instead of NaN."""
    return torch.exp(s - lse.masked_fill(lse == NEG_INF, 0.0).unsqueeze(-1))


HALF = (torch.float16, torch.bfloat16)


def kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> str:
    """Which kernel computes (mean, lse): PyTorch's fused kernels that return the log-sum-exp where one
    applies, else the math path (scores materialised in the work dtype).

    cpu-flash: any float dtype on the CPU, equal head dims. cuda-flash: fp16/bf16 on CUDA, no mask, equal
    head dims ≤ 256. cuda-efficient (memory-efficient attention): fp32/fp16/bf16 on CUDA with an additive
    mask or none, head dims multiples of 8. math: anything else (float64 on CUDA, other devices, mixed dtypes).
    """
    dims = {q.shape[-1], k.shape[-1], v.shape[-1]}
    if not q.dtype == k.dtype == v.dtype or (mask is not None and mask.dtype != q.dtype):
        return "math"
    if q.device.type == "cpu" and len(dims) == 1:
        return "cpu-flash"
    if q.device.type != "cuda":
        return "math"
    if q.dtype in HALF and mask is None and len(dims) == 1 and q.shape[-1] <= 256:
        return "cuda-flash"
    if q.dtype in (torch.float32, *HALF) and all(d % 8 == 0 for d in dims):
        return "cuda-efficient"
    return "math"


def _aligned_bias(mask: Tensor, q: Tensor, k: Tensor) -> Tensor:
    """The additive mask at [B, H, L, S] with its last dimension's stride padded to a multiple of 16 (what
    the memory-efficient kernel needs; SDPA pads the same way)."""
    B, H, L, S = *torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2]
    full = mask.expand(B, H, L, S)
    pad = -S % 16
    return torch.nn.functional.pad(full, (0, pad))[..., :S] if pad else full


def _math(q, k, v, mask, scale, is_causal):
    s = _scores(q.to(_work_dtype(q.dtype)), k.to(_work_dtype(q.dtype)), scale, mask, is_causal)
    lse = torch.logsumexp(s, dim=-1)
    return (_softmax_weights(s, lse) @ v.to(s.dtype)).to(v.dtype), lse


def _attention_lse_forward(q, k, v, mask, scale, is_causal):
    name = kernel(q, k, v, mask)
    if name == "math":
        return _math(q, k, v, mask, scale, is_causal)
    if name == "cpu-flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=is_causal, attn_mask=mask, scale=scale)
    elif name == "cuda-flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)[:2]
    else:
        bias = None if mask is None else _aligned_bias(mask, q, k)
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, 0.0, is_causal, scale=scale)[:2]
        lse = lse[..., : q.shape[-2]]  # some versions pad the lse's rows
    if mask is not None:  # the fused kernels report a finite lse for a row with every key masked
        lse = lse.masked_fill((mask == NEG_INF).all(-1).expand_as(lse), NEG_INF)
    return out, lse.to(_work_dtype(q.dtype))


def _fused_cpu_backward(q, k, v, mask, out, lse, g_out, g_lse, scale, is_causal):
    """The CPU flash kernel's backward, made to carry the lse's gradient too. The kernel's
    dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)) reads O only in that row sum, so passing O' = O − g_lse·dO/‖dO‖²
    (rowsum(dO ∘ O') = rowsum(dO ∘ O) − g_lse) gives P ∘ (dO·Vᵀ − rowsum(dO ∘ O) + g_lse), the gradient of
    both outputs. Where a row has g_lse ≠ 0 but dO = 0, one column is appended instead: ones to V, zeros to
    O, Q and K (no score changes) and g_lse to dO."""
    lse = lse.masked_fill(lse == NEG_INF, 0.0)  # a row with no key: P = 0 either way
    g_lse = g_lse.to(g_out.dtype).unsqueeze(-1)
    norm2 = (g_out * g_out).sum(-1, keepdim=True)
    shift = torch.where(g_lse == 0, 0.0, g_lse / norm2)
    # the shift when every row's is finite (|shift·dO| ≤ |g_lse|/‖dO‖ is then finite too); under torch.compile always
    # the widened column, which needs no data-dependent branch (a graph break)
    if not torch.compiler.is_compiling() and torch.isfinite(shift).all() and torch.isfinite(norm2).all():
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g_out, q, k, v, torch.addcmul(out, shift, g_out, value=-1.0), lse, 0.0, is_causal, attn_mask=mask,
            scale=scale)

    def widen(t: Tensor, value: float) -> Tensor:
        return torch.cat([t, t.new_full((*t.shape[:-1], 1), value)], dim=-1)

    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        torch.cat([g_out, g_lse], dim=-1), widen(q, 0.0), widen(k, 0.0), widen(v, 1.0),
        widen(out, 0.0), lse, 0.0, is_causal, attn_mask=mask, scale=scale)
    return dq[..., :-1], dk[..., :-1], dv[..., :-1]


class _AttentionLSE(torch.autograd.Function):
    """(softmax(s·QKᵀ + M)·V, logsumexp(s·QKᵀ + M)) with gradients through both outputs.

    The forward uses PyTorch's fused kernels where one applies (`kernel`; they return the lse but do not
    differentiate it). The backward is dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O) + d_lse), which covers both
    outputs at once: on the CPU through the flash kernel's own backward (`_fused_cpu_backward`), elsewhere
    by recomputing P in blocks of BACKWARD_BLOCK score entries per head. Either way training memory grows
    as L (times the block), not L².
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, is_causal):
        out, lse = _attention_lse_forward(q, k, v, mask, scale, is_causal)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale, ctx.is_causal = scale, is_causal
        return out, lse

    @staticmethod
    def backward(ctx, g_out, g_lse):
        q0, k0, v0, mask, out, lse = ctx.saved_tensors
        if FUSED_BACKWARD and kernel(q0, k0, v0, mask) == "cpu-flash":
            return (*_fused_cpu_backward(q0, k0, v0, mask, out, lse, g_out, g_lse, ctx.scale, ctx.is_causal),
                    None, None, None)
        wd = _work_dtype(q0.dtype)
        q, k, v, out, g_out, g_lse, lse = (t.to(wd) for t in (q0, k0, v0, out, g_out, g_lse, lse))
        L, rows = q.shape[-2], max(1, BACKWARD_BLOCK // max(1, k.shape[-2]))
        dq, dk, dv = [], 0, 0
        for i in range(0, L, rows):
            block = slice(i, i + rows)
            m = None if mask is None else (mask if mask.shape[-2] == 1 else mask[..., block, :])
            p = _softmax_weights(_scores(q[..., block, :], k, ctx.scale, m, ctx.is_causal, i), lse[..., block])
            g = g_out[..., block, :]
            ds = p * (g @ v.transpose(-1, -2) - (g * out[..., block, :]).sum(-1, keepdim=True)
                      + g_lse[..., block].unsqueeze(-1))
            dq.append((ds @ k) * ctx.scale)
            dk = dk + (ds.transpose(-1, -2) @ q[..., block, :]) * ctx.scale
            dv = dv + p.transpose(-1, -2) @ g
        dq = torch.cat(dq, dim=-2)
        return dq.to(q0.dtype), dk.to(k0.dtype), dv.to(v0.dtype), None, None, None


def _causal_into_mask(mask: Tensor, L: int, S: int) -> Tensor:
    """An additive mask with the (top-left) causal mask folded in, so that a row emptied by the two together
    is seen as empty (the fused kernel reports such a row's lse as 0, not −inf)."""
    return mask.masked_fill(torch.ones(L, S, dtype=torch.bool, device=mask.device).triu(1), NEG_INF)


def _empty(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The result for empty shapes (no query, no key, no head, no batch), as SDPA gives: an empty tensor, or
    zeros with lse = −inf where there is no key."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    mean = q.new_zeros(*lead, q.shape[-2], v.shape[-1])
    return mean, torch.full(mean.shape[:-1], NEG_INF, dtype=_work_dtype(q.dtype), device=q.device)


def attention_lse(q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None,
                  attn_mask: Tensor | None = None, is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """Softmax attention of q over (k, v) as (mean [..., L, dv], lse [..., L]); lse is float32 or wider.
    A row with no visible key has mean 0 and lse −inf."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if 0 in (q.numel(), k.numel(), v.numel()):
        return _empty(q, k, v)
    mask = additive_mask(attn_mask, q.dtype if kernel(q, k, v, None) != "math" else _work_dtype(q.dtype))
    if mask is not None and is_causal:
        mask, is_causal = _causal_into_mask(mask, q.shape[-2], k.shape[-2]), False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _AttentionLSE.apply(q, k, v, mask, scale, is_causal)
    return _attention_lse_forward(q, k, v, mask, scale, is_causal)


def merge(mean1: Tensor, lse1: Tensor, mean2: Tensor, lse2: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax attention over the union of two disjoint key sets, from each set's (mean, lse)."""
    lse = torch.logaddexp(lse1, lse2)
    safe = lse.masked_fill(lse == NEG_INF, 0.0)
    w1, w2 = torch.exp(lse1 - safe).unsqueeze(-1), torch.exp(lse2 - safe).unsqueeze(-1)
    return w1 * mean1 + w2 * mean2, lse


class _Combine(torch.autograd.Function):
    """T = a·mean + b·φZ with a = α/den, b = β/den, den = α + β·φk (Algorithm 1, line 7), from mean, α, β and
    φ[Z | k]; a row with den = 0 (no input key, no prefix) is zero. Its backward, written out, takes four passes
    over [.., L, dv] where autograd's takes about a dozen: with G = dT, u = G·mean, w = G·φZ and G·T = a·u + b·w,
    d mean = a·G, d φZ = b·G, d φk = −b·(G·T), dα = (u − G·T)/den, dβ = (w − φk·(G·T))/den."""

    @staticmethod
    def forward(ctx, mean, alpha, beta, fzk):
        fz, fk = fzk[..., :-1], fzk[..., -1]
        den = torch.addcmul(alpha, beta, fk)
        den = den.masked_fill(den == 0, math.inf)  # then a = b = 0, and so are their gradients
        a, b = alpha / den, beta / den
        ctx.save_for_backward(mean, fzk, a, b, den)
        return (a.unsqueeze(-1) * mean).addcmul_(fz, b.unsqueeze(-1))

    @staticmethod
    def backward(ctx, G):
        mean, fzk, a, b, den = ctx.saved_tensors
        fz, fk = fzk[..., :-1], fzk[..., -1]
        u, w = (G * mean).sum(-1), (G * fz).sum(-1)
        GT = torch.addcmul(a * u, b, w)
        d_fzk = torch.cat([G * b.unsqueeze(-1), (-b * GT).unsqueeze(-1)], dim=-1)  # no out=: compiles unbroken
        return G * a.unsqueeze(-1), (u - GT) / den, (w - fk * GT) / den, d_fzk


def ntk_combine(mean: Tensor, lse: Tensor, f: Tensor, c: Tensor, Z: Tensor, kvec: Tensor,
                log_scale: Tensor | float = 0.0) -> Tensor:
    """Lines 6–7 of Algorithm 1 given the input attention as (mean, lse) and φ(Q) = exp(c)·f:
    T = (e^lse·mean + e^g·f Z) / (e^lse + e^g·f k), g = c + log_scale, shifted by max(lse, g)."""
    wd = _work_dtype(mean.dtype)
    f, Z, kvec, lse = f.to(wd), Z.to(wd), kvec.to(wd), lse.to(wd)
    log_scale = torch.as_tensor(log_scale, dtype=wd, device=f.device)
    g = c.to(wd) + (log_scale.unsqueeze(-1) if log_scale.ndim else log_scale)
    top = torch.maximum(lse, g)
    fzk = f @ torch.cat([Z, kvec.unsqueeze(-1)], dim=-1)  # φ(Q)[Z | k] in one matmul
    return _Combine.apply(mean.to(wd), torch.exp(lse - top), torch.exp(g - top), fzk).to(mean.dtype)


def _checked_mask(attn_mask: Tensor | None, padding_mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """attn_mask checked against [B, H, L, S], or a [B, S] padding mask as the [B, 1, 1, S] keep-mask SDPA takes;
    a mask of another shape is one ValueError that says what is taken."""
    full = (q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
    if padding_mask is not None:
        if attn_mask is not None or tuple(padding_mask.shape) != (full[0], full[3]):
            raise ValueError(f"padding_mask must be [B, S] = {[full[0], full[3]]} (and attn_mask unset), not "
                             f"{list(padding_mask.shape)}")
        return padding_mask.bool()[:, None, None, :]
    if attn_mask is not None:
        try:
            fits = torch.broadcast_shapes(attn_mask.shape, full) == torch.Size(full)
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"attn_mask of shape {list(attn_mask.shape)} does not broadcast to [B, H, L, S] = "
                             f"{list(full)}; give a [B, S] padding mask as padding_mask=")
    return attn_mask


def ntk_attention(q: Tensor, k: Tensor, v: Tensor, Z: Tensor, kvec: Tensor, *,
                  feature_map: FeatureMap = elu, scale: float | None = None,
                  attn_mask: Tensor | None = None, padding_mask: Tensor | None = None, is_causal: bool = False,
                  log_scale: Tensor | float = 0.0) -> Tensor:
    """Algorithm 1: T = D⁻¹(A·V + φ(Q)Z), D = diag(A·1 + φ(Q)k), A = exp(s·QKᵀ) ∘ M, in log space.

    q, k, v: [B, H, L, d] (k, v may have another length); Z: [H, dφ, dv]; kvec: [H, dφ];
    attn_mask as SDPA takes it (boolean keep-mask or additive, broadcasting to [B, H, L, S]); padding_mask
    [B, S] (1 or True = a real key), as tokenizers give it;
    φ is applied to √s·q, so that φ(√s q)·φ(√s k) ≈ exp(s q·k) for the exp-approximating maps;
    log_scale ([H] or scalar) multiplies Z and k by exp(log_scale) without overflow.
    A row whose input keys are all masked sees the prefix alone, φ(Q)Z / φ(Q)k, or is zero where φ(Q)k = 0.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    attn_mask = _checked_mask(attn_mask, padding_mask, q, k)
    mean, lse = attention_lse(q, k, v, scale=scale, attn_mask=attn_mask, is_causal=is_causal)
    f, c = feature_map(q.to(_work_dtype(q.dtype)), math.sqrt(scale))
    return ntk_combine(mean, lse, f, c, Z, kvec, log_scale)
