"""The fine-tuning methods on tiny random BERT, ViT and Llama models (offline, built from configs)."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from torch import nn
from transformers import (AttentionInterface, AutoConfig, AutoModelForImageClassification,
                          AutoModelForSequenceClassification)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ntkcli.adapters import inject, load_adapter, ntk, save_adapter
from ntkcli.experiments.finetune import adapter_bytes
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
    assert (tmp_path / "adapter" / "adapter.safetensors").stat().st_size == adapter_bytes(injected.model)  # the cost
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


def test_freeze_backbone_keeps_only_the_head():
    model = tiny("bert")
    freeze_backbone(model)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"classifier.weight", "classifier.bias"}
    register(ntk)
    register(ntk)  # registering twice is harmless


@pytest.mark.parametrize("peft_type, own", [("IA3", "ia3_"), ("PROMPT_TUNING", "prompt_encoder")])
def test_a_peft_entry_trains_only_its_method_and_the_head(peft_type, own):
    """`{method: peft, peft_type: …}` builds the method from peft's own config class (no code of ours per
    method): after one step only that method's tensors and the task head have moved."""
    options = {"num_virtual_tokens": 4} if peft_type == "PROMPT_TUNING" else {}
    model = inject(tiny("bert"), "peft", peft_type=peft_type, **options).model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(own in n or "classifier" in n for n in trainable), trainable
    assert any(own in n for n in trainable) and any("classifier" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = model(**batch("bert"), labels=torch.tensor([0, 1, 2])).loss
    loss.backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5).step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved <= trainable and any(own in n for n in moved) and any("classifier" in n for n in moved)


def test_a_bad_peft_entry_is_refused_with_its_reason():
    with pytest.raises(ValueError, match="unknown peft_type"):
        inject(tiny("bert"), "peft", peft_type="NOPE")
    with pytest.raises(ValueError, match="IA3Config has no field 'rank'"):
        inject(tiny("bert"), "peft", peft_type="IA3", rank=3)
