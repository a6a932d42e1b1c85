"""Paper 2, Theorems 7.1 and 7.2, measured: teacher–student sweeps of time T, data N and model size M.

Every student is paper 2's transformer (`theory/transformer.py`), trained by SGD (batch |B| = α·N)
on N noisy teacher examples; its excess risk E‖F(X) − F*(X)‖²_F is measured on fresh noiseless test
sequences at log-spaced steps, with compute C = M·t·|B| counted exactly. All sweeps are views of
one grid of (N, m, depth) points: students of one (m, depth) train together, their mini-batches packed
into one batch (each row through its own student's parameters) with one autograd backward; the test
risk is a torch.func.vmap over the students.

time     risk vs T at (base_n, base_width): exponential decay to a floor (Thm 7.2 time law)
data     final risk vs N at base_width: power law, exponent vs the bound's 1 (data law)
model    final risk vs M = N_layers(md + d²) at base_n: exponent vs ζ ∈ (0, 1/3) (model law)
compute  per N, the frontier min risk vs C over widths and steps: exponential stage, then a power
         law, breakpoint C*; exponent vs 1/6 and C*(N) vs N⁶ (Thm 7.1)
"""

from __future__ import annotations

import math
from dataclasses import replace
from enum import IntEnum
from typing import Iterator, Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, model_validator
from torch.func import vmap

from .. import batteries, fitting, rules
from ..claims import DIVERGED, INCONCLUSIVE, NOT_RUN, OUTSIDE, Claim, Section, fmt
from ..rules import Condition
from ..errors import first_line
from ..executors import Failed
from ..figures import scaling_law as figures
from ..recipes import Count, Depth, Positive, Recipe, TransformerSpec, Width
from ..runs import Results, Run, is_main_process, nested_randn, process_rank, seed_for
from ..theory import transformer

COMMAND, TITLE = "scaling-law", "Scaling laws of the transformer (paper 2, Theorems 7.1–7.2)"
KEYS = ["n", "width", "depth", "epsilon", "seed"]
RESUMABLE = ("sweeps", "seeds", "n_values", "widths", "depths", "bootstrap", "epsilon_rule", "model_zeta",
             "width_rule", "base_n", "base_width", "base_depth")  # a student's key holds all that sets its training
FILES = ("results.csv", "results.rank*.csv", "frontier.csv", "fits.csv", "summary.csv", "diverged.csv", "scaling_law.png",
         "claims.csv", "battery.csv")
SCALE = ("n_values", "widths", "steps", "seeds")  # the fields that set a run's scale, shown beside its claims
DEVICES = ("cpu",)  # small students, vectorised on the CPU
POINTS = True  # a packed group of students per (width, depth)
HELP = ("Paper 2, Theorems 7.1–7.2: scaling laws of a transformer trained by SGD on teacher–student data.\n\n"
        "Trains paper 2's model for every (data size N, width m, depth) the sweeps need, several seeds, vectorised over "
        "N and seeds; fits the time, data and model laws (power laws with offset, Huber loss in log space, bootstrap "
        "95% intervals) and the two-stage compute frontier with its breakpoint C*(N). Writes results.csv, "
        "frontier.csv, fits.csv, summary.csv (verdicts), scaling_law.png, claims.csv and run.json to "
        "outputs/scaling-law/<recipe>/; re-running resumes point by point. Under torchrun the sweep points are "
        "sharded across processes.")
NEEDS_RECIPE = False
FLAGS = {"sweeps": ("--sweeps", list, "Comma-separated: time, data, model, compute."),
         "seeds": ("--seeds", int, "Students per sweep point.")}


class ScalingLawRecipe(Recipe):
    """Paper 2, Theorems 7.1–7.2: teacher–student sweeps of training time T, data size N and model size M."""

    sweeps: list[Literal["time", "data", "model", "compute"]] = Field(["time", "data", "model", "compute"], min_length=1)
    seeds: int = Field(3, ge=1, le=1000, description="independent students (init, data, noise) per sweep point")
    transformer: TransformerSpec = Field(TransformerSpec(), description="paper 2's model (Eq. 1): students and the "
                                         "transformer teacher share d, L and the coefficients")
    # the data
    teacher: Literal["student", "transformer", "mlp"] = Field(
        "student", description="F*: `student`, a network of each student's own class, width and ε, its initial "
        "weights moved by teacher_radius (in the Good Model Class); or a misspecified contrast at ε = 1: paper 2's "
        "model at teacher_width/teacher_depth, or a token-wise tanh MLP")
    teacher_radius: float = Field(0.1, gt=0, le=1, description="student teacher: ‖θ* − θ₀‖/‖θ₀‖ of U and W")
    teacher_width: Width = Field(512, description="m of the transformer and mlp teachers")
    teacher_depth: Depth = Field(1, description="N of the transformer teacher")
    noise: float = Field(0.1, ge=0, description="ξ: std of the label noise Y = F*(X) + ξ·G (the risk's noise level "
                         "is ξ²·L·d; the excess risk is measured on noiseless test labels)")
    clock: Literal["flow", "steps"] = Field("flow", description="the unit of T and C = M·T·|B|: the paper's "
                                            "gradient-flow time (steps × the SGD step), or SGD steps")
    battery: int = Field(100, ge=10, le=100_000, description="planted inputs per class in each rule's battery")
    n_test: Count = Field(512, description="fresh noiseless test sequences for the excess risk")
    # the sweep grid
    n_values: list[Count] = Field([8, 16, 32, 64, 128, 256], min_length=3, description="data sizes N")
    widths: list[Width] = Field([8, 16, 32, 64, 128, 256], min_length=3, description="student widths m")
    depths: list[Depth] = Field([1, 2], min_length=1, description="student depths (model law)")
    base_n: int = Field(64, ge=1, description="N held fixed in the time and model laws")
    base_width: int = Field(64, ge=1, description="m held fixed in the time and data laws")
    base_depth: int = Field(1, ge=1, description="depth of the time, data and compute sweeps")
    # the theorems' couplings (docs/theory-verdicts.md): off by default in nothing, stated per claim in run.json
    epsilon_rule: Literal["fixed", "xi/N"] = Field("fixed", description="ε of the time, data and compute students: "
                                                   "transformer.epsilon, or ξ/N (Thm 7.1, 7.2)")
    model_zeta: float | None = Field(None, gt=0, lt=1 / 3, description="ζ of the model law: its students get "
                                     "ε = ξ/M^ζ (Thm 7.2); null keeps transformer.epsilon")
    width_rule: Literal["grid", "cube"] = Field("grid", description="width of the time and data students: "
                                                "base_width, or per N the smallest of `widths` with M ≥ N³")
    lr_rule: Literal["fixed", "epsilon"] = Field("fixed", description="SGD step: lr, or lr/ε² (the same step in "
                                                 "function space whatever ε)")
    # training
    steps: int = Field(2000, ge=2, le=10_000_000, description="SGD steps T of every student")
    checkpoints: int = Field(24, ge=3, le=10_000, description="log-spaced steps at which the excess risk is measured")
    lr: float = Field(0.5, gt=0, description="SGD step on ½·mean‖F(X) − Y‖²")
    lr_fallbacks: list[Positive] = Field([], description="smaller steps tried in turn for the students that diverge "
                                      "(NaN or infinite risk) at lr; results.csv records every step tried")
    batch_fraction: float = Field(0.25, gt=0, le=1, description="α: |B| = max(1, round(α·N))")
    bootstrap: int = Field(200, ge=10, le=100_000, description="bootstrap resamples per fit")
    dtype: Literal["float32", "float64"] = "float32"

    def peak_bytes(self) -> int:
        """The largest group of students trained at once (every N of the widest m, or every depth at base_n): per
        packed row of its whole training set (the checkpoint's loss) its own U, W and A (W and A twice: gathered,
        and cached for the batches) and its MLP activations; per student the test set's activations, its
        parameters and their gradients."""
        size, w, d, L = (8 if self.dtype == "float64" else 4), max(self.widths), self.transformer.d, self.transformer.seq_len
        groups = [(self.seeds * len(self.n_values), self.seeds * sum(self.n_values), self.base_depth),
                  (self.seeds, self.seeds * self.base_n, max(self.depths))]
        return size * max(depth * (students * (4 * (w * d + d * d) + 3 * self.n_test * L * w)
                                   + rows * (d * d + 4 * d * w + 3 * L * w))
                          for students, rows, depth in groups)

    @model_validator(mode="after")
    def _base_in_grid(self) -> "ScalingLawRecipe":
        for name, value, grid in (("base_n", self.base_n, self.n_values), ("base_width", self.base_width, self.widths)):
            if value not in grid:
                raise ValueError(f"{name} = {value} must be one of {'n_values' if name == 'base_n' else 'widths'} {grid}")
        if self.base_depth not in self.depths:
            raise ValueError(f"base_depth = {self.base_depth} must be one of depths {self.depths}")
        if self.noise == 0 and (self.epsilon_rule == "xi/N" or self.model_zeta is not None):
            raise ValueError("epsilon_rule xi/N and model_zeta set ε from ξ: they need noise > 0")
        if self.width_rule == "cube":
            for n in self.n_values:
                width_for(self, n)  # raises for an N that no width serves
        return self

    def size(self, width: int, depth: int) -> int:
        """M = N_layers(md + d²) of a student."""
        return self.transformer.shape(width, depth).size


RECIPE = ScalingLawRecipe
TRAINED_AXES = {"U": 0, "W": 0}  # vmap axes of the test risk: every student has its own U and W …
FROZEN_AXES = {"A": 0, "E": None}  # … and its own A; the positional embedding E is the teacher's, shared


class Stream(IntEnum):
    """Named random streams: seed_for(base seed, stream, the values that identify the draw)."""

    BATCHES = 3
    DATA = 5
    NOISE = 6
    TEACHER = 7
    TEST = 9


def width_for(cfg: ScalingLawRecipe, n: int) -> int:
    """The width of the time and data students with N examples: base_width, or the smallest of `widths` whose
    model size reaches N³ (Thm 7.2: M = Ω(N³))."""
    if cfg.width_rule == "grid":
        return cfg.base_width
    for width in sorted(cfg.widths):
        if cfg.size(width, cfg.base_depth) >= n ** 3:
            return width
    d = cfg.transformer.d
    raise ValueError(f"width_rule cube: no width in widths {cfg.widths} gives M ≥ N³ = {n ** 3:,} for N = {n} "
                     f"(needs m ≥ {-(-(n ** 3 // cfg.base_depth - d * d) // d)})")


def _rounded(x: float) -> float:
    """ε as a point key: six significant digits, so that it reads back from results.csv exactly."""
    return float(f"{x:.6g}")


def epsilon_for(cfg: ScalingLawRecipe, n: int) -> float:
    """ε of a time, data or compute student with N examples: transformer.epsilon, or ξ/N (Thm 7.1, 7.2)."""
    return _rounded(cfg.noise / n if cfg.epsilon_rule == "xi/N" else cfg.transformer.epsilon)


def model_epsilon(cfg: ScalingLawRecipe, size: int) -> float:
    """ε of a model-law student of size M: transformer.epsilon, or ξ/M^ζ (Thm 7.2's model law)."""
    return _rounded(cfg.noise / size ** cfg.model_zeta if cfg.model_zeta is not None else cfg.transformer.epsilon)


def law_points(cfg: ScalingLawRecipe) -> dict[str, set[tuple[int, int, int, float]]]:
    """Per chosen sweep, the (N, m, depth, ε) points it needs."""
    points = {"time": {(cfg.base_n, width_for(cfg, cfg.base_n), cfg.base_depth, epsilon_for(cfg, cfg.base_n))},
              "data": {(n, width_for(cfg, n), cfg.base_depth, epsilon_for(cfg, n)) for n in cfg.n_values},
              "model": {(cfg.base_n, w, dep, model_epsilon(cfg, cfg.size(w, dep))) for w in cfg.widths
                        for dep in cfg.depths},
              "compute": {(n, w, cfg.base_depth, epsilon_for(cfg, n)) for n in cfg.n_values for w in cfg.widths}}
    return {sweep: p for sweep, p in points.items() if sweep in cfg.sweeps}


def sweep_points(cfg: ScalingLawRecipe) -> list[tuple[int, int, int, float]]:
    """Every point the chosen sweeps need, each trained once and shared between sweeps."""
    return sorted(set().union(*law_points(cfg).values()))


def learning_rate(cfg: ScalingLawRecipe, epsilon: float, lr: float | None = None) -> float:
    """The SGD step of a student at ε: lr (the recipe's, or a fallback), over ε² under lr_rule epsilon."""
    lr = cfg.lr if lr is None else lr
    return lr / epsilon ** 2 if cfg.lr_rule == "epsilon" else lr


def batch_size(cfg: ScalingLawRecipe, n: int) -> int:
    return max(1, round(cfg.batch_fraction * n))


def checkpoint_steps(steps: int, count: int) -> list[int]:
    """`count` log-spaced steps (a power law's resolution) and `count` evenly spaced ones (an exponential's)."""
    return sorted({0, *np.geomspace(1, steps, count).round().astype(int).tolist(),
                   *np.linspace(0, steps, count + 1).round().astype(int).tolist()})


def inputs(X: torch.Tensor, dtype) -> torch.Tensor:
    """X [count, L, d] (standard normal draws) with RMS-normalised rows (each token has mean square 1)."""
    return (X / X.pow(2).mean(-1, keepdim=True).sqrt()).to(dtype)


class Teacher:
    """The misspecified contrasts at ε = 1 (`transformer`, `mlp`) and the positional embedding E that every
    student and teacher shares. The `student` teacher is each student's own (`moved`), made in train_group."""

    def __init__(self, cfg: ScalingLawRecipe, dtype):
        self.shape = cfg.transformer.shape(cfg.teacher_width, cfg.teacher_depth)
        params, frozen = transformer.init(self.shape, seed_for(cfg.seed, Stream.TEACHER, Stream.TEACHER), dtype=dtype)
        self.params, self.frozen, self.kind = params, frozen, cfg.teacher
        self.E = frozen["E"]

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        if self.kind == "transformer":
            return transformer.forward(self.params, self.frozen, X, self.shape)
        W1, W2 = self.params["W"][0], self.frozen["A"][0]  # [d, m], [m, d]
        hidden = torch.tanh(X @ W1 / math.sqrt(self.shape.d))
        return self.shape.epsilon * (X + self.E + self.shape.omega / math.sqrt(self.shape.m) * hidden @ W2)


def moved(cfg: ScalingLawRecipe, params: dict[str, torch.Tensor], width: int, depth: int, seeds: list[int]):
    """The student teachers θ* = θ₀ + r·‖θ₀‖·u/‖u‖ per tensor (U, W), u ~ N(0, I) from each seed's teacher
    stream: a network of the student's own class (Def. 5.2's Good Model Class), r = teacher_radius inside the
    lazy radius (`linear_error` measures how far)."""
    star = {}
    for j, (key, p) in enumerate(params.items()):
        u = torch.stack([torch.randn(p.shape[1:], dtype=p.dtype, generator=torch.Generator().manual_seed(
            seed_for(cfg.seed, Stream.TEACHER, width, depth, seed, j))) for seed in seeds])
        scale = cfg.teacher_radius * p.flatten(1).norm(dim=1) / u.flatten(1).norm(dim=1)
        star[key] = p + scale.view(-1, *(1,) * (p.dim() - 1)) * u
    return star


def linear_error(params, star, frozen, X: torch.Tensor, shape) -> torch.Tensor:
    """Per student, ‖F(θ*) − F(θ₀) − J(θ₀)(θ* − θ₀)‖ / ‖F(θ*) − F(θ₀)‖ on X: how far the teacher is from the
    linearised (kernel) model around the student's initialisation (0 inside the lazy regime)."""
    def one(p, q, f):
        run = lambda theta: transformer.forward(theta, f, X, shape)  # noqa: E731
        base, tangent = torch.func.jvp(run, (p,), ({k: q[k] - p[k] for k in p},))
        moved_out = run(q) - base
        return (moved_out - tangent).norm() / moved_out.norm()
    return vmap(one, in_dims=(TRAINED_AXES, TRAINED_AXES, FROZEN_AXES))(params, star, frozen)


def excess_risk(F: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """E‖F(X) − F*(X)‖²_F over the leading (sequence) axis."""
    return (F - target).pow(2).sum((-1, -2)).mean(-1)


def train_group(cfg: ScalingLawRecipe, width: int, depth: int, students: list[tuple[int, float, int]], teacher: Teacher,
                pools: dict[int, tuple[torch.Tensor, torch.Tensor]], test: torch.Tensor,
                advance=lambda k=1: None, base: float | None = None) -> pd.DataFrame:
    """SGD for every (N, ε, seed) student of one (m, depth) at once; risk and training loss at checkpoints.

    The students' mini-batches are packed, not padded: row r of a step is one sequence of student who[r], run
    through that student's own parameters (gathered per row and layer) and scaled by its own ε, so a step costs
    Σ_i b_i sequences, not (students)·max_i b_i; the gradient of the rows' summed loss is each student's own
    gradient, and each student steps by its own learning rate."""
    shape, dtype = replace(cfg.transformer.shape(width, depth), epsilon=1.0), getattr(torch, cfg.dtype)
    inits = [transformer.init(shape, seed_for(cfg.seed, seed, width, depth), dtype=dtype) for _, _, seed in students]
    params = {k: torch.stack([p[k] for p, _ in inits]) for k in TRAINED_AXES}
    frozen = {"A": torch.stack([f["A"] for _, f in inits]), "E": teacher.E}
    n = torch.tensor([s[0] for s in students])
    eps = torch.tensor([s[1] for s in students], dtype=dtype)
    lr = torch.tensor([learning_rate(cfg, e, base) for _, e, _ in students], dtype=dtype).view(-1, 1, 1, 1)
    b = torch.tensor([batch_size(cfg, s[0]) for s in students])
    X = torch.stack([pools[seed][0] for _, _, seed in students])  # [S, n_max, L, d]; student i uses its first n_i
    G = torch.stack([pools[seed][1] for _, _, seed in students])  # the label noise, standard normal
    with torch.no_grad():
        if cfg.teacher == "student":
            star = moved(cfg, params, width, depth, [seed for _, _, seed in students])
            out = vmap(lambda p, f, e, x: e * transformer.forward(p, f, x, shape),
                       in_dims=(TRAINED_AXES, FROZEN_AXES, 0, 0))
            clean, target = out(star, frozen, eps, X), out(star, frozen, eps, test.expand(len(students), *test.shape))
            lazy = linear_error(params, star, frozen, test, shape).tolist()
        else:
            clean, target, lazy = teacher(X), teacher(test).expand(len(students), *test.shape), [np.nan] * len(students)
    Y = clean + cfg.noise * G
    everyone, batch_rows, start = Packing(n, frozen, eps), Packing(b, frozen, eps), params

    def test_risk(p, f, e, y):
        return excess_risk(e * transformer.forward(p, f, test, shape), y)

    risk = vmap(test_risk, in_dims=(TRAINED_AXES, FROZEN_AXES, 0, 0))
    # one batch stream per student, so that its trajectory is the same alone, in any group, on any rank
    gens = [torch.Generator().manual_seed(seed_for(cfg.seed, Stream.BATCHES, n_i, width, depth, s))
            for n_i, _, s in students]
    marks, rows = set(checkpoint_steps(cfg.steps, cfg.checkpoints)), []
    batches = _batches(gens, [(n_i, s) for n_i, _, s in students], b, cfg.steps)
    size = cfg.size(width, depth)
    for t in range(cfg.steps + 1):
        if t in marks:
            with torch.no_grad():
                r, tl = risk(params, frozen, eps, target), everyone.losses(params, X, Y, everyone.first, shape)
                moved_by = _moved_by(params, start)
            rows += [{"n": n_i, "width": width, "depth": depth, "epsilon": e, "seed": s, "step": t,
                      "excess_risk": float(r[i]), "train_loss": float(tl[i]), "batch": int(b[i]),
                      "model_size": size, "lr": float(lr[i]), "weight_change": float(moved_by[i]),
                      "teacher_linear_error": lazy[i]}
                     for i, (n_i, e, s) in enumerate(students)]
            if t == cfg.steps or not (torch.isfinite(r) & torch.isfinite(tl)).any():
                advance(cfg.steps - t)  # every student diverged: no step left to take
                break
        leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
        loss = batch_rows.losses(leaves, X, Y, next(batches), shape).sum()
        g = torch.autograd.grad(loss, list(leaves.values()))
        params = {k: v.detach() - lr * gk for (k, v), gk in zip(leaves.items(), g)}
        advance(1)
    return pd.DataFrame(rows)


def _moved_by(params: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per student, ‖θ − θ₀‖/‖θ₀‖ over U and W: how far training took it from its initialisation (lazy: small)."""
    flat = lambda p: torch.cat([p[k].flatten(1) for k in TRAINED_AXES], 1)  # noqa: E731
    return (flat(params) - flat(start)).norm(dim=1) / flat(start).norm(dim=1)


class Packing:
    """Rows of several students packed into one batch: student i owns count[i] consecutive rows (who[r] says
    whose row r is), each weighted 1/count[i], so that a student's loss is the mean over its own rows."""

    def __init__(self, count: torch.Tensor, frozen: dict[str, torch.Tensor], eps: torch.Tensor):
        self.students = len(count)
        self.who = torch.repeat_interleave(torch.arange(len(count)), count)
        self.first = torch.cat([torch.arange(int(c)) for c in count])  # each student's first count[i] examples
        self.weight = (1.0 / count.to(eps.dtype))[self.who]
        self.eps = eps[self.who].view(-1, 1, 1)
        self.frozen = {"A": frozen["A"].index_select(0, self.who), "E": frozen["E"]}  # per row, once

    def losses(self, params, X, Y, examples, shape) -> torch.Tensor:
        """Each student's ½·mean over its rows of ‖ε·Λ_N(x) − y‖²_F, x = X[who, examples], through its own
        parameters (`shape` has ε = 1; each row carries its student's ε)."""
        flat = self.who * X.shape[1] + examples  # row r is X[who[r], examples[r]]
        x, y = X.flatten(0, 1).index_select(0, flat), Y.flatten(0, 1).index_select(0, flat)
        out = self.eps * transformer.forward(params, self.frozen, x, shape, rows=self.who)
        per_row = 0.5 * self.weight * (out - y).pow(2).sum((-1, -2))
        return per_row.new_zeros(self.students).index_add_(0, self.who, per_row)


def _batches(gens: list[torch.Generator], students: list[tuple[int, int]], b: torch.Tensor, steps: int,
             chunk: int = 64) -> Iterator[torch.Tensor]:
    """Each step's packed mini-batches: for student i, b_i distinct indices among its own n_i examples (the b_i
    smallest of n_i uniform keys from its own stream), so they depend neither on the other students nor on the
    largest N. Keys are drawn `chunk` steps at a time (the same stream as one draw per step)."""
    for start in range(0, steps, chunk):
        rows = min(chunk, steps - start)
        yield from torch.cat([torch.rand(rows, n_i, generator=g).argsort(-1)[:, : int(b_i)]
                              for g, (n_i, _), b_i in zip(gens, students, b)], dim=1)


def data_pools(cfg: ScalingLawRecipe, seeds: list[int], dtype) -> tuple[dict, torch.Tensor]:
    """Per seed: N_max training sequences and their standard normal label noise (every N uses the first N: nested
    data sets, drawn in seeded blocks so that the first N rows and their noise do not depend on N_max); the test
    sequences, shared."""
    pools, n_max, shape = {}, max(cfg.n_values), (cfg.transformer.seq_len, cfg.transformer.d)
    for seed in seeds:
        pools[seed] = (inputs(nested_randn(n_max, shape, cfg.seed, Stream.DATA, seed, block=64), dtype),
                       nested_randn(n_max, shape, cfg.seed, Stream.NOISE, seed, block=64).to(dtype))
    gen = torch.Generator().manual_seed(seed_for(cfg.seed, Stream.TEST))
    return pools, inputs(torch.randn(cfg.n_test, *shape, generator=gen, dtype=torch.float64), dtype)


def plan(cfg: ScalingLawRecipe) -> list[tuple[str, str]]:
    """What a run trains (the same `sweep_points` that `measure` groups and trains)."""
    points = sweep_points(cfg)
    return [("sweep points (N, m, depth)", str(len(points))), ("students", str(len(points) * cfg.seeds)),
            ("vectorised groups (m, depth)", str(len({(w, d) for _, w, d in points}))),
            ("SGD steps per student", str(cfg.steps))]


def measure(cfg: ScalingLawRecipe, folder: Run) -> Results:
    """Train the missing students (this process's share of the groups under torchrun) and save them."""
    dtype = getattr(torch, cfg.dtype)
    rank, world = process_rank()
    results = Results(folder, KEYS, write=world == 1, ordered=True)
    groups: dict[tuple[int, int], list[tuple[int, float, int]]] = {}
    for n, width, depth, eps, seed in results.todo((*p, s) for p in sweep_points(cfg) for s in range(cfg.seeds)):
        groups.setdefault((width, depth), []).append((n, eps, seed))
    mine = [g for i, g in enumerate(sorted(groups)) if i % world == rank]
    if mine:
        shared = (cfg, Teacher(cfg, dtype), *data_pools(cfg, list(range(cfg.seeds)), dtype), groups)
        for (width, depth), outcome in folder.measure(
                f"train {sum(len(groups[g]) for g in mine)} students in {len(mine)} groups", _group, mine, shared,
                lambda group: passes(cfg)):
            if isinstance(outcome, Failed):
                raise outcome.error or RuntimeError(f"the students of width {width}, depth {depth}: {outcome.reason}")
            results.add(outcome)
            if world > 1:
                folder.save_csv(f"results.rank{rank}.csv", results.table())
    if world > 1:
        _gather_shards(folder, world)
        return Results(folder, KEYS, write=False)
    return results


def _group(shared: tuple, group: tuple[int, int], advance) -> pd.DataFrame:
    """One (width, depth) group of students trained: a pure function of the group, for any executor's worker."""
    cfg, teacher, pools, test, groups = shared
    return train_with_fallbacks(cfg, *group, groups[group], teacher, pools, test, advance)


def passes(cfg: ScalingLawRecipe) -> int:
    """The progress steps of one group: its SGD steps at lr and at every fallback step."""
    return cfg.steps * (1 + len(cfg.lr_fallbacks))


def train_with_fallbacks(cfg: ScalingLawRecipe, width: int, depth: int, students, teacher: Teacher, pools, test,
                         advance=lambda k=1: None) -> pd.DataFrame:
    """train_group at lr, then the students that diverged again at each of lr_fallbacks in turn: each student's
    rows come from the first step at which it stayed finite (or the last tried), with every step tried in
    `lrs_tried`. Advances `steps × (1 + fallbacks)` in all (`passes`), the fallbacks not needed at once."""
    done, tried, steps = [], {s: [] for s in students}, [cfg.lr, *cfg.lr_fallbacks]
    for i, base in enumerate(steps):
        df = train_group(cfg, width, depth, students, teacher, pools, test, advance, base=base)
        for s in students:
            tried[s].append(f"{base:g}")
        lost = {(n, eps, seed) for n, _, _, eps, seed in diverged(df)[KEYS].itertuples(index=False, name=None)}
        done.append(rows_where(df, lambda n, w, d, eps, seed: base == steps[-1] or (n, eps, seed) not in lost))
        students = [s for s in students if s in lost]
        if not students:
            advance(cfg.steps * (len(steps) - 1 - i))
            break
    out = pd.concat(done, ignore_index=True)
    return out.assign(lrs_tried=[" ".join(tried[(n, eps, seed)])
                                 for n, _, _, eps, seed in out[KEYS].itertuples(index=False, name=None)])


def _gather_shards(run: Run, world: int) -> None:
    """Under torchrun: wait for every rank, then rank 0 merges the shards into results.csv."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    dist.barrier()
    if is_main_process():
        parts = [run.load_csv(f"results.rank{r}.csv") for r in range(world)]
        merged = pd.concat([p for p in parts if p is not None], ignore_index=True)
        run.save_csv("results.csv", merged.drop_duplicates(subset=KEYS + ["step"], keep="last"))
        for r in range(world):
            run.path(f"results.rank{r}.csv").unlink(missing_ok=True)
    dist.barrier()


THEORY = {
    "time": ("risk ≤ exp(−ε²ξ²T/N²) + O(ξ²/N): an exponential decay (late local rate 0.6–1.2× the early one) to a "
             "floor it does not leave", "Thm 7.2 time law"),
    "data": ("risk ≤ O(ξ²/N): A·N^(−α) fitted without a floor, α ≥ 1", "Thm 7.2 data law"),
    "model": ("risk ≤ ξ²·M^(−ζ), per depth: A·M^(−α) with α ≥ ζ, never rising with M", "Thm 7.2 model law"),
    "compute": ("stage II envelope (best student at each C) ≤ ξ^(5/3)·C^(−1/6): β ≥ 1/6", "Thm 7.1 compute frontier"),
    "breakpoint": ("C* ∝ N⁶·log(N·Ld/ξ²)/ξ² (Eq. 3): slope 1 of log fitted C* on log Eq. (3)", "Thm 7.1 breakpoint"),
}
UNITS = {"flow": "gradient-flow time t = steps × the SGD step η (η = lr/ε² under lr_rule epsilon)", "steps": "SGD steps"}
MIN_STAGE2 = 4  # envelope points past Eq. (3)'s C* that the frontier's fit needs
MIN_BREAKS = 3  # data sizes whose Eq. (3) C* lies inside their own compute range


def step_size(cfg: ScalingLawRecipe, epsilon) -> np.ndarray:
    """How much of T one SGD step at lr is: its step size η in the paper's gradient-flow time, or 1 (clock: steps)."""
    eps = np.asarray(epsilon, float)
    return np.ones_like(eps) if cfg.clock == "steps" else np.vectorize(lambda e: learning_rate(cfg, e))(eps)


def clocked(cfg: ScalingLawRecipe, df: pd.DataFrame) -> pd.DataFrame:
    """results with T (`time`: steps × each student's own SGD step, or steps) and C = M·T·|B| (`compute`) in the
    recipe's clock."""
    time = df.step * (1.0 if cfg.clock == "steps" else df.lr)
    return df.assign(time=time, compute=df.model_size * time * df.batch)


def horizon(cfg: ScalingLawRecipe, epsilon: float) -> float:
    """T of a student at ε, in the recipe's clock."""
    return float(cfg.steps * step_size(cfg, epsilon))


def noise_level(cfg: ScalingLawRecipe) -> float:
    """R(F*) = E‖ξG‖²_F = ξ²·L·d: the risk of the teacher itself on noisy labels."""
    return cfg.noise ** 2 * cfg.transformer.seq_len * cfg.transformer.d


def eq3_compute(cfg: ScalingLawRecipe, n) -> np.ndarray:
    """Eq. (3)'s breakpoint with unit constants: C* = N⁶·log(N·L·d/ξ²)/ξ²."""
    n, xi2 = np.asarray(n, float), cfg.noise ** 2
    return n ** 6 * np.log(n * cfg.transformer.seq_len * cfg.transformer.d / xi2) / xi2


def _at_least(name: str, value: float, bound: float, unit: str = "") -> Condition:
    """`name` as a condition value ≥ bound, its detail written with the comparison that holds."""
    return Condition(name, value >= bound, f"{value:,.4g}{unit} {'≥' if value >= bound else '<'} {bound:,.4g}{unit}")


def _epsilon_condition(cfg: ScalingLawRecipe) -> Condition:
    met = cfg.epsilon_rule == "xi/N"
    return Condition("ε = ξ/N", met, "ε = ξ/N for every N" if met else f"ε = {cfg.transformer.epsilon:g} for every N")


def _teacher_condition(cfg: ScalingLawRecipe) -> Condition:
    return Condition("the teacher is in the students' class (Def. 5.2)", cfg.teacher == "student",
                     f"{cfg.teacher} teacher" + ("" if cfg.teacher == "student" else " at ε = 1 (misspecified)"))


def _cube_condition(cfg: ScalingLawRecipe, ns) -> Condition:
    worst = min(ns, key=lambda n: cfg.size(width_for(cfg, n), cfg.base_depth) / n ** 3)
    size = cfg.size(width_for(cfg, worst), cfg.base_depth)
    return Condition("M ≥ N³", size >= worst ** 3,
                     f"M = {size:,} {'≥' if size >= worst ** 3 else '<'} N³ = {worst ** 3:,} at N = {worst}")


def regimes(cfg: ScalingLawRecipe) -> dict[str, list[Condition]]:
    """The conditions each law's theorem assumes, as this recipe meets them, T in the recipe's clock (run.json
    records them). The compute and breakpoint conditions on measured compute are added where those laws are
    fitted, the measured ones (the students reach the teacher) in fit_laws."""
    xi, unit = max(cfg.noise, 1e-300), " (flow time)" if cfg.clock == "flow" else " steps"
    sizes = [cfg.size(w, dep) for w in cfg.widths for dep in cfg.depths]
    worst = min(cfg.n_values, key=lambda n: horizon(cfg, epsilon_for(cfg, n)) * xi / n ** 2)
    data = [_teacher_condition(cfg), _epsilon_condition(cfg), _cube_condition(cfg, cfg.n_values),
            _at_least(f"T ≥ N²/ξ (unit constant; at N = {worst})", horizon(cfg, epsilon_for(cfg, worst)),
                      worst ** 2 / xi, unit)]
    zeta = cfg.model_zeta
    model = [_teacher_condition(cfg),
             Condition("ε = ξ/M^ζ, ζ ∈ (0, 1/3)", zeta is not None,
                       f"ζ = {zeta}" if zeta is not None else f"ε = {cfg.transformer.epsilon:g} for every M")]
    if zeta is not None:
        big = max(sizes)
        model += [Condition("M < N^(3/(2ζ))", big < cfg.base_n ** (3 / (2 * zeta)),
                            f"M = {big:,} {'<' if big < cfg.base_n ** (3 / (2 * zeta)) else '≥'} "
                            f"{cfg.base_n ** (3 / (2 * zeta)):,.0f} at N = {cfg.base_n}"),
                  _at_least("T ≥ M^ζ/ξ (unit constant; at the largest M)", horizon(cfg, model_epsilon(cfg, big)),
                            big ** zeta / xi, unit)]
    coupled = [_teacher_condition(cfg), _epsilon_condition(cfg)]
    return {"time": [*coupled, _cube_condition(cfg, [cfg.base_n])], "data": data, "model": model,
            "compute": coupled, "breakpoint": coupled}


REACH = 0.5  # the single laws' students must bring their risk below this share of its start
LAZY = 0.1  # the student teacher's linearisation error at most this: inside the kernel (lazy) regime


def reach(cfg: ScalingLawRecipe, df: pd.DataFrame, points) -> list[Condition]:
    """Thm 7.2 bounds the excess risk of the Good Model Class, whose target the class can reach: measured
    conditions that every point of the law (seed means of the finite students) learns, ending at most REACH of
    its initial excess risk, and reaches the noise level, its noisy risk ΔR + ξ²Ld within 2× the teacher's own
    ξ²Ld. A sweep whose students stay far above the teacher tests approximation error, not these laws."""
    mine = rows_where(df, lambda *key: key[:4] in points)
    start, end = (mine[mine.step == step].groupby(KEYS[:4]).excess_risk.mean() for step in (0, mine.step.max()))
    ratio, level = (end / start).dropna(), noise_level(cfg)
    if ratio.empty:
        return [Condition("the students learn and reach the noise level", False, "no finite student")]
    n, width, depth, eps = ratio.idxmax()
    far = end.dropna().idxmax()
    return [Condition(f"the students learn (R(T) ≤ {REACH}·R(0) at every point)", ratio.max() <= REACH,
                      f"R(T)/R(0) = {ratio.max():.2g} at N = {n}, m = {width}, depth {depth}, ε = {eps:g}"),
            Condition("the students reach the teacher within 2× the noise level (ΔR(T) ≤ ξ²Ld at every point)",
                      end.max() <= level, f"ΔR(T) = {end.max():.3g} {'≤' if end.max() <= level else '>'} ξ²Ld = "
                      f"{level:.3g} (worst at N = {far[0]}, m = {far[1]}, depth {far[2]})")]


def lazy_students(df: pd.DataFrame, points) -> Condition:
    """The kernel regime the theorems work in: every student of the law ends within LAZY (relative) of its
    initial weights."""
    mine = rows_where(df, lambda *key: key[:4] in points)
    worst = mine[mine.step == mine.step.max()].weight_change.max() if "weight_change" in mine else np.nan
    return Condition(f"the students stay lazy (‖θ(T) − θ₀‖/‖θ₀‖ ≤ {LAZY})", bool(worst <= LAZY),
                     f"they move up to {worst:.2g}")


def frontier(df: pd.DataFrame, by: tuple[str, ...] = ("width",)) -> pd.DataFrame:
    """Seed-mean risk per (`by`…, step), then the points no cheaper point beats (the compute frontier; with
    by = (n, width) over every data size, the envelope)."""
    mean = df[df.step > 0].groupby([*by, "step"], as_index=False).agg(
        compute=("compute", "mean"), excess_risk=("excess_risk", "mean")).sort_values(["compute", "excess_risk"])
    best = mean.excess_risk.cummin()
    return mean[mean.excess_risk <= best].drop_duplicates("compute")


def _law(law: str, measured: str, verdict_: str) -> dict:
    """A verdict row of summary.csv."""
    claim, where = THEORY[law]
    return {"law": law, "theorem": where, "theory": claim, "measured": measured, "verdict": verdict_}


def _time_law(cfg: ScalingLawRecipe, df: pd.DataFrame, conditions) -> tuple[list, dict, object]:
    """Risk against T at the base point: rules.decay_to_floor on the seeds' curves, T in the recipe's clock; the
    theorem's rate ε²ξ²/N² (unit constant) beside the measured one, reported, not judged (its α_cr is unstated)."""
    n, width, eps = cfg.base_n, width_for(cfg, cfg.base_n), epsilon_for(cfg, cfg.base_n)
    t = df[(df.n == n) & (df.width == width) & (df.depth == cfg.base_depth) & (df.epsilon == eps)]
    curves = t.pivot_table(index="seed", columns="time", values="excess_risk")
    test = rules.decay_to_floor(curves.columns.to_numpy(), curves.to_numpy(), n_boot=cfg.bootstrap, seed=cfg.seed)
    theory = eps ** 2 * cfg.noise ** 2 / n ** 2
    group = f"N={n} m={width}"
    rows = [{"law": "time", "group": group, "form": "decay of R − R∞ to the floor R_min", "parameter": k,
             "estimate": v, "lower": lo, "upper": hi}
            for k, v, lo, hi in (("R_min", test.floor, test.floor_lower, test.floor_upper),
                                 ("t_min", test.at, np.nan, np.nan), ("rise", test.rise, np.nan, np.nan),
                                 ("rate_1", test.rates[0], np.nan, np.nan), ("rate_2", test.rates[1], np.nan, np.nan),
                                 ("rate_ratio", test.ratio, test.lower, test.upper),
                                 ("theory_rate", theory, np.nan, np.nan))]
    unit = "flow time" if cfg.clock == "flow" else "step"
    rise = ("; the risk never falls below its start" if not np.isfinite(test.rise) else
            f"; it leaves the floor: R(T) sits {test.rise:.0%} of its drop above it (± {test.rise_se:.0%})"
            if test.left_floor() else f"; R(T) within {max(test.rise, 0):.1%} of the drop above the floor")
    end = t[t.step == t.step.max()].excess_risk.mean()
    measured = (f"N = {n}, m = {width}: floor R_min = {fmt(test.floor)} [{fmt(test.floor_lower)}, "
                f"{fmt(test.floor_upper)}] at T = {fmt(test.at)}, R(T) = {fmt(end)}{rise}; local rate {fmt(test.rates[0])} then "
                f"{fmt(test.rates[1])} per {unit}, ratio {fmt(test.ratio)} [{fmt(test.lower)}, {fmt(test.upper)}] "
                f"(an exponential: {rules.RATE_BAND[0]}–{rules.RATE_BAND[1]}); the theorem's ε²ξ²/N² = {fmt(theory)} "
                f"per {unit} (unit constant, not judged)")
    return rows, _law("time", measured, test.verdict(float(curves.columns.max()), conditions)), (test, t)


def _data_law(cfg: ScalingLawRecipe, final: pd.DataFrame, boot: dict, conditions) -> tuple[list, dict, dict]:
    """Final excess risk against N at each N's own width and ε: A·N^(−α) without a floor (the excess risk of a
    noiseless-target fit has none: a floor shows as a small α)."""
    d = rows_where(final, lambda n, width, depth, eps, seed: (width, eps) == (width_for(cfg, n), epsilon_for(cfg, n)))
    d = d[d.depth == cfg.base_depth]
    fit = fitting.bootstrap(fitting.fit_power_law, d.n, d.excess_risk, offset=False, **boot)
    rows = fit.rows(law="data", group="N³ widths" if cfg.width_rule == "cube" else f"m={cfg.base_width}",
                    form=fit.form("N"))
    verdict_ = rules.judge(conditions, lambda: rules.interval(fit.lower["alpha"], fit.upper["alpha"], at_least=1.0))
    return rows, _law("data", f"α = {fit.interval('alpha')}", verdict_), ({"data": fit}, d)


def zeta(cfg: ScalingLawRecipe) -> float:
    """The model law's ζ: the recipe's model_zeta, or 1/4 where it sets none (that law is then outside its regime)."""
    return cfg.model_zeta if cfg.model_zeta is not None else 0.25


def _model_law(cfg: ScalingLawRecipe, final: pd.DataFrame, boot: dict, conditions) -> tuple[list, dict, dict]:
    """Final risk against M per depth, at base_n and each M's own ε: a power law at least as steep as M^(−ζ)
    that never rises."""
    rows, verdicts, parts, fits, points = [], [], [], {}, []
    for depth in cfg.depths:
        wanted = {(w, model_epsilon(cfg, cfg.size(w, depth))) for w in cfg.widths}
        d = final[(final.n == cfg.base_n) & (final.depth == depth)]
        d = rows_where(d, lambda n, width, depth, eps, seed: (width, eps) in wanted)
        if d.model_size.nunique() < 3:
            parts.append(f"depth {depth}: " + (f"every student diverged, at every step tried "
                                               f"({', '.join(f'{x:g}' for x in [cfg.lr, *cfg.lr_fallbacks])})" if d.empty else
                                               f"{d.model_size.nunique()} sizes with finite students (3 needed)"))
            continue
        fit = fitting.bootstrap(fitting.fit_power_law, d.model_size, d.excess_risk, offset=False, **boot)
        stats = d.groupby("model_size").excess_risk.agg(["mean", "sem"]).fillna(0.0)
        rise = rules.rises(stats["mean"], stats["sem"])
        rows += fit.rows(law="model", group=f"N={cfg.base_n} depth={depth}", form=fit.form("M"))
        verdicts.append(rules.model_law(fit.lower["alpha"], fit.upper["alpha"], stats["mean"], stats["sem"], zeta(cfg)))
        parts.append(f"depth {depth}: α = {fit.interval('alpha')}" + (" (rises with M)" if rise else ""))
        fits[depth] = fit
        points.append(d)
    if not fits:
        raise ValueError("; ".join(parts))
    verdict_ = rules.judge(conditions, lambda: rules.all_of(verdicts))
    return rows, _law("model", "; ".join(parts), verdict_), (fits, pd.concat(points))


def _envelope_law(cfg: ScalingLawRecipe, df: pd.DataFrame, boot: dict, conditions) -> tuple[list, dict, dict]:
    """Thm 7.1's frontier: the envelope over every (N, m, T) (the lowest risk at each compute), its power law in C
    past Eq. (3)'s C* (stage II), and the compute-optimal N* against C."""
    env = frontier(df[df.depth == cfg.base_depth], by=("n", "width"))
    stage2 = env[env.compute > eq3_compute(cfg, env.n)]
    enough, fall = len(stage2) >= MIN_STAGE2, env.excess_risk.min() / env.excess_risk.iloc[0]
    conditions = [*conditions, Condition(f"≥ {MIN_STAGE2} envelope points past Eq. (3)'s C* (stage II)", enough,
                                         f"{len(stage2)} of {len(env)} envelope points"),
                  Condition(f"the best students reach the teacher (the envelope falls to ≤ {REACH}× its start)",
                            fall <= REACH, f"it falls to {fall:.2g}× its start")]
    upper = env[env.compute >= np.sqrt(env.compute.min() * env.compute.max())]
    used, where = (stage2, "stage II") if enough else (upper, f"C ≥ {fmt(upper.compute.min())}")
    fit = fitting.bootstrap(fitting.fit_power_law, used.compute, used.excess_risk, offset=False, **boot)
    slopes = [np.polyfit(np.log(s.compute), np.log(s.n), 1)[0] for s in
              (used.sample(len(used), replace=True, random_state=cfg.seed + j) for j in range(cfg.bootstrap))
              if s.compute.nunique() > 1]
    n_star = np.polyfit(np.log(used.compute), np.log(used.n), 1)[0]
    rows = fit.rows(law="compute", group=f"envelope, {where}", form=fit.form("C")) + [
        {"law": "compute", "group": f"envelope, {where}", "form": "log N* = c + slope·log C", "parameter": "n_star_slope",
         "estimate": n_star, "lower": np.percentile(slopes, 2.5), "upper": np.percentile(slopes, 97.5)}]
    measured = (f"envelope over {len(env)} points, {where} ({len(used)} points): β = {fit.interval('alpha')}; "
                f"compute-optimal N* ∝ C^{n_star:.2f} [{np.percentile(slopes, 2.5):.2f}, "
                f"{np.percentile(slopes, 97.5):.2f}] (theory 1/6)")
    verdict_ = rules.judge(conditions, lambda: rules.interval(fit.lower["alpha"], fit.upper["alpha"], at_least=1 / 6))
    return rows, _law("compute", measured, verdict_), {"envelope": env, "envelope_fit": fit, "envelope_points": used}


def _breakpoint_law(cfg: ScalingLawRecipe, df: pd.DataFrame, boot: dict, conditions) -> tuple[list, dict, dict]:
    """Per N, the two-stage fit of its own frontier (over widths and steps) gives C*; against Eq. (3)'s C*(N)."""
    rows, curves, frontiers, stars, inside = [], {}, [], {}, []
    for n in cfg.n_values:
        own = df[(df.n == n) & (df.depth == cfg.base_depth) & (df.epsilon == epsilon_for(cfg, n)) & (df.step > 0)]
        front = frontier(own).assign(n=n)
        frontiers.append(front)
        learned = len(front) and front.excess_risk.min() <= REACH * front.excess_risk.iloc[0]
        if learned and own.compute.min() < eq3_compute(cfg, n) < own.compute.max():
            inside.append(n)
        if len(front) >= 6:
            try:
                stars[n] = fitting.bootstrap(fitting.fit_two_stage, front.compute, front.excess_risk, **boot)
            except ValueError:
                continue
            rows += stars[n].rows(law="breakpoint", group=f"N={n}", form=stars[n].form("C"))
            curves[f"compute N={n}"] = stars[n]
    conditions = [*conditions, Condition(f"Eq. (3)'s C* inside the compute range of a frontier that falls to "
                                         f"{REACH}× its start (the students reach the teacher), for ≥ {MIN_BREAKS} N",
                                         len(inside) >= MIN_BREAKS, f"{len(inside)} N ({inside or 'none'})")]
    ns = np.array([n for n in sorted(stars) if n in inside] if len(inside) >= MIN_BREAKS else sorted(stars))
    curves["frontiers"] = frontiers
    if len(ns) < 3:
        return rows, _law("breakpoint", f"C* fitted for {len(ns)} N (3 needed)",
                          rules.judge(conditions, lambda: NOT_RUN)), curves
    theory, xstar = np.log(eq3_compute(cfg, ns)), np.array([stars[n].params["xstar"] for n in ns])
    count = min(len(stars[n].draws) for n in ns)  # paired bootstrap draws across N
    slope = np.polyfit(theory, np.log(xstar), 1)[0]
    draws = [np.polyfit(theory, np.log([stars[n].draws[j]["xstar"] for n in ns]), 1)[0] for j in range(count)]
    fit = fitting.Fit({"slope": slope}, float("nan"), {"slope": float(np.percentile(draws, 2.5))},
                      {"slope": float(np.percentile(draws, 97.5))}, law="line")
    rows += fit.rows(law="breakpoint", group="N " + ",".join(map(str, ns)), form="log C* = c + slope·log C*_Eq3")
    curves["breakpoint"] = (ns, xstar, eq3_compute(cfg, ns), fit)
    against_n = np.polyfit(np.log(ns), np.log(xstar), 1)[0]
    measured = (f"slope on Eq. (3) = {fit.interval('slope')} over N = {list(map(int, ns))} (log C* ∝ N^{against_n:.2f}); "
                f"Eq. (3) inside the compute range for N = {inside or 'none'}")
    verdict_ = rules.judge(conditions, lambda: rules.covers(fit.lower["slope"], fit.upper["slope"], 1.0))
    return rows, _law("breakpoint", measured, verdict_), curves


def _no_fit(law: str, err: Exception | str, conditions=()) -> tuple[list, dict]:
    """A law that no fit describes (every student diverged, or too few points stayed finite): a row saying so in
    fits.csv and an inconclusive verdict after the regime's `conditions`, so that the run still ends with its CSVs
    and figure."""
    why = err if isinstance(err, str) else first_line(err)
    return ([{"law": law, "group": "", "form": "no finite fit", "parameter": why, "estimate": np.nan,
              "lower": np.nan, "upper": np.nan}],
            _law(law, f"no finite fit ({why})", rules.judge(list(conditions), lambda: INCONCLUSIVE)))


def rows_where(df: pd.DataFrame, keep) -> pd.DataFrame:
    """The rows whose KEYS (n, width, depth, ε, seed) satisfy keep(*key) (an empty frame keeps its columns)."""
    mask = [bool(keep(*key)) for key in df[KEYS].itertuples(index=False, name=None)]
    return df[pd.Series(mask, index=df.index, dtype=bool)]


def diverged(df: pd.DataFrame) -> pd.DataFrame:
    """One row per student whose risk or training loss became NaN or infinite, with the first such step."""
    bad = df[~(np.isfinite(df.excess_risk) & np.isfinite(df.train_loss))]
    return bad.groupby(KEYS, as_index=False).step.min().rename(columns={"step": "diverged_at"})


def _divergence(row: dict, lost: pd.DataFrame, total: int) -> dict:
    """A verdict row told how many of its `total` students diverged (and left out), or DIVERGED if all did."""
    if len(lost) == total:
        return {**row, "measured": f"all {total} students diverged (the first at step {int(lost.diverged_at.min())})",
                "verdict": f"{DIVERGED} (lr too large?)"}
    if len(lost):
        return {**row, "measured": f"{row['measured']}; {len(lost)} of {total} students diverged (from step "
                                   f"{int(lost.diverged_at.min())}), left out"}
    return row


def fit_laws(cfg: ScalingLawRecipe, df: pd.DataFrame) -> dict[str, object]:
    """Every law's fit with bootstrap intervals, the frontier points, and a verdict per law (after its regime),
    on the students that stayed finite; each law says how many of its own diverged."""
    df, lost = clocked(cfg, df), diverged(df)
    gone = set(lost[KEYS].itertuples(index=False, name=None))
    df = rows_where(df, lambda *key: key not in gone)
    fits, verdicts, curves, frontiers = [], [], {}, []
    boot, final, regime = dict(n=cfg.bootstrap, seed=cfg.seed), df[df.step == cfg.steps], regimes(cfg)
    points = law_points(cfg)
    if cfg.teacher == "student" and len(df):
        worst = float(df.teacher_linear_error.max())
        for law in regime:
            regime[law] = [*regime[law], Condition(f"the teacher inside the lazy radius (linearisation error ≤ {LAZY})",
                                                   worst <= LAZY, f"at most {worst:.2g}")]
    for law in ("time", "data", "model"):
        if law in cfg.sweeps:
            regime[law] = [*regime[law], *reach(cfg, df, points[law]), lazy_students(df, points[law])]
    if "compute" in cfg.sweeps:
        for law in ("compute", "breakpoint"):
            regime[law] = [*regime[law], lazy_students(df, points["compute"])]
    laws = {"time": ("time", lambda: _time_law(cfg, df, regime["time"])),
            "data": ("data", lambda: _data_law(cfg, final, boot, regime["data"])),
            "model": ("model", lambda: _model_law(cfg, final, boot, regime["model"])),
            "compute": ("compute", lambda: _envelope_law(cfg, df, boot, regime["compute"])),
            "breakpoint": ("compute", lambda: _breakpoint_law(cfg, df, boot, regime["breakpoint"]))}
    for law, (sweep, fitter) in laws.items():
        if sweep not in cfg.sweeps:
            continue
        mine = rows_where(lost, lambda *key: key[:4] in points[sweep])
        total = len(points[sweep]) * cfg.seeds
        try:
            rows, row, curve = fitter() if len(mine) < total else (
                _no_fit(law, "every student diverged")[0], _law(law, "", ""), None)
        except ValueError as err:  # no finite fit (numpy's LinAlgError is one too)
            (rows, row), curve = _no_fit(law, err, regime[law]), None
        fits += rows
        for one in row if isinstance(row, list) else [row]:
            verdicts.append(_divergence(one, mine, total))
        if isinstance(curve, dict) and "frontiers" in curve:
            frontiers = curve.pop("frontiers")
            curves.update(curve)
        elif curve is not None:
            curves[law] = curve
    return {"fits": pd.DataFrame(fits), "verdicts": pd.DataFrame(verdicts), "curves": curves, "diverged": lost,
            "frontier": pd.concat(frontiers, ignore_index=True) if frontiers else pd.DataFrame(),
            "regimes": {law: [c.as_dict() for c in conds] for law, conds in regime.items()}}


def prepare(cfg: ScalingLawRecipe) -> None:
    """Nothing to load: the recipe holds every input."""


def tables(cfg: ScalingLawRecipe, result: dict[str, pd.DataFrame]) -> list[tuple[str, pd.DataFrame]]:
    return [("paper 2 scaling laws: theory vs measurement (95% bootstrap intervals)",
             result["verdicts"][["law", "theorem", "theory", "measured", "verdict"]])]


def battery_grid(cfg: ScalingLawRecipe) -> batteries.Grid:
    """What each rule sees in this recipe's run: the time law's checkpoints in its clock, the N and M of the data
    and model laws, the seeds, the bootstrap, ζ and Eq. (3)'s C* per N."""
    times = np.array(checkpoint_steps(cfg.steps, cfg.checkpoints)) * float(step_size(cfg, epsilon_for(cfg, cfg.base_n)))
    sizes = sorted({cfg.size(w, cfg.base_depth) for w in cfg.widths})
    return batteries.Grid(times, np.array(cfg.n_values, float), np.array(sizes, float), cfg.seeds, cfg.bootstrap,
                          zeta(cfg), eq3_compute(cfg, cfg.n_values))


def battery(cfg: ScalingLawRecipe, folder: Run) -> pd.DataFrame:
    """The rules' planted batteries at this run's grid: battery.csv of an earlier run, else computed now, before the
    first student trains (rules before data; a function of the recipe's grid alone). The run writes it with its
    other results."""
    table = folder.load_csv("battery.csv")
    if table is None:
        laws = [law for law in THEORY if (law if law in ("time", "data", "model") else "compute") in cfg.sweeps]
        table = batteries.acceptance(battery_grid(cfg), laws, draws=cfg.battery, seed=cfg.seed)
    return table


def run(cfg: ScalingLawRecipe, folder: Run, prepared: None = None) -> dict[str, pd.DataFrame]:
    """Fix the rules' error rates (battery.csv), train every student not yet in results.csv, fit the laws, write
    CSVs, verdicts, figure, run.json."""
    rules_first = battery(cfg, folder) if is_main_process() else None
    measured = measure(cfg, folder)
    if not is_main_process():
        return {}
    folder.save_csv("battery.csv", rules_first)
    # a run grown and then shrunk again fits, and keeps, only what the recipe asks for
    results = measured.table((*p, s) for p in sweep_points(cfg) for s in range(cfg.seeds))
    folder.save_csv("results.csv", results)
    laws = fit_laws(cfg, results)
    folder.save_csv("fits.csv", laws["fits"])
    folder.save_csv("summary.csv", laws["verdicts"])
    folder.save_csv("diverged.csv", laws["diverged"])
    if not laws["frontier"].empty:
        folder.save_csv("frontier.csv", laws["frontier"])
    folder.save_figure("scaling_law.png", figures.figure(cfg, clocked(cfg, results), laws))
    folder.finish(students=len(results[KEYS].drop_duplicates()), sweep_points=len(set(sweep_points(cfg))),
                  clock=UNITS[cfg.clock], regimes=laws["regimes"])
    lost, total = laws["diverged"], len(results[KEYS].drop_duplicates())
    warn = ([f"{len(lost)} of {total} students diverged (NaN or infinite risk, the first at step "
             f"{int(lost.diverged_at.min())}): left out of every fit, listed in diverged.csv; lower lr?"] if len(lost)
            else [])
    return {"verdicts": laws["verdicts"], "fits": laws["fits"], "warnings": warn}


def _closeness(verdict: str) -> tuple[int, int]:
    """How near a verdict's run came to its theorem's regime: judged (0) before outside (1), then the fewer unmet
    conditions the nearer (judge() joins them with '; '); not run is farthest."""
    if verdict == NOT_RUN:
        return 2, 0
    return (1, verdict.count("; ") + 1) if verdict.startswith(OUTSIDE) else (0, 0)


def report(runs: list[Run]) -> Section:
    """The report section: the verdicts each finished run wrote into its summary.csv. Per law, the runs that came
    nearest to its theorem's regime (a judged verdict, else the fewest unmet conditions): every judged one on a tie
    (none hides another's verdict), the last of equally far "outside" ones; and each rule's planted battery beside
    them, per run (its acceptance rate per class)."""
    section = Section(COMMAND, TITLE)
    best: dict[str, list[Claim]] = {}
    for run, verdicts in section.readable(runs, "summary.csv", columns=("law", "measured", "verdict"),
                                          figure="scaling_law.png"):
        for row in verdicts.itertuples():
            if row.law not in THEORY:
                continue
            theory, where = THEORY[row.law]
            claim = Claim(where, theory, str(row.measured), run.source, str(row.verdict))
            held = best.get(row.law, [])
            if not held or _closeness(claim.verdict) < _closeness(held[0].verdict):
                best[row.law] = [claim]
            elif _closeness(claim.verdict) == _closeness(held[0].verdict):
                best[row.law] = held + [claim] if _closeness(claim.verdict)[0] == 0 else [claim]
    section.claims = [c for law, (theory, where) in THEORY.items() for c in best.get(law, [Claim(where, theory)])]
    section.notes += [f"`{COMMAND}/{run.name}`: T and C = M·T·|B| in {(run.info() or {}).get('clock', UNITS['steps'])}"
                      for run in runs if run.info() is not None]
    tables = [(run.name, table) for run, table in section.readable(runs, "battery.csv", columns=("law", "class", "accepted"))]
    if tables:
        keys = ["law", "class", "kind"]
        wide = pd.concat([t.set_index(keys).accepted.rename(name) for name, t in tables], axis=1).reset_index()
        section.tables.append((f"each rule's acceptance rate on planted inputs (share judged reproduced; a rule must "
                               f"accept ≤ {batteries.MAX_FALSE:.0%} of a violating class and ≥ {batteries.MIN_TRUE:.0%} "
                               f"of a satisfying one), at each run's own grid", wide))
    return section
