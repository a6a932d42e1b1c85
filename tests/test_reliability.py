"""Reliability: every bad input is one line, exit 2 and an unchanged file system; resuming after growing any
resumable field equals a fresh run; --fresh and killed writes touch only the run's own files; the report
survives malformed run folders; the same recipe gives the same CSV."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import RECIPES, assert_one_line_error, invoke, write_rte
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
]


@pytest.mark.parametrize("command, args, words", BAD_INPUTS, ids=[f"{c}-{' '.join(a)}" for c, a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_leaves_the_file_system_as_it_was(tmp_path, monkeypatch, command, args,
                                                                           words):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    rte = write_rte(tmp_path / "rte", "superglue")
    places = {"tmp": tmp_path, "latin1": _bad_recipe(tmp_path), "rte": rte,
              "digits": RECIPES / "digits_vit.yaml", "minilm": RECIPES / "minilm_rte.yaml"}
    before = snapshot(tmp_path)
    r = invoke(command, *(a.format(**places) for a in args), "--out", tmp_path / "out")
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
    and methods adds rows without changing the old ones."""
    quick = QUICK_DIGITS[:-4]  # without its seeds and methods
    small = ["--set", "seeds=[0]", "--set", "methods=[{method: ntk}]"]
    big = ["--set", "seeds=[0, 1]", "--set", "methods=[{method: ntk}, {method: lora, r: 2}]"]
    for out, sets in (("grown", small), ("grown", big), ("fresh", big), ("again", big)):
        r = invoke("finetune", RECIPES / "digits_vit.yaml", *quick, *sets, "--out", tmp_path / out)
        assert r.exit_code == 0, r.output
    keys = ["method", "seed", "epoch"]
    grown, fresh, again = (_results(tmp_path / k / "finetune" / "digits_vit", keys) for k in ("grown", "fresh", "again"))
    pd.testing.assert_frame_equal(fresh, again)
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
