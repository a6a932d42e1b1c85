"""The fine-tuning methods on tiny random BERT, ViT and Llama models (offline, built from configs)."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (AttentionInterface, AutoConfig, AutoModelForImageClassification,
                          AutoModelForSequenceClassification)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ntkcli.adapters import inject, load_adapter, save_adapter
from ntkcli.adapters.common import freeze_backbone, register

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=3)
ARCHS = {
    "bert": dict(vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "llama": dict(vocab_size=100, num_key_value_heads=2, pad_token_id=0),  # grouped-query attention, causal
    "vit": dict(image_size=8, patch_size=4, num_channels=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
}
# every interface method with a non-trivial start, so that its extra attention terms matter
METHODS = {"ntk": dict(init="prefix", prefix_length=16, feature_map="elu"), "ptuning-v2": dict(prefix_length=5),
           "lora": dict(r=4, dropout=0.0), "fft": {}}


def tiny(arch: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    auto = AutoModelForImageClassification if arch == "vit" else AutoModelForSequenceClassification
    return auto.from_config(AutoConfig.for_model(arch, **SIZES, **ARCHS[arch])).eval()


def batch(arch: str, padded: bool = True) -> dict:
    g = torch.Generator().manual_seed(1)
    if arch == "vit":
        return {"pixel_values": torch.randn(3, 1, 8, 8, generator=g)}
    ids = torch.randint(1, 100, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 6:], mask[2, 3:] = 0, 0
        ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask}


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    """‖a − b‖ ≤ rel·‖b‖ (random tiny models have small logits, so absolute tolerances say little)."""
    return bool((a - b).norm() <= rel * b.norm())


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("arch", ARCHS)
def test_ntk_with_zero_z_and_k_is_the_base_model(arch):
    base = tiny(arch)
    want = logits(base, batch(arch))
    injected = inject(base, "ntk", init="zeros")
    assert torch.equal(logits(injected.model, batch(arch)), want)
    nz = [p for n, p in injected.model.named_parameters() if "ntk_" in n]
    assert nz and all(torch.count_nonzero(p) == 0 for p in nz)


def _naive_prefix_attention(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
    """Reference: explicit concatenation [P_K; K], [P_V; V] and a float64 softmax with -inf masking."""
    B, H, L, d = q.shape
    g = H // k.shape[1]
    pk, pv = (p.repeat_interleave(H // p.shape[0], 0).expand(B, -1, -1, -1) for p in
              (module.prefix_key, module.prefix_value))
    keys = torch.cat([pk, k.repeat_interleave(g, 1)], 2).double()
    values = torch.cat([pv, v.repeat_interleave(g, 1)], 2).double()
    s = q.double() @ keys.transpose(-1, -2) * scaling
    m = pk.shape[2]
    if mask is not None:
        s[..., m:] = s[..., m:].masked_fill(~mask, -math.inf)
    elif getattr(module, "is_causal", False):
        s[..., m:] = s[..., m:].masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    return (torch.softmax(s, -1) @ values).float().transpose(1, 2), None


@pytest.mark.parametrize("arch", ARCHS)
def test_ptuning_v2_equals_explicit_concatenation(arch):
    injected = inject(tiny(arch), "ptuning-v2", prefix_length=7)
    ours = logits(injected.model, batch(arch))
    AttentionInterface.register("naive-prefix", _naive_prefix_attention)
    AttentionMaskInterface.register("naive-prefix", partial(sdpa_mask, allow_is_causal_skip=False))
    injected.model.set_attn_implementation("naive-prefix")
    assert close(ours, logits(injected.model, batch(arch)))
    assert not close(ours, logits(tiny(arch), batch(arch)), 1e-2)  # the prefix does act


@pytest.mark.parametrize("arch", ["bert", "llama"])
@pytest.mark.parametrize("method", ["ntk", "ptuning-v2", "lora"])
def test_padding_does_not_change_the_unpadded_rows(arch, method):
    model = inject(tiny(arch), method, **METHODS[method]).model
    full = batch(arch, padded=False)
    padded = batch(arch)
    together = logits(model, padded)
    for row, length in ((1, 6), (2, 3)):
        alone = {"input_ids": padded["input_ids"][row:row + 1, :length],
                 "attention_mask": torch.ones(1, length, dtype=torch.long)}
        assert close(logits(model, alone)[0], together[row])
    assert close(logits(model, full)[0], together[0])


INTENDED = {"ntk": ("ntk_Z", "ntk_k"), "ptuning-v2": ("prefix_key", "prefix_value"), "lora": ("lora_A", "lora_B")}


def _train_step(model, arch: str) -> None:
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    out = model(**batch(arch), labels=torch.tensor([0, 1, 2]))
    out.loss.backward()
    opt.step()
    model.eval()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", METHODS)
def test_a_training_step_changes_only_the_intended_parameters(arch, method):
    injected = inject(tiny(arch), method, **METHODS[method])
    model = injected.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train_step(model, arch)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable, changed - trainable  # the frozen backbone is bit-identical
    if method == "fft":
        assert injected.trainable == injected.total
        return
    heads = {n for n in trainable if "classifier" in n or "score" in n}
    assert heads and heads <= changed  # the task head trains
    assert trainable - heads == {n for n in trainable if any(k in n for k in INTENDED[method])}
    assert any(any(k in n for k in INTENDED[method]) for n in changed)
    assert injected.trainable < injected.total / 4


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", ["ntk", "ptuning-v2", "lora"])
def test_save_then_load_gives_the_same_logits(arch, method, tmp_path):
    injected = inject(tiny(arch), method, **METHODS[method])
    _train_step(injected.model, arch)
    want = logits(injected.model, batch(arch))
    save_adapter(injected, tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter.safetensors").is_file()
    loaded = load_adapter(tiny(arch), tmp_path / "adapter")  # same base weights (same seed), fresh head
    assert close(logits(loaded.model, batch(arch)), want, 1e-6)
    assert not close(logits(tiny(arch), batch(arch)), want, 1e-2)


def test_ntk_prefix_init_approximates_the_same_prefix_attended_exactly():
    """Eq. (4) with taylor2 features compresses the same random prefix that ptuning-v2 attends to."""
    m = 64
    exact = logits(inject(tiny("bert"), "ptuning-v2", prefix_length=m, init="prefix").model, batch("bert"))
    approx = logits(inject(tiny("bert"), "ntk", init="prefix", prefix_length=m, feature_map="taylor2").model,
                    batch("bert"))
    base = logits(tiny("bert"), batch("bert"))
    assert (approx - exact).norm() < 0.1 * (base - exact).norm()


def test_unknown_method_and_option_are_errors():
    with pytest.raises(ValueError, match="unknown method"):
        inject(tiny("bert"), "adapterx")
    with pytest.raises(ValueError, match="rank"):
        inject(tiny("bert"), "ntk", rank=3)


# --- ChatGLM3: core_attention(query, key, value, mask) on [seq, batch, heads, head_dim] -------------

class ReferenceCore(nn.Module):
    """ChatGLM3's contract: bool mask with True = masked out, None = causal; returns [seq, batch, h·d]."""

    def forward(self, query, key, value, attention_mask):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=~attention_mask)
        L, B, H, d = query.shape
        return out.permute(2, 0, 1, 3).reshape(L, B, H * d)


class GLMAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query_key_value = nn.Linear(hidden, 3 * hidden)
        self.core_attention = ReferenceCore()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, x, mask):
        L, B, _ = x.shape
        q, k, v = self.query_key_value(x).view(L, B, 3, self.heads, self.head_dim).unbind(2)
        return x + self.dense(self.core_attention(q, k, v, mask))


class TinyGLM(nn.Module):
    def __init__(self, hidden=32, heads=4, layers=2, labels=3):
        super().__init__()
        self.config = AutoConfig.for_model("bert", hidden_size=hidden, num_attention_heads=heads)
        self.config.kv_channels = hidden // heads
        self.embed = nn.Embedding(100, hidden)
        self.layers = nn.ModuleList(GLMAttention(hidden, heads) for _ in range(layers))
        self.classifier = nn.Linear(hidden, labels)

    def forward(self, ids, mask=None):
        x = self.embed(ids).transpose(0, 1)  # [seq, batch, hidden]
        for layer in self.layers:
            x = layer(x, mask)
        return self.classifier(x[-1])


def _glm(seed=0):
    torch.manual_seed(seed)
    return TinyGLM().eval()


def test_chatglm_adapter_with_zero_ntk_is_the_base_module():
    ids = torch.randint(0, 100, (2, 6))
    want = _glm()(ids)
    injected = inject(_glm(), "ntk", init="zeros")
    assert all(type(layer.core_attention).__name__ == "CoreAttention" for layer in injected.model.layers)
    with torch.no_grad():
        assert close(injected.model(ids), want, 1e-6)
    names = {n for n, p in injected.model.named_parameters() if p.requires_grad}
    assert names == {f"layers.{i}.core_attention.ntk_{t}" for i in range(2) for t in "Zk"} | \
        {"classifier.weight", "classifier.bias"}


def test_chatglm_adapter_honours_the_masked_out_convention_and_trains():
    ids = torch.randint(0, 100, (2, 6))
    pad = torch.zeros(2, 1, 6, 6, dtype=torch.bool)
    pad[..., 4:] = True  # the last two keys are masked out
    model = inject(_glm(), "ptuning-v2", prefix_length=3, init="normal").model
    with torch.no_grad():
        a = model(ids, pad)
        ids2 = ids.clone()
        ids2[:, 4] = (ids2[:, 4] + 1) % 100  # change a masked-out token that is not the last (read) one
        b = model(ids2, pad)
    assert close(a, b, 1e-6)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    F.cross_entropy(model(ids), torch.tensor([0, 1])).backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert any("prefix_key" in n for n in changed) and not any("query_key_value" in n for n in changed)


def test_chatglm_ptuning_matches_an_explicit_prefix():
    core = inject(_glm(), "ptuning-v2", prefix_length=4, init="normal").model.layers[0].core_attention
    L, B, H, d = 5, 2, 4, 8
    q, k, v = (torch.randn(L, B, H, d) for _ in range(3))
    with torch.no_grad():
        out = core(q, k, v, None)
    pk, pv = (p.unsqueeze(0).expand(B, -1, -1, -1) for p in (core.prefix_key, core.prefix_value))
    keys = torch.cat([pk, k.permute(1, 2, 0, 3)], 2)
    values = torch.cat([pv, v.permute(1, 2, 0, 3)], 2)
    s = q.permute(1, 2, 0, 3) @ keys.transpose(-1, -2) / math.sqrt(d)
    s[..., 4:] = s[..., 4:].masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    want = (torch.softmax(s, -1) @ values).permute(2, 0, 1, 3).reshape(L, B, H * d)
    assert close(out, want, 1e-5)


def test_chatglm_prefix_init_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="ChatGLM"):
        inject(_glm(), "ntk", init="prefix")


def test_freeze_backbone_keeps_only_the_head():
    model = tiny("bert")
    freeze_backbone(model)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"classifier.weight", "classifier.bias"}
    register("ntk-test", lambda *a: None)  # registering twice or under new names is harmless
