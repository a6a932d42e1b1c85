"""The operator on the device named by NTK_TEST_DEVICE (default cpu; `make gpu-check` sets cuda), against
float64 references computed on the CPU: the kernel the dispatch picks, forward and backward, in float32
and half precision."""

import math
import os

import pytest
import torch

from ntkcli.attention import attention_lse, ntk_attention
from ntkcli.attention.core import kernel

DEVICE = torch.device(os.environ.get("NTK_TEST_DEVICE", "cpu"))
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _inputs(dtype, L=96, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 4, L, d, generator=g, dtype=torch.float64) for _ in range(3))
    Z, kvec = torch.randn(4, d, d, generator=g, dtype=torch.float64) * 0.05, torch.rand(4, d, generator=g, dtype=torch.float64)
    keep = (torch.arange(L) < torch.tensor([L, L // 2])[:, None])[:, None, None, :]
    return (q, k, v, Z, kvec, keep), [t.to(DEVICE, dtype) for t in (q, k, v)] + [Z.to(DEVICE), kvec.to(DEVICE)] + \
        [keep.to(DEVICE)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_lse_on_the_device_matches_float64(dtype, masked):
    (q, k, v, _, _, keep), (dq, dk, dv, _, _, dkeep) = _inputs(dtype)
    mean, lse = attention_lse(dq, dk, dv, attn_mask=dkeep if masked else None)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, -math.inf) if masked else s
    ref_lse = torch.logsumexp(s, -1)
    ref = torch.softmax(s, -1) @ v
    assert lse.dtype == torch.float32 and mean.dtype == dtype
    assert (mean.double().cpu() - ref).abs().max() < TOLERANCE[dtype]
    assert (lse.double().cpu() - ref_lse).abs().max() < TOLERANCE[dtype] * 10
    assert kernel(dq, dk, dv, None) != "math"  # a fused kernel for these shapes, on the CPU and on CUDA


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ntk_attention_gradients_on_the_device_match_float64(dtype):
    (q, k, v, Z, kvec, keep), device_inputs = _inputs(dtype, L=48)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v, Z, kvec)]
    ntk_attention(*ref_in, attn_mask=keep, is_causal=True).pow(2).sum().backward()
    dev_in = [t.detach().clone().requires_grad_() for t in device_inputs[:5]]
    ntk_attention(*dev_in, attn_mask=device_inputs[5], is_causal=True).float().pow(2).sum().backward()
    for ours, ref in zip(dev_in, ref_in):
        scale = ref.grad.abs().max()
        assert (ours.grad.double().cpu() - ref.grad).abs().max() <= TOLERANCE[dtype] * 20 * scale
