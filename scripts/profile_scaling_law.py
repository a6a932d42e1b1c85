"""Where a packed group of scaling-law students spends its time: torch.profiler over one group of the CPU
recipe (6 data sizes × 3 seeds at m = 64), the operators with the most self CPU time, and the share of
the checkpoint evaluations. Run: .venv/bin/python scripts/profile_scaling_law.py [steps]"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from ntkcli.bench import group_seconds
from ntkcli.experiments import scaling_law as sl
from ntkcli.runs import tune_malloc


def main(steps: int) -> None:
    tune_malloc()  # as the ntk command does
    cfg = sl.RECIPE(steps=steps)
    teacher = sl.Teacher(cfg, torch.float32)
    pools, test = sl.data_pools(cfg, list(range(cfg.seeds)), torch.float32)
    group = [(n, sl.epsilon_for(cfg, n), s) for s in range(cfg.seeds) for n in cfg.n_values]
    few = cfg.model_copy(update={"checkpoints": 3})  # 4 evaluations instead of the recipe's
    group_seconds(few, [group], teacher, pools, test)  # warm-up
    full, bare = (group_seconds(c, [group], teacher, pools, test) for c in (cfg, few))
    marks = len(sl.checkpoint_steps(cfg.steps, cfg.checkpoints))
    print(f"{len(group)} students, {cfg.steps} steps: {full:.2f} s with {marks} checkpoint evaluations, "
          f"{bare:.2f} s with 4 (evaluations ≈ {(full - bare) / max(full, 1e-9):.0%} of the run)")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        sl.train_group(few, few.base_width, few.base_depth, group, teacher, pools, test)
    events = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    print(f"top operators of the run with 4 evaluations (self CPU, {total / 1e3:.0f} ms in all):")
    for e in events[:12]:
        print(f"  {e.self_cpu_time_total / total:6.1%}  {e.count:6d}×  {e.key:28s} {str(e.input_shapes)[:70]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
