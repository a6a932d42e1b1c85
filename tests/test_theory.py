"""Closed-form kernels of both papers against autodiff (float64), and the dynamics they predict."""

import numpy as np
import pytest
import torch

from ntkcli.experiments import convergence
from ntkcli.experiments.convergence import ConvergenceRecipe
from ntkcli.theory import one_token, transformer
from ntkcli.theory.ntk import empirical_ntk

F64 = torch.float64


def unit_points(n, d, seed):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return x / x.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("signs", [False, True])
def test_one_token_full_ntk_equals_autodiff_and_def39_does_not(signs):
    W, a = one_token.init(3, 9, signs=signs, seed=0)
    X = unit_points(5, 3, 1)
    auto = empirical_ntk(lambda p, x: one_token.model(p["W"], x, a), {"W": W}, X) / W.shape[1]
    full = one_token.ntk_full(W, X, a)
    assert ((full - auto).norm() / auto.norm()).item() < 1e-8
    # Def 3.9 keeps one of the two gradient paths of Claim F64.12: it is visibly another kernel
    assert ((one_token.ntk_def39(W, X, a) - auto).norm() / auto.norm()).item() > 0.05


@pytest.mark.parametrize("causal", [True, False])
def test_transformer_layer_kernels_equal_autodiff(causal):
    shape = transformer.Shape(d=4, m=12, depth=3, seq_len=3, omega=0.7, epsilon=1.3, causal=causal)
    params, frozen = transformer.init(shape, seed=2)
    X = torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(3), dtype=F64)
    states = transformer.hidden_states(params, frozen, X, shape)
    for nu in range(shape.depth):
        auto = empirical_ntk(lambda p, x: transformer.block_mlp(x, p["U"], p["W"], frozen["A"][nu], shape),
                             {"U": params["U"][nu], "W": params["W"][nu]}, states[nu])
        full = transformer.layer_kernel_full(params, frozen, X, shape, nu)
        assert ((full - auto).norm() / auto.norm()).item() < 1e-8, nu
        # H' = <β, β> is the W-part of the paper's H and is PSD (Assumption 5.1's object)
        H, H_beta = transformer.layer_kernel_paper(params, frozen, X, shape, nu)
        assert torch.linalg.eigvalsh(H_beta)[0] > -1e-10 and H.shape == (9, 9)


def test_lemma41_identity_holds_with_the_exact_layer_kernels():
    shape = transformer.Shape(d=4, m=16, depth=2, seq_len=3, omega=0.5)
    params, frozen = transformer.init(shape, seed=0)
    g = torch.Generator().manual_seed(5)
    X, Y = torch.randn(4, 3, 4, generator=g, dtype=F64), torch.randn(4, 3, 4, generator=g, dtype=F64)
    kernels = [(transformer.layer_kernel_full(params, frozen, X, shape, nu),
                transformer.layer_kernel_paper(params, frozen, X, shape, nu)[0]) for nu in range(shape.depth)]
    exact_err, paper_err = convergence._lemma41(params, frozen, X, Y, shape, kernels)
    assert exact_err < 1e-10
    assert paper_err > 1e-4  # the paper's H ⊗ I_d is an approximation


def test_gradient_descent_with_small_step_decreases_prefix_loss_every_step():
    cfg = ConvergenceRecipe(d=3, n=4, steps=300, lr=0.2, checkpoints=2)
    row, losses, _ = convergence.run_prefix(cfg, 64, seed=0)
    assert np.all(np.diff(losses) < 0)
    assert losses[-1] < 0.5 * losses[0]
    assert row["rate_fit"] > 0


def test_kernel_drift_shrinks_as_the_prefix_grows():
    """Fixed seeds; same data and step rule: 64× more prefix rows gives at least 3× less kernel drift."""
    cfg = ConvergenceRecipe(d=3, n=4, steps=400, lr=1.0, checkpoints=2)
    small, _, drifts = convergence.run_prefix(cfg, 64, seed=0)
    large, _, _ = convergence.run_prefix(cfg, 4096, seed=0)
    assert large["kernel_drift"] < small["kernel_drift"] / 3
    assert large["max_w_move"] < small["max_w_move"]
    assert drifts[0] == 0.0 and drifts[399] == small["kernel_drift"]
