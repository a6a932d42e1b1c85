"""The NTK convergence theory of both papers, in numbers.

prefix       paper 1, Thm 3.10: full-batch gradient descent on the one-token prefix model for each m;
             loss curve, fitted exponential rate vs the kernel's prediction 2ηλ_min(JJᵀ), λ_min of
             Def 3.9's kernel and of the full one, weight movement and kernel drift.
stand-in     paper 1, §4: Z and k of one-token NTK-Attention (initialised by Eq. 4 from the same
             W(0)) trained by gradient descent on the same data, beside the prefix at the largest m.
transformer  paper 2, Lemma 4.1, Thm 5.5, Lemma 5.3: the N-layer model over depths and widths in the kernel
             regime (full-batch gradient descent at step 1/λ_max(K₀)); late rate against the kernel's
             −2 log(1 − λ_min/λ_max), λ_min(H'_(ν)(0)/ω) (Assumption 5.1), drift of the whole-model NTK, and
             Lemma 4.1's loss derivative with the paper's H_(ν) ⊗ I_d against the exact value.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field

from .. import rules
from ..attention import compress_prefix, feature_map
from ..claims import OUTSIDE, Claim, Section, fmt
from ..errors import UserError
from ..figures import convergence as figures
from ..recipes import Depth, Log2m, Recipe, TransformerSpec, Width
from ..runs import Results, Run, seed_for
from ..theory import one_token, transformer
from ..theory.ntk import empirical_ntk

COMMAND, TITLE = "convergence", "NTK convergence (paper 1 Thm 3.10; paper 2 Thm 5.5)"
KEYS = ["part", "depth", "m", "seed"]
RESUMABLE = ("parts", "seeds", "log2m", "t_depths", "t_widths")
FILES = ("results.csv", "curves.csv", "summary.csv", "convergence.png", "claims.csv")
SCALE = ("log2m", "t_depths", "t_widths", "seeds")  # the fields that set a run's scale, shown beside its claims
DEVICES = ("cpu",)  # float64 theory checks
POINTS = False  # seconds per point: not worth a worker
# the two papers' claims and the rules our measurements are judged by
THM_310 = Claim("Thm 3.10: prefix learning converges linearly to any accuracy for large m, its NTK barely moving",
                "loss → 0 at rate ~2ηλ_min; kernel drift ~ m^(−1/2)")
THM_55 = Claim("Thm 5.5: training the N-layer transformer in the kernel regime converges exponentially, "
               "L(T) ≤ exp(−α ε² T)·L(0)", "L(T)/L(0) < 1e-3 with no floor, late rate within 2× of the kernel's")
CONVERGED = 1e-12  # the transformer part stops once L(T)/L(0) is below this
SINGULAR = 1e-10  # λ_min(K₀)/λ_max(K₀) at or below this (or M < nLd): K₀ is singular, the point is excluded
HELP = ("NTK convergence of both papers: prefix learning (Thm 3.10) and the N-layer transformer (Thm 5.5).\n\n"
        "Trains paper 1's one-token prefix model by gradient descent for m = 2^4 … 2^14, the NTK-Attention stand-in "
        "(Z, k) beside it, and paper 2's transformer in the kernel regime (gradient descent at step 1/λ_max of its NTK) "
        "over depths and widths; closed-form kernels are checked "
        "against autodiff. Writes results.csv, curves.csv, summary.csv (log-log fits), convergence.png, claims.csv and "
        "run.json to outputs/convergence/<recipe>/; re-running resumes. Runs in float64 on the CPU.")
NEEDS_RECIPE = False
FLAGS = {"parts": ("--parts", list, "Comma-separated: prefix, transformer, stand-in.")}
F64 = torch.float64


class ConvergenceRecipe(Recipe):
    """Thm 3.10 (paper 1) and Lemma 4.1 / Thm 5.5 / Lemma 5.3 (paper 2), checked in numbers."""

    parts: list[Literal["prefix", "transformer", "stand-in"]] = Field(["prefix", "transformer", "stand-in"], min_length=1)
    seeds: int = Field(1, ge=1, le=1000, description="independent initialisations per point")
    # prefix part: paper 1's one-token model, full-batch gradient descent
    n: int = Field(8, ge=1, le=4096, description="training points x_i with ‖x_i‖ = 1")
    d: int = Field(4, ge=1, le=256, description="dimension of x, of w_r and of the output")
    log2m: list[Log2m] = Field([4, 6, 8, 10, 12, 14], min_length=1, description="prefix lengths m = 2^j")
    signs: bool = Field(True, description="random ±1 signs a_r (Def C.2); false: a_r = 1 (Def 3.4)")
    steps: int = Field(8000, ge=2, le=10_000_000, description="gradient-descent steps of the prefix and stand-in parts")
    lr: float = Field(1.0, gt=0, description="step η = lr / λ_max(J Jᵀ at init), below the stability limit 2")
    checkpoints: int = Field(8, ge=2, le=10_000, description="times at which the kernel drift is measured")
    stand_in_features: Literal["taylor2", "favor"] = Field("taylor2", description="φ of the NTK-Attention stand-in")
    # transformer part: paper 2's model, full-batch gradient descent in the kernel regime
    t_depths: list[Depth] = Field([1, 2, 4, 8], min_length=1, description="depths N")
    t_widths: list[Width] = Field([32, 128, 512, 2048], min_length=1, description="MLP widths m")
    t_n: int = Field(16, ge=1, le=4096, description="training sequences")
    t_steps: int = Field(4000, ge=2, le=10_000_000, description="full-batch gradient-descent steps (kernel regime)")
    t_target_scale: float = Field(0.03, gt=0, description="targets Y = F(X; θ₀) + s·G/√d: how far the function must "
                                  "move (small s: the kernel regime, Chizat & Bach's lazy scale; large s: far targets)")
    t_lr: float = Field(1.0, gt=0, lt=2, description="step η = t_lr·n/(2λ_max(K₀)): the fastest kernel mode "
                        "shrinks by 1 − t_lr per step (stable below 2)")
    transformer: TransformerSpec = Field(TransformerSpec(), description="paper 2's model (d, L, ε, ω, κ, causal)")

    def peak_bytes(self) -> int:
        """Prefix part: the Jacobian (n·d × d·m) and the m-long prefix; transformer part: its layer kernels
        ((t_n·L·d)² per layer) and the Jacobian over every parameter."""
        m = 2 ** max(self.log2m) if "prefix" in self.parts or "stand-in" in self.parts else 0
        outputs = self.t_n * self.transformer.seq_len * self.transformer.d
        params = max(self.t_depths) * (max(self.t_widths) * self.transformer.d + self.transformer.d ** 2)
        transformer = 8 * 4 * (outputs * params + max(self.t_depths) * outputs ** 2)
        return 8 * 4 * self.n * self.d * self.d * m + (transformer if "transformer" in self.parts else 0)


RECIPE = ConvergenceRecipe


class Stream(IntEnum):
    """Named random streams of a point's data (its initialisations are keyed by (seed, m) or (seed, depth, m))."""

    PREFIX_DATA = 1
    TRANSFORMER_DATA = 2


def fit_rate(losses: np.ndarray, start: float = 0.25) -> float:
    """−slope of log(loss) per step, least squares over the curve from `start` (a share of its steps) on."""
    t = np.arange(len(losses))[int(len(losses) * start):]
    return float(-np.polyfit(t, np.log(losses[t]), 1)[0]) if len(t) >= 2 else float("nan")


def late_rate(losses: np.ndarray) -> float:
    """The rate over the last quarter of the steps run: where Thm 5.5's exp(−αT) is judged."""
    return fit_rate(losses, 0.75)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _prefix_data(cfg: ConvergenceRecipe, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed_for(seed, Stream.PREFIX_DATA))
    X = torch.randn(cfg.n, cfg.d, generator=g, dtype=F64)
    return X / X.norm(dim=-1, keepdim=True), torch.randn(cfg.n, cfg.d, generator=g, dtype=F64)


class Diverged(Exception):
    """A loss became NaN or infinite: the step at which it did, and the value."""

    def __init__(self, step: int, loss: float):
        super().__init__(f"diverged at step {step} (loss {loss})")
        self.step, self.loss = step, loss


def _finite(loss: float, step: int) -> float:
    if not math.isfinite(loss):
        raise Diverged(step, loss)
    return loss


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
        losses.append(_finite(loss.item(), t))
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
    shape, model = cfg.transformer.shape(m, depth), cfg.transformer
    params, frozen = transformer.init(shape, seed_for(seed, depth, m))
    g = torch.Generator().manual_seed(seed_for(seed, Stream.TRANSFORMER_DATA))
    X = torch.randn(cfg.t_n, model.seq_len, model.d, generator=g, dtype=F64)
    X = X / X.norm(dim=-1, keepdim=True)  # token rows of norm 1 (RMS-normalised, Θ(1))
    noise = torch.randn(cfg.t_n, model.seq_len, model.d, generator=g, dtype=F64) / math.sqrt(model.d)

    def fn(p, x):
        return transformer.forward(p, frozen, x, shape)

    with torch.no_grad():  # targets at distance t_target_scale from the initial function: the lazy scale
        Y = fn(params, X) + cfg.t_target_scale * noise

    K0 = empirical_ntk(fn, params, X)
    full = [transformer.layer_kernel_full(params, frozen, X, shape, nu) for nu in range(depth)]
    paper = [transformer.layer_kernel_paper(params, frozen, X, shape, nu) for nu in range(depth)]  # (H, H')
    lam_h = [torch.linalg.eigvalsh(h_prime)[0].item() / shape.omega for _, h_prime in paper]
    paper_gap = [_rel(torch.kron(H, torch.eye(model.d, dtype=F64)), K) for K, (H, _) in zip(full, paper)]
    lemma_exact, lemma_paper = _lemma41(params, frozen, X, Y, shape, [(K, H) for K, (H, _) in zip(full, paper)])
    # full-batch gradient descent on L = (1/n)Σ‖F − Y‖² (the kernel regime of Thm 5.5): the residual moves by
    # −η(2/n)K r, so η = t_lr·n/(2λ_max) sets the fastest mode's factor to 1 − t_lr and the slowest's to
    # 1 − t_lr·λ_min/λ_max: the loss's predicted late rate is −2 log(1 − t_lr·λ_min/λ_max) per step
    eig = torch.linalg.eigvalsh(K0)
    lam_min, lam_max = eig[0].item(), eig[-1].item()
    eta = cfg.t_lr * cfg.t_n / (2 * lam_max)
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    losses = []
    for t in range(cfg.t_steps):
        loss = (fn(p, X) - Y).pow(2).sum() / cfg.t_n
        losses.append(_finite(loss.item(), t))
        if losses[-1] < CONVERGED * losses[0]:  # at float64's floor a rate means nothing: stop there
            break
        grads = torch.autograd.grad(loss, list(p.values()))
        with torch.no_grad():
            for t, gr in zip(p.values(), grads):
                t -= eta * gr
    final = {k: v.detach() for k, v in p.items()}
    losses = np.array(losses)
    singular = shape.size < K0.shape[0] or lam_min <= SINGULAR * lam_max
    return {"loss_0": losses[0], "loss_final": losses[-1], "rate_fit": fit_rate(losses),
            "rate_late": late_rate(losses), "rate_kernel": -2 * math.log1p(-cfg.t_lr * max(lam_min, 0.0) / lam_max),
            "eta": eta, "steps_run": len(losses), "t_steps": cfg.t_steps, "singular": bool(singular),
            "lambda_min_Hprime": min(lam_h), "ntk_lambda_min": lam_min, "ntk_lambda_max": lam_max,
            "kernel_drift": _rel(empirical_ntk(fn, final, X), K0),
            "max_w_move": (final["W"] - params["W"]).norm(dim=1).max().item(),
            "paper_H_vs_full": float(np.mean(paper_gap)), "lemma41_exact_err": lemma_exact,
            "lemma41_paper_err": lemma_paper, "model_size": shape.size,
            "compute": shape.size * len(losses) * cfg.t_n}, losses, {}


def _curve(part: str, depth: int, m: int, seed: int, losses: np.ndarray, drifts: dict) -> pd.DataFrame:
    """The loss at ~120 log-spaced steps, plus the kernel drift at the checkpoints where it was measured."""
    steps = np.unique(np.concatenate([np.geomspace(1, len(losses), 120).astype(int) - 1, list(drifts)]).astype(int))
    return pd.DataFrame({"part": part, "depth": depth, "m": m, "seed": seed, "step": steps, "loss": losses[steps],
                         "kernel_drift": [drifts.get(t, np.nan) for t in steps]})


def points(cfg: ConvergenceRecipe) -> list[tuple[str, int, int, int]]:
    """Every (part, depth, m, seed) point of the recipe, in the order they are measured."""
    ms, out = [2 ** j for j in cfg.log2m], []
    for seed in range(cfg.seeds):
        if "prefix" in cfg.parts:
            out += [("prefix", 1, m, seed) for m in ms]
        if "stand-in" in cfg.parts:
            out.append(("stand-in", 1, max(ms), seed))
        if "transformer" in cfg.parts:
            out += [("transformer", n, m, seed) for n in cfg.t_depths for m in cfg.t_widths]
    return out


def plan(cfg: ConvergenceRecipe) -> list[tuple[str, str]]:
    """What a run trains (the same `points` that `run` walks through), per part."""
    count = {part: sum(p[0] == part for p in points(cfg)) for part in ("prefix", "stand-in", "transformer")}
    return [("prefix runs (m values × seeds)", str(count["prefix"])), ("stand-in runs", str(count["stand-in"])),
            ("transformer runs (depths × widths × seeds)", str(count["transformer"]))]


def _measure(cfg: ConvergenceRecipe, part: str, depth: int, m: int, seed: int) -> tuple[dict, pd.DataFrame]:
    """One point: its results row and its loss curve. A loss that becomes NaN or infinite stops the run with one
    line naming the point, the step and the field to lower; the points measured before it stay in results.csv."""
    base = seed_for(cfg.seed, seed)
    try:
        if part == "prefix":
            row, losses, drifts = run_prefix(cfg, m, base)
        elif part == "stand-in":
            row, losses, drifts = run_stand_in(cfg, m, base)
        else:
            row, losses, drifts = run_transformer(cfg, depth, m, base)
    except Diverged as err:
        field = "t_lr" if part == "transformer" else "lr"
        raise UserError(f"{part} (depth {depth}, m {m}, seed {seed}) {err}: {field} = {getattr(cfg, field)} is too "
                        f"large; nothing recorded for this point") from None
    return {"part": part, "depth": depth, "m": m, "seed": seed, **row}, _curve(part, depth, m, seed, losses, drifts)


def prepare(cfg: ConvergenceRecipe) -> None:
    """Nothing to load: the recipe holds every input."""


def run(cfg: ConvergenceRecipe, folder: Run, prepared: None = None) -> dict[str, pd.DataFrame]:
    """Measure every point not yet in results.csv; write CSVs, figures, run.json."""
    wanted = points(cfg)  # what this recipe asks for: a shrunk grid, or the stand-in's old m, drops out
    results = Results(folder, KEYS)
    curves = Results(folder, KEYS, "curves.csv", done=results.done)
    todo = results.todo(wanted)
    with folder.task("convergence", len(todo)) as advance:
        for point in todo:
            row, curve = _measure(cfg, *point)
            results.add([row])
            curves.add(curve)
            advance(1)
    table, curves_df = results.table(wanted), curves.table(wanted)
    folder.save_csv("results.csv", table)
    folder.save_csv("curves.csv", curves_df)
    fits = summarize(table)
    folder.save_csv("summary.csv", fits)
    folder.save_figure("convergence.png", figures.figure(table, curves_df, fits))
    folder.finish(points=len(table), skipped_points=len(wanted) - len(todo))
    return {"prefix": _table(table, ["prefix", "stand-in"], ["m"], PREFIX_COLS),
            "transformer": _table(table, ["transformer"], ["depth", "m"], TRANSFORMER_COLS), "fits": fits}


def tables(cfg: ConvergenceRecipe, result: dict[str, pd.DataFrame]) -> list[tuple[str, pd.DataFrame]]:
    return [("paper 1: one-token prefix (rates per step; λ of H = JJᵀ/m)", result["prefix"]),
            ("paper 2: N-layer transformer, gradient descent in the kernel regime", result["transformer"]), ("log-log fits", result["fits"])]


PREFIX_COLS = ["rate_fit", "rate_theory", "lambda_min_full", "lambda_min_def39", "def39_vs_full",
               "max_w_move", "kernel_drift", "loss_final"]
TRANSFORMER_COLS = ["rate_late", "rate_kernel", "lambda_min_Hprime", "kernel_drift", "paper_H_vs_full",
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


def _thm310(run: Run, res: pd.DataFrame) -> Claim | None:
    """Thm 3.10 from the prefix part of one run: the loss drop at the largest m, the rate window at the two largest
    m, and the kernel drift's slope against m (one slope per seed, a t interval over the seeds)."""
    pre = res[res.part == "prefix"]
    means = pre.groupby("m").mean(numeric_only=True).reset_index()
    if len(means) < 2:
        return None
    top = means.iloc[-1]
    ratios = (means.rate_fit / means.rate_theory).iloc[-2:].to_numpy()
    slopes = [_slope(g.m, g.kernel_drift) for _, g in pre.groupby("seed") if g.m.nunique() > 1]
    slope, lower, upper = rules.mean_interval(slopes)
    verdict_ = rules.prefix_convergence(top.loss_final / top.loss_0, ratios, lower, upper)
    spread = [rules.mean_interval(g.rate_fit / g.rate_theory)[1:] for _, g in pre.groupby("m")][-2:]
    return Claim(THM_310.claim, THM_310.paper,
                 f"m = {top.m:,.0f}: loss {fmt(top.loss_0)} → {fmt(top.loss_final)}; fitted rate "
                 f"{' and '.join(f'{r:.2f} [{fmt(lo)}, {fmt(hi)}]' for r, (lo, hi) in zip(ratios, spread))}× the "
                 f"kernel's prediction at the two largest m (per-seed t intervals); kernel "
                 f"drift ~ m^{slope:.2f} [{fmt(lower)}, {fmt(upper)}] over {len(slopes)} seeds", run.source, verdict_)


def _thm55(run: Run, res: pd.DataFrame) -> Claim | None:
    """Thm 5.5 in the kernel regime: rules.kernel_convergence on each (depth, width) point with a non-singular K₀
    (seed means), every singular point listed as excluded."""
    tr = res[res.part == "transformer"]
    if tr.empty or "rate_kernel" not in tr:
        return None
    config = run.config() or {}
    outputs = config.get("t_n", 16) * config.get("transformer", {}).get("seq_len", 4) * config.get("transformer", {}).get("d", 8)
    excluded = [(int(d), int(m), int(g.model_size.iloc[0]), (g.ntk_lambda_min / g.ntk_lambda_max).max())
                for (d, m), g in tr[tr.singular.astype(bool)].groupby(["depth", "m"])]
    judged = tr[~tr.singular.astype(bool)].groupby(["depth", "m"]).mean(numeric_only=True).reset_index()
    verdicts = [rules.kernel_convergence(r.loss_final / r.loss_0, r.rate_late, r.rate_kernel, int(r.t_steps),
                                        r.kernel_drift)
                for r in judged.itertuples()]
    short = [f"(N={int(r.depth)}, m={int(r.m)})" for r, v in zip(judged.itertuples(), verdicts) if v.startswith(OUTSIDE)
             and "T·rate" in v]
    drops = judged.loss_final / judged.loss_0
    ratios = judged.rate_late / judged.rate_kernel
    measured = (f"{len(judged)} points with K₀ non-singular: L(T)/L(0) {fmt(drops.min())}–{fmt(drops.max())}, late "
                f"rate {fmt(ratios.min())}–{fmt(ratios.max())}× the kernel's; T too short for the kernel's rate at "
                f"{', '.join(short) or 'none'}; kernel drift {fmt(judged.kernel_drift.min())}–{fmt(judged.kernel_drift.max())}; "
                f"excluded (K₀ singular): " + (", ".join(
                    f"(N={d}, m={m}: " + (f"M = {size} < nLd = {outputs}" if size < outputs else
                                          f"M = {size} ≥ nLd = {outputs}, λ_min/λ_max ≤ {fmt(ratio)}") + ")"
                    for d, m, size, ratio in excluded) or "none"))
    scale = (run.config() or {}).get("t_target_scale")
    claim = THM_55.claim + ("" if scale is None else f" — targets {scale:g} from the initial function")
    return Claim(claim, THM_55.paper, measured, run.source, rules.all_of(verdicts))


def report(runs: list[Run]) -> Section:
    """The report section: Thm 3.10 from the last finished run that measured it; Thm 5.5 from every run that
    measured it, each named by its targets' distance from the initial function (the lazy scale, and a far one)."""
    section, thm310, thm55 = Section(COMMAND, TITLE), THM_310, {}
    for run, res in section.readable(runs, "results.csv", ("m", "loss_0", "loss_final", "rate_fit"), ("part",),
                                     "convergence.png"):
        with section.reading(run):
            thm310 = _thm310(run, res) or thm310
            if claim := _thm55(run, res):
                thm55[claim.claim] = claim
    section.claims = [thm310, *(thm55.values() or [THM_55])]
    return section
