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
from enum import IntEnum
from typing import Iterator, Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, model_validator
from torch.func import vmap

from .. import fitting
from ..claims import INCONCLUSIVE, Claim, Section, verdict
from ..errors import first_line
from ..figures import scaling_law as figures
from ..recipes import Count, Depth, Recipe, TransformerSpec, Width
from ..runs import Results, Run, is_main_process, nested_randn, process_rank, seed_for
from ..theory import transformer

COMMAND, TITLE = "scaling-law", "Scaling laws of the transformer (paper 2, Theorems 7.1–7.2)"
KEYS = ["n", "width", "depth", "seed"]
RESUMABLE = ("sweeps", "seeds", "n_values", "widths", "depths", "bootstrap")
FILES = ("results.csv", "results.rank*.csv", "frontier.csv", "fits.csv", "summary.csv", "scaling_law.png", "claims.csv")
SCALE = ("n_values", "widths", "steps", "seeds")  # the fields that set a run's scale, shown beside its claims
DEVICES = ("cpu",)  # small students, vectorised on the CPU
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
    teacher: Literal["transformer", "mlp"] = Field("transformer", description="F*: paper 2's model (wider), or a "
                                                   "token-wise tanh MLP on the same residual stream")
    teacher_width: Width = Field(512, description="m of the teacher")
    teacher_depth: Depth = Field(1, description="N of the teacher (transformer)")
    noise: float = Field(0.1, ge=0, description="ξ: std of the label noise Y = F*(X) + ξ·G")
    n_test: Count = Field(512, description="fresh noiseless test sequences for the excess risk")
    # the sweep grid
    n_values: list[Count] = Field([8, 16, 32, 64, 128, 256], min_length=3, description="data sizes N")
    widths: list[Width] = Field([8, 16, 32, 64, 128, 256], min_length=3, description="student widths m")
    depths: list[Depth] = Field([1, 2], min_length=1, description="student depths (model law)")
    base_n: int = Field(64, ge=1, description="N held fixed in the time and model laws")
    base_width: int = Field(64, ge=1, description="m held fixed in the time and data laws")
    base_depth: int = Field(1, ge=1, description="depth of the time, data and compute sweeps")
    # training
    steps: int = Field(2000, ge=2, le=10_000_000, description="SGD steps T of every student")
    checkpoints: int = Field(24, ge=3, le=10_000, description="log-spaced steps at which the excess risk is measured")
    lr: float = Field(0.5, gt=0, description="SGD step on ½·mean‖F(X) − Y‖²")
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
        return self


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


def sweep_points(cfg: ScalingLawRecipe) -> list[tuple[int, int, int]]:
    """The (N, m, depth) points the chosen sweeps need (each trained once, shared between sweeps)."""
    points = set()
    if "time" in cfg.sweeps:
        points.add((cfg.base_n, cfg.base_width, cfg.base_depth))
    if "data" in cfg.sweeps:
        points |= {(n, cfg.base_width, cfg.base_depth) for n in cfg.n_values}
    if "model" in cfg.sweeps:
        points |= {(cfg.base_n, w, dep) for w in cfg.widths for dep in cfg.depths}
    if "compute" in cfg.sweeps:
        points |= {(n, w, cfg.base_depth) for n in cfg.n_values for w in cfg.widths}
    return sorted(points)


def batch_size(cfg: ScalingLawRecipe, n: int) -> int:
    return max(1, round(cfg.batch_fraction * n))


def checkpoint_steps(steps: int, count: int) -> list[int]:
    return sorted({0, *np.geomspace(1, steps, count).round().astype(int).tolist()})


def inputs(X: torch.Tensor, dtype) -> torch.Tensor:
    """X [count, L, d] (standard normal draws) with RMS-normalised rows (each token has mean square 1)."""
    return (X / X.pow(2).mean(-1, keepdim=True).sqrt()).to(dtype)


class Teacher:
    """F*: paper 2's model at teacher_width/teacher_depth, or a token-wise tanh MLP; its positional
    embedding E is shared with every student, so that F* is in reach of the student class."""

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


def excess_risk(F: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """E‖F(X) − F*(X)‖²_F over the leading (sequence) axis."""
    return (F - target).pow(2).sum((-1, -2)).mean(-1)


def train_group(cfg: ScalingLawRecipe, width: int, depth: int, students: list[tuple[int, int]], teacher: Teacher,
                pools: dict[int, tuple[torch.Tensor, torch.Tensor]], test: tuple[torch.Tensor, torch.Tensor],
                advance=lambda k=1: None) -> pd.DataFrame:
    """SGD for every (N, seed) student of one (m, depth) at once; risk and training loss at checkpoints.

    The students' mini-batches are packed, not padded: row r of a step is one sequence of student who[r], run
    through that student's own parameters (gathered per row and layer), so a step costs Σ_i b_i sequences, not
    (students)·max_i b_i; the gradient of the rows' summed loss is each student's own gradient."""
    shape, dtype = cfg.transformer.shape(width, depth), getattr(torch, cfg.dtype)
    inits = [transformer.init(shape, seed_for(cfg.seed, seed, width, depth), dtype=dtype) for _, seed in students]
    params = {k: torch.stack([p[k] for p, _ in inits]) for k in TRAINED_AXES}
    frozen = {"A": torch.stack([f["A"] for _, f in inits]), "E": teacher.E}
    n = torch.tensor([s[0] for s in students])
    b = torch.tensor([batch_size(cfg, s[0]) for s in students])
    X = torch.stack([pools[seed][0] for _, seed in students])  # [S, n_max, L, d]; student i uses its first n_i
    Y = torch.stack([pools[seed][1] for _, seed in students])
    everyone, batch_rows = Packing(n, frozen, dtype), Packing(b, frozen, dtype)

    def test_risk(p, f):
        return excess_risk(transformer.forward(p, f, test[0], shape), test[1])

    risk = vmap(test_risk, in_dims=(TRAINED_AXES, FROZEN_AXES))
    # one batch stream per student, so that its trajectory is the same alone, in any group, on any rank
    gens = [torch.Generator().manual_seed(seed_for(cfg.seed, Stream.BATCHES, n_i, width, depth, s)) for n_i, s in students]
    marks, rows, batches = set(checkpoint_steps(cfg.steps, cfg.checkpoints)), [], _batches(gens, students, b, cfg.steps)
    for t in range(cfg.steps + 1):
        if t in marks:
            with torch.no_grad():
                r, tl = risk(params, frozen), everyone.losses(params, X, Y, everyone.first, shape)
            rows += [{"n": n_i, "width": width, "depth": depth, "seed": s, "step": t,
                      "excess_risk": float(r[i]), "train_loss": float(tl[i]), "batch": int(b[i]),
                      "model_size": shape.size, "compute": shape.size * t * int(b[i])}
                     for i, (n_i, s) in enumerate(students)]
        if t == cfg.steps:
            break
        leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
        loss = batch_rows.losses(leaves, X, Y, next(batches), shape).sum()
        g = torch.autograd.grad(loss, list(leaves.values()))
        params = {k: v.detach() - cfg.lr * gk for (k, v), gk in zip(leaves.items(), g)}
        advance(1)
    return pd.DataFrame(rows)


class Packing:
    """Rows of several students packed into one batch: student i owns count[i] consecutive rows (who[r] says
    whose row r is), each weighted 1/count[i], so that a student's loss is the mean over its own rows."""

    def __init__(self, count: torch.Tensor, frozen: dict[str, torch.Tensor], dtype):
        self.students = len(count)
        self.who = torch.repeat_interleave(torch.arange(len(count)), count)
        self.first = torch.cat([torch.arange(int(c)) for c in count])  # each student's first count[i] examples
        self.weight = (1.0 / count.to(dtype))[self.who]
        self.frozen = {"A": frozen["A"].index_select(0, self.who), "E": frozen["E"]}  # per row, once

    def losses(self, params, X, Y, examples, shape) -> torch.Tensor:
        """Each student's ½·mean over its rows of ‖F(x) − y‖²_F, x = X[who, examples], through its own parameters."""
        flat = self.who * X.shape[1] + examples  # row r is X[who[r], examples[r]]
        x, y = X.flatten(0, 1).index_select(0, flat), Y.flatten(0, 1).index_select(0, flat)
        out = transformer.forward(params, self.frozen, x, shape, rows=self.who)
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


def data_pools(cfg: ScalingLawRecipe, teacher: Teacher, seeds: list[int], dtype):
    """Per seed: N_max training sequences and noisy labels (every N uses the first N: nested data sets, drawn
    in seeded blocks so that the first N rows and their noise do not depend on N_max)."""
    pools, n_max, shape = {}, max(cfg.n_values), (cfg.transformer.seq_len, cfg.transformer.d)
    for seed in seeds:
        X = inputs(nested_randn(n_max, shape, cfg.seed, Stream.DATA, seed, block=64), dtype)
        with torch.no_grad():
            Y = teacher(X) + cfg.noise * nested_randn(n_max, shape, cfg.seed, Stream.NOISE, seed, block=64).to(dtype)
        pools[seed] = (X, Y)
    gen = torch.Generator().manual_seed(seed_for(cfg.seed, Stream.TEST))
    X_test = inputs(torch.randn(cfg.n_test, *shape, generator=gen, dtype=torch.float64), dtype)
    with torch.no_grad():
        return pools, (X_test, teacher(X_test))


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
    results = Results(folder, KEYS, write=world == 1)
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for n, width, depth, seed in results.todo((*p, s) for p in sweep_points(cfg) for s in range(cfg.seeds)):
        groups.setdefault((width, depth), []).append((n, seed))
    mine = [g for i, g in enumerate(sorted(groups)) if i % world == rank]
    if mine:
        teacher = Teacher(cfg, dtype)
        pools, test = data_pools(cfg, teacher, list(range(cfg.seeds)), dtype)
        with folder.task(f"train {sum(len(groups[g]) for g in mine)} students in {len(mine)} groups",
                         len(mine) * cfg.steps) as advance:
            for width, depth in mine:
                results.add(train_group(cfg, width, depth, groups[(width, depth)], teacher, pools, test, advance))
                if world > 1:
                    folder.save_csv(f"results.rank{rank}.csv", results.table())
    if world > 1:
        _gather_shards(folder, world)
        return Results(folder, KEYS, write=False)
    return results


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
    "time": ("exponential decay in T to a floor O(ξ²/N)", "Thm 7.2 time law"),
    "data": ("risk ≤ O(ξ²/N): exponent α ≥ 1", "Thm 7.2 data law"),
    "model": ("risk ≤ ξ²·M^(−ζ), ζ ∈ (0, 1/3): α > 0", "Thm 7.2 model law"),
    "compute": ("stage II ≤ ξ^(5/3)·C^(−1/6): β ≥ 1/6", "Thm 7.1 compute frontier"),
    "breakpoint": ("C* ∝ N⁶ (Eq. 3, up to a log): slope 6", "Thm 7.1 breakpoint"),
}


def frontier(df: pd.DataFrame) -> pd.DataFrame:
    """Seed-mean risk per (width, step), then the points no cheaper point beats (the compute frontier)."""
    mean = df[df.step > 0].groupby(["width", "step"], as_index=False).agg(
        compute=("compute", "mean"), excess_risk=("excess_risk", "mean")).sort_values("compute")
    best = mean.excess_risk.cummin()
    return mean[mean.excess_risk <= best].drop_duplicates("compute")


def _law(law: str, measured: str, ok: bool) -> dict:
    """A verdict row of summary.csv."""
    claim, where = THEORY[law]
    return {"law": law, "theorem": where, "theory": claim, "measured": measured, "verdict": verdict(ok)}


def _time_law(cfg: ScalingLawRecipe, df: pd.DataFrame, boot: dict) -> tuple[list, dict, object]:
    """Excess risk against T at the base point: fitting.decay_test, the test of every exponential claim."""
    t = df[(df.n == cfg.base_n) & (df.width == cfg.base_width) & (df.depth == cfg.base_depth) & (df.step > 0)]
    test = fitting.decay_test(t.step, t.excess_risk, **boot)
    exp, power = test.exponential, test.power
    group = f"N={cfg.base_n} m={cfg.base_width}"
    rows = exp.rows(law="time", group=group, form=exp.form("T")) + power.rows(law="time", group=group,
                                                                              form=power.form("T"))
    measured = (f"r = {exp.interval('r')}/step, floor E = {exp.interval('E')}; Huber loss exp {exp.loss:.3g} "
                f"vs power law {power.loss:.3g}")
    return rows, _law("time", measured, test.exponential_wins), (exp, power)


def _power_law(law: str, x: pd.Series, y: pd.Series, group: str, variable: str, ok, boot: dict):
    fit = fitting.bootstrap(fitting.fit_power_law, x, y, **boot)
    return (fit.rows(law=law, group=group, form=fit.form(variable)),
            _law(law, f"α = {fit.interval('alpha')}", ok(fit)), fit)


def _no_fit(law: str, err: Exception, group: str = "") -> tuple[list, dict, None]:
    """A law that no fit describes (training that diverged leaves infinite or NaN risks): a row saying so in
    fits.csv and an inconclusive verdict, so that the run still ends with its CSVs and figure."""
    claim, where = THEORY[law]
    return ([{"law": law, "group": group, "form": "no finite fit", "parameter": "", "estimate": np.nan,
              "lower": np.nan, "upper": np.nan}],
            {"law": law, "theorem": where, "theory": claim, "measured": f"no finite fit ({first_line(err)})",
             "verdict": INCONCLUSIVE}, None)


def _compute_laws(cfg: ScalingLawRecipe, df: pd.DataFrame, boot: dict) -> tuple[list, list, dict, list]:
    """The two-stage fit of each N's compute frontier (Thm 7.1) and the slope of log C* against log N."""
    rows, verdicts, curves, frontiers, stars, failed = [], [], {}, [], {}, None
    for n in cfg.n_values:
        front = frontier(df[(df.n == n) & (df.depth == cfg.base_depth)]).assign(n=n)
        frontiers.append(front)
        if len(front) >= 6:
            try:
                stars[n] = fitting.bootstrap(fitting.fit_two_stage, front.compute, front.excess_risk, **boot)
            except ValueError as err:
                rows += _no_fit("compute", err, f"N={n}")[0]
                failed = err
                continue
            rows += stars[n].rows(law="compute", group=f"N={n}", form=stars[n].form("C"))
            curves[f"compute N={n}"] = stars[n]
    if not stars and failed is not None:
        verdicts.append(_no_fit("compute", failed)[1])
    else:
        verdicts.append(_law("compute", "; ".join(f"N={n}: β = {f.interval('beta')}" for n, f in stars.items()),
                             bool(stars) and all(f.upper["beta"] >= 1 / 6 for f in stars.values())))
    if len(stars) >= 3:
        ns = np.array(sorted(stars))
        slope = np.polyfit(np.log(ns), np.log([stars[n].params["xstar"] for n in ns]), 1)[0]
        count = min(len(stars[n].draws) for n in ns)  # paired bootstrap draws across N
        slopes = [np.polyfit(np.log(ns), np.log([stars[n].draws[j]["xstar"] for n in ns]), 1)[0] for j in range(count)]
        fit = fitting.Fit({"slope": slope}, float("nan"), {"slope": float(np.percentile(slopes, 2.5))},
                          {"slope": float(np.percentile(slopes, 97.5))}, law="line")
        rows += fit.rows(law="breakpoint", group="all N", form=fit.form("N"))
        curves["breakpoint"] = (ns, np.array([stars[n].params["xstar"] for n in ns]), fit)
        verdicts.append(_law("breakpoint", f"slope = {fit.interval('slope')}", fit.lower["slope"] <= 6 <= fit.upper["slope"]))
    return rows, verdicts, curves, frontiers


def fit_laws(cfg: ScalingLawRecipe, df: pd.DataFrame) -> dict[str, object]:
    """Every law's fit with bootstrap intervals, the frontier points, and a verdict per law."""
    fits, verdicts, curves, frontiers = [], [], {}, []
    boot, final = dict(n=cfg.bootstrap, seed=cfg.seed), df[df.step == cfg.steps]
    data, model = (final[(final.width == cfg.base_width) & (final.depth == cfg.base_depth)],
                   final[final.n == cfg.base_n])
    fitters = {"time": lambda: _time_law(cfg, df, boot),
               "data": lambda: _power_law("data", data.n, data.excess_risk, f"m={cfg.base_width}", "N",
                                          lambda f: f.upper["alpha"] >= 1.0, boot),
               "model": lambda: _power_law("model", model.model_size, model.excess_risk, f"N={cfg.base_n}", "M",
                                           lambda f: f.lower["alpha"] > 0.0, boot)}
    for law in [law for law in fitters if law in cfg.sweeps]:
        try:
            rows, row, curve = fitters[law]()
        except ValueError as err:  # no finite fit (numpy's LinAlgError is one too)
            rows, row, curve = _no_fit(law, err)
        fits = fits + rows
        if curve is not None:
            curves[law] = curve
        verdicts.append(row)
    if "compute" in cfg.sweeps:
        rows, rows_v, more, frontiers = _compute_laws(cfg, df, boot)
        fits, verdicts = fits + rows, verdicts + rows_v
        curves.update(more)
    return {"fits": pd.DataFrame(fits), "verdicts": pd.DataFrame(verdicts), "curves": curves,
            "frontier": pd.concat(frontiers, ignore_index=True) if frontiers else pd.DataFrame()}


def prepare(cfg: ScalingLawRecipe) -> None:
    """Nothing to load: the recipe holds every input."""


def tables(cfg: ScalingLawRecipe, result: dict[str, pd.DataFrame]) -> list[tuple[str, pd.DataFrame]]:
    return [("paper 2 scaling laws: theory vs measurement (95% bootstrap intervals)",
             result["verdicts"][["law", "theorem", "theory", "measured", "verdict"]])]


def run(cfg: ScalingLawRecipe, folder: Run, prepared: None = None) -> dict[str, pd.DataFrame]:
    """Train every student not yet in results.csv, fit the laws, write CSVs, verdicts, figure, run.json."""
    measured = measure(cfg, folder)
    if not is_main_process():
        return {}
    # a run grown and then shrunk again fits only what the recipe asks for
    results = measured.table((*p, s) for p in sweep_points(cfg) for s in range(cfg.seeds))
    laws = fit_laws(cfg, results)
    folder.save_csv("fits.csv", laws["fits"])
    folder.save_csv("summary.csv", laws["verdicts"])
    if not laws["frontier"].empty:
        folder.save_csv("frontier.csv", laws["frontier"])
    folder.save_figure("scaling_law.png", figures.figure(cfg, results, laws))
    folder.finish(students=len(results[KEYS].drop_duplicates()), sweep_points=len(set(sweep_points(cfg))))
    return {"verdicts": laws["verdicts"], "fits": laws["fits"]}


def report(runs: list[Run]) -> Section:
    """The report section: the verdicts each finished run wrote into its summary.csv (the last run wins)."""
    section = Section(COMMAND, TITLE)
    claims = {law: Claim(where, theory) for law, (theory, where) in THEORY.items()}
    for run, verdicts in section.readable(runs, "summary.csv", columns=("law", "measured", "verdict"),
                                          figure="scaling_law.png"):
        for row in verdicts.itertuples():
            if row.law in claims:
                claims[row.law] = Claim(claims[row.law].claim, claims[row.law].paper, str(row.measured), run.source,
                                        str(row.verdict))
    section.claims = list(claims.values())
    return section
