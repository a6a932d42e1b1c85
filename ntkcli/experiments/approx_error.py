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
from typing import Iterator

import pandas as pd
import torch
from torch import Tensor

from ..attention import (attention_lse, compress_prefix, feature_map, fit_prefix_adam, fit_prefix_lstsq,
                         infinite_prefix_limit, merge, ntk_combine, prefix_stats)
from ..figures import approx_error as figures
from ..recipes import ApproxErrorRecipe
from ..runs import Run, nested_randn, resolve_device, resume, seed_for

KEYS = ["weight_std", "repeat", "m", "method"]
FILES = ("results.csv", "summary.csv", "timings.csv", "approx_error.png")
RESUMABLE = ("max_log2m", "repeats", "methods", "include_infinity", "weight_std", "chunk")
INF = math.inf
BLOCK = 4096  # prefix rows per seeded block, so P's first m rows do not depend on max_log2m
FEATURES = {"compress-taylor2": "taylor2", "compress-favor": "favor", "compress-elu": "elu",
            "fit-lstsq": "elu", "fit-adam": "elu"}
AT_INFINITY = {"compress-taylor2", "fit-lstsq", "fit-adam"}  # methods whose m → ∞ limit we can compute


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


def _text_protocol(cfg: ApproxErrorRecipe, dr: Draw, marks: list[int], infinity: bool) -> Iterator[Exact]:
    s = cfg.scale
    q, k, v = _qkv(dr, dr.x)
    mean_x, lse_x = attention_lse(q, k, v, scale=s)
    qk_max = _score_max(q, k, s)
    if marks:
        pk, pv = dr.prefix @ dr.w_k, dr.prefix @ dr.w_v
        for m, (mean_p, lse_p) in zip(marks, prefix_stats(q, pk, pv, scale=s, ends=marks, chunk=cfg.chunk)):
            yield Exact(m, q, mean_x, lse_x, mean_p, lse_p, qk_max)
    if infinity:  # the input's weight vanishes next to m·e^{‖a‖²/2}; log m drops out of every ratio
        mean_p, lse_p = infinite_prefix_limit(q, dr.w_k, dr.w_v, sigma=cfg.prefix_std, scale=s, m=1.0)
        yield Exact(INF, q, mean_x, torch.full_like(lse_x, -INF), mean_p, lse_p, qk_max)


def _released_protocol(cfg: ApproxErrorRecipe, dr: Draw, marks: list[int]) -> Iterator[Exact]:
    s = cfg.scale
    for m in marks:
        seq = torch.cat([dr.prefix[:m].expand(dr.x.shape[0], m, cfg.d), dr.x], dim=1)
        q, k, v = _qkv(dr, seq)
        mean_x, lse_x = attention_lse(q, k, v, scale=s)
        yield Exact(m, q, mean_x, lse_x, torch.zeros_like(mean_x), torch.full_like(lse_x, -INF), _score_max(q, k, s))


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
    if method == "infinite-limit":
        mean_p, lse_p = infinite_prefix_limit(ex.q[test], dr.w_k, dr.w_v, sigma=cfg.prefix_std, scale=s, m=ex.m)
        return merge(ex.mean_x[test], ex.lse_x[test], mean_p, lse_p)[0]
    phi = feature_map(FEATURES[method], cfg.d, cfg.favor_features, seed)
    f, c = phi(ex.q[test] * math.sqrt(s))  # features of the training queries only where a fit needs them
    if method.startswith("compress-"):
        Z, kvec, log_scale = compressed[method][ex.m]
    else:
        f_train, c_train = (_flat(t) for t in phi(ex.q[train] * math.sqrt(s)))
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


def run(cfg: ApproxErrorRecipe, run: Run) -> dict[str, pd.DataFrame]:
    """Measure every (regime, repeat, m, method) point not yet in results.csv; write CSVs, figure, run.json."""
    device, dtype = resolve_device(cfg.device), getattr(torch, cfg.dtype)
    marks = [2 ** j for j in range(1, cfg.max_log2m + 1)]
    infinity = cfg.include_infinity and cfg.protocol == "text"
    lengths = marks + ([INF] if infinity else [])
    previous = run.load_csv("results.csv")
    done = resume(previous, KEYS)
    rows = [] if previous is None else previous.to_dict("records")
    units = [(w, rep) for w in cfg.weight_std for rep in range(cfg.repeats)]
    skipped, timings = 0, []
    with run.task("approx-error", len(units) * len(lengths)) as advance:
        for w_std, rep in units:
            todo = {(m, meth) for m in lengths for meth in cfg.methods
                    if _applies(meth, m) and (w_std, rep, m, meth) not in done}
            skipped += sum(_applies(meth, m) for m in lengths for meth in cfg.methods) - len(todo)
            if not todo:
                advance(len(lengths))
                continue
            seen = 0
            seed = seed_for(cfg.seed, float(w_std), rep)  # keyed by the regime's value, not its place in the list
            need = [m for m in marks if m <= max((m for m, _ in todo if m != INF), default=0)]
            dr = _draw(cfg, w_std, seed, max(need, default=1), device, dtype)
            compressed = {meth: _compressed(cfg, dr, meth, need, seed) for meth in cfg.methods
                          if meth.startswith("compress-") and any(meth == t for _, t in todo)}
            parts = (_text_protocol(cfg, dr, need, infinity and any(m == INF for m, _ in todo))
                     if cfg.protocol == "text" else _released_protocol(cfg, dr, need))
            clock = time.perf_counter()
            for seen, ex in enumerate(parts, start=1):
                exact = merge(ex.mean_x, ex.lse_x, ex.mean_p, ex.lse_p)[0][: cfg.n_test]
                for meth in cfg.methods:
                    if (ex.m, meth) not in todo:
                        continue
                    T = _ntk_output(meth, cfg, dr, ex, compressed, seed)
                    eq6, rel = errors(T, exact, ex.qk_max[: cfg.n_test])
                    rows.append({"weight_std": w_std, "repeat": rep, "m": float(ex.m),
                                 "log2m": math.log2(ex.m), "method": meth, "eq6_error": eq6,
                                 "relative_error": rel})
                timings.append({"weight_std": w_std, "repeat": rep, "m": float(ex.m),
                                "seconds": round(time.perf_counter() - clock, 4)})
                clock = time.perf_counter()
                advance(1)
            advance(len(lengths) - seen)
            run.save_csv("results.csv", pd.DataFrame(rows))
    results = pd.DataFrame(rows).sort_values(KEYS, kind="stable").reset_index(drop=True)
    results = results[results.method.isin(cfg.methods) & results.weight_std.isin(cfg.weight_std)
                      & (results.repeat < cfg.repeats) & results.m.isin(lengths)]
    run.save_csv("results.csv", results)
    summary = summarize(results)
    run.save_csv("summary.csv", summary)
    if timings:  # wall seconds per m (its stretch of the prefix stream plus every method), for `ntk bench`
        run.save_csv("timings.csv", pd.DataFrame(timings))
    run.save_figure("approx_error.png", figures.figure(summary, cfg))
    run.finish(points=len(results), skipped_points=skipped, protocol=cfg.protocol, score_scale=cfg.scale)
    return {"summary": summary, "headline": headline(summary)}


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over repeats of both errors, per (regime, m, method)."""
    g = results.groupby(["weight_std", "m", "log2m", "method"], sort=True)
    out = g[["eq6_error", "relative_error"]].agg(["mean", "std"])
    out.columns = [f"{a}_{b}" for a, b in out.columns]
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
