"""Scaling-law fits recover known laws; the sweep counts compute exactly; students are vectorised honestly."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from ntkcli import fitting
from ntkcli.claims import NOT_REPRODUCED, OUTSIDE, REPRODUCED
from ntkcli.experiments import scaling_law as sl
from ntkcli.experiments.scaling_law import ScalingLawRecipe
from ntkcli.theory import transformer
from conftest import assert_one_line_error, invoke, no_results

TINY = dict(transformer={"d": 4, "seq_len": 3}, n_values=[4, 8, 16], widths=[4, 8, 16], depths=[1, 2], base_n=8, base_width=8,
            steps=40, checkpoints=12, seeds=2, teacher_width=16, n_test=32, bootstrap=10, battery=10)
TINY_SETS = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]


def noisy(y, rng, sd=0.05):
    return y * np.exp(rng.normal(0, sd, np.shape(y)))


@pytest.mark.parametrize("alpha, A, E", [(0.5, 5.0, 0.02), (1.0, 3.0, 0.0), (1 / 6, 2.0, 0.1)])
def test_power_law_fit_recovers_the_exponent_within_its_interval(alpha, A, E):
    rng = np.random.default_rng(1)
    x = np.repeat(np.logspace(1, 5, 14), 3)
    fit = fitting.bootstrap(fitting.fit_power_law, x, noisy(E + A * x ** -alpha, rng), n=100, offset=E > 0)
    assert fit.lower["alpha"] <= alpha <= fit.upper["alpha"]
    assert fit.upper["alpha"] - fit.lower["alpha"] < 0.25  # informative, not a blanket interval
    assert abs(fit.params["alpha"] - alpha) < 0.1


def test_power_law_fit_rejects_a_wrong_exponent():
    rng = np.random.default_rng(2)
    x = np.repeat(np.logspace(1, 4, 10), 3)
    fit = fitting.bootstrap(fitting.fit_power_law, x, noisy(3 * x ** -0.3, rng), n=100, offset=False)
    assert not fit.lower["alpha"] <= 1.0 <= fit.upper["alpha"]


def test_two_stage_fit_finds_the_breakpoint_and_the_late_exponent():
    rng = np.random.default_rng(4)
    C = np.logspace(2, 8, 60)
    cstar, beta, rate = 3e4, 1 / 6, 5e-5
    logy = np.where(C < cstar, np.log(0.4) - rate * (C - cstar), np.log(0.4) - beta * np.log(C / cstar))
    fit = fitting.bootstrap(fitting.fit_two_stage, C, noisy(np.exp(logy), rng, 0.03), n=60)
    assert fit.lower["beta"] <= beta <= fit.upper["beta"]
    assert fit.lower["xstar"] <= cstar <= fit.upper["xstar"]
    assert 0.5 < fit.params["r"] / rate < 2


def _setup(**kw):
    cfg = ScalingLawRecipe(**{**TINY, **kw})
    teacher = sl.Teacher(cfg, getattr(torch, cfg.dtype))
    pools, test = sl.data_pools(cfg, list(range(cfg.seeds)), getattr(torch, cfg.dtype))
    return cfg, teacher, pools, test


def test_the_label_noise_is_standard_and_the_inputs_rms_normalised():
    cfg, teacher, pools, test = _setup(noise=0.3, dtype="float64")
    X, G = pools[0]
    assert abs(G.std().item() - 1) < 0.1 and abs(G.mean().item()) < 0.1  # Y = F*(X) + ξ·G
    rms = X.pow(2).mean(-1)
    assert torch.allclose(rms, torch.ones_like(rms))


def test_the_student_teacher_is_the_students_own_network_moved_by_the_radius():
    """θ* − θ₀ has norm r·‖θ₀‖ per tensor; the linearisation error of F(θ*) around θ₀ grows with r (as √r: ReLU kinks; small
    for a small r: inside the lazy regime); another seed's teacher is another network."""
    cfg, teacher, pools, test = _setup(dtype="float64", teacher_radius=0.001)
    shape = cfg.transformer.shape(16, 1)
    inits = [transformer.init(shape, s, dtype=torch.float64) for s in (0, 1)]
    params = {k: torch.stack([p[k] for p, _ in inits]) for k in sl.TRAINED_AXES}
    frozen = {"A": torch.stack([f["A"] for _, f in inits]), "E": teacher.E}
    star = sl.moved(cfg, params, 16, 1, [0, 1])
    for k in params:
        ratio = (star[k] - params[k]).flatten(1).norm(dim=1) / params[k].flatten(1).norm(dim=1)
        assert torch.allclose(ratio, torch.full_like(ratio, 0.001))
    near = sl.linear_error(params, star, frozen, test, shape)
    far = sl.linear_error(params, sl.moved(cfg.model_copy(update={"teacher_radius": 0.5}), params, 16, 1, [0, 1]),
                          frozen, test, shape)
    assert (near < 0.05).all() and (far > 5 * near).all()


def test_compute_is_counted_exactly_in_either_clock():
    cfg, teacher, pools, test = _setup(dtype="float64", lr_rule="epsilon")
    df = sl.train_group(cfg, 8, 2, [(4, 1.0, 0), (16, 0.5, 1)], teacher, pools, test)
    assert sorted(df.step.unique()) == sl.checkpoint_steps(cfg.steps, cfg.checkpoints)
    M = 2 * (8 * cfg.transformer.d + cfg.transformer.d ** 2)
    assert (df.model_size == M).all()
    assert (df.batch == df.n.map(lambda n: max(1, round(cfg.batch_fraction * n)))).all()
    assert np.allclose(df.lr, cfg.lr / df.epsilon ** 2)
    flow = sl.clocked(cfg, df)
    assert np.allclose(flow.time, df.step * cfg.lr / df.epsilon ** 2) and np.allclose(flow.compute, M * flow.time * df.batch)
    steps = sl.clocked(cfg.model_copy(update={"clock": "steps"}), df)
    assert (steps.compute == M * df.step * df.batch).all()


def test_a_student_trains_the_same_alone_and_in_a_vectorised_group():
    cfg, teacher, pools, test = _setup(dtype="float64")
    group = sl.train_group(cfg, 8, 1, [(4, 1.0, 0), (8, 0.5, 1), (16, 1.0, 0)], teacher, pools, test)
    alone = sl.train_group(cfg, 8, 1, [(8, 0.5, 1)], teacher, pools, test)
    together = group[(group.n == 8) & (group.seed == 1)].reset_index(drop=True)
    assert np.allclose(together.excess_risk, alone.excess_risk, rtol=1e-10)


def test_batches_drawn_in_chunks_are_the_per_step_draws():
    """The packed mini-batches come from each student's own stream, drawn 64 steps at a time: the same indices
    as one draw per step, b_i distinct indices below n_i per student."""
    students, b = [(8, 0), (20, 1)], torch.tensor([2, 5])

    def stream(chunk):
        gens = [torch.Generator().manual_seed(10 + i) for i in range(2)]
        return torch.stack(list(sl._batches(gens, students, b, 130, chunk=chunk)))

    chunked, per_step = stream(64), stream(1)
    assert chunked.shape == (130, 7) and torch.equal(chunked, per_step)
    assert (chunked[:, :2] < 8).all() and (chunked[:, 2:] < 20).all()
    assert all(len(set(row[:2].tolist())) == 2 and len(set(row[2:].tolist())) == 5 for row in chunked)


def test_scaling_law_cli_runs_fits_and_resumes(tmp_path):
    r = invoke("scaling-law", *TINY_SETS, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "scaling-law" / "default"
    results = pd.read_csv(folder / "results.csv")
    assert len(results[sl.KEYS].drop_duplicates()) == len(sl.sweep_points(ScalingLawRecipe(**TINY))) * 2
    fits = pd.read_csv(folder / "fits.csv")
    assert {"law", "parameter", "estimate", "lower", "upper"} <= set(fits.columns)
    assert set(pd.read_csv(folder / "summary.csv").law) == {"time", "data", "model", "compute", "breakpoint"}
    regimes = json.loads((folder / "run.json").read_text())["regimes"]
    assert {"condition": "ε = ξ/N", "met": False, "sweep": "ε = 1 for every N"} in regimes["data"]
    assert (folder / "scaling_law.png").stat().st_size > 10_000
    again = invoke("scaling-law", *TINY_SETS, "--out", tmp_path)
    assert again.exit_code == 0 and "train" not in again.stderr  # nothing left to train
    assert pd.read_csv(folder / "results.csv").equals(results)


@pytest.mark.parametrize("sets, words", [
    (["base_n=5"], ["base_n", "n_values"]),
    (["sweeps=[time, speed]"], ["sweeps.1", "speed"]),
    (["noise=-1"], ["noise", "greater than or equal to 0"]),
    (["n_values=[8]"], ["n_values", "at least 3"]),
    (["width_rule=cube"], ["width_rule cube", "N = 16", "M ≥ N³"]),
    (["model_zeta=0.5"], ["model_zeta", "less than 0.333"]),
    (["epsilon_rule=xi/N", "noise=0"], ["noise > 0"]),
    (["teacher=oracle"], ["teacher", "student"]),
    (["teacher_radius=0"], ["teacher_radius", "greater than 0"]),
    (["teacher_radius=3"], ["teacher_radius", "less than or equal to 1"]),
    (["clock=hours"], ["clock", "flow"]),
    (["lr_fallbacks=[0.1, x]"], ["lr_fallbacks.1"]),
    (["battery=3"], ["battery", "greater than or equal to 10"]),
])
def test_bad_scaling_law_recipes_exit_2_with_one_line(tmp_path, sets, words):
    args = [a for s in sets for a in ("--set", s)]
    r = invoke("scaling-law", *args, "--out", tmp_path)
    assert_one_line_error(r, *words)
    assert no_results(tmp_path)


def test_a_students_epsilon_and_step_are_its_own():
    """lr_rule epsilon: a packed student at ε = 0.5 takes the same SGD step as one written out by hand with
    transformer.forward at ε = 0.5 and step lr/ε², on the same mini-batch of Y = F*(X) + ξG."""
    cfg, teacher, pools, test = _setup(dtype="float64", lr_rule="epsilon", steps=2, checkpoints=3, teacher="transformer")
    n, eps, seed, width = 8, 0.5, 1, 8
    got = sl.train_group(cfg, width, 1, [(4, 1.0, 0), (n, eps, seed)], teacher, pools, test)
    shape = cfg.transformer.shape(width, 1)
    from dataclasses import replace
    shape = replace(shape, epsilon=eps)
    params, frozen = transformer.init(shape, sl.seed_for(cfg.seed, seed, width, 1), dtype=torch.float64)
    frozen["E"] = teacher.E
    gen = torch.Generator().manual_seed(sl.seed_for(cfg.seed, sl.Stream.BATCHES, n, width, 1, seed))
    b = sl.batch_size(cfg, n)
    rows = next(sl._batches([gen], [(n, seed)], torch.tensor([b]), cfg.steps))
    X = pools[seed][0][rows]
    Y = teacher(X) + cfg.noise * pools[seed][1][rows]
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    loss = 0.5 * (transformer.forward(leaves, frozen, X, shape) - Y).pow(2).sum((-1, -2)).mean()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    stepped = {k: v - cfg.lr / eps ** 2 * g for (k, v), g in zip(params.items(), grads)}
    risk = sl.excess_risk(transformer.forward(stepped, frozen, test, shape), teacher(test)).item()
    mine = got[(got.n == n) & (got.step == 1)]
    assert mine.epsilon.item() == eps and mine.excess_risk.item() == pytest.approx(risk, rel=1e-10)


def test_coupled_points_carry_each_ns_width_and_epsilon():
    cfg = ScalingLawRecipe(**COUPLED)
    points = sl.law_points(cfg)
    assert points["data"] == {(2, 4, 1, 0.05), (4, 16, 1, 0.025), (8, 128, 1, 0.0125)}  # M = 32, 80, 528 ≥ N³
    assert all(eps == sl.model_epsilon(cfg, cfg.size(w, dep)) for _, w, dep, eps in points["model"])
    assert sl.model_epsilon(cfg, 80) == pytest.approx(0.1 / 80 ** 0.25, rel=1e-5)
    assert all(c["met"] for law in ("time", "data", "model") for c in (x.as_dict() for x in sl.regimes(cfg)[law]))


# --- the laws' verdicts on planted sweeps ------------------------------------------------------------------------

COUPLED = dict(transformer={"d": 4, "seq_len": 3}, noise=0.1, n_values=[2, 4, 8], widths=[4, 16, 128], depths=[1, 2],
               base_n=4, base_width=16, epsilon_rule="xi/N", width_rule="cube", lr_rule="epsilon", model_zeta=0.25,
               steps=4000, checkpoints=40, seeds=3, bootstrap=50, sweeps=["time", "data", "model"])
BREAK = dict(COUPLED, noise=1.0, n_values=[2, 4, 8, 16], widths=[4, 16, 128, 1024], depths=[1], base_n=4, bootstrap=20,
             steps=20000, sweeps=["compute"], model_zeta=None, clock="steps")


def planted(cfg: ScalingLawRecipe, risk, noise: float = 0.01, moved: float = 0.01) -> pd.DataFrame:
    """A results.csv of every point, seed and checkpoint with risk(n, M, step, compute) times a little noise (compute
    in the recipe's clock), lazy students (`moved`) and a lazy teacher."""
    rng, rows = np.random.default_rng(0), []
    for n, w, dep, eps in sl.sweep_points(cfg):
        size, b, lr = cfg.size(w, dep), sl.batch_size(cfg, n), sl.learning_rate(cfg, eps)
        for seed in range(cfg.seeds):
            for t in sl.checkpoint_steps(cfg.steps, cfg.checkpoints):
                c = size * t * b * float(sl.step_size(cfg, eps))
                r = risk(n, size, t, c) * np.exp(rng.normal(0, noise))
                rows.append(dict(n=n, width=w, depth=dep, epsilon=eps, seed=seed, step=t, excess_risk=r, train_loss=r,
                                 batch=b, model_size=size, lr=lr, weight_change=moved * t / cfg.steps,
                                 teacher_linear_error=0.01))
    return pd.DataFrame(rows)


def verdicts_of(cfg, df) -> dict[str, str]:
    return dict(zip(*sl.fit_laws(cfg, df)["verdicts"][["law", "verdict"]].T.to_numpy()))


def theorem_world(n, size, t, c):
    """Exponential in T to a floor that falls as 1/N and as M^(−0.3), below the noise level ξ²Ld = 0.12."""
    return 0.05 * (size / 100) ** -0.3 / n * (1 + 5 * np.exp(-t / 300))


def power_world(n, size, t, c):
    """A power law in T, a floor that falls only as N^(−0.3) and does not move with M."""
    return 0.05 * n ** -0.3 * (1 + 5 * (1 + t / 3) ** -1.5)


def test_a_sweep_that_follows_the_theorem_reproduces_its_single_laws():
    cfg = ScalingLawRecipe(**COUPLED)
    got = verdicts_of(cfg, planted(cfg, theorem_world))
    assert got == {"time": REPRODUCED, "data": REPRODUCED, "model": REPRODUCED}


def test_a_sweep_that_breaks_the_theorem_does_not():
    cfg = ScalingLawRecipe(**COUPLED)
    got = verdicts_of(cfg, planted(cfg, power_world))
    assert got["time"] == NOT_REPRODUCED and got["data"] == NOT_REPRODUCED and got["model"] == NOT_REPRODUCED
    rising = verdicts_of(cfg, planted(cfg, lambda n, size, t, c: theorem_world(n, size, t, c) * (size / 100) ** 0.6))
    assert rising["model"] == NOT_REPRODUCED


def test_a_sweep_outside_the_couplings_says_so_and_names_them():
    cfg = ScalingLawRecipe(**{**COUPLED, "epsilon_rule": "fixed", "width_rule": "grid", "model_zeta": None})
    got = verdicts_of(cfg, planted(cfg, theorem_world))
    assert all(v.startswith(OUTSIDE) for v in got.values())
    assert "ε = ξ/N" in got["data"] and "M ≥ N³: M = 80 < N³ = 512 at N = 8" in got["data"]
    assert "ε = ξ/M^ζ" in got["model"]


def two_stage_world(breaks, beta: float, top=lambda n: 0.5 / n):
    """Per N: exponential decay in C from above down to top(N) at breaks(N), then C^(−β)."""
    def risk(n, size, t, c):
        star, top_ = breaks(n), top(n)
        return top_ * np.exp(-3 * (c - star) / star) if c < star else top_ * (c / star) ** -beta
    return risk


def test_the_breakpoint_and_the_envelope_follow_the_planted_law():
    cfg = ScalingLawRecipe(**BREAK)
    good = verdicts_of(cfg, planted(cfg, two_stage_world(lambda n: 0.5 * sl.eq3_compute(cfg, n), 0.35)))
    assert good == {"compute": REPRODUCED, "breakpoint": REPRODUCED}
    # every N flattens at the same risk: the envelope is as flat as each curve (a larger N that reached a lower risk
    # would make the envelope fall even with flat curves: the frontier is the envelope's claim, not each N's)
    bad = verdicts_of(cfg, planted(cfg, two_stage_world(lambda n: 300.0 * n ** 2, 0.02, top=lambda n: 0.5)))
    assert bad == {"compute": NOT_REPRODUCED, "breakpoint": NOT_REPRODUCED}


def test_a_breakpoint_beyond_the_sweeps_compute_is_outside_the_regime():
    cfg = ScalingLawRecipe(**{**BREAK, "noise": 0.1, "clock": "steps"})  # Eq. (3) at ξ = 0.1: C* of 2.6e4 … 1.1e10
    got = verdicts_of(cfg, planted(cfg, two_stage_world(lambda n: 300.0 * n ** 2, 0.35)))
    assert got["breakpoint"].startswith(OUTSIDE) and "inside the compute range" in got["breakpoint"]
    assert got["compute"].startswith(OUTSIDE) and "stage II" in got["compute"]


def test_diverged_students_are_named_and_left_out():
    cfg = ScalingLawRecipe(**COUPLED)
    df = planted(cfg, theorem_world)
    deep = df.depth == 2
    df.loc[deep & (df.step >= 5), ["excess_risk", "train_loss"]] = np.nan
    laws = sl.fit_laws(cfg, df)
    model = laws["verdicts"].set_index("law").loc["model"]
    assert model.verdict == REPRODUCED and "9 of 18 students diverged (from step 5), left out" in model.measured
    assert len(laws["diverged"]) == 9 and (laws["diverged"].diverged_at == 5).all()
    df.loc[:, ["excess_risk", "train_loss"]] = np.inf
    everything = sl.fit_laws(cfg, df)["verdicts"]
    assert (everything.verdict == "diverged (lr too large?)").all()


def test_students_that_never_reach_the_teacher_are_outside_the_regime():
    """A sweep in the couplings whose risks barely move from their start (the class cannot reach the teacher at its
    ε) tests no single law: each says so, naming the worst point, even where its trend would pass."""
    cfg = ScalingLawRecipe(**COUPLED)
    got = verdicts_of(cfg, planted(cfg, lambda n, size, t, c: theorem_world(n, size, t, c) * (1 + 5 * (t == 0))
                                   if n == 8 else theorem_world(n, size, 0, c)))
    assert all(v.startswith(OUTSIDE) and "the students learn" in v for v in got.values()), got
    assert "R(T)/R(0) = " in got["data"]


def test_frontiers_that_never_fall_are_outside_the_regime():
    """Eq. (3)'s C* inside every N's compute range, but each risk barely moves from its start: the frontier and the
    breakpoint test nothing, and say so."""
    cfg = ScalingLawRecipe(**BREAK)
    got = verdicts_of(cfg, planted(cfg, lambda n, size, t, c: 0.5 * (1 + 0.3 * np.exp(-c / sl.eq3_compute(cfg, n)))))
    assert all(v.startswith(OUTSIDE) and "reach the teacher" in v for v in got.values()), got


def test_students_that_leave_the_lazy_regime_or_stay_above_the_noise_are_outside():
    cfg = ScalingLawRecipe(**COUPLED)
    wild = verdicts_of(cfg, planted(cfg, theorem_world, moved=3.0))
    assert all(v.startswith(OUTSIDE) and "the students stay lazy" in v and "they move up to 3" in v
               for v in wild.values()), wild
    loud = verdicts_of(cfg, planted(cfg, lambda *a: 100 * theorem_world(*a)))
    assert all("within 2× the noise level" in v for v in loud.values()), loud


def test_a_misspecified_teacher_is_outside_the_regime_by_name():
    cfg = ScalingLawRecipe(**{**COUPLED, "teacher": "transformer"})
    got = verdicts_of(cfg, planted(cfg, theorem_world))
    assert all("the teacher is in the students' class" in v and "misspecified" in v for v in got.values()), got


def test_a_student_that_diverges_is_retrained_at_the_fallback_steps():
    """At lr = 1e6 every student diverges; the fallbacks are tried in turn and the first finite one kept, every
    step tried recorded per student; the progress bar's units add up to its total whether fallbacks ran or not."""
    cfg, teacher, pools, test = _setup(dtype="float32", lr=1e6, lr_fallbacks=[1e5, 0.05], steps=20, checkpoints=4)
    for lr in (1e6, 0.05):
        units = []
        df = sl.train_with_fallbacks(cfg.model_copy(update={"lr": lr}), 8, 1, [(4, 1.0, 0), (8, 1.0, 1)], teacher,
                                     pools, test, lambda k=1: units.append(k))
        assert sum(units) == sl.passes(cfg) == 60
    assert np.isfinite(df.excess_risk).all() and set(df.lrs_tried) == {"0.05"}
    df = sl.train_with_fallbacks(cfg, 8, 1, [(4, 1.0, 0), (8, 1.0, 1)], teacher, pools, test)
    assert np.isfinite(df.excess_risk).all() and set(df.lrs_tried) == {"1e+06 100000 0.05"}
    assert np.allclose(df.lr, 0.05)
