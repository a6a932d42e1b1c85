"""`ntk report` on fixture output trees: every section renders, missing runs say so, broken runs don't crash."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ntkcli import claims, report
from conftest import assert_one_line_error, invoke


def _run(outputs: Path, command: str, name: str, files: dict[str, pd.DataFrame], figure: str | None = None) -> Path:
    folder = outputs / command / name
    folder.mkdir(parents=True)
    for file, df in files.items():
        df.to_csv(folder / file, index=False)
    if figure:
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([1, 2], [2, 1])
        fig.savefig(folder / figure)
        plt.close(fig)
    (folder / "run.json").write_text(json.dumps({"device": "cpu", "wall_seconds": 12.0}))
    return folder


def fixture_tree(root: Path, growth: float = 99.0, ntk_vit: float = 91.0, exponential: bool = True) -> Path:
    ms = 2.0 ** np.arange(1, 19)
    approx = pd.DataFrame({"weight_std": 0.125, "m": ms, "log2m": np.log2(ms), "method": "compress-taylor2",
                           "eq6_error_mean": 1e-6 * growth ** (np.arange(18) / 17), "eq6_error_std": 0.0,
                           "relative_error_mean": 0.1, "relative_error_std": 0.0, "repeats": 3})
    null = approx.assign(method="no-prefix", relative_error_mean=0.9, eq6_error_mean=1e-3)
    _run(root, "approx-error", "approx_error", {"summary.csv": pd.concat([approx, null])}, "approx_error.png")
    prefix = [{"part": "prefix", "depth": 1, "m": m, "seed": seed, "loss_0": 1e3, "loss_final": 1e-3 * 16 / m,
               "rate_fit": 1e-3, "rate_theory": 1.1e-3, "kernel_drift": (1 + 0.05 * seed) * m ** -0.5}
              for m in (16, 256, 4096) for seed in range(3)]
    # Thm 5.5 in the kernel regime: converging at the kernel's rate, or stalling at a floor
    kernel = [{"part": "transformer", "depth": n, "m": 64, "seed": 0, "loss_0": 5.0, "t_steps": 3000,
               "loss_final": 5e-9 if exponential else 0.5, "rate_fit": 0.01, "rate_late": 0.01 if exponential else 1e-5,
               "rate_kernel": 0.011, "singular": False, "kernel_drift": 0.02} for n in (1, 2)]
    _run(root, "convergence", "convergence", {"results.csv": pd.DataFrame(prefix + kernel)}, "convergence.png")
    table = lambda accs: pd.DataFrame({"method": list(accs), "accuracy_mean": [a / 100 for a in accs.values()],  # noqa: E731
                                       "accuracy_std": 0.01, "trainable_params": 100, "trainable_pct": 1.0,
                                       "train_seconds": 3.0})
    _run(root, "finetune", "vit_cifar100", {"summary.csv": table({"FFT-ViT": 70.0, "NTK-ViT": ntk_vit})})
    _run(root, "finetune", "digits_vit", {"summary.csv": table({"ntk": 46.0, "fft": 93.0})})
    verdicts = pd.DataFrame([{"law": "data", "theorem": "Thm 7.2 data law", "theory": "α ≥ 1",
                              "measured": "α = 1.06 [0.95, 1.52]", "verdict": "reproduced"}])
    _run(root, "scaling-law", "scaling_law", {"summary.csv": verdicts}, "scaling_law.png")
    return root


def verdicts(sections) -> dict[str, str]:
    return {c.claim: c.verdict for s in sections for c in s.claims}


def test_every_section_renders_with_its_figures(tmp_path):
    outputs = fixture_tree(tmp_path / "outputs")
    r = invoke("report", outputs)
    assert r.exit_code == 0, r.output
    md, page = (outputs / "report.md").read_text(), (outputs / "report.html").read_text()
    for command in ("approx-error", "convergence", "finetune", "scaling-law"):
        assert f"`ntk {command}`" in md and f"ntk {command}" in page
    assert page.count("data:image/png;base64,") == 3  # self-contained: every figure embedded
    assert "](approx-error/approx_error/approx_error.png)" in md
    assert "finetune/digits_vit" in md and "46.00 ± 1.00" in md  # the CPU stand-in's table
    assert "reproduction report" in r.stdout
    counts = md.splitlines()[2].split("Verdicts: ")[1]
    assert counts in page and "<h2>Contents</h2>" in page  # the page opens with the counts and a contents list
    assert all(f'href="#{c}"' in page and f'id="{c}"' in page for c in ("approx-error", "scaling-law"))


def test_verdicts_follow_the_measurements(tmp_path):
    got = verdicts(report.build(fixture_tree(tmp_path / "a")))
    assert got["NTK-Attention's error grows only ~100× while m grows ~131,000× (m = 2^1 → 2^18) — W entries std 0.125"] \
        == claims.REPRODUCED
    assert got["Table 1: NTK-ViT on CIFAR-100"] == claims.REPRODUCED  # 91.0 vs 91.69
    assert got["Table 1: FFT-ViT on CIFAR-100"] == claims.NOT_REPRODUCED  # 70 vs 85.15
    assert got["Table 1: NTK-ViT on Food-101"] == claims.NOT_RUN
    assert got["Thm 7.2 data law"] == claims.REPRODUCED
    assert got["Thm 7.1 breakpoint"] == claims.NOT_RUN
    assert all(v == claims.REPRODUCED for k, v in got.items() if k.startswith(("Thm 3.10", "Thm 5.5")))
    worse = verdicts(report.build(fixture_tree(tmp_path / "b", growth=1e4, ntk_vit=80.0, exponential=False)))
    assert worse["NTK-Attention's error grows only ~100× while m grows ~131,000× (m = 2^1 → 2^18) — W entries std 0.125"] \
        == claims.NOT_REPRODUCED
    assert worse["Table 1: NTK-ViT on CIFAR-100"] == claims.NOT_REPRODUCED
    assert [v for k, v in worse.items() if k.startswith("Thm 5.5")] == [claims.NOT_REPRODUCED]  # stalls at a floor
    assert got["Eq. (4)'s NTK-Attention beats the null (Z = k = 0: the input's attention alone) at every m ≥ 2^10 — W "
               "entries std 0.125"] == claims.REPRODUCED


def test_missing_experiments_are_marked_not_run(tmp_path):
    (tmp_path / "outputs").mkdir()
    r = invoke("report", tmp_path / "outputs")
    assert r.exit_code == 0, r.output
    sections = report.build(tmp_path / "outputs")
    assert {c.verdict for s in sections for c in s.claims} == {claims.NOT_RUN}
    assert "26 not run at this scale" in (tmp_path / "outputs" / "report.md").read_text()


def test_half_written_run_folders_do_not_crash_the_report(tmp_path):
    outputs = fixture_tree(tmp_path / "outputs")
    broken = outputs / "scaling-law" / "interrupted"
    broken.mkdir()
    (broken / "results.csv").write_text("n,width,depth,seed\n8,16,1")  # cut off mid-write, no run.json
    bad = _run(outputs, "approx-error", "garbled", {})
    (bad / "summary.csv").write_text("")
    r = invoke("report", outputs)
    assert r.exit_code == 0, r.output
    md = (outputs / "report.md").read_text()
    assert "incomplete run `scaling-law/interrupted`" in md
    assert "`approx-error/garbled` has no readable summary.csv" in md


def test_a_missing_outputs_folder_is_one_line(tmp_path):
    assert_one_line_error(invoke("report", tmp_path / "nowhere"), "outputs folder not found")


def test_two_runs_that_judge_a_law_equally_are_both_shown(tmp_path):
    """A tie between judged verdicts is not broken by folder name: both rows stand, so neither hides the other."""
    root = tmp_path / "outputs"
    for name, verdict in (("a_full", "reproduced"), ("b_slice", "not reproduced")):
        rows = pd.DataFrame([{"law": "model", "theorem": "Thm 7.2 model law", "theory": "α ≥ ζ",
                              "measured": f"{name} α", "verdict": verdict}])
        _run(root, "scaling-law", name, {"summary.csv": rows}, "scaling_law.png")
    model = [c for s in report.build(root) for c in s.claims if c.claim == "Thm 7.2 model law"]
    assert sorted(c.verdict for c in model) == ["not reproduced", "reproduced"]
