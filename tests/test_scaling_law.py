"""Scaling-law fits recover known laws; the sweep counts compute exactly; students are vectorised honestly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from ntkcli import fitting
from ntkcli.experiments import scaling_law as sl
from ntkcli.experiments.scaling_law import ScalingLawRecipe
from ntkcli.theory import transformer
from conftest import assert_one_line_error, invoke, no_results

TINY = dict(transformer={"d": 4, "seq_len": 3}, n_values=[4, 8, 16], widths=[4, 8, 16], depths=[1, 2], base_n=8, base_width=8,
            steps=40, checkpoints=12, seeds=2, teacher_width=16, n_test=32, bootstrap=10)
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


def test_exponential_fit_recovers_rate_and_floor():
    rng = np.random.default_rng(3)
    t = np.repeat(np.linspace(0, 2000, 20), 3)
    fit = fitting.bootstrap(fitting.fit_exponential, t, noisy(0.05 + 2.0 * np.exp(-3e-3 * t), rng), n=100)
    assert fit.lower["r"] <= 3e-3 <= fit.upper["r"]
    assert fit.lower["E"] <= 0.05 <= fit.upper["E"]
    assert fit.loss < fitting.fit_power_law(t[t > 0], noisy(0.05 + 2.0 * np.exp(-3e-3 * t[t > 0]), rng)).loss * 10


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
    teacher = sl.Teacher(cfg, torch.float64)
    pools, test = sl.data_pools(cfg, teacher, list(range(cfg.seeds)), torch.float64)
    return cfg, teacher, pools, test


def test_the_teacher_has_zero_excess_risk_and_labels_carry_the_noise():
    cfg, teacher, pools, test = _setup(noise=0.3, dtype="float64")
    assert sl.excess_risk(transformer.forward(teacher.params, teacher.frozen, test[0], teacher.shape), test[1]) == 0
    X, Y = pools[0]
    residual = Y - teacher(X)
    assert abs(residual.std().item() - 0.3) < 0.03  # Y = F*(X) + ξ·G
    rms = X.pow(2).mean(-1)
    assert torch.allclose(rms, torch.ones_like(rms))  # RMS-normalised rows


def test_compute_is_counted_exactly():
    cfg, teacher, pools, test = _setup(dtype="float64")
    df = sl.train_group(cfg, 8, 2, [(4, 0), (16, 1)], teacher, pools, test)
    assert sorted(df.step.unique()) == sl.checkpoint_steps(cfg.steps, cfg.checkpoints)
    M = 2 * (8 * cfg.transformer.d + cfg.transformer.d ** 2)
    assert (df.model_size == M).all()
    assert (df.batch == df.n.map(lambda n: max(1, round(cfg.batch_fraction * n)))).all()
    assert (df.compute == M * df.step * df.batch).all()
    risk = df.pivot_table(index="step", columns="n", values="excess_risk")
    assert (risk.iloc[-1] < risk.iloc[0]).all()  # SGD learns the teacher


def test_a_student_trains_the_same_alone_and_in_a_vectorised_group():
    cfg, teacher, pools, test = _setup(dtype="float64")
    group = sl.train_group(cfg, 8, 1, [(4, 0), (8, 1), (16, 0)], teacher, pools, test)
    alone = sl.train_group(cfg, 8, 1, [(8, 1)], teacher, pools, test)
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
    assert (folder / "scaling_law.png").stat().st_size > 10_000
    again = invoke("scaling-law", *TINY_SETS, "--out", tmp_path)
    assert again.exit_code == 0 and "train" not in again.stderr  # nothing left to train
    assert pd.read_csv(folder / "results.csv").equals(results)


@pytest.mark.parametrize("sets, words", [
    (["base_n=5"], ["base_n", "n_values"]),
    (["sweeps=[time, speed]"], ["sweeps.1", "speed"]),
    (["noise=-1"], ["noise", "greater than or equal to 0"]),
    (["n_values=[8]"], ["n_values", "at least 3"]),
])
def test_bad_scaling_law_recipes_exit_2_with_one_line(tmp_path, sets, words):
    args = [a for s in sets for a in ("--set", s)]
    r = invoke("scaling-law", *args, "--out", tmp_path)
    assert_one_line_error(r, *words)
    assert no_results(tmp_path)
