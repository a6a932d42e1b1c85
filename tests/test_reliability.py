"""Reliability: every bad input is one line, exit 2 and an unchanged file system; resuming after growing any
resumable field equals a fresh run; --fresh and killed writes touch only the run's own files; the report
survives malformed run folders; the same recipe gives the same CSV."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import RECIPES, assert_one_line_error, invoke, no_results, write_rte
from test_cli import TINY
from test_finetune import QUICK_DIGITS
from test_scaling_law import TINY_SETS as SCALING_TINY

CONVERGENCE_TINY = ["--set", "log2m=[3]", "--set", "steps=20", "--set", "t_depths=[1]", "--set", "t_widths=[8]",
                    "--set", "t_steps=10", "--set", "t_n=3"]
TIMING = ("train_seconds", "peak_mem_mb", "seconds")


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under root with a hash of its content."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _bad_recipe(tmp: Path) -> Path:
    path = tmp / "latin1.yaml"
    path.write_bytes(b"\xff\xfe\x00n_test: 2\n")
    return path


# (command, arguments, words the one line must hold); {tmp} is the test's folder
BAD_INPUTS = [
    ("approx-error", ["{latin1}"], ["UTF-8"]),
    ("approx-error", ["/proc/self/mem"], ["cannot read recipe"]),
    ("approx-error", ["{tmp}"], ["not found"]),
    ("approx-error", ["--set", "weight_std=[.nan]"], ["weight_std.0"]),
    ("approx-error", ["--set", "weight_std=[-1]"], ["weight_std.0", "greater than 0"]),
    ("approx-error", ["--set", "prefix_std=.inf"], ["prefix_std", "finite"]),
    ("approx-error", ["--set", "adam_lr=.inf"], ["adam_lr"]),
    ("approx-error", ["--set", "n_test=100000000000"], ["n_test"]),
    ("approx-error", ["--set", "d=1024", "--max-log2m", "30"], ["memory", "GiB"]),
    ("approx-error", ["--seed", "-1"], ["seed", "greater than or equal to 0"]),
    ("approx-error", ["--set", "name=../.."], ["name", "inside"]),
    ("approx-error", ["--set", "name=a/b"], ["name"]),
    ("approx-error", ["--device", "cuda"], ["CUDA"]),
    ("convergence", ["--set", "log2m=[-1]"], ["log2m.0"]),
    ("convergence", ["--set", "log2m=[60]"], ["log2m.0"]),
    ("convergence", ["--set", "t_depths=[0]"], ["t_depths.0"]),
    ("convergence", ["--set", "t_widths=[0]"], ["t_widths.0"]),
    ("convergence", ["--set", "lr=.inf"], ["lr"]),
    ("convergence", ["--seed", "-1"], ["seed"]),
    ("scaling-law", ["--set", "n_values=[0,8,16]"], ["n_values.0"]),
    ("scaling-law", ["--set", "widths=[0,8,16]"], ["widths.0"]),
    ("scaling-law", ["--seed", "-1"], ["seed"]),
    ("scaling-law", ["--set", "lr=.nan"], ["lr"]),
    ("scaling-law", ["--device", "cuda"], ["CUDA"]),
    ("finetune", ["{digits}", "--set", "train.lr=.inf"], ["train.lr"]),
    ("finetune", ["{digits}", "--seed", "-1"], ["seed"]),
    ("finetune", ["{digits}", "--set", "seeds=[0,-2]"], ["seeds.1"]),
    ("finetune", ["{digits}", "--device", "cuda"], ["CUDA"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: ntk, seed: -1}}]"], ["methods.0", "seed"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: lora, alpha: .inf}}]"], ["methods.0", "alpha"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: peft, peft_type: NOPE}}]"], ["methods.0", "unknown peft_type"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: peft, peft_type: IA3, rank: 3}}]"],
     ["methods.0", "IA3Config has no field 'rank'"]),
    ("finetune", ["{minilm}", "--set", "data.path={tmp}/nowhere"], ["data path not found"]),
    ("finetune", ["{minilm}", "--set", "data.path={rte}", "--set", "model.name_or_path={tmp}/no-model"],
     ["cannot be loaded"]),
    ("finetune", ["{minilm}", "--set", "data.path={rte}", "--set", "data.label_names=[yes, no]"], ["label"]),
    ("finetune", ["{minilm}", "--set", "data.path={rte}", "--set", "model.tokenizer={tmp}/no-tokenizer"],
     ["tokenizer"]),
    ("bench", ["--device", "tpu"], ["unknown device", "tpu"]),
    # the paths added since: SuperGLUE data, peft entries, adapter sizes, model configs, checkpoints (one fixture each)
    ("superglue", ["{slice}", "--set", "data.path={sg_latin1}"], ["task cb", "not UTF-8", "line 1"]),
    ("superglue", ["{slice}", "--set", "data.path={sg_unlabelled}"], ["task cb", "row 1 has no label"]),
    ("superglue", ["{slice}", "--set", "data.path={sg_broken}"], ["task cb", "cannot read train data"]),
    ("superglue", ["{slice}", "--set", "data.path={sg_folder}"], ["task cb", "train.jsonl is not a data file"]),
    ("superglue", ["{slice}", "--set", "data.path={sg}", "--set", "data.max_train={{cb: 2}}",
                   "--set", "selection.val_fraction=0.9"], ["task cb", "cannot be split"]),
    ("superglue", ["{slice}", "--set", "data.path={sg}", "--set",
                   "methods=[{{method: peft, peft_type: PROMPT_TUNING, num_virtual_tokens: 0, lrs: [0.1]}}]"],
     ["num_virtual_tokens must be at least 1"]),
    ("superglue", ["{slice}", "--set", "data.path={sg}", "--set",
                   "methods=[{{method: peft, peft_type: LORA, lora_dropout: .nan, lrs: [0.1]}}]"],
     ["lora_dropout", "finite"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: peft, peft_type: PROMPT_TUNING, num_virtual_tokens: abc}}]"],
     ["methods.0", "num_virtual_tokens", "valid integer"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: peft, peft_type: PROMPT_TUNING, num_virtual_tokens: 20}}]"],
     ["methods.0", "text model", "pixels"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: peft, peft_type: LORA, r: 0}}]"], ["LoraConfig.r", "at least 1"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: peft, peft_type: LORA, lora_alpha: .inf}}]"],
     ["lora_alpha", "finite"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: lora, target_modules: [nope]}}]"], ["methods.0", "'nope'"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: peft, peft_type: IA3, target_modules: [nope], "
                                       "feedforward_modules: [nope]}}]"], ["methods.0", "target_modules", "'nope'"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: ptuning-v2, prefix_length: 100000000}}]"],
     ["methods.0", "GiB", "lower its sizes"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: lora, r: 10000000}}]"], ["methods.0", "GiB"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: ntk, init: prefix, prefix_length: 100000000}}]"],
     ["methods.0", "GiB"]),
    ("finetune", ["{digits}", "--set", "methods=[{{method: ntk, feature_map: favor, num_features: 100000000}}]"],
     ["methods.0", "GiB"]),
    ("finetune", ["{digits}", "--set", "model.config.num_hidden_layers=64", "--set", "model.config.hidden_size=65536"],
     ["GiB", "parameters"]),
    ("finetune", ["{minilm}", "--set", "data.path={rte_latin1}"], ["not UTF-8"]),
    ("finetune", ["{chatglm}", "--device", "cpu", "--set", "model.name_or_path={glm_cut}"], ["cut short"]),
    ("finetune", ["{chatglm}", "--device", "cpu", "--set", "model.name_or_path={glm_empty}"], ["is empty"]),
    ("finetune", ["{chatglm}", "--device", "cpu", "--set", "model.name_or_path={glm_header}"], ["not a safetensors file"]),
    ("finetune", ["{chatglm}", "--device", "cpu", "--set", "model.name_or_path={glm_none}"], ["no model.safetensors"]),
    ("finetune", ["{chatglm}", "--device", "cpu", "--set", "model.name_or_path={glm_shard}"], ["shard", "is not in"]),
    ("finetune", ["{chatglm}", "--device", "cpu", "--set", "model.name_or_path={glm_layers}"], ["num_layers", "positive integer"]),
    ("finetune", ["{chatglm}", "--device", "cpu", "--set", "model.name_or_path={glm_sizes}"], ["dense_h_to_4h", "config.json says"]),
    ("approx-error", ["--protocol", "released", "--max-log2m", "12", "--set", "seq_len=65536"], ["GiB"]),
]


def _superglue_variant(tmp: Path, name: str) -> Path:
    """The small official-layout SuperGLUE folder with CB's train.jsonl broken one way."""
    from test_superglue import write_superglue

    root = write_superglue(tmp / name)
    train = root / "CB" / "train.jsonl"
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    if name == "sg_latin1":
        train.write_bytes(b"\xff\xfe" + train.read_bytes())
    elif name == "sg_unlabelled":
        train.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "label"}) + "\n" for r in rows))
    elif name == "sg_broken":
        train.write_text(train.read_text() + "{not json\n")
    elif name == "sg_folder":
        train.unlink()
        train.mkdir()
    return root


def _chatglm_variant(tmp: Path, name: str) -> Path:
    """A tiny ChatGLM3 checkpoint in the hub layout, broken one way."""
    from test_chatglm3 import write_chatglm3

    config = {"glm_layers": {"num_layers": -2}, "glm_sizes": {"ffn_hidden_size": 64}}.get(name, {})
    folder = write_chatglm3(tmp / name, "sharded" if name == "glm_shard" else "safetensors", **config)
    weights = folder / "model.safetensors"
    if name == "glm_cut":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif name == "glm_empty":
        weights.write_bytes(b"")
    elif name == "glm_header":
        weights.write_bytes(weights.read_bytes()[:50])
    elif name == "glm_none":
        weights.unlink()
    elif name == "glm_shard":
        next(folder.glob("model-00001-*")).unlink()
    return folder


class Places(dict):
    """The test's places by name, each fixture built only when an argument names it."""

    def __init__(self, tmp: Path):
        super().__init__(tmp=tmp, digits=RECIPES / "digits_vit.yaml", minilm=RECIPES / "minilm_rte.yaml",
                         slice=RECIPES / "superglue_slice.yaml", chatglm=RECIPES / "chatglm_rte.yaml")
        self.tmp = tmp

    def __missing__(self, key: str) -> Path:
        if key == "latin1":
            made = _bad_recipe(self.tmp)
        elif key == "rte":
            made = write_rte(self.tmp / "rte", "superglue")
        elif key == "rte_latin1":
            made = write_rte(self.tmp / "rte_latin1", "superglue")
            (made / "train.jsonl").write_bytes(b"\xe9" + (made / "train.jsonl").read_bytes())
        elif key.startswith("sg"):
            made = _superglue_variant(self.tmp, key)
        else:
            made = _chatglm_variant(self.tmp, key)
        self[key] = made
        return made


@pytest.mark.parametrize("command, args, words", BAD_INPUTS, ids=[f"{c}-{' '.join(a)}" for c, a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_leaves_the_file_system_as_it_was(tmp_path, monkeypatch, command, args,
                                                                           words):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    places = Places(tmp_path)
    args = [a.format_map(places) for a in args]  # the fixtures are made before the snapshot
    before = snapshot(tmp_path)
    r = invoke(command, *args, "--out", tmp_path / "out")
    assert_one_line_error(r, *words)
    assert snapshot(tmp_path) == before


def test_usage_errors_get_typers_usage_box_and_exit_2(tmp_path):
    for args in (["approx-error", "--seed", "abc"], ["approx-error", "--no-such-flag"], ["finetune"]):
        r = invoke(*args, "--out", tmp_path / "out")
        assert r.exit_code == 2 and "Usage:" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


def _results(folder: Path, keys: list[str]) -> pd.DataFrame:
    df = pd.read_csv(folder / "results.csv")
    return df.drop(columns=[c for c in TIMING if c in df]).sort_values(keys, kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("start, grown", [
    (["--set", "weight_std=[0.125]"], ["--set", "weight_std=[1.0, 0.125]"]),
    (["--repeats", "1"], ["--repeats", "2"]),
    (["--max-log2m", "2"], ["--max-log2m", "3"]),
    (["--set", "methods=[fit-lstsq]"], ["--set", "methods=[compress-taylor2, fit-lstsq, infinite-limit]"]),
    (["--set", "include_infinity=false"], ["--set", "include_infinity=true"]),
])
def test_approx_error_resume_after_growing_equals_a_fresh_run(tmp_path, start, grown):
    base = [*TINY, "--repeats", "2", "--max-log2m", "3"]
    assert invoke("approx-error", *base, *start, "--out", tmp_path / "grown").exit_code == 0
    assert invoke("approx-error", *base, *grown, "--out", tmp_path / "grown").exit_code == 0
    assert invoke("approx-error", *base, *grown, "--out", tmp_path / "fresh").exit_code == 0
    keys = ["weight_std", "repeat", "m", "method"]
    a, b = (_results(tmp_path / k / "approx-error" / "default", keys) for k in ("grown", "fresh"))
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("field, start, grown, sweeps", [("n_values", "[4, 8, 16]", "[4, 8, 16, 32]", "[data]"),
                                                         ("widths", "[4, 8, 16]", "[4, 8, 16, 32]", "[model]"),
                                                         ("seeds", "1", "2", "[data]"),
                                                         ("depths", "[1]", "[1, 2]", "[model]"),
                                                         ("sweeps", "[data]", "[data, time]", None)])
def test_scaling_law_resume_after_growing_equals_a_fresh_run(tmp_path, field, start, grown, sweeps):
    base = [*SCALING_TINY, "--set", "steps=12", "--set", "depths=[1, 2]" if field != "depths" else "depths=[1]",
            *(["--set", f"sweeps={sweeps}"] if sweeps else [])]
    for out, value in (("grown", start), ("grown", grown), ("fresh", grown)):
        r = invoke("scaling-law", *base, "--set", f"{field}={value}", "--out", tmp_path / out)
        assert r.exit_code == 0, r.output
    keys = ["n", "width", "depth", "seed", "step"]
    a, b = (_results(tmp_path / k / "scaling-law" / "default", keys) for k in ("grown", "fresh"))
    # a student's data, init and batches are keyed by (N, seed, width, depth); what growing a grid can still
    # change is float32 rounding, where a group's batched kernels (per-row matmuls, the risk's vmap) round differently
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-6, atol=0)


@pytest.mark.parametrize("field, start, grown", [("log2m", "[3]", "[3, 4]"), ("t_widths", "[8]", "[8, 16]"),
                                                 ("t_depths", "[1]", "[1, 2]"), ("seeds", "1", "2"),
                                                 ("parts", "[prefix]", "[prefix, transformer, stand-in]")])
def test_convergence_resume_after_growing_equals_a_fresh_run(tmp_path, field, start, grown):
    for out, value in (("grown", start), ("grown", grown), ("fresh", grown)):
        r = invoke("convergence", *CONVERGENCE_TINY, "--set", f"{field}={value}", "--out", tmp_path / out)
        assert r.exit_code == 0, r.output
    keys = ["part", "depth", "m", "seed"]
    a, b = (_results(tmp_path / k / "convergence" / "default", keys) for k in ("grown", "fresh"))
    pd.testing.assert_frame_equal(a, b)


def test_finetune_is_repeatable_and_resume_after_growing_equals_a_fresh_run(tmp_path):
    """The same recipe and seeds give the same CSV (timing and memory columns aside), and growing seeds
    and methods adds rows without changing the old ones: every row of the grown run was trained in another process
    call than the fresh run's same row, so their equality shows both."""
    quick = QUICK_DIGITS[:-4]  # without its seeds and methods
    small = ["--set", "seeds=[0]", "--set", "methods=[{method: ntk}]"]
    big = ["--set", "seeds=[0, 1]", "--set", "methods=[{method: ntk}, {method: lora, r: 2}]"]
    for out, sets in (("grown", small), ("grown", big), ("fresh", big)):
        r = invoke("finetune", RECIPES / "digits_vit.yaml", *quick, *sets, "--out", tmp_path / out)
        assert r.exit_code == 0, r.output
    keys = ["method", "seed", "epoch"]
    grown, fresh = (_results(tmp_path / k / "finetune" / "digits_vit", keys) for k in ("grown", "fresh"))
    assert len(fresh) == 2 * 2 * fresh.epoch.nunique()  # two methods × two seeds, every epoch
    pd.testing.assert_frame_equal(grown, fresh)


def test_fresh_removes_only_the_runs_own_files_and_temp_files_are_swept(tmp_path):
    out = tmp_path / "out"
    assert invoke("approx-error", *TINY, "--out", out).exit_code == 0
    folder = out / "approx-error" / "default"
    (folder / "my-notes.txt").write_text("keep me")
    (folder / ".hidden").write_text("keep me too")
    (folder / ".ntk-tmp-results.csv.k3j2.csv").write_text("")  # what a write killed mid-way leaves
    r = invoke("approx-error", *TINY, "--set", "prefix_std=2.0", "--fresh", "--out", out)
    assert r.exit_code == 0, r.output
    assert (folder / "my-notes.txt").read_text() == "keep me" and (folder / ".hidden").exists()
    assert not list(folder.glob(".ntk-tmp-*"))
    assert json.loads((folder / "run.json").read_text())["skipped_points"] == 0
    assert "prefix_std: 2.0" in (folder / "config.yaml").read_text()


def test_a_run_that_failed_before_measuring_does_not_block_the_corrected_recipe(tmp_path, monkeypatch):
    """A failure after the run folder exists (here a non-finite loss) leaves no results, so the corrected
    recipe is not refused as 'a different recipe'."""
    data = write_rte(tmp_path / "rte", "superglue")
    args = [RECIPES / "minilm_rte.yaml", "--set", f"data.path={data}", "--device", "cpu", "--set", "seeds=[0]",
            "--set", "train.epochs=1", "--set", "train.batch_size=2", "--set", "data.max_train_samples=8",
            "--out", tmp_path / "out"]
    r = invoke("finetune", *args, "--set", "methods=[{method: ntk, lr: 1.0e+30}]")
    assert_one_line_error(r, "method ntk, seed 0", "step")
    assert not (tmp_path / "out" / "finetune" / "minilm_rte" / "results.csv").exists()
    r = invoke("finetune", *args, "--set", "methods=[{method: ntk}]")
    assert r.exit_code == 0, r.output


def test_report_never_fails_on_malformed_run_folders(tmp_path):
    from test_report import fixture_tree

    root = fixture_tree(tmp_path / "outputs")
    bad = {"approx-error/latin1": {"summary.csv": b"m,weight_std\n\xff\xfe,1\n", "run.json": b"{}"},
           "approx-error/text": {"summary.csv": b"weight_std,m,log2m,method,eq6_error_mean,relative_error_mean\n"
                                                b"0.1,two,1,compress-taylor2,abc,x\n", "run.json": b"{}"},
           "convergence/list-json": {"results.csv": b"part,m\nprefix,2\n", "run.json": b"[]"},
           "convergence/columns": {"results.csv": b"part,m,loss_0,loss_final,rate_fit\nprefix,2,1,1,1\nprefix,4,1,1,1\n",
                                   "run.json": b"{}"},
           "finetune/text": {"summary.csv": b"method,accuracy_mean\nntk,high\n", "run.json": b"{}"},
           "finetune/ragged": {"summary.csv": b'method,accuracy_mean\n"ntk,0.5\n', "run.json": b"{}"},
           "scaling-law/no-columns": {"summary.csv": b"x\n1\n", "run.json": b"{\"device\": 3}"}}
    for folder, files in bad.items():
        (root / folder).mkdir(parents=True)
        for name, content in files.items():
            (root / folder / name).write_bytes(content)
    r = invoke("report", root)
    assert r.exit_code == 0, r.output
    md = (root / "report.md").read_text()
    for folder in bad:
        command, name = folder.split("/")
        assert name in md or folder in md, folder  # each malformed run is named in a note
    assert "reproduced" in md


def test_an_unreachable_hub_is_one_line_whatever_its_clients_log(tmp_path, monkeypatch, capfd):
    """Offline, the hub client logs a line per retry and datasets a line per parse error, each to the process's
    stderr; the command silences them, so the user sees its one line."""
    import datasets
    from huggingface_hub.utils import logging as hub_logging

    def unreachable(*args, **kwargs):
        hub_logging.get_logger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
        datasets.utils.logging.get_logger("datasets.builder").error("Failed to load JSON from file")
        raise ConnectionError("Couldn't reach 'aps/super_glue' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    r = invoke("finetune", RECIPES / "minilm_rte.yaml", "--device", "cpu", "--out", tmp_path)
    assert_one_line_error(r, "not reachable", "Couldn't reach")
    logged = capfd.readouterr().err
    assert "Retrying" not in logged and "Failed to load" not in logged, logged


def test_a_scaling_law_fit_that_diverges_is_a_result_not_a_crash(tmp_path):
    """At lr 1e6 every student diverges: each law's verdict says so (never "inconclusive"), diverged.csv names every
    student with its step, and the run ends with exit 0, its CSVs and its figure."""
    r = invoke("scaling-law", *SCALING_TINY, "--set", "lr=1e6", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "scaling-law" / "default"
    fits, claims = pd.read_csv(folder / "fits.csv"), pd.read_csv(folder / "claims.csv")
    assert (fits.form == "no finite fit").all() and (fits.parameter == "every student diverged").all()
    assert (claims.verdict == "diverged (lr too large?)").all(), claims.verdict
    assert claims.measured.str.startswith("all ").all() and claims.measured.str.contains("students diverged").all()
    lost = pd.read_csv(folder / "diverged.csv")
    assert len(lost) == len(pd.read_csv(folder / "results.csv")[["n", "width", "depth", "epsilon", "seed"]]
                            .drop_duplicates()) and (lost.diverged_at >= 1).all()
    assert "diverged" in r.stderr
    assert (folder / "scaling_law.png").stat().st_size > 10_000


def test_a_convergence_run_that_diverges_stops_with_one_line(tmp_path):
    """A step far past the stability limit 2 makes the prefix loss infinite: one line naming the point, the step and
    the field, exit 2, and nothing recorded for it."""
    r = invoke("convergence", *CONVERGENCE_TINY, "--set", "parts=[prefix]", "--set", "lr=1e30", "--out", tmp_path)
    assert_one_line_error(r, "prefix (depth 1, m 8, seed 0) diverged at step", "lr = 1e+30 is too large")
    assert no_results(tmp_path)


LIMITED = """import resource, sys
import psutil
import ntkcli.recipes
if sys.argv[1] == "no-estimate":  # an estimate that lets everything through: the allocator has the last word
    ntkcli.recipes.beyond_memory = lambda need, device: None
limit = psutil.Process().memory_info().vms + 2**30  # 1 GiB more than the process has mapped (ntkcli loaded)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from ntkcli.cli import app
sys.argv = ["ntk", *sys.argv[2:]]
app()
"""


def _under_address_limit(tmp_path, mode: str, *args) -> subprocess.CompletedProcess:
    script = tmp_path / "limited.py"
    script.write_text(LIMITED)
    return subprocess.run([sys.executable, str(script), mode, *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("widths, kept", [("[8,16,16384]", {8, 16}), ("[65000,65100,65200]", None)])
def test_memory_under_ulimit_v_is_one_line_from_the_estimate_or_the_allocator(tmp_path, widths, kept):
    """Under RLIMIT_AS the estimate compares against what the limit leaves (not the machine's RAM); with the estimate
    switched off, the allocator's failure is one line naming the stage, the bytes and the limit. Groups measured
    before it stay in results.csv; a run that measured nothing leaves no folder."""
    sets = ["--set", f"widths={widths}", "--set", "n_values=[8,16,32]", "--set", "base_n=8", "--set",
            f"base_width={widths[1:].split(',')[0]}", "--set", "steps=10", "--set", "seeds=1", "--set", "battery=10",
            "--out", tmp_path / "out"]
    estimate = _under_address_limit(tmp_path, "estimate", "scaling-law", *sets)
    assert estimate.returncode == 2, estimate.stderr
    lines = [ln for ln in estimate.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "left under the process's address-space limit (ulimit -v" in lines[0], lines
    assert not (tmp_path / "out").exists()
    allocator = _under_address_limit(tmp_path, "no-estimate", "scaling-law", *sets)
    assert allocator.returncode == 2, allocator.stderr
    last = [ln for ln in allocator.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith("error: out of memory while train") and "GiB asked for" in last and "ulimit -v" in last
    assert "Traceback" not in allocator.stderr
    folder = tmp_path / "out" / "scaling-law" / "default"
    if kept is None:
        assert not folder.exists()
    else:
        assert set(pd.read_csv(folder / "results.csv").width) == kept and not (folder / "run.json").exists()


KILLED = ["--set", "transformer={d: 4, seq_len: 3}", "--set", "noise=0.1", "--set", "n_values=[2,3,4]", "--set",
          "widths=[4,8,16]", "--set", "depths=[1]", "--set", "base_n=3", "--set", "base_width=16", "--set",
          "base_depth=1", "--set", "epsilon_rule=xi/N", "--set", "lr_rule=epsilon", "--set", "model_zeta=0.25",
          "--set", "steps=400", "--set", "checkpoints=10", "--set", "seeds=2", "--set", "teacher_width=16",
          "--set", "n_test=32", "--set", "bootstrap=10", "--set", "dtype=float64", "--set", "battery=10"]


@pytest.mark.parametrize("delay", [0.3])
def test_a_coupled_scaling_law_run_killed_by_sigkill_resumes_to_the_fresh_runs_csv(tmp_path, delay):
    """kill -9 a run of a coupled sweep (ε = ξ/N, ε = ξ/M^ζ) after the first group of students is saved (and a
    moment more), resume it on 2 local workers: results.csv equals a fresh serial run's, and the laws are fitted
    from it."""
    killed = tmp_path / "killed" / "scaling-law" / "default" / "results.csv"
    child = subprocess.Popen([sys.executable, "-c", "from ntkcli.cli import app; app()", "scaling-law", *KILLED,
                              "--out", str(tmp_path / "killed")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1200):
        if killed.exists() or child.poll() is not None:
            break
        time.sleep(0.1)
    time.sleep(delay)
    child.kill()
    child.wait()
    assert killed.exists() and not (killed.parent / "run.json").exists(), "the run ended before it was killed"
    assert invoke("scaling-law", *KILLED, "--out", tmp_path / "killed", "--workers", "2").exit_code == 0
    assert invoke("scaling-law", *KILLED, "--out", tmp_path / "fresh").exit_code == 0
    a, b = (pd.read_csv(tmp_path / k / "scaling-law" / "default" / "results.csv") for k in ("killed", "fresh"))
    pd.testing.assert_frame_equal(a, b)
    assert (killed.parent / "claims.csv").exists()


@pytest.mark.parametrize("limit, used, version", [(2 * 2**30, 2**29, 2), (3 * 2**30, 2**30, 1)])
def test_a_cgroup_memory_limit_binds_the_estimate(tmp_path, monkeypatch, limit, used, version):
    """A container's cgroup limit (v2: memory.max, v1: memory/memory.limit_in_bytes) less its usage is what a run
    may use; "max" (v2) or v1's huge number is no limit."""
    from ntkcli import memory

    folder = tmp_path if version == 2 else tmp_path / "memory"
    folder.mkdir(exist_ok=True)
    names = ("memory.max", "memory.current") if version == 2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    (folder / names[0]).write_text(f"{limit}\n")
    (folder / names[1]).write_text(f"{used}\n")
    monkeypatch.setattr(memory, "CGROUP", tmp_path)
    have, what = memory.available()
    assert have == limit - used and "cgroup" in what
    assert "left under the cgroup's memory limit" in memory.beyond_memory(have + 1, "cpu")
    assert memory.beyond_memory(have, "cpu") is None
    (folder / names[0]).write_text("max\n" if version == 2 else f"{2**63 - 4096}\n")
    assert "cgroup" not in memory.available()[1]


def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT's default action in the child, as at a terminal: a test suite started in the background (or by a CI
    runner) may ignore SIGINT, and an ignored signal stays ignored across exec, so Python would never raise
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stopped(path, out: Path, results: Path, rows: int, stop) -> None:
    """Start a superglue run on 2 local workers, `stop` its driver (a signal) once results.csv holds more than `rows`
    rows; it must have been mid-run, and none of its workers may outlive it."""
    child = subprocess.Popen([sys.executable, "-c", "from ntkcli.cli import app; app()", "superglue", str(path),
                              "--out", str(out), "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=_ctrl_c_as_at_a_terminal)
    for _ in range(3000):
        if (results.exists() and len(results.read_text().splitlines()) > rows) or child.poll() is not None:
            break
        time.sleep(0.1)
    workers = _children(child.pid)
    child.send_signal(stop)
    child.wait(timeout=120)
    assert results.exists() and not (results.parent / "run.json").exists(), "the run ended before it was stopped"
    assert workers and _gone(workers), "a worker outlived its driver"


def test_a_superglue_run_on_workers_stopped_by_ctrl_c_then_sigkill_resumes_to_the_fresh_runs_csv(tmp_path):
    """A superglue run scored by 2 folds (plus the official split) on 2 local workers: Ctrl-C (SIGINT) once six runs
    are saved, resumed and killed with kill -9 once ten are, then resumed to the end on 2 workers: results.csv and
    predictions.csv equal a fresh serial run's row for row (the timings aside; every point at 1 thread), the tables
    are written, and no worker outlives its driver either time."""
    from test_superglue import recipe, write_superglue

    methods = [{"method": "fft", "lrs": [0.0001]}, {"method": "ntk", "lrs": [0.001, 0.01]}]
    path = recipe(tmp_path, write_superglue(tmp_path / "sg"), data={"folds": {"cb": 2}}, seeds=[0], methods=methods,
                  threads=1)
    killed = tmp_path / "killed" / "superglue" / "sg" / "results.csv"
    _stopped(path, tmp_path / "killed", killed, 6, signal.SIGINT)
    _stopped(path, tmp_path / "killed", killed, 10, signal.SIGKILL)
    assert invoke("superglue", path, "--out", tmp_path / "killed", "--workers", "2").exit_code == 0
    assert invoke("superglue", path, "--out", tmp_path / "fresh").exit_code == 0
    timings = ["train_seconds", "examples_per_s", "peak_mem_mb"]
    for name in ("results.csv", "predictions.csv"):
        a, b = (pd.read_csv(tmp_path / k / "superglue" / "sg" / name).drop(columns=timings, errors="ignore")
                for k in ("killed", "fresh"))
        pd.testing.assert_frame_equal(a, b)
    assert set(pd.read_csv(killed).fold) == {"val", "cv0", "cv1"}
    assert (killed.parent / "claims.csv").exists() and (killed.parent / "summary.csv").exists()


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _gone(pids: list[int], wait: float = 30.0) -> bool:
    """Whether every process of `pids` has ended within `wait` seconds."""
    def alive(pid: int) -> bool:
        try:
            return "zombie" not in Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False

    for _ in range(int(wait * 10)):
        if not any(map(alive, pids)):
            return True
        time.sleep(0.1)
    return False
