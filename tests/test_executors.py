"""Executors (serial, local worker processes, Ray): the same CSVs whatever measures the points, a failing or dying
point recorded as one failure, and bad choices refused in one line."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from conftest import assert_one_line_error, invoke
from ntkcli import executors
from planted_points import planted
from test_superglue import recipe, write_superglue

TIMINGS = ["train_seconds", "examples_per_s", "peak_mem_mb"]


def _csvs(folder) -> list[pd.DataFrame]:
    return [pd.read_csv(folder / name).drop(columns=TIMINGS, errors="ignore")
            for name in ("results.csv", "predictions.csv")]


def test_two_local_workers_and_ray_give_the_serial_runs_csvs_row_for_row(tmp_path):
    """The tiny superglue recipe by this process, by 2 worker processes and by 2 Ray tasks at a time: results.csv
    and predictions.csv are equal row for row (the timing columns aside), and the tables follow."""
    methods = [{"method": "fft", "lrs": [0.0001]}, {"method": "ntk", "lrs": [0.001, 0.01]}]
    path = recipe(tmp_path, write_superglue(tmp_path / "sg"), seeds=[0], methods=methods, selection={"grow": 0},
                  threads=1)  # the same intra-op threads for every executor: CPU sums split by thread
    # the selection runs (majority, fft, ntk at two steps, the paper's points) and the finals of the chosen and the
    # paper's points
    runs = {"serial": [], "local": ["--workers", "2"], "ray": ["--executor", "ray", "--workers", "2"]}
    for name, flags in runs.items():
        r = invoke("superglue", path, "--out", tmp_path / name, *flags)
        assert r.exit_code == 0, r.output
    serial = _csvs(tmp_path / "serial" / "superglue" / "sg")
    points = pd.read_csv(tmp_path / "serial" / "superglue" / "sg" / "points.csv")
    finals = serial[0][serial[0].stage == "final"]
    assert len(finals) == len(points.drop_duplicates(["method", "lr"])) and serial[0].failed.isna().all()
    for name in ("local", "ray"):
        folder = tmp_path / name / "superglue" / "sg"
        for mine, theirs in zip(serial, _csvs(folder)):
            pd.testing.assert_frame_equal(mine, theirs)
        assert (folder / "claims.csv").exists() and (folder / "summary.csv").exists()


def test_a_point_that_raises_or_kills_its_worker_is_one_recorded_failure():
    """Of 7 points on 2 local workers (1 thread each), the one that raises and the one whose worker dies come back
    as Failed with their reasons; every other point's result comes back once; the progress counts all 7."""
    done = []
    out = dict(executors.Local(2, 1).map(planted, range(7), None, done.append, lambda p: 1))
    assert sorted(out) == list(range(7)) and len(done) == 7
    assert isinstance(out[3], executors.Failed) and "ValueError: planted failure" == out[3].reason
    assert isinstance(out[5], executors.Failed) and "worker process died" in out[5].reason
    assert {p: out[p] for p in out if p not in (3, 5)} == {p: p * p + 1 for p in range(7) if p not in (3, 5)}
    serial = dict(executors.Serial().map(planted, [3, 4], None, done.append, lambda p: 1))
    assert serial[3].reason == out[3].reason and isinstance(serial[3].error, ValueError) and serial[4] == 16 + \
        torch.get_num_threads()
    before = torch.get_num_threads()
    assert dict(executors.Serial(1).map(planted, [4], None, done.append, lambda p: 1))[4] == 17  # 1 thread inside
    assert torch.get_num_threads() == before  # and the process's own count after


@pytest.mark.parametrize("flags, words", [
    (["--workers", "0"], ["workers"]),
    (["--executor", "dask"], ["executor"]),
    (["--executor", "serial", "--workers", "2"], ["serial executor", "--executor local or ray"]),
    (["--address", "127.0.0.1:1"], ["--address", "--executor ray"]),
    (["--executor", "ray", "--address", "127.0.0.1:1"], ["cannot reach the Ray cluster at 127.0.0.1:1"]),
])
def test_bad_executor_choices_are_one_line_and_write_nothing(tmp_path, flags, words):
    path = recipe(tmp_path, write_superglue(tmp_path / "sg"), seeds=[0])
    r = invoke("superglue", path, "--out", tmp_path / "out", *flags)
    assert_one_line_error(r, *words)
    assert not (tmp_path / "out").exists()


def test_ray_missing_and_workers_on_a_one_process_experiment_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # import ray → ImportError
    assert_one_line_error(invoke("superglue", recipe(tmp_path, write_superglue(tmp_path / "sg"), seeds=[0]),
                                 "--executor", "ray", "--out", tmp_path / "out"), "needs Ray", "ntkcli[ray]")
    assert_one_line_error(invoke("approx-error", "--workers", "2", "--out", tmp_path / "out"),
                          "approx-error measures its points in one process", "superglue")
    assert not (tmp_path / "out").exists()
