"""The operator and the prefix tools against naive float64 references."""

import math

import pytest
import torch

from ntkcli.attention import (attention_lse, compress_prefix, elu, feature_map, fit_prefix_lstsq,
                              infinite_prefix_limit, ntk_attention, prefix_attention, prefix_stats, taylor2)

F64 = torch.float64


def naive_attention(q, k, v, scale, keep=None):
    """softmax(s·QKᵀ) V with a boolean keep-mask, written out in float64."""
    s = (q @ k.transpose(-1, -2)) * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    w = torch.exp(s - s.amax(-1, keepdim=True))
    return (w / w.sum(-1, keepdim=True)) @ v


def qkv(B=2, H=3, L=7, d=5, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, d, generator=g, dtype=dtype) for _ in range(3)]


def masks(B, L):
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    lengths = torch.tensor([L, L - 3])
    padding = (torch.arange(L)[None, :] < lengths[:, None])[:, None, None, :].expand(B, 1, L, L)
    return {"full": (None, False, None), "causal": (None, True, causal),
            "padding": (padding, False, padding), "padding+causal": (padding, True, padding & causal)}


@pytest.mark.parametrize("kind", ["full", "causal", "padding", "padding+causal"])
def test_zero_Z_k_is_softmax_attention(kind):
    q, k, v = qkv()
    H, d = q.shape[1], q.shape[-1]
    mask, is_causal, keep = masks(q.shape[0], q.shape[2])[kind]
    out = ntk_attention(q, k, v, torch.zeros(H, d, d, dtype=F64), torch.zeros(H, d, dtype=F64),
                        attn_mask=mask, is_causal=is_causal)
    ref = naive_attention(q, k, v, d ** -0.5, keep)
    assert (out - ref).abs().max() < 1e-10


def test_additive_float_mask_equals_boolean_mask():
    q, k, v = qkv()
    keep = masks(2, 7)["padding"][0]
    additive = torch.zeros(keep.shape, dtype=F64).masked_fill(~keep, torch.finfo(F64).min)
    Z, kv = torch.randn(3, 5, 5, dtype=F64), torch.rand(3, 5, dtype=F64)
    a = ntk_attention(q, k, v, Z, kv, attn_mask=keep)
    b = ntk_attention(q, k, v, Z, kv, attn_mask=additive)
    assert (a - b).abs().max() < 1e-10


def test_row_with_every_key_masked_sees_only_the_prefix():
    """A row with no visible input key is φ(Q)Z/φ(Q)k (the prefix alone: how approx-error evaluates m = ∞),
    and zero where that is 0/0 (Z = k = 0), with finite gradients."""
    q, k, v = qkv()
    keep = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    keep[0, :, 2, :] = False
    Z, kv = torch.randn(3, 5, 5, dtype=F64), torch.rand(3, 5, dtype=F64) + 0.1
    out = ntk_attention(q, k, v, Z, kv, attn_mask=keep)
    f, _ = elu(q[0, :, 2] * 5 ** -0.25)
    prefix_only = (f.unsqueeze(1) @ Z).squeeze(1) / (f * kv).sum(-1, keepdim=True)
    assert torch.isfinite(out).all()
    assert (out[0, :, 2] - prefix_only).abs().max() < 1e-10
    _, lse = attention_lse(q, k, v, attn_mask=keep)
    assert torch.isinf(lse[0, :, 2]).all() and torch.isfinite(lse[1]).all()
    Z = torch.zeros(3, 5, 5, dtype=F64, requires_grad=True)
    out = ntk_attention(q, k, v, Z, torch.zeros(3, 5, dtype=F64), attn_mask=keep)
    assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2])) and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(Z.grad).all()


def test_zero_key_prefix_is_reproduced_by_a_constant_feature_map():
    """Keys 0 give every prefix row weight exp(0) = 1: φ ≡ 1, Z = Σ v_r, k = m is then exact."""
    q, k, v = qkv()
    m, H, d = 6, 3, 5
    pk = torch.zeros(H, m, d, dtype=F64)
    pv = torch.randn(H, m, d, dtype=F64)
    const = lambda x, root_scale=1.0: (torch.ones(*x.shape[:-1], 1, dtype=x.dtype), x.new_zeros(x.shape[:-1]))  # noqa: E731
    Z, kv, log_scale = compress_prefix(pk, pv, const, scale=d ** -0.5)[0]
    assert torch.allclose(Z * log_scale.exp()[:, None, None], pv.sum(-2, keepdim=True))
    assert torch.allclose(kv * log_scale.exp()[:, None], torch.full((H, 1), float(m), dtype=F64))
    out = ntk_attention(q, k, v, Z, kv, feature_map=const, log_scale=log_scale)
    ref = prefix_attention(q, k, v, pk, pv)
    assert (out - ref).abs().max() < 1e-12


@pytest.mark.parametrize("chunk", [1, 3, 5, 100])
@pytest.mark.parametrize("kind", ["full", "causal", "padding"])
def test_prefix_attention_equals_dense_softmax_over_concatenation(chunk, kind):
    q, k, v = qkv()
    B, H, L, d = q.shape
    g = torch.Generator().manual_seed(1)
    pk, pv = torch.randn(H, 5, d, generator=g, dtype=F64), torch.randn(H, 5, d, generator=g, dtype=F64)
    mask, is_causal, keep = masks(B, L)[kind]
    out = prefix_attention(q, k, v, pk, pv, attn_mask=mask, is_causal=is_causal, chunk=chunk)
    keys = torch.cat([pk.expand(B, H, 5, d), k], dim=2)
    vals = torch.cat([pv.expand(B, H, 5, d), v], dim=2)
    full_keep = None if keep is None else torch.cat([torch.ones(*keep.shape[:-1], 5, dtype=torch.bool).expand(
        *torch.broadcast_shapes(keep.shape[:-1], (B, 1, L)), 5), keep.expand(*torch.broadcast_shapes(
            keep.shape[:-1], (B, 1, L)), L)], dim=-1)
    assert (out - naive_attention(q, keys, vals, d ** -0.5, full_keep)).abs().max() < 1e-12


def test_prefix_stats_at_several_lengths_matches_separate_passes():
    q = torch.randn(4, 3, dtype=F64)
    pk, pv = torch.randn(20, 3, dtype=F64), torch.randn(20, 3, dtype=F64)
    nested = list(prefix_stats(q, pk, pv, scale=1.0, ends=[2, 7, 20], chunk=4))
    for (mean, lse), m in zip(nested, [2, 7, 20]):
        s = q @ pk[:m].T
        assert torch.allclose(lse, torch.logsumexp(s, -1))
        assert torch.allclose(mean, torch.softmax(s, -1) @ pv[:m])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_no_overflow_with_huge_scores_or_half_precision(dtype):
    q, k, v = qkv(L=16, d=8, dtype=torch.float32)
    q = q * 400.0  # scores of magnitude ~1e3
    assert (q @ k.transpose(-1, -2) * 8 ** -0.5).abs().max() > 1e3
    pk = torch.randn(3, 1000, 8) * 30.0
    pv = torch.randn(3, 1000, 8)
    for name in ("elu", "taylor2", "favor"):
        phi = feature_map(name, 8, num_features=32)
        Z, kv, ls = compress_prefix(pk, pv, phi, scale=8 ** -0.5)[0]
        assert torch.isfinite(Z).all() and torch.isfinite(kv).all()
        out = ntk_attention(q.to(dtype), k.to(dtype), v.to(dtype), Z.to(dtype), kv.to(dtype),
                            feature_map=phi, log_scale=ls)
        assert out.dtype == dtype and torch.isfinite(out).all(), name
    ref = ntk_attention(q, k, v, Z, kv, feature_map=phi, log_scale=ls)
    assert (out.float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_gradcheck_float64():
    q, k, v = (t.requires_grad_() for t in qkv(B=1, H=2, L=4, d=3))
    Z = torch.randn(2, 3, 3, dtype=F64, requires_grad=True)
    kv = (torch.rand(2, 3, dtype=F64) + 0.5).requires_grad_()
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    keep[..., -1] = False
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": keep}):
        assert torch.autograd.gradcheck(lambda *a: ntk_attention(*a, **kwargs), (q, k, v, Z, kv))
    # fewer queries than keys: the fused forward and the recomputing backward must agree on the mask
    assert torch.autograd.gradcheck(lambda q_, *a: ntk_attention(q_, *a, is_causal=True), (q[:, :, :2], k, v, Z, kv))


def test_combination_backward_equals_autograd_of_the_formula():
    """ntk_combine's written-out backward against autograd through Algorithm 1's line 7 in float64, with a
    per-head log_scale, a feature shift c, and a row that sees nothing (lse = −inf, φ(q) = 0): zero, zero grads."""
    from ntkcli.attention import ntk_combine

    g = torch.Generator().manual_seed(3)
    mean, f = torch.randn(2, 3, 5, 4, generator=g, dtype=F64), torch.rand(2, 3, 5, 4, generator=g, dtype=F64)
    lse, c = torch.randn(2, 3, 5, generator=g, dtype=F64), torch.randn(2, 3, 5, generator=g, dtype=F64)
    Z, kv, log_scale = (torch.randn(3, 4, 4, generator=g, dtype=F64), torch.rand(3, 4, generator=g, dtype=F64),
                        torch.randn(3, generator=g, dtype=F64))
    lse[1, 2, 3], f[1, 2, 3] = -math.inf, 0.0
    G = torch.randn(2, 3, 5, 4, generator=g, dtype=F64)

    def formula(mean, lse, f, c, Z, kv, log_scale):
        a, b = torch.exp(lse), torch.exp(c + log_scale.unsqueeze(-1))
        num, den = a.unsqueeze(-1) * mean + b.unsqueeze(-1) * (f @ Z), a + b * (f @ kv.unsqueeze(-1)).squeeze(-1)
        empty = (den == 0).unsqueeze(-1)  # T = 0 there, so its gradients are zero too
        return torch.where(empty, 0.0, num / den.unsqueeze(-1).masked_fill(empty, 1.0))

    leaves = [t.clone().requires_grad_() for t in (mean, lse, f, c, Z, kv, log_scale)]
    out = ntk_combine(*leaves)
    (out * G).sum().backward()
    ref_leaves = [t.clone().requires_grad_() for t in (mean, lse, f, c, Z, kv, log_scale)]
    ref = formula(*ref_leaves)
    (ref * G).sum().backward()
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12) and (out[1, 2, 3] == 0).all()
    for a, b in zip(leaves, ref_leaves):
        assert torch.allclose(a.grad, b.grad, rtol=1e-10, atol=1e-12)
    live = [t.clone().requires_grad_() for t in (mean, lse.clamp_min(-5.0), f + 0.1, c, Z, kv, log_scale)]
    assert torch.autograd.gradcheck(ntk_combine, live)


def test_causal_with_fewer_queries_than_keys_is_top_left_as_in_sdpa():
    q, k, v = qkv(L=7)
    Z, kv = torch.zeros(3, 5, 5, dtype=F64), torch.zeros(3, 5, dtype=F64)
    out = ntk_attention(q[:, :, :3], k, v, Z, kv, is_causal=True)
    keep = torch.ones(3, 7, dtype=torch.bool).tril()
    assert (out - naive_attention(q[:, :, :3], k, v, 5 ** -0.5, keep)).abs().max() < 1e-10


def test_taylor2_features_give_the_second_order_series():
    x, y = torch.randn(10, 6, dtype=F64), torch.randn(10, 6, dtype=F64)
    t = (x * y).sum(-1)
    fx, fy = taylor2(x)[0], taylor2(y)[0]
    assert fx.shape[-1] == 1 + 6 + 21
    assert torch.allclose((fx * fy).sum(-1), 1 + t + t * t / 2, rtol=1e-14, atol=1e-14)  # exact in float64


def naive_ntk(q, k, v, Z, kv, keep):
    """Algorithm 1 written out in float64 with the keep-mask (a row that sees no key gets the prefix alone)."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    A = torch.exp(s).masked_fill(~keep, 0.0)
    f = elu(q * q.shape[-1] ** -0.25)[0]
    return (A @ v + f @ Z) / (A.sum(-1, keepdim=True) + (f @ kv.unsqueeze(-1)))


@pytest.mark.parametrize("Lq, Lk", [(6, 6), (3, 7), (7, 3)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_every_mask_and_causal_combination_matches_the_float64_reference(Lq, Lk, mask_kind, is_causal):
    """Including rows that the mask and the causal triangle empty only together (the fused kernel's lse of 0
    for such a row must become −inf), and Lq ≠ Lk (causal is top-left, as in SDPA)."""
    g = torch.Generator().manual_seed(Lq * 10 + Lk)
    q, k, v = (torch.randn(2, 3, n, 5, generator=g, dtype=F64) for n in (Lq, Lk, Lk))
    Z, kv = torch.randn(3, 5, 5, generator=g, dtype=F64), torch.rand(3, 5, generator=g, dtype=F64) + 0.1
    keep = torch.ones(2, 1, Lq, Lk, dtype=torch.bool)
    keep[0, :, :, 0] = False  # with causal: row 0 of batch 0 sees key 0 only, which the mask removes
    keep[1, :, 1, :] = False  # a row the mask alone empties
    mask = {"none": None, "bool": keep,
            "additive": torch.zeros(keep.shape, dtype=F64).masked_fill(~keep, float("-inf"))}[mask_kind]
    want_keep = (keep if mask is not None else torch.ones_like(keep)) & (
        torch.ones(Lq, Lk, dtype=torch.bool).tril() if is_causal else torch.ones(Lq, Lk, dtype=torch.bool))
    out = ntk_attention(q, k, v, Z, kv, attn_mask=mask, is_causal=is_causal)
    assert (out - naive_ntk(q, k, v, Z, kv, want_keep)).abs().max() < 1e-12
    mean, lse = attention_lse(q, k, v, attn_mask=mask, is_causal=is_causal)
    assert torch.equal(torch.isinf(lse), ~want_keep.any(-1).expand_as(lse))
    exact = prefix_attention(q, k, v, k[:, :, :0], v[:, :, :0], attn_mask=mask, is_causal=is_causal)
    assert torch.isfinite(exact).all() and torch.equal(exact == 0, (mean == 0))


@pytest.mark.parametrize("shape_q, shape_k", [((1, 2, 0, 8), (1, 2, 5, 8)), ((1, 2, 3, 8), (1, 2, 0, 8)),
                                              ((1, 0, 3, 8), (1, 0, 3, 8)), ((0, 2, 3, 8), (0, 2, 3, 8))])
def test_empty_shapes_give_empty_or_zero_results_like_sdpa(shape_q, shape_k):
    """No query, no key, no head or no batch: an empty result (or zero rows), never a crashed process."""
    q, k, v = torch.randn(shape_q), torch.randn(shape_k), torch.randn(shape_k)
    H = q.shape[1]
    out = ntk_attention(q, k, v, torch.zeros(H, 8, 8), torch.zeros(H, 8))
    assert out.shape == torch.nn.functional.scaled_dot_product_attention(q, k, v).shape
    assert torch.equal(out, torch.zeros_like(out))
    mean, lse = attention_lse(q, k, v, is_causal=True)
    assert mean.shape == out.shape and lse.shape == out.shape[:-1]


def test_favor_compression_is_unbiased_over_seeds():
    """E_ω[φ(q)·Σ_r φ(k_r)] = Σ_r exp(q·k_r) and likewise for Z: over 1000 feature seeds the mean is
    within 4 standard errors of the exact sums, while a single draw is visibly off."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, 4, generator=g, dtype=F64) * 0.5
    pk, pv = torch.randn(50, 4, generator=g, dtype=F64) * 0.5, torch.randn(50, 4, generator=g, dtype=F64)
    exact = torch.cat([torch.exp(q @ pk.T).sum(-1, keepdim=True), torch.exp(q @ pk.T) @ pv], dim=-1)
    draws = []
    for seed in range(1000):
        phi = feature_map("favor", 4, num_features=8, seed=seed)
        Z, kv, ls = compress_prefix(pk, pv, phi, scale=1.0)[0]
        f, c = phi(q)
        draws.append(torch.exp(c + ls).unsqueeze(-1) * torch.cat([f @ kv.unsqueeze(-1), f @ Z], dim=-1))
    draws = torch.stack(draws)
    z = (draws.mean(0) - exact) / (draws.std(0) / math.sqrt(len(draws)))
    assert z.abs().max() < 4.0, z
    assert ((draws[0] - exact).abs() / exact.abs().clamp_min(1.0)).max() > 0.05


def test_lstsq_recovers_Z_k_that_generated_the_targets():
    g = torch.Generator().manual_seed(0)
    f = torch.rand(200, 6, generator=g, dtype=F64) + 0.1
    Z, kv = torch.randn(6, 3, generator=g, dtype=F64), torch.rand(6, generator=g, dtype=F64) + 0.1
    den = f @ kv
    Zf, kf, ls = fit_prefix_lstsq(f, torch.zeros(200, dtype=F64), (f @ Z) / den[:, None], den.log(), ridge=0.0)
    assert torch.allclose(Zf * ls.exp(), Z, atol=1e-8) and torch.allclose(kf * ls.exp(), kv, atol=1e-8)


def test_infinite_limit_approaches_exact_prefix_in_unit_score_regime():
    """W std 1/√d, s = 1/√d, P ~ N(0, I): at m = 2^16 the prefix-only output is within 1% (relative MSE)."""
    d, m = 64, 2 ** 16
    g = torch.Generator().manual_seed(0)
    w_k, w_v, w_q = (torch.randn(d, d, generator=g, dtype=F64) / math.sqrt(d) for _ in range(3))
    q = torch.randn(256, d, generator=g, dtype=F64) @ w_q
    P = torch.randn(m, d, generator=g, dtype=F64)
    mean, lse = next(prefix_stats(q, P @ w_k, P @ w_v, scale=d ** -0.5))
    mean_inf, lse_inf = infinite_prefix_limit(q, w_k, w_v, sigma=1.0, scale=d ** -0.5, m=m)
    rel = ((mean - mean_inf) ** 2).sum() / (mean ** 2).sum()
    assert rel < 1e-2, rel
    assert (lse - lse_inf).abs().max() < 0.05
    # with the paper's std 1 the same m is nowhere near the limit
    w_k1, w_v1 = w_k * math.sqrt(d), w_v * math.sqrt(d)
    mean1, _ = next(prefix_stats(q * 4, P @ w_k1, P @ w_v1, scale=d ** -0.5))
    mean1_inf, _ = infinite_prefix_limit(q * 4, w_k1, w_v1, sigma=1.0, scale=d ** -0.5, m=m)
    assert ((mean1 - mean1_inf) ** 2).sum() / (mean1 ** 2).sum() > 0.5


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"mask": True}, {"mask": True, "is_causal": True}])
def test_backward_in_query_blocks_equals_the_fused_cpu_backward(monkeypatch, kwargs):
    """Two backwards, the same gradients (float64), masks, a row with no key and the causal offset of each
    block included, with Lq ≠ Lk: the CPU flash kernel's own backward (the default here), and the blocked
    recomputation used where no fused backward applies (memory L·block, not L²) at any block size."""
    import ntkcli.attention.core as core

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=F64) for n in (7, 9, 9))
    keep = torch.rand(2, 1, 7, 9, generator=g) > 0.3
    keep[0, 0, 2] = False
    args = {"is_causal": kwargs.get("is_causal", False), "attn_mask": keep if kwargs.get("mask") else None}
    Z, kv = torch.randn(3, 4, 4, generator=g, dtype=F64), torch.rand(3, 4, generator=g, dtype=F64) + 0.1
    weights = torch.randn(2, 3, 7, 4, generator=g, dtype=F64)

    def grads():
        leaves = [t.clone().requires_grad_() for t in (q, k, v, Z, kv)]
        (ntk_attention(*leaves, **args) * weights).sum().backward()
        return [t.grad for t in leaves]

    fused = grads()
    assert all(torch.isfinite(t).all() for t in fused)
    assert torch.autograd.gradcheck(lambda *t: ntk_attention(*t, **args), [t.clone().requires_grad_() for t in (q, k, v, Z, kv)])
    monkeypatch.setattr(core, "FUSED_BACKWARD", False)
    for block in (1, 9, 20, 1 << 20):  # one row, one row of 9 keys, two rows per block, all at once
        monkeypatch.setattr(core, "BACKWARD_BLOCK", block)
        for a, b in zip(grads(), fused):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("zero_rows", [False, True])
def test_fused_cpu_backward_carries_the_lse_gradient_in_both_forms(monkeypatch, zero_rows):
    """The CPU flash backward gets the lse's gradient through a shifted O (every row with dO ≠ 0), or through
    an appended column where some row has g_lse ≠ 0 but dO = 0 (zero_rows): both equal the recomputation."""
    import ntkcli.attention.core as core

    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=F64) for n in (6, 8, 8))
    w_mean, w_lse = torch.randn(2, 3, 6, 4, generator=g, dtype=F64), torch.randn(2, 3, 6, generator=g, dtype=F64)
    if zero_rows:
        w_mean[0, 1, 2] = 0.0

    def grads():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        mean, lse = attention_lse(*leaves, is_causal=True)
        ((mean * w_mean).sum() + (lse * w_lse).sum()).backward()
        return [t.grad for t in leaves]

    fused = grads()
    monkeypatch.setattr(core, "FUSED_BACKWARD", False)
    for a, b in zip(grads(), fused):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["elu", "taylor2", "favor", "identity"])
def test_feature_maps_fold_the_input_scale(name):
    """φ(x, r) is φ(r·x): each map folds r into its first operation (elu into ATen's input_scale)."""
    phi = feature_map(name, 5, num_features=16, seed=1)
    x = torch.randn(4, 7, 5, dtype=F64)
    for r in (0.3, 1.0, 2.5):
        (f1, c1), (f2, c2) = phi(x, r), phi(x * r)
        assert torch.allclose(f1 * torch.exp(c1).unsqueeze(-1), f2 * torch.exp(c2).unsqueeze(-1), rtol=1e-13, atol=1e-13)


def _like(device: str, dtype, *shape):
    """Something with a tensor's device, dtype and shape: what `kernel` reads (CUDA cases on a CPU machine)."""
    from types import SimpleNamespace
    return SimpleNamespace(device=SimpleNamespace(type=device), dtype=dtype, shape=shape)


@pytest.mark.parametrize("device, dtype, dims, masked, expected", [
    ("cpu", F64, (64, 64, 64), True, "cpu-flash"),
    ("cpu", torch.float32, (64, 64, 32), False, "math"),
    ("cuda", torch.bfloat16, (64, 64, 64), False, "cuda-flash"),
    ("cuda", torch.float16, (64, 64, 64), True, "cuda-efficient"),
    ("cuda", torch.float32, (64, 64, 64), False, "cuda-efficient"),
    ("cuda", torch.float16, (320, 320, 320), False, "cuda-efficient"),
    ("cuda", F64, (64, 64, 64), False, "math"),
    ("cuda", torch.float32, (60, 60, 60), False, "math"),
    ("mps", torch.float32, (64, 64, 64), False, "math"),
])
def test_kernel_dispatch_picks_a_fused_kernel_where_one_applies(device, dtype, dims, masked, expected):
    from ntkcli.attention.core import kernel
    q, k, v = (_like(device, dtype, 2, 4, 16, d) for d in dims)
    mask = _like(device, dtype, 2, 1, 16, 16) if masked else None
    assert kernel(q, k, v, mask) == expected


BRANCHES = [(name, kind) for name in ("math", "cpu-flash", "cuda-flash", "cuda-efficient")
            for kind in ("full", "causal", "padding", "padding+causal", "no key")
            if name != "cuda-flash" or kind in ("full", "causal")]  # the dispatch sends flash no mask


@pytest.mark.parametrize("name, kind", BRANCHES)
def test_every_kernel_branch_gives_the_float64_reference(monkeypatch, name, kind):
    """Each branch of the dispatch runs here: the CUDA kernels replaced by CPU stand-ins with their calling
    convention (the efficient kernel's lse padded to 32 rows and finite on fully masked rows), so the code
    around them (argument order, lse slicing, masked rows, the mask's padded stride) is what is checked."""
    from ntkcli.attention import core

    def cuda_flash(q, k, v, dropout, is_causal, debug, scale):
        assert dropout == 0.0 and not debug
        return (*core._math(q, k, v, None, scale, is_causal), None, None, 0, 0, None, None, None)

    def cuda_efficient(q, k, v, bias, with_lse, dropout, is_causal, scale):
        assert with_lse and dropout == 0.0 and (bias is None or bias.stride(-2) % 16 == 0)
        out, lse = core._math(q, k, v, bias, scale, is_causal)
        lse = torch.nn.functional.pad(lse.masked_fill(lse == -math.inf, 0.0), (0, -lse.shape[-1] % 32))
        return out, lse, None, None

    monkeypatch.setattr(core, "kernel", lambda *a: name)
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention", cuda_flash, raising=False)
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", cuda_efficient, raising=False)
    q, k, v = qkv(L=9)
    if kind == "no key":  # the second sequence has every key masked
        keep = (torch.arange(9) < torch.tensor([9, 0])[:, None])[:, None, None, :].expand(2, 1, 9, 9)
        mask, is_causal = keep, False
    else:
        mask, is_causal, keep = masks(q.shape[0], q.shape[2])[kind]
    mean, lse = attention_lse(q, k, v, attn_mask=mask, is_causal=is_causal)
    scale = q.shape[-1] ** -0.5
    assert torch.allclose(mean, naive_attention(q, k, v, scale, keep).nan_to_num(0.0), atol=1e-12)
    s = (q @ k.transpose(-1, -2)) * scale
    ref = torch.logsumexp(s if keep is None else s.masked_fill(~keep, -math.inf), -1)
    assert torch.allclose(lse, ref, atol=1e-12)
