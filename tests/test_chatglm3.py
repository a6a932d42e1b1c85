"""ChatGLM3 without remote code: a tiny checkpoint in ChatGLM3-6B's hub layout (its config field names, its
`transformer.*` tensors, a sentencepiece tokenizer.model) loads into transformers' GLM and equals an
independent float64 forward written here from ChatGLM3's published architecture."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import save_file

from ntkcli.adapters import inject
from ntkcli.models import load_model, load_tokenizer
from ntkcli.models.chatglm3 import load_chatglm3
from ntkcli.models.glm import SPECIAL_TOKENS
from ntkcli.experiments.finetune.recipe import ModelSpec
from conftest import RECIPES, assert_one_line_error, invoke, no_results, write_rte

CONFIG = dict(  # ChatGLM3-6B's config.json, shrunk: 2 layers, 4 heads of 8 dims, 2 key/value groups
    model_type="chatglm", architectures=["ChatGLMModel"], auto_map={"AutoConfig": "configuration_chatglm.ChatGLMConfig"},
    add_bias_linear=False, add_qkv_bias=True, apply_residual_connection_post_layernorm=False, attention_dropout=0.0,
    ffn_hidden_size=48, hidden_size=32, kv_channels=8, layernorm_epsilon=1e-5, multi_query_attention=True,
    multi_query_group_num=2, num_attention_heads=4, num_layers=2, original_rope=True, post_layer_norm=True,
    rmsnorm=True, seq_length=256, rope_ratio=2.0, torch_dtype="float16")
TEXT = ["The cat sat on the mat.", "A dog is running in the park.", "Paris is the capital of France.",
        "It is not raining today.", "The team crossed the bridge on day one.", "Many people saw the leopard."] * 10
PIECES = 300  # with byte fallback (any text encodes, as ChatGLM3's does) and a piece spelled like a special token


def sentencepiece_model() -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT), model_writer=out, vocab_size=PIECES,
                                   model_type="unigram", character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, byte_fallback=True, user_defined_symbols=["eop"],
                                   hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return out.getvalue()


def checkpoint(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float16 weights under ChatGLM3's tensor names."""
    g = torch.Generator().manual_seed(seed)
    h, d, heads, groups, ffn = 32, 8, 4, 2, 48

    def w(*shape, base=0.0):
        return (base + 0.3 * torch.randn(*shape, generator=g)).half()

    state = {"transformer.embedding.word_embeddings.weight": w(vocab, h),
             "transformer.encoder.final_layernorm.weight": w(h, base=1.0),
             "transformer.output_layer.weight": w(vocab, h),
             "transformer.rotary_pos_emb.inv_freq": torch.ones(d // 4).half()}
    for i in range(2):
        p = f"transformer.encoder.layers.{i}."
        state |= {p + "input_layernorm.weight": w(h, base=1.0), p + "post_attention_layernorm.weight": w(h, base=1.0),
                  p + "self_attention.query_key_value.weight": w((heads + 2 * groups) * d, h),
                  p + "self_attention.query_key_value.bias": w((heads + 2 * groups) * d),
                  p + "self_attention.dense.weight": w(h, heads * d),
                  p + "mlp.dense_h_to_4h.weight": w(2 * ffn, h), p + "mlp.dense_4h_to_h.weight": w(h, ffn)}
    return state


def write_chatglm3(folder: Path, layout: str = "safetensors", **config) -> Path:
    """The hub layout: config.json, weights (one safetensors file, two shards with an index, or .bin),
    tokenizer.model and tokenizer_config.json naming ChatGLM's remote tokenizer class."""
    folder.mkdir(parents=True)
    sp = sentencepiece_model()
    (folder / "tokenizer.model").write_bytes(sp)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "ChatGLMTokenizer", "padding_side": "left",
        "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}}))
    vocab = PIECES + len(SPECIAL_TOKENS) + 3  # padded, as padded_vocab_size is
    (folder / "config.json").write_text(json.dumps({**CONFIG, "padded_vocab_size": vocab, "vocab_size": vocab, **config}))
    state = checkpoint(vocab)
    if layout == "safetensors":
        save_file(state, folder / "model.safetensors")
    elif layout == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        names = sorted(state)
        shards = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
        for file, part in shards.items():
            save_file({n: state[n] for n in part}, folder / file)
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}))
    return folder


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory) -> Path:
    return write_chatglm3(tmp_path_factory.mktemp("chatglm3") / "model")


def chatglm_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids as ChatGLM3's tokenizer gives them: 0, 1, … from the first real token, 0 on left padding."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def reference_logits(folder: Path, head: torch.nn.Linear, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ChatGLM3's forward in float64 as its modelling code computes it: fused query_key_value, rotary on the
    first half of each head in interleaved pairs with ChatGLM3's position ids, RMSNorm, SwiGLU, causal +
    padding mask, the last position pooled."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    W = {k: v.double() for k, v in load_file(folder / "model.safetensors").items()}
    heads, groups, d, eps = cfg["num_attention_heads"], cfg["multi_query_group_num"], cfg["kv_channels"], cfg["layernorm_epsilon"]
    B, L = ids.shape
    rot = d // 2
    # the rotary table in float32, as ChatGLM3's RotaryEmbedding builds it whatever the model's dtype
    inv = 1.0 / (10000.0 * cfg["rope_ratio"]) ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    angle = chatglm_positions(mask).float()[..., None] * inv  # [B, L, rot/2]
    cos, sin = angle.cos().double()[:, :, None], angle.sin().double()[:, :, None]

    def rope(t):  # [B, L, heads, d]
        pairs, rest = t[..., :rot].unflatten(-1, (rot // 2, 2)), t[..., rot:]
        x0, x1 = pairs[..., 0], pairs[..., 1]
        return torch.cat([torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).flatten(-2), rest], -1)

    def rms(t, w):
        return w * t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps)

    visible = torch.ones(L, L, dtype=torch.bool).tril()[None, None] & mask.bool()[:, None, None, :]
    x = W["transformer.embedding.word_embeddings.weight"][ids]
    for i in range(cfg["num_layers"]):
        p = f"transformer.encoder.layers.{i}."
        qkv = rms(x, W[p + "input_layernorm.weight"]) @ W[p + "self_attention.query_key_value.weight"].T \
            + W[p + "self_attention.query_key_value.bias"]
        q, k, v = qkv.split([heads * d, groups * d, groups * d], -1)
        q, k, v = rope(q.unflatten(-1, (heads, d))), rope(k.unflatten(-1, (groups, d))), v.unflatten(-1, (groups, d))
        k, v = (t.repeat_interleave(heads // groups, 2) for t in (k, v))
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        a = torch.softmax(s.masked_fill(~visible, -math.inf), -1).nan_to_num(0.0)
        x = x + torch.einsum("bhqk,bkhd->bqhd", a, v).flatten(-2) @ W[p + "self_attention.dense.weight"].T
        gate, up = (rms(x, W[p + "post_attention_layernorm.weight"]) @ W[p + "mlp.dense_h_to_4h.weight"].T).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ W[p + "mlp.dense_4h_to_h.weight"].T
    x = rms(x, W["transformer.encoder.final_layernorm.weight"])
    return x[:, -1] @ head.weight.double().T + head.bias.double()  # the last position; ChatGLM3's head has a bias


def encode(folder: Path, padded: bool):
    tok = load_tokenizer(ModelSpec(name_or_path=str(folder)))
    first, second = (["The cat sat on the mat.", "A dog."], ["It is not raining.", "Paris is the capital of France."])
    if not padded:
        first, second = first[:1], second[:1]
    return tok(first, second, padding=True, return_tensors="pt")


def glm_logits(model, batch, positions: bool = False) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch, position_ids=chatglm_positions(batch["attention_mask"]) if positions else None).logits


@pytest.mark.parametrize("padded", [False, True])
def test_native_glm_equals_chatglm3_reference_in_float64(glm_dir, padded, monkeypatch):
    from transformers.models.glm.modeling_glm import GlmRMSNorm

    model, head = load_chatglm3(str(glm_dir), 3, torch.float64)
    batch = encode(glm_dir, padded)
    if padded:
        assert (batch["attention_mask"] == 0).any() and (batch["attention_mask"][:, -1] == 1).all()  # left padding
    with torch.no_grad():
        model.score.bias.normal_()  # starts at zero; a trained one is not
    want = reference_logits(glm_dir, model.score, batch["input_ids"], batch["attention_mask"])
    assert head == ["score.weight", "score.bias"]
    # as transformers ships it, RMSNorm always normalises in float32, so float64 agrees to float32 rounding
    assert torch.allclose(glm_logits(model, batch), want, rtol=0, atol=1e-6)
    # with that one float32 step in float64 instead, the two agree to 1e-10 (the loader numbers positions from
    # the first real token, as ChatGLM3's tokenizer does; passing them explicitly changes nothing)
    monkeypatch.setattr(GlmRMSNorm, "forward", lambda self, x: self.weight * x * torch.rsqrt(
        x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
    got = glm_logits(model, batch)
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=0, atol=1e-10), (got - want).abs().max()
    assert torch.equal(glm_logits(model, batch, positions=True), got)


@pytest.mark.parametrize("layout", ["sharded", "bin"])
def test_sharded_and_bin_checkpoints_load_the_same_weights(tmp_path, glm_dir, layout):
    other = write_chatglm3(tmp_path / layout, layout)
    a, _ = load_chatglm3(str(glm_dir), 2, torch.float32)
    b, _ = load_chatglm3(str(other), 2, torch.float32)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[n], sb[n]) for n in sa if not n.startswith("score"))
    assert a.config.num_key_value_heads == 2 and a.config.head_dim == 8
    assert a.config.rope_parameters["rope_theta"] == 20000.0 and a.config.rope_parameters["partial_rotary_factor"] == 0.5


def test_tokenizer_puts_gmask_sop_first_eos_after_a_pair_and_pads_left(glm_dir):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(glm_dir / "tokenizer.model"))
    tok = load_tokenizer(ModelSpec(name_or_path=str(glm_dir)))
    n = sp.vocab_size()
    assert list(tok.special_ids) == list(SPECIAL_TOKENS) and list(tok.special_ids.values()) == list(range(n, n + 9))
    assert tok.convert_tokens_to_ids(["[gMASK]", "sop", "eop"]) == [n + 1, n + 3, sp.piece_to_id("eop")]  # a piece
    gmask, sop = n + 1, n + 3  # ChatGLM3-6B: 64790 and 64792 after its 64789 pieces
    a, b = "The cat sat.", "It is not raining."
    assert tok(a)["input_ids"] == [gmask, sop] + sp.encode(a)
    assert tok(a, b)["input_ids"] == [gmask, sop] + sp.encode(a) + sp.encode(b) + [2]
    batch = tok([a, a + " " + b], padding=True)
    assert tok.padding_side == "left" and batch["input_ids"][0][0] == tok.pad_token_id == 0
    assert batch["attention_mask"][0][0] == 0 and batch["attention_mask"][0][-1] == 1


ODD_TEXTS = ["Many people saw the leopard.", "jeopardy", "A sophisticated philosopher", "the sopranos",
             "literal [gMASK] sop eop <|user|> <|assistant|> </s> <s> <unk> [MASK] here", "café 東京 — naïve"]


def _tokenizer_and_pieces(folder: Path):
    import sentencepiece as spm

    return load_tokenizer(ModelSpec(name_or_path=str(folder))), spm.SentencePieceProcessor(
        model_file=str(folder / "tokenizer.model"))


@pytest.mark.parametrize("text", ODD_TEXTS)
def test_text_is_sentencepiece_alone_and_round_trips(glm_dir, text):
    """No text becomes a control token, in a word ('people' holds 'eop', which the test vocabulary even has as a
    piece of its own) or literally; decode gives the text back, bytes included."""
    tok, sp = _tokenizer_and_pieces(glm_dir)
    n = sp.vocab_size()
    ids = tok(text)["input_ids"]
    assert ids == [n + 1, n + 3] + sp.encode(text) and max(ids[2:]) < n
    assert tok.decode(ids[2:]) == text == sp.decode(sp.encode(text))  # byte pieces decode to their characters
    assert tok.decode(ids).startswith("[gMASK]sop") and text in tok.decode(ids)  # as ChatGLM3 shows the layout


def _reference(sp, a: str, b: str | None, max_length: int | None) -> list[int]:
    """ChatGLM3's layout from the sentencepiece ids: [gMASK] sop A (B </s>), cut longest field first."""
    n = sp.vocab_size()
    first, second = sp.encode(a), None if b is None else sp.encode(b)
    room = None if max_length is None else max_length - (2 if b is None else 3)
    while room is not None and len(first) + len(second or []) > room:
        if second is None or len(first) > len(second):
            first = first[:-1]
        else:
            second = second[:-1]
    return [n + 1, n + 3] + first + ([] if second is None else second + [sp.eos_id()])


@pytest.mark.parametrize("pair", [False, True])
@pytest.mark.parametrize("max_length", [None, 9])
def test_ids_equal_sentencepiece_plus_chatglm3s_layout_padded_and_truncated(glm_dir, pair, max_length):
    tok, sp = _tokenizer_and_pieces(glm_dir)
    firsts, seconds = ODD_TEXTS[:3], ["It is.", "The team crossed the bridge on day one.", "no"]
    cut = {"truncation": True, "max_length": max_length} if max_length else {}
    batch = tok(firsts, seconds if pair else None, padding=True, **cut)
    want = [_reference(sp, a, b if pair else None, max_length) for a, b in zip(firsts, seconds)]
    width = max(map(len, want))
    assert batch["input_ids"] == [[0] * (width - len(w)) + w for w in want]  # <unk> pads on the left
    assert batch["attention_mask"] == [[0] * (width - len(w)) + [1] * len(w) for w in want]


def test_vocab_size_counts_the_special_tokens_and_decode_drops_eos(glm_dir):
    tok, sp = _tokenizer_and_pieces(glm_dir)
    assert tok.vocab_size == sp.vocab_size() + len(SPECIAL_TOKENS) == len(tok)
    ids = tok("A dog.", "It is.")["input_ids"]
    assert ids[-1] == tok.eos_token_id == 2 and tok.decode(ids[2:]) == tok.decode(ids[2:-1]) == "A dog. It is."
    assert "</s>" not in tok.decode(ids) and tok.decode([0, 1, 2]) == ""  # <unk>, <s>, </s> decode to nothing


def test_a_row_whose_last_real_token_is_unk_is_pooled_at_that_token(glm_dir):
    """ChatGLM3 pools the last position; GLM's stock pooling looks for the last id that is not the pad id (0), so it
    would read such a row one token early. The mask says where the row ends."""
    model, _ = load_chatglm3(str(glm_dir), 2, torch.float64)
    ids = torch.tensor([[0, 0, 301, 303, 7, 0], [301, 303, 7, 8, 9, 10]])  # row 0: left padded, ends in <unk>
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    with torch.no_grad():
        hidden = model.model(ids, attention_mask=mask).last_hidden_state
        got = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, model.score(hidden[:, -1]))
    assert not torch.allclose(got[0], model.score(hidden[0, -2]))  # where the pad-id rule would have pooled


def test_ntk_with_zero_z_and_k_is_the_base_chatglm3(glm_dir):
    model, _ = load_chatglm3(str(glm_dir), 2, torch.float64)
    batch = encode(glm_dir, padded=True)
    with torch.no_grad():
        want = model(**batch).logits
        got = inject(model, "ntk", init="zeros").model(**batch).logits
    assert torch.equal(got, want)


@pytest.mark.parametrize("method, options", [("ntk", {}), ("ptuning-v2", {"prefix_length": 3}),
                                             ("lora", {"r": 2, "dropout": 0.0}), ("fft", {})])
def test_every_method_trains_the_head_and_its_own_tensors_only(glm_dir, method, options):
    spec = ModelSpec(name_or_path=str(glm_dir), dtype="float16" if method != "fft" else "float32")
    model = inject(load_model(spec, image=False, num_labels=2), method, **options).model
    head = [n for n, p in model.named_parameters() if n.endswith(("score.weight", "score.bias")) or
            "modules_to_save" in n and "score" in n]
    assert head and all(p.dtype == torch.float32 for n, p in model.named_parameters() if n in head)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = F.cross_entropy(model(**encode(glm_dir, padded=True)).logits, torch.tensor([0, 1]))
    assert torch.isfinite(loss)
    loss.backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5).step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert moved <= trainable  # nothing frozen moved: the backbone is bit-identical (LoRA's A waits for B ≠ 0)
    assert any(n in moved for n in head)
    own = {"ntk": "ntk_", "ptuning-v2": "prefix_", "lora": "lora_", "fft": "mlp."}[method]
    assert any(own in n for n in moved)


def test_chatglm_rte_recipe_runs_every_method_on_the_tiny_checkpoint(tmp_path, glm_dir):
    """On RTE rows about people (the word whose 'eop' the old shim turned into a control token)."""
    data = write_rte(tmp_path / "rte", "superglue")
    for split in ("train", "val"):
        path = data / f"{split}.jsonl"
        path.write_text(path.read_text().replace('The \\"team\\"', "Many people").replace("The team", "The people"))
    assert "Many people" in (data / "train.jsonl").read_text()
    r = invoke("finetune", RECIPES / "chatglm_rte.yaml", "--set", f"model.name_or_path={glm_dir}",
               "--set", f"data.path={data}", "--device", "cpu", "--set", "train.epochs=2", "--set", "seeds=[0]",
               "--out", tmp_path)
    assert r.exit_code == 0, r.output
    summary = pd.read_csv(tmp_path / "finetune" / "chatglm_rte" / "summary.csv")
    assert list(summary.method) == ["ptuning-v2 m=1", "ptuning-v2 m=10", "ptuning-v2 m=100", "lora r=8", "ntk"]
    results = pd.read_csv(tmp_path / "finetune" / "chatglm_rte" / "results.csv")
    assert results.train_loss.notna().all() and results.eval_loss.map(math.isfinite).all()
    head = 32 * 2 + 2
    assert (summary.trainable_params > head).all()  # the head (32 × 2 and its bias) and each method's own tensors


def test_no_chatglm_recipe_runs_remote_code_and_all_pass_dry_run():
    for recipe in sorted(RECIPES.glob("chatglm_*.yaml")):
        assert "trust_remote_code" not in yaml.safe_load(recipe.read_text())["model"], recipe
        r = invoke("finetune", recipe, "--dry-run")
        assert r.exit_code == 0, r.output


def test_a_non_finite_loss_stops_the_run_naming_method_seed_and_step(tmp_path, glm_dir):
    data = write_rte(tmp_path / "rte", "superglue")
    r = invoke("finetune", RECIPES / "chatglm_rte.yaml", "--set", f"model.name_or_path={glm_dir}",
               "--set", f"data.path={data}", "--device", "cpu", "--set", "seeds=[3]", "--set", "train.epochs=3",
               "--set", "methods=[{method: ntk, lr: 1.0e+30}]", "--set", "train.precision=fp32", "--out", tmp_path)
    assert_one_line_error(r, "method ntk, seed 3", "step", "nothing recorded")
    assert no_results(tmp_path)


def test_unsupported_chatglm_variant_and_broken_loading_are_one_line(tmp_path, glm_dir, monkeypatch):
    import transformers

    layernorm = write_chatglm3(tmp_path / "layernorm", rmsnorm=False)
    r = invoke("finetune", RECIPES / "chatglm_rte.yaml", "--set", f"model.name_or_path={layernorm}",
               "--set", f"data.path={write_rte(tmp_path / 'rte', 'superglue')}", "--device", "cpu", "--out", tmp_path)
    assert_one_line_error(r, str(layernorm), f"transformers {transformers.__version__}", "rmsnorm")

    def broken(*args, **kwargs):
        raise AttributeError("'ChatGLMForSequenceClassification' object has no attribute 'all_tied_weights_keys'")

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", broken)
    r = invoke("finetune", RECIPES / "minilm_rte.yaml", "--set", f"data.path={tmp_path / 'rte'}", "--device", "cpu",
               "--out", tmp_path / "broken")
    assert_one_line_error(r, "all_tied_weights_keys", f"transformers {transformers.__version__}")


def test_padded_queries_cannot_reach_the_visible_rows_once_k_crosses_zero(glm_dir):
    """With k < 0 a padded query's φ(Q)Z/φ(Q)k is unbounded (in float16 it overflowed and, through the next
    layer's values, turned every logit of the padded sequence into NaN): the adapter zeroes those rows, so
    the padded sequence gets the logits it gets alone, and float16 stays finite."""
    batch = encode(glm_dir, padded=True)
    real = batch["attention_mask"][0] == 1
    alone = {"input_ids": batch["input_ids"][:1, real], "attention_mask": batch["attention_mask"][:1, real]}
    for dtype, rel in ((torch.float32, 1e-4), (torch.float16, None)):
        model = inject(load_chatglm3(str(glm_dir), 2, dtype)[0], "ntk", init="zeros").model
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".ntk_Z." in name or ".ntk_k." in name:
                    p.copy_(10 * torch.randn(p.shape, generator=g) if ".ntk_Z." in name
                            else -1e-6 * torch.rand(p.shape, generator=g))
            logits, single = model(**batch).logits, model(**alone).logits
        assert torch.isfinite(logits).all(), dtype
        if rel is not None:
            assert close(logits[0], single[0], rel)


def close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    return bool((a - b).norm() <= rel * b.norm())


def test_an_fp16_scaler_that_skips_every_step_is_an_error(tmp_path, glm_dir, monkeypatch):
    """The grad scaler skipping every optimizer step (overflowing gradients) leaves the weights untouched:
    reported as one line, never a summary of an untrained model."""
    from accelerate import Accelerator

    monkeypatch.setattr(Accelerator, "optimizer_step_was_skipped", property(lambda self: True))
    data = write_rte(tmp_path / "rte", "superglue")
    r = invoke("finetune", RECIPES / "chatglm_rte.yaml", "--set", f"model.name_or_path={glm_dir}",
               "--set", f"data.path={data}", "--device", "cpu", "--set", "seeds=[0]", "--set", "train.epochs=2",
               "--set", "methods=[{method: ntk}]", "--out", tmp_path)
    assert_one_line_error(r, "method ntk, seed 0", "skipped all 2 optimizer steps", "nothing recorded")
    assert no_results(tmp_path)
