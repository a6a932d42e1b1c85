"""The CLI: bad input ends in one line and exit code 2 with nothing written; a small run resumes."""


import pandas as pd
import pytest
import torch

from conftest import assert_one_line_error, invoke, no_results

TINY = ["--set", "d=8", "--set", "seq_len=8", "--set", "n_train=4", "--set", "n_test=2", "--set", "adam_steps=5",
        "--repeats", "2", "--max-log2m", "3"]


def test_missing_recipe_file(tmp_path):
    r = invoke("approx-error", tmp_path / "nope.yaml", "--out", tmp_path)
    assert_one_line_error(r, "not found", "nope.yaml")
    assert no_results(tmp_path)


def test_invalid_yaml_names_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("d: 64\nmethods: [fit-lstsq\nseed: 1\n")
    r = invoke("approx-error", bad, "--out", tmp_path)
    assert_one_line_error(r, "invalid YAML", "line 3", "column")
    assert no_results(tmp_path)


@pytest.mark.parametrize("content, words", [
    ("dd: 64\n", ["unknown recipe field", "dd"]),
    ("d: sixty-four\n", ["d", "integer", "sixty-four"]),
    ("weight_std: [1.0, abc]\n", ["weight_std.1", "abc"]),
    ("methods: [magic]\n", ["methods.0", "magic"]),
    ("protocol: released\nmax_log2m: 14\n", ["max_log2m must be at most 12"]),
])
def test_bad_recipe_fields(tmp_path, content, words):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(content)
    r = invoke("approx-error", recipe, "--out", tmp_path)
    assert_one_line_error(r, *words)
    assert no_results(tmp_path)


@pytest.mark.parametrize("value", [0, -3, 31])
def test_max_log2m_out_of_range(tmp_path, value):
    r = invoke("approx-error", "--max-log2m", value, "--out", tmp_path)
    assert_one_line_error(r, "max_log2m")
    assert no_results(tmp_path)


def test_cuda_asked_for_but_absent(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = invoke("approx-error", "--device", "cuda", "--out", tmp_path, *TINY)
    assert_one_line_error(r, "CUDA")
    assert no_results(tmp_path)


def test_output_folder_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    r = invoke("approx-error", "--out", blocker / "sub", *TINY)
    assert_one_line_error(r, "cannot write")
    assert no_results(tmp_path)


def test_unknown_override_and_malformed_set(tmp_path):
    assert_one_line_error(invoke("approx-error", "--set", "nosuch=1", "--out", tmp_path), "nosuch")
    assert_one_line_error(invoke("approx-error", "--set", "novalue", "--out", tmp_path), "key=value")


def test_dry_run_prints_plan_and_writes_nothing(tmp_path):
    r = invoke("approx-error", "--dry-run", "--out", tmp_path, *TINY)
    assert r.exit_code == 0, r.output
    assert "planned work" in r.stdout and "max_log2m" in r.stdout
    assert not (tmp_path / "approx-error").exists()


def test_small_run_writes_outputs_resumes_and_is_reproducible(tmp_path):
    r = invoke("approx-error", "--out", tmp_path / "a", *TINY)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "a" / "approx-error" / "default"
    for name in ("config.yaml", "results.csv", "summary.csv", "approx_error.png", "run.json", "timings.csv"):
        assert (folder / name).exists(), name
    results = pd.read_csv(folder / "results.csv")
    # 2 regimes × 2 repeats × (3 finite m × 7 methods + 4 methods at ∞), the no-prefix null among them
    assert len(results) == 2 * 2 * (3 * 7 + 4)
    assert results[["eq6_error", "relative_error"]].notna().all().all()

    again = invoke("approx-error", "--out", tmp_path / "a", *TINY)
    assert again.exit_code == 0
    run_json = pd.read_json(folder / "run.json", typ="series")
    assert run_json["skipped_points"] == len(results)
    pd.testing.assert_frame_equal(pd.read_csv(folder / "results.csv"), results)

    invoke("approx-error", "--out", tmp_path / "b", *TINY)
    other = (tmp_path / "b" / "approx-error" / "default" / "results.csv").read_text()
    assert other == (folder / "results.csv").read_text()

    bigger = invoke("approx-error", "--out", tmp_path / "a", *TINY[:-2], "--max-log2m", "4")
    assert bigger.exit_code == 0
    grown = pd.read_csv(folder / "results.csv")
    assert len(grown) == 2 * 2 * (4 * 7 + 4)
    pd.testing.assert_frame_equal(grown[grown.m != 16].reset_index(drop=True), results)

    changed = invoke("approx-error", "--out", tmp_path / "a", *TINY, "--set", "prefix_std=2.0")
    assert_one_line_error(changed, "different recipe", "prefix_std")


def test_help_explains_every_option():
    r = invoke("approx-error", "--help")
    for option in ("--max-log2m", "--repeats", "--protocol", "--seed", "--device", "--out", "--set", "--dry-run", "--fresh"):
        assert option in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--set", "t_batch_fraction=0"], ["t_batch_fraction"]),
    (["--set", "log2m=[]"], ["log2m"]),
    (["--parts", "prefix,bogus"], ["parts.1", "bogus"]),
    (["--set", "steps=1"], ["steps"]),
    (["--device", "cuda"], ["CUDA"]),
])
def test_convergence_bad_values(tmp_path, monkeypatch, args, words):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = invoke("convergence", "--out", tmp_path, *args)
    assert_one_line_error(r, *words)
    assert no_results(tmp_path)


def test_convergence_small_run_resumes(tmp_path):
    small = ["--set", "log2m=[3,5]", "--set", "steps=50", "--set", "t_depths=[1,2]", "--set", "t_widths=[8]",
             "--set", "t_steps=20", "--set", "t_n=3", "--out", tmp_path]
    r = invoke("convergence", *small)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "convergence" / "default"
    results = pd.read_csv(folder / "results.csv")
    assert sorted(results.part.unique()) == ["prefix", "stand-in", "transformer"] and len(results) == 5
    assert (folder / "convergence.png").exists() and (folder / "curves.csv").exists()
    again = invoke("convergence", *small)
    assert again.exit_code == 0
    assert pd.read_json(folder / "run.json", typ="series")["skipped_points"] == 5
