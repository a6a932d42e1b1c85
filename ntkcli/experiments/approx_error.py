"""§4.4, Figure 1: how well NTK-Attention stands in for an m-long prefix, m = 2^1 … 2^max_log2m and ∞.

For each regime (entry std of W_Q, W_K, W_V) and repeat we draw W, a prefix P and inputs X, compute
the exact prefix attention once for every query (one streamed pass gives every m), and measure each
method's output T against it on the test inputs with Eq. (6) and a plain relative error.

Protocols. `text` (the paper's §4.4): the exact side attends over [P; X_i], NTK-Attention over X_i
plus φ(Q)Z / φ(Q)k, queries from X_i only. `released` (the authors' script): P also enters the NTK
side as ordinary tokens and supplies queries, so the best Z, k are zero; it costs (m+L)² per input.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterator, Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, model_validator
from torch import Tensor

from ..attention import (attention_lse, compress_prefix, feature_map, fit_prefix_adam, fit_prefix_lstsq,
                         infinite_prefix_limit, merge, ntk_combine, prefix_stats)
from .. import rules
from ..claims import NOT_RUN, Claim, Section, fmt
from ..figures import approx_error as figures
from ..recipes import Count, Positive, Recipe
from ..runs import Results, Run, nested_randn, resolve_device, seed_for

COMMAND, TITLE = "approx-error", "Approximation of an infinite prefix (paper 1, §4.4, Figure 1)"
METHODS = ("compress-taylor2", "compress-favor", "compress-elu", "fit-lstsq", "fit-adam", "infinite-limit", "no-prefix")
KEYS = ["weight_std", "repeat", "m", "method"]
FILES = ("results.csv", "summary.csv", "timings.csv", "approx_error.png", "claims.csv")
SCALE = ("max_log2m", "repeats", "n_test", "d")  # the fields that set a run's scale, shown beside its claims
# Figure 1's claim and the rule our measurement is judged by
CLAIM = "NTK-Attention's error grows only ~100× while m grows ~131,000× (m = 2^1 → 2^18)"
PAPER = "~100× (Figure 1), below the input-only null"
NULL_CLAIM = "Eq. (4)'s NTK-Attention beats the null (Z = k = 0: the input's attention alone) at every m ≥ 2^10"
NULL_PAPER = "relative error ≤ ½ the null's (ours; Figure 1 has no null)"
MIN_SPAN = 2 ** 16  # the m range a run must cover for a verdict
HELP = ("Figure 1 (§4.4): error of NTK-Attention against exact attention with an m-long prefix.\n\n"
        "For m = 2, 4, …, 2^max_log2m and m = ∞, and for each method (compress-taylor2, compress-favor, compress-elu, "
        "fit-lstsq, fit-adam, infinite-limit, and the null no-prefix: Z = k = 0, the input's attention alone), writes results.csv (one row per regime, repeat, m, method), summary.csv "
        "(mean ± std), approx_error.png, claims.csv and run.json to outputs/approx-error/<recipe>/. Re-running resumes "
        "and skips finished points.")
NEEDS_RECIPE, DEVICES = False, ("cpu", "cuda")
POINTS = False  # vectorised over m in one process
FLAGS = {"max_log2m": ("--max-log2m", int, "Largest prefix length is 2^max_log2m (1–30)."),
         "repeats": ("--repeats", int, "Independent draws of W and P per regime."),
         "protocol": ("--protocol", str, "text (paper §4.4) or released (authors' script; m ≤ 2^12).")}
RESUMABLE = ("max_log2m", "repeats", "methods", "include_infinity", "weight_std", "chunk")
INF = math.inf
BLOCK = 4096  # prefix rows per seeded block, so P's first m rows do not depend on max_log2m
FEATURES = {"compress-taylor2": "taylor2", "compress-favor": "favor", "compress-elu": "elu",
            "fit-lstsq": "elu", "fit-adam": "elu"}
AT_INFINITY = {"compress-taylor2", "fit-lstsq", "fit-adam", "no-prefix"}  # methods whose m → ∞ limit we can compute



class ApproxErrorRecipe(Recipe):
    """§4.4 / Figure 1: NTK-Attention vs exact attention with an m-long prefix."""

    d: int = Field(64, ge=1, le=1024, description="head dimension")
    seq_len: int = Field(128, ge=1, le=65536, description="input length L")
    max_log2m: int = Field(18, ge=1, le=30, description="prefix lengths m = 2^1 … 2^max_log2m")
    include_infinity: bool = Field(True, description="also evaluate m = ∞ (closed-form Gaussian limit)")
    n_train: Count = Field(32, description="training inputs for the fitted methods (paper: 40000)")
    n_test: Count = Field(8, description="test inputs the errors are measured on (paper: 8000)")
    repeats: int = Field(3, ge=1, le=10_000, description="independent draws of W and P (paper: 50)")
    weight_std: list[Positive] = Field([1.0, 0.125], min_length=1, description="entry std of W_Q, W_K, W_V; one regime each")
    prefix_std: float = Field(1.0, gt=0, description="entry std σ of the prefix P")
    score_scale: float | None = Field(None, gt=0, description="s in exp(s·q·k); null means 1/√d (paper text: 1)")
    protocol: Literal["text", "released"] = Field("text", description="text: prefix only in the exact side; released: in both")
    methods: list[Literal[METHODS]] = Field(list(METHODS), min_length=1)  # type: ignore[valid-type]
    favor_features: int = Field(256, ge=1, le=65536, description="random features of compress-favor")
    ridge: float = Field(1e-6, ge=0, description="relative ridge of fit-lstsq")
    adam_steps: Count = 300
    adam_lr: float = Field(1e-2, gt=0)
    adam_batch: Count = 1024
    chunk: int = Field(4096, ge=1, le=2**22, description="prefix rows per streamed chunk")
    dtype: Literal["float32", "float64"] = "float32"

    @model_validator(mode="after")
    def _released_is_quadratic(self) -> "ApproxErrorRecipe":
        if self.protocol == "released" and self.max_log2m > 12:
            raise ValueError("protocol 'released' costs (m+L)^2 per input, so max_log2m must be at most 12")
        return self

    @property
    def scale(self) -> float:
        return self.score_scale if self.score_scale is not None else self.d ** -0.5

    def peak_bytes(self) -> int:
        """The prefix (a float64 draw, its keys and values), q/k/v and the attention statistics of every query,
        one chunk of prefix scores for every query, the test (train) queries' features of the compressing (fitted)
        methods, and one input's full score matrix (Eq. (6)'s normaliser; over [P; X] in the released protocol)."""
        rows, width = (self.n_train + self.n_test) * self.seq_len, 8 if self.dtype == "float64" else 4
        dphi = max([{"compress-taylor2": 1 + self.d + self.d * (self.d + 1) // 2,
                     "compress-favor": self.favor_features}.get(m, self.d) for m in self.methods])
        fits = any(m.startswith("fit-") for m in self.methods)
        seen = self.seq_len + (2 ** self.max_log2m if self.protocol == "released" else 0)  # keys one query sees
        return (16 * 2 ** self.max_log2m * self.d + width * (2 * 2 ** self.max_log2m * self.d + 8 * rows * self.d
                + 2 * rows * self.chunk + 2 * self.n_test * self.seq_len * dphi
                + (2 * self.n_train * self.seq_len * self.d if fits else 0)
                + 2 * self.seq_len * seen))  # one input's scores for Eq. (6)'s ‖s·QKᵀ‖_∞, and their max


RECIPE = ApproxErrorRecipe


@dataclass
class Draw:
    """One repeat's random problem: projections, inputs (test first, then train) and the prefix."""

    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    x: Tensor
    prefix: Tensor


@dataclass
class Exact:
    """What both sides share at one prefix length m; every tensor covers all inputs, test first."""

    m: float
    q: Tensor  # [n, 1, Lq, d]
    mean_x: Tensor  # attention over the input side
    lse_x: Tensor
    mean_p: Tensor  # exact attention over the prefix (lse = -inf where the protocol has none)
    lse_p: Tensor
    qk_max: Tensor  # [n]: ‖s·Q_i K_iᵀ‖_∞ of Eq. (6)
    largest_logit: float  # max |s·qᵀk| over the test queries and every key they see at m (Thm 4.1's premise)


def _draw(cfg: ApproxErrorRecipe, w_std: float, seed: int, m_max: int, device, dtype) -> Draw:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(3, cfg.d, cfg.d, generator=gen, dtype=torch.float64) * w_std
    x = torch.randn(cfg.n_test + cfg.n_train, cfg.seq_len, cfg.d, generator=gen, dtype=torch.float64)
    prefix = nested_randn(m_max, (cfg.d,), seed, block=BLOCK) * cfg.prefix_std
    w, x, prefix = (t.to(device=device, dtype=dtype) for t in (w, x, prefix))
    return Draw(w[0], w[1], w[2], x, prefix)


def _qkv(dr: Draw, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return tuple((x @ w).unsqueeze(1) for w in (dr.w_q, dr.w_k, dr.w_v))


def _score_max(q: Tensor, k: Tensor, scale: float) -> Tensor:
    return torch.stack([(qi @ ki.transpose(-1, -2)).abs().amax() * scale for qi, ki in zip(q, k)])


def largest_logits(q: Tensor, keys: Tensor, scale: float, chunk: int) -> Tensor:
    """max |s·qᵀk_j| over the queries q [.., d], for every key j of keys [m, d] (streamed in chunks)."""
    q = q.reshape(-1, q.shape[-1])
    return torch.cat([(q @ block.T).abs().amax(0) * scale for block in keys.split(chunk)])


def _text_protocol(cfg: ApproxErrorRecipe, dr: Draw, marks: list[int], infinity: bool) -> Iterator[Exact]:
    s = cfg.scale
    q, k, v = _qkv(dr, dr.x)
    mean_x, lse_x = attention_lse(q, k, v, scale=s)
    qk_max = _score_max(q, k, s)
    own = qk_max[: cfg.n_test].max().item()
    if marks:
        pk, pv = dr.prefix @ dr.w_k, dr.prefix @ dr.w_v
        seen = largest_logits(q[: cfg.n_test], pk[: max(marks)], s, cfg.chunk).cummax(0).values
        for m, (mean_p, lse_p) in zip(marks, prefix_stats(q, pk, pv, scale=s, ends=marks, chunk=cfg.chunk)):
            yield Exact(m, q, mean_x, lse_x, mean_p, lse_p, qk_max, max(own, seen[m - 1].item()))
    if infinity:  # the input's weight vanishes next to m·e^{‖a‖²/2}; log m drops out of every ratio
        mean_p, lse_p = infinite_prefix_limit(q, dr.w_k, dr.w_v, sigma=cfg.prefix_std, scale=s, m=1.0)
        yield Exact(INF, q, mean_x, torch.full_like(lse_x, -INF), mean_p, lse_p, qk_max, INF)  # Gaussian keys


def _released_protocol(cfg: ApproxErrorRecipe, dr: Draw, marks: list[int]) -> Iterator[Exact]:
    s = cfg.scale
    for m in marks:
        seq = torch.cat([dr.prefix[:m].expand(dr.x.shape[0], m, cfg.d), dr.x], dim=1)
        q, k, v = _qkv(dr, seq)
        mean_x, lse_x = attention_lse(q, k, v, scale=s)
        qk_max = _score_max(q, k, s)
        yield Exact(m, q, mean_x, lse_x, torch.zeros_like(mean_x), torch.full_like(lse_x, -INF), qk_max,
                    qk_max[: cfg.n_test].max().item())


def _compressed(cfg: ApproxErrorRecipe, dr: Draw, method: str, marks: list[int], seed: int) -> dict:
    """(Z, k, log_scale) by Eq. 4 at every mark, and at m = ∞ for the polynomial taylor2 map: its Z/k
    ratio needs Gaussian moments up to order 3, which the 2d points ±σ√d·e_i match exactly."""
    phi = feature_map(FEATURES[method], cfg.d, cfg.favor_features, seed)
    s = cfg.scale
    pk, pv = dr.prefix @ dr.w_k, dr.prefix @ dr.w_v
    out = dict(zip(marks, compress_prefix(pk, pv, phi, scale=s, ends=marks, chunk=cfg.chunk))) if marks else {}
    if method in AT_INFINITY:
        eye = torch.eye(cfg.d, dtype=dr.prefix.dtype, device=dr.prefix.device)
        sigma_points = cfg.prefix_std * math.sqrt(cfg.d) * torch.cat([eye, -eye])
        out[INF] = compress_prefix(sigma_points @ dr.w_k, sigma_points @ dr.w_v, phi, scale=s)[0]
    return out


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1, *t.shape[3:]) if t.ndim > 3 else t.reshape(-1)


def _ntk_output(method: str, cfg: ApproxErrorRecipe, dr: Draw, ex: Exact, compressed: dict, seed: int) -> Tensor:
    """The method's NTK-Attention output for the test queries."""
    s, test, train = cfg.scale, slice(0, cfg.n_test), slice(cfg.n_test, None)
    if method == "no-prefix":  # Z = k = 0: the input's own attention, what a method that learned nothing gives
        return ex.mean_x[test]
    if method == "infinite-limit":
        mean_p, lse_p = infinite_prefix_limit(ex.q[test], dr.w_k, dr.w_v, sigma=cfg.prefix_std, scale=s, m=ex.m)
        return merge(ex.mean_x[test], ex.lse_x[test], mean_p, lse_p)[0]
    phi = feature_map(FEATURES[method], cfg.d, cfg.favor_features, seed)
    f, c = phi(ex.q[test], math.sqrt(s))  # features of the training queries only where a fit needs them
    if method.startswith("compress-"):
        Z, kvec, log_scale = compressed[method][ex.m]
    else:
        f_train, c_train = (_flat(t) for t in phi(ex.q[train], math.sqrt(s)))
        if method == "fit-lstsq":
            Z, kvec, log_scale = fit_prefix_lstsq(f_train, c_train, _flat(ex.mean_p[train]),
                                                  _flat(ex.lse_p[train]), ridge=cfg.ridge)
        else:
            target = merge(ex.mean_x[train], ex.lse_x[train], ex.mean_p[train], ex.lse_p[train])[0]
            Z, kvec, log_scale = fit_prefix_adam(
                f_train, c_train, _flat(ex.mean_x[train]), _flat(ex.lse_x[train]), _flat(target),
                _flat(ex.lse_p[train]), steps=cfg.adam_steps, lr=cfg.adam_lr, batch=cfg.adam_batch, seed=seed)
    return ntk_combine(ex.mean_x[test], ex.lse_x[test], f, c, Z, kvec, log_scale)


def errors(T: Tensor, exact: Tensor, qk_max: Tensor) -> tuple[float, float]:
    """Eq. (6), (1/(L·d·n)) Σ_i ‖T_i − Attn_i‖_F² / ‖Q_i K_iᵀ‖_∞, and Σ‖T − Attn‖² / Σ‖Attn‖²."""
    sq = (T.double() - exact.double()).pow(2).flatten(1).sum(-1)
    n, rows, d = T.shape[0], T.shape[-2], T.shape[-1]
    eq6 = (sq / qk_max.double()).sum() / (rows * d * n)
    return eq6.item(), (sq.sum() / exact.double().pow(2).sum()).item()


def _applies(method: str, m: float) -> bool:
    return m != INF or method in AT_INFINITY


def lengths(cfg: ApproxErrorRecipe) -> list[float]:
    """The prefix lengths measured: m = 2^1 … 2^max_log2m, and ∞ (text protocol)."""
    marks = [float(2 ** j) for j in range(1, cfg.max_log2m + 1)]
    return marks + ([INF] if cfg.include_infinity and cfg.protocol == "text" else [])


def points(cfg: ApproxErrorRecipe) -> list[tuple[float, int, float, str]]:
    """Every (regime, repeat, m, method) point of the recipe, in the order they are measured."""
    return [(w, rep, m, meth) for w in cfg.weight_std for rep in range(cfg.repeats) for m in lengths(cfg)
            for meth in cfg.methods if _applies(meth, m)]


def plan(cfg: ApproxErrorRecipe) -> list[tuple[str, str]]:
    """What a run measures (the same `points` that `run` walks through)."""
    ms = lengths(cfg)
    return [("regimes (weight_std)", str(len(cfg.weight_std))), ("repeats", str(cfg.repeats)),
            ("prefix lengths m", f"{len(ms)} (2^1 … 2^{cfg.max_log2m}{', ∞' if ms[-1] == INF else ''})"),
            ("methods", str(len(cfg.methods))), ("points (regime, repeat, m, method)", str(len(points(cfg)))),
            ("queries streamed per repeat", str((cfg.n_train + cfg.n_test) * cfg.seq_len))]


def _measure(cfg: ApproxErrorRecipe, w_std: float, rep: int, todo: set[tuple[float, str]], advance) -> tuple[list, list]:
    """One repeat of one regime: its (m, method) points in `todo` as result rows, and seconds per m."""
    device, dtype = resolve_device(cfg.device), getattr(torch, cfg.dtype)
    seed = seed_for(cfg.seed, float(w_std), rep)  # keyed by the regime's value, not its place in the list
    finite = [m for m, _ in todo if m != INF]
    need = [int(m) for m in lengths(cfg) if m != INF and m <= max(finite, default=0)]
    dr = _draw(cfg, w_std, seed, max(need, default=1), device, dtype)
    compressed = {meth: _compressed(cfg, dr, meth, need, seed) for meth in cfg.methods
                  if meth.startswith("compress-") and any(meth == t for _, t in todo)}
    parts = (_text_protocol(cfg, dr, need, any(m == INF for m, _ in todo))
             if cfg.protocol == "text" else _released_protocol(cfg, dr, need))
    rows, timings, clock = [], [], time.perf_counter()
    for ex in parts:
        exact = merge(ex.mean_x, ex.lse_x, ex.mean_p, ex.lse_p)[0][: cfg.n_test]
        for meth in [meth for meth in cfg.methods if (ex.m, meth) in todo]:
            eq6, rel = errors(_ntk_output(meth, cfg, dr, ex, compressed, seed), exact, ex.qk_max[: cfg.n_test])
            rows.append({"weight_std": w_std, "repeat": rep, "m": float(ex.m), "log2m": math.log2(ex.m),
                         "method": meth, "eq6_error": eq6, "relative_error": rel, "largest_logit": ex.largest_logit})
        timings.append({"weight_std": w_std, "repeat": rep, "m": float(ex.m),
                        "seconds": round(time.perf_counter() - clock, 4)})
        clock = time.perf_counter()
        advance(1)
    return rows, timings


def prepare(cfg: ApproxErrorRecipe) -> None:
    """Nothing to load: the recipe holds every input."""


def run(cfg: ApproxErrorRecipe, folder: Run, prepared: None = None) -> dict[str, pd.DataFrame]:
    """Measure every point not yet in results.csv, one repeat at a time; write CSVs, figure, run.json."""
    results, wanted = Results(folder, KEYS), points(cfg)
    todo = results.todo(wanted)
    units: dict[tuple[float, int], set] = {}
    for w, rep, m, meth in todo:
        units.setdefault((w, rep), set()).add((m, meth))
    timings = []
    with folder.task("approx-error", sum(len({m for m, _ in u}) for u in units.values())) as advance:
        for (w, rep), unit in units.items():
            rows, seconds = _measure(cfg, w, rep, unit, advance)
            results.add(rows)
            timings += seconds
    table = results.table(wanted).sort_values(KEYS, kind="stable").reset_index(drop=True)
    folder.save_csv("results.csv", table)
    summary = summarize(table)
    folder.save_csv("summary.csv", summary)
    if timings:  # wall seconds per m (its stretch of the prefix stream plus every method), for `ntk bench`
        folder.save_csv("timings.csv", pd.DataFrame(timings))
    folder.save_figure("approx_error.png", figures.figure(summary, cfg))
    folder.finish(points=len(table), skipped_points=len(wanted) - len(todo), protocol=cfg.protocol,
                  score_scale=cfg.scale)
    return {"summary": summary, "headline": headline(summary)}


def tables(cfg: ApproxErrorRecipe, result: dict[str, pd.DataFrame]) -> list[tuple[str, pd.DataFrame]]:
    return [(f"approx-error: Eq. (6) error, mean over {cfg.repeats} repeats (s = {cfg.scale:.4g})", result["headline"])]


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over repeats of both errors, and the largest logit of any repeat, per (regime, m, method)."""
    g = results.groupby(["weight_std", "m", "log2m", "method"], sort=True)
    out = g[["eq6_error", "relative_error"]].agg(["mean", "std"])
    out.columns = [f"{a}_{b}" for a, b in out.columns]
    if "largest_logit" in results:  # runs made before it was measured lack it
        out["largest_logit"] = g.largest_logit.max()
    out["repeats"] = g.size()
    return out.reset_index()


def headline(summary: pd.DataFrame) -> pd.DataFrame:
    """Per regime and method: Eq. (6) error at the smallest and largest finite m, at ∞, and the growth."""
    rows = []
    for (w, meth), grp in summary.groupby(["weight_std", "method"], sort=False):
        fin = grp[grp.m != INF].sort_values("m")
        inf = grp[grp.m == INF]
        rows.append({
            "weight_std": w, "method": meth,
            f"eq6 m=2^{int(fin.log2m.iloc[0])}": fin.eq6_error_mean.iloc[0],
            f"eq6 m=2^{int(fin.log2m.iloc[-1])}": fin.eq6_error_mean.iloc[-1],
            "eq6 m=inf": inf.eq6_error_mean.iloc[0] if len(inf) else float("nan"),
            "growth max/min": fin.eq6_error_mean.max() / fin.eq6_error_mean.min(),
            f"rel m=2^{int(fin.log2m.iloc[-1])}": fin.relative_error_mean.iloc[-1],
        })
    return pd.DataFrame(rows)


def _growth_interval(results: pd.DataFrame | None, w: float, low: float, high: float) -> str:
    """compress-taylor2's Eq. (6) growth from m = low to high with its bootstrap interval over the repeats (the
    repeats resampled, each repeat's two errors together); empty when results.csv cannot give it."""
    if results is None or "repeat" not in results:
        return ""
    rows = results[(results.method == "compress-taylor2") & (results.weight_std == w)]
    at = rows.pivot_table(index="repeat", columns="m", values="eq6_error")
    if low not in at or high not in at:
        return ""
    paired = at[[low, high]].dropna()
    _, lower, upper = rules.ratio_interval(paired[high], paired[low])
    return f" [{lower:.0f}, {upper:.0f}] (bootstrap over {len(paired)} repeats)" if np.isfinite(lower) else ""


def _claims(run: Run, summary: pd.DataFrame) -> list[Claim]:
    """Figure 1's trend for compress-taylor2 and its comparison with the null, two claims per regime of one run."""
    found, results = [], run.csv("results.csv", ("weight_std", "m", "repeat", "eq6_error"))
    fin = summary[np.isfinite(summary.m)]
    for w, grp in fin[fin.method == "compress-taylor2"].groupby("weight_std"):
        grp = grp.sort_values("m")
        null = fin[(fin.method == "no-prefix") & (fin.weight_std == w)].set_index("m").reindex(grp.m)
        span, growth = grp.m.iloc[-1] / grp.m.iloc[0], grp.eq6_error_mean.iloc[-1] / grp.eq6_error_mean.iloc[0]
        rel, null_rel = grp.relative_error_mean.to_numpy(), null.relative_error_mean.to_numpy()
        ran = span >= MIN_SPAN and np.isfinite(null_rel).all()
        premise = [rules.bounded_logits(grp.largest_logit.iloc[-1], grp.m.iloc[-1])] if "largest_logit" in grp else []
        found.append(Claim(f"{CLAIM} — W entries std {w:g}", PAPER,
                           f"compress-taylor2: Eq. (6) {fmt(grp.eq6_error_mean.iloc[0])} → "
                           f"{fmt(grp.eq6_error_mean.iloc[-1])}, {growth:.0f}×"
                           f"{_growth_interval(results, w, grp.m.iloc[0], grp.m.iloc[-1])} over m × {span:,.0f}; "
                           f"relative error "
                           f"{fmt(rel[-1])} at m = {grp.m.iloc[-1]:,.0f} (null {fmt(null_rel[-1])})", run.source,
                           rules.judge(premise, lambda: rules.growth(growth, rel[-1], null_rel[-1])) if ran
                           else NOT_RUN))
        big = grp.m.to_numpy() >= rules.NULL_FROM_M
        worst = float(np.max(rel[big] / null_rel[big])) if big.any() and ran else float("nan")
        found.append(Claim(f"{NULL_CLAIM} — W entries std {w:g}", NULL_PAPER,
                           f"compress-taylor2's relative error is at most {fmt(worst)}× the null's over m ≥ 2^10",
                           run.source, rules.judge(premise, lambda: rules.beats_null(grp.m, rel, null_rel)) if ran
                           else NOT_RUN))
    return found


def report(runs: list[Run]) -> Section:
    """The report section: Figure 1's claim per regime of every finished run, and the figures."""
    section = Section(COMMAND, TITLE)
    for run, summary in section.readable(runs, "summary.csv", ("m", "weight_std", "eq6_error_mean",
                                                               "relative_error_mean"), ("method",), "approx_error.png"):
        with section.reading(run):
            section.claims += _claims(run, summary)
    section.claims = section.claims or [Claim(CLAIM, PAPER)]
    return section
