"""Wall time of a sweep by each executor, side by side in one sitting (docs/performance.md, "Executors"): the
scaling-law recipe and the superglue slice, each run fresh by serial, 2 local workers and Ray with 2 tasks; the CSVs
of the three checked equal (timings aside). --threads N runs every point at N intra-op threads, whoever runs it (the
CSVs are then equal bit for bit); without it each executor divides the cores among its workers.
Usage: python scripts/executor_times.py SUPERGLUE_DIR [--seeds 0,1] [--threads N]."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

TIMINGS = ["train_seconds", "examples_per_s", "peak_mem_mb"]
EXECUTORS = {"serial": [], "local": ["--workers", "2"], "ray": ["--executor", "ray", "--workers", "2"]}


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "ntk"), *args], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("superglue_dir")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    threads = ["--set", f"threads={args.threads}"] if args.threads else []
    sweeps = {"scaling-law": ["scaling-law", "recipes/scaling_law.yaml"],
              "superglue slice": ["superglue", "recipes/superglue_slice.yaml", "--set",
                                  f"data.path={Path(args.superglue_dir).resolve()}", "--set", f"seeds=[{args.seeds}]"]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for sweep, command in sweeps.items():
            seconds = {name: timed([*command, "--out", f"{tmp}/{name}", *threads, *flags])
                       for name, flags in EXECUTORS.items()}
            folders = {name: next(Path(tmp, name).glob(f"{command[0]}/*")) for name in EXECUTORS}
            same = {n: all(pd.read_csv(folders[n] / f).drop(columns=TIMINGS, errors="ignore").equals(
                pd.read_csv(folders["serial"] / f).drop(columns=TIMINGS, errors="ignore"))
                for f in ("results.csv", "predictions.csv") if (folders["serial"] / f).exists()) for n in EXECUTORS}
            rows += [{"sweep": sweep, "executor": n, "wall_s": round(s, 1), "vs_serial": round(s / seconds["serial"], 3),
                      "csvs_equal_serial": same[n]} for n, s in seconds.items()]
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
