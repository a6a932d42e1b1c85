"""The NTK convergence theory of both papers, in numbers.

prefix       paper 1, Thm 3.10: full-batch gradient descent on the one-token prefix model for each m;
             loss curve, fitted exponential rate vs the kernel's prediction 2ηλ_min(JJᵀ), λ_min of
             Def 3.9's kernel and of the full one, weight movement and kernel drift.
stand-in     paper 1, §4: Z and k of one-token NTK-Attention (initialised by Eq. 4 from the same
             W(0)) trained by gradient descent on the same data, beside the prefix at the largest m.
transformer  paper 2, Lemma 4.1, Thm 5.5, Lemma 5.3: SGD on the N-layer model over depths and widths;
             fitted rate, λ_min(H'_(ν)(0)/ω) (Assumption 5.1), drift of the whole-model NTK, and
             Lemma 4.1's loss derivative with the paper's H_(ν) ⊗ I_d against the exact value.
"""

from __future__ import annotations

import math
from enum import IntEnum

import numpy as np
import pandas as pd
import torch

from ..attention import compress_prefix, feature_map
from ..figures import convergence as figures
from ..recipes import ConvergenceRecipe
from ..runs import Run, resume, seed_for
from ..theory import one_token, transformer
from ..theory.ntk import empirical_ntk

KEYS = ["part", "depth", "m", "seed"]
RESUMABLE = ("parts", "seeds", "log2m", "t_depths", "t_widths")
FILES = ("results.csv", "curves.csv", "summary.csv", "convergence.png")
F64 = torch.float64


class Stream(IntEnum):
    """Named random streams of a point's data (its initialisations are keyed by (seed, m) or (seed, depth, m))."""

    PREFIX_DATA = 1
    TRANSFORMER_DATA = 2


def fit_rate(losses: np.ndarray) -> float:
    """−slope of log(loss) per step, least squares over the last three quarters of the curve."""
    t = np.arange(len(losses))[len(losses) // 4:]
    return float(-np.polyfit(t, np.log(losses[len(losses) // 4:]), 1)[0])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _prefix_data(cfg: ConvergenceRecipe, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed_for(seed, Stream.PREFIX_DATA))
    X = torch.randn(cfg.n, cfg.d, generator=g, dtype=F64)
    return X / X.norm(dim=-1, keepdim=True), torch.randn(cfg.n, cfg.d, generator=g, dtype=F64)


def _gradient_descent(fn, params: dict, X, Y, steps: int, lr: float, on_checkpoint=None, checkpoints: int = 0):
    """Full-batch GD on ½Σ‖fn(params, x_i) − y_i‖², step lr/λ_max(JJᵀ at init).

    Returns (losses, K(0) = JJᵀ at init, the step η, the final params).
    """
    K0 = empirical_ntk(fn, params, X)
    eta = lr / torch.linalg.eigvalsh(K0)[-1].item()
    params = {k: v.clone().requires_grad_() for k, v in params.items()}
    marks = set(np.linspace(0, steps - 1, checkpoints).round().astype(int)) if checkpoints else set()
    losses = []
    for t in range(steps):
        loss = 0.5 * (torch.func.vmap(fn, in_dims=(None, 0))(params, X) - Y).pow(2).sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        losses.append(loss.item())
        if t in marks and on_checkpoint is not None:  # the state whose loss is losses[t]
            on_checkpoint(t, {k: v.detach() for k, v in params.items()})
        with torch.no_grad():
            for p, g in zip(params.values(), grads):
                p -= eta * g
    return np.array(losses), K0, eta, {k: v.detach() for k, v in params.items()}


def run_prefix(cfg: ConvergenceRecipe, m: int, seed: int) -> tuple[dict, np.ndarray, dict]:
    X, Y = _prefix_data(cfg, seed)
    W0, a = one_token.init(cfg.d, m, signs=cfg.signs, seed=seed_for(seed, m))
    H0 = one_token.ntk_full(W0, X, a)
    H39 = one_token.ntk_def39(W0, X, a)
    drifts = {}

    def fn(p, x):
        return one_token.model(p["W"], x, a)

    def record(t, p):
        drifts[t] = _rel(one_token.ntk_full(p["W"], X, a), H0)

    losses, K0, eta, final = _gradient_descent(fn, {"W": W0}, X, Y, cfg.steps, cfg.lr, record, cfg.checkpoints)
    lam_k = torch.linalg.eigvalsh(K0)
    row = {"loss_0": losses[0], "loss_final": losses[-1], "rate_fit": fit_rate(losses),
           "rate_theory": 2 * eta * lam_k[0].item(), "eta": eta,
           "lambda_min_full": torch.linalg.eigvalsh(H0)[0].item(), "lambda_min_def39": torch.linalg.eigvalsh(H39)[0].item(),
           "def39_vs_full": _rel(H39, H0), "max_w_move": (final["W"] - W0).norm(dim=0).max().item(),
           "kernel_drift": drifts[cfg.steps - 1], "kernel_drift_max": max(drifts.values())}
    return row, losses, drifts


def run_stand_in(cfg: ConvergenceRecipe, m: int, seed: int) -> tuple[dict, np.ndarray, dict]:
    """NTK-Attention with one token: F̂(x) = m·φ(x)Z / φ(x)k, (Z, k) from Eq. 4 on the prefix W(0)."""
    X, Y = _prefix_data(cfg, seed)
    W0, a = one_token.init(cfg.d, m, signs=cfg.signs, seed=seed_for(seed, m))
    phi = feature_map(cfg.stand_in_features, cfg.d, num_features=64, seed=seed)
    Z, kvec, _ = compress_prefix(W0.T, a.unsqueeze(-1) * W0.T, phi, scale=1.0)[0]

    def fn(p, x):
        f, _ = phi(x)  # exp(c) cancels in the ratio
        return m * (f @ p["Z"]) / (f @ p["k"])

    start_gap = _rel(torch.func.vmap(fn, in_dims=(None, 0))({"Z": Z, "k": kvec}, X), one_token.model(W0, X, a))
    losses, K0, eta, _ = _gradient_descent(fn, {"Z": Z, "k": kvec}, X, Y, cfg.steps, cfg.lr)
    return {"loss_0": losses[0], "loss_final": losses[-1], "rate_fit": fit_rate(losses), "eta": eta,
            "rate_theory": 2 * eta * torch.linalg.eigvalsh(K0)[0].item(), "init_vs_prefix": start_gap}, losses, {}


def _lemma41(params, frozen, X, Y, shape, kernels) -> tuple[float, float]:
    """dL/dt under gradient flow, −‖∇θ L‖², against Lemma 4.1's −Σ_ν gᵀ(H ⊗ I)g with the exact and the paper's H.

    kernels[ν] = (exact K_ν, paper H_ν) at these params.
    """
    params = {k: v.clone().requires_grad_() for k, v in params.items()}
    lam, mus = X + frozen["E"], []
    for nu in range(shape.depth):
        mus.append(transformer.block_mlp(lam, params["U"][nu], params["W"][nu], frozen["A"][nu], shape))
        lam = mus[-1] + lam
    loss = (shape.epsilon * lam - Y).pow(2).sum() / X.shape[0]
    g_mu = torch.autograd.grad(loss, mus, retain_graph=True)
    truth = sum(g.pow(2).sum() for g in torch.autograd.grad(loss, list(params.values())))
    exact = paper = 0.0
    for g, (K, H) in zip(g_mu, kernels):
        flat = g.reshape(-1)
        exact += flat @ K @ flat
        paper += (g.reshape(-1, shape.d) * (H @ g.reshape(-1, shape.d))).sum()
    return abs(exact / truth - 1).item(), abs(paper / truth - 1).item()


def run_transformer(cfg: ConvergenceRecipe, depth: int, m: int, seed: int) -> tuple[dict, np.ndarray, dict]:
    shape = transformer.Shape(d=cfg.t_d, m=m, depth=depth, seq_len=cfg.t_seq_len, epsilon=cfg.t_epsilon,
                              omega=cfg.t_omega, kappa=cfg.t_kappa, causal=cfg.t_causal)
    params, frozen = transformer.init(shape, seed_for(seed, depth, m))
    g = torch.Generator().manual_seed(seed_for(seed, Stream.TRANSFORMER_DATA))
    X = torch.randn(cfg.t_n, cfg.t_seq_len, cfg.t_d, generator=g, dtype=F64)
    X = X / X.norm(dim=-1, keepdim=True)  # token rows of norm 1 (RMS-normalised, Θ(1))
    Y = torch.randn(cfg.t_n, cfg.t_seq_len, cfg.t_d, generator=g, dtype=F64) / math.sqrt(cfg.t_d)
    def fn(p, x):
        return transformer.forward(p, frozen, x, shape)

    K0 = empirical_ntk(fn, params, X)
    full = [transformer.layer_kernel_full(params, frozen, X, shape, nu) for nu in range(depth)]
    paper = [transformer.layer_kernel_paper(params, frozen, X, shape, nu) for nu in range(depth)]  # (H, H')
    lam_h = [torch.linalg.eigvalsh(h_prime)[0].item() / shape.omega for _, h_prime in paper]
    paper_gap = [_rel(torch.kron(H, torch.eye(cfg.t_d, dtype=F64)), K) for K, (H, _) in zip(full, paper)]
    lemma_exact, lemma_paper = _lemma41(params, frozen, X, Y, shape, [(K, H) for K, (H, _) in zip(full, paper)])
    batch = max(1, round(cfg.t_batch_fraction * cfg.t_n))
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    losses = []
    for _ in range(cfg.t_steps):
        with torch.no_grad():
            losses.append((fn(p, X) - Y).pow(2).sum().item() / cfg.t_n)
        idx = torch.randperm(cfg.t_n, generator=g)[:batch]
        loss = (fn(p, X[idx]) - Y[idx]).pow(2).sum() / batch
        grads = torch.autograd.grad(loss, list(p.values()))
        with torch.no_grad():
            for t, gr in zip(p.values(), grads):
                t -= cfg.t_lr * gr
    final = {k: v.detach() for k, v in p.items()}
    losses = np.array(losses)
    return {"loss_0": losses[0], "loss_final": losses[-1], "rate_fit": fit_rate(losses),
            "lambda_min_Hprime": min(lam_h), "ntk_lambda_min": torch.linalg.eigvalsh(K0)[0].item(),
            "kernel_drift": _rel(empirical_ntk(fn, final, X), K0),
            "max_w_move": (final["W"] - params["W"]).norm(dim=1).max().item(),
            "paper_H_vs_full": float(np.mean(paper_gap)), "lemma41_exact_err": lemma_exact,
            "lemma41_paper_err": lemma_paper, "model_size": shape.size,
            "compute": shape.size * cfg.t_steps * batch}, losses, {}


def _curve(part: str, depth: int, m: int, seed: int, losses: np.ndarray, drifts: dict) -> pd.DataFrame:
    """The loss at ~120 log-spaced steps, plus the kernel drift at the checkpoints where it was measured."""
    steps = np.unique(np.concatenate([np.geomspace(1, len(losses), 120).astype(int) - 1, list(drifts)]).astype(int))
    return pd.DataFrame({"part": part, "depth": depth, "m": m, "seed": seed, "step": steps, "loss": losses[steps],
                         "kernel_drift": [drifts.get(t, np.nan) for t in steps]})


def run(cfg: ConvergenceRecipe, run: Run) -> dict[str, pd.DataFrame]:
    """Measure every (part, depth, m, seed) point not yet in results.csv; write CSVs, figures, run.json."""
    ms = [2 ** j for j in cfg.log2m]
    points = []
    for seed in range(cfg.seeds):
        if "prefix" in cfg.parts:
            points += [("prefix", 1, m, seed) for m in ms]
        if "stand-in" in cfg.parts:
            points.append(("stand-in", 1, max(ms), seed))
        if "transformer" in cfg.parts:
            points += [("transformer", n, m, seed) for n in cfg.t_depths for m in cfg.t_widths]
    previous, old_curves = run.load_csv("results.csv"), run.load_csv("curves.csv")
    done = resume(previous, KEYS)
    rows = [] if previous is None else previous.to_dict("records")
    curves = [] if old_curves is None else [old_curves]
    todo = [p for p in points if p not in done]
    with run.task("convergence", len(todo)) as advance:
        for part, depth, m, seed in todo:
            base = seed_for(cfg.seed, seed)
            if part == "prefix":
                row, losses, drifts = run_prefix(cfg, m, base)
            elif part == "stand-in":
                row, losses, drifts = run_stand_in(cfg, m, base)
            else:
                row, losses, drifts = run_transformer(cfg, depth, m, base)
            rows.append({"part": part, "depth": depth, "m": m, "seed": seed, **row})
            curves.append(_curve(part, depth, m, seed, losses, drifts))
            run.save_csv("curves.csv", pd.concat(curves, ignore_index=True))
            run.save_csv("results.csv", pd.DataFrame(rows))
            advance(1)
    wanted = set(points)  # what this recipe asks for: a shrunk grid, or the stand-in's old m, drops out
    results = pd.DataFrame(rows)
    results = results[[tuple(r) in wanted for r in results[KEYS].itertuples(index=False, name=None)]]
    curves_df = pd.concat(curves, ignore_index=True)
    curves_df = curves_df[[tuple(r) in wanted for r in curves_df[KEYS].itertuples(index=False, name=None)]]
    run.save_csv("results.csv", results)
    run.save_csv("curves.csv", curves_df)
    fits = summarize(results)
    run.save_csv("summary.csv", fits)
    run.save_figure("convergence.png", figures.figure(results, curves_df, fits))
    run.finish(points=len(results), skipped_points=len(points) - len(todo))
    return {"prefix": _table(results, ["prefix", "stand-in"], ["m"], PREFIX_COLS),
            "transformer": _table(results, ["transformer"], ["depth", "m"], TRANSFORMER_COLS), "fits": fits}


PREFIX_COLS = ["rate_fit", "rate_theory", "lambda_min_full", "lambda_min_def39", "def39_vs_full",
               "max_w_move", "kernel_drift", "loss_final"]
TRANSFORMER_COLS = ["rate_fit", "lambda_min_Hprime", "kernel_drift", "paper_H_vs_full",
                    "lemma41_exact_err", "lemma41_paper_err", "loss_final"]


def _table(results: pd.DataFrame, parts: list[str], by: list[str], cols: list[str]) -> pd.DataFrame:
    """Means over seeds of the given columns, per part and grid point."""
    sub = results[results.part.isin(parts)].reindex(columns=["part", *by, *cols])
    return sub.groupby(["part", *by], as_index=False)[cols].mean()


def _slope(x, y) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Log-log slopes: kernel drift and weight movement vs m (lazy training), rate vs depth N and width m."""
    rows = []
    pre = results[results.part == "prefix"].groupby("m").mean(numeric_only=True).reset_index()
    if len(pre) > 1:
        rows += [{"part": "prefix", "fit": "kernel_drift ~ m^slope", "slope": _slope(pre.m, pre.kernel_drift)},
                 {"part": "prefix", "fit": "max_w_move ~ m^slope", "slope": _slope(pre.m, pre.max_w_move)}]
    tr = results[results.part == "transformer"].groupby(["depth", "m"]).mean(numeric_only=True).reset_index()
    for depth, grp in tr.groupby("depth"):
        if len(grp) > 1:
            rows.append({"part": "transformer", "fit": f"kernel_drift ~ m^slope (N={depth})",
                         "slope": _slope(grp.m, grp.kernel_drift)})
    for m, grp in tr.groupby("m"):
        if len(grp) > 1:
            rows.append({"part": "transformer", "fit": f"rate ~ N^slope (m={m})", "slope": _slope(grp.depth, grp.rate_fit)})
    return pd.DataFrame(rows, columns=["part", "fit", "slope"])
