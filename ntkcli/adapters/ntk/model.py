"""NTK-Attention as a peft tuner: `NTKAttentionModel`, the BaseTuner that `get_peft_model(model,
NTKAttentionConfig(...))` builds. Its layers (NTKAttentionLayer) are children of the modules that call
transformers' attention interface, found by that call (so fused-QKV models are served too), not by projection
names; the attention runs through the interface under the name "ntk". The same injection serves `ntk finetune`
(adapters.inject), so the CLI and the library share one implementation."""

from __future__ import annotations

import functools
import inspect

import torch
from peft.tuners.tuners_utils import BaseTuner
from torch import nn

import ntkcli.adapters.ntk.layer as ntk_layer  # the adapter module inject_attention takes (not the package: no loop)

from ..common import attention_modules, inject_attention
from .config import NTKAttentionConfig
from .layer import NAME, NTKAttentionLayer, modules_of

NOT_MERGEABLE = ("NTK-Attention cannot be merged into the model's weights: its (Z, k) add φ(Q)Z to the numerator and "
                 "φ(Q)k to the softmax normaliser of every query row, a function of the query that no weight matrix "
                 "computes. Keep the adapter (save_pretrained), or take the base model back with unload().")


@functools.cache
def _takes_positions(cls: type) -> bool:
    return "position_ids" in inspect.signature(cls.forward).parameters


def positions_from_mask(model: nn.Module, args: tuple, kwargs: dict) -> dict:
    """Without position_ids, the positions a padded row has alone (as generate() derives them), where the model
    takes them: φ(Q) of NTK-Attention reads each query's absolute (RoPE-rotated) value, which softmax attention
    does not, so a left-padded row must not see shifted positions."""
    mask = kwargs.get("attention_mask")
    if mask is None or kwargs.get("position_ids") is not None or not _takes_positions(type(model)):
        return kwargs
    ids = kwargs.get("input_ids", args[0] if args else None)
    length = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
    positions = mask.long().cumsum(-1) - 1
    return {**kwargs, "position_ids": positions.masked_fill(mask == 0, 1)[:, -length:]}


class NTKAttentionModel(BaseTuner):
    """peft's tuner for NTK-Attention (see the module's docstring). merge_adapter and merge_and_unload raise, since
    NTK-Attention has no merged form; unload() gives the base model back."""

    prefix = "ntk_"
    tuner_layer_cls = NTKAttentionLayer
    target_module_mapping: dict = {}  # no target names: the attention modules are found by their call

    def inject_adapter(self, model: nn.Module, adapter_name: str, autocast_adapter_dtype: bool = True,
                       low_cpu_mem_usage: bool = False, state_dict: dict | None = None) -> None:
        """Add the adapter's layers to every attention module and route attention through NTK-Attention; then
        peft's bookkeeping as BaseTuner.inject_adapter does it (trainable flags, modules_to_save, the flags of the
        adapters already there kept)."""
        from peft import PeftModel
        from peft.utils.other import set_additional_trainable_modules

        config: NTKAttentionConfig = self.peft_config[adapter_name]
        if isinstance(model, (PeftModel, BaseTuner)):
            raise ValueError("this model is a peft model already; give get_peft_model the base model")
        if modules_of(model) and not hasattr(self, "original_attention"):
            raise ValueError(f"this {type(model).__name__} holds NTK-Attention layers already (from an earlier "
                             "get_peft_model or inject?); start from a fresh base model, or add_adapter on that one")
        if config.base_model_class not in (None, type(model).__name__):
            raise ValueError(f"adapter {adapter_name!r} was made for {config.base_model_class}, not "
                             f"{type(model).__name__}")
        config.base_model_class = type(model).__name__
        existing = [(p, p.requires_grad) for p in model.parameters()] if modules_of(model) else []
        if not hasattr(self, "original_attention"):
            self.original_attention = model.config._attn_implementation
        modules = inject_attention(model, ntk_layer, config.options(), adapter_name)
        adapted = {id(m) for m in modules}
        self.targeted_module_names += [name for name, m in model.named_modules() if id(m) in adapted]
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)
        self._mark_only_adapters_as_trainable(model)
        set_additional_trainable_modules(model=model, peft_config=config, model_config=self.get_model_config(model),
                                         adapter_name=adapter_name,
                                         activate_adapter=adapter_name in self.active_adapters)
        for parameter, requires_grad in existing:
            parameter.requires_grad = requires_grad

    def forward(self, *args, **kwargs):
        return self.model(*args, **positions_from_mask(self.model, args, kwargs))

    def _create_and_replace(self, *args, **kwargs):  # BaseTuner's abstract hook; inject_adapter does not use it
        raise NotImplementedError("NTK-Attention adds layers beside the attention modules; nothing is replaced")

    @staticmethod
    def _check_target_module_exists(config, key):
        return False

    def _prepare_adapter_config(self, peft_config, model_config):
        return peft_config

    def _enable_adapter_layers(self, enabled: bool = True) -> None:
        """peft's switch, and the model's own attention implementation while disabled: the base model exactly."""
        super()._enable_adapter_layers(enabled)
        self.model.set_attn_implementation(NAME if enabled else self.original_attention)

    def set_adapter(self, adapter_name, inference_mode: bool = False) -> None:
        names = [adapter_name] if isinstance(adapter_name, str) else list(adapter_name)
        if len(names) != 1:
            raise ValueError(f"NTK-Attention runs one adapter at a time; asked for {names}")
        super().set_adapter(adapter_name, inference_mode)

    def merge_adapter(self, *args, **kwargs) -> None:
        raise ValueError(NOT_MERGEABLE)

    def merge_and_unload(self, *args, **kwargs) -> nn.Module:
        raise ValueError(NOT_MERGEABLE)

    def _unload_and_optionally_merge(self, merge: bool = True, **kwargs) -> nn.Module:
        """unload(): every NTK-Attention layer removed and the model's own attention back; peft unloads the rest
        (a modules_to_save head becomes its trained copy)."""
        if merge:
            raise ValueError(NOT_MERGEABLE)
        for module in attention_modules(self.model):
            if hasattr(module, "ntk_attention"):
                del module.ntk_attention
        self.model.set_attn_implementation(self.original_attention)
        return super()._unload_and_optionally_merge(merge=False, **kwargs)

    @classmethod
    def _remap_adapter_state_dict_for_load(cls, model, config, adapter_name, state_dict):
        """peft's key mapping, then a check that the file holds exactly this model's NTK-Attention tensors in their
        shapes (peft only warns about missing keys: a partial NTK adapter computes something else)."""
        state_dict = super()._remap_adapter_state_dict_for_load(model, config, adapter_name, state_dict)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if config.base_model_class not in (None, type(base).__name__):
            raise ValueError(f"the adapter was made for {config.base_model_class}, not {type(base).__name__}")
        own = {n: t for n, t in model.state_dict().items() if ".ntk_attention." in n and n.endswith(f".{adapter_name}")}
        saved = {n: t for n, t in state_dict.items() if ".ntk_attention." in n}
        check_tensors(saved, own, "the adapter")
        for layer in modules_of(model):
            layer.pending.discard(adapter_name)  # the saved tensors replace whatever a calibration would compute
        return state_dict


def check_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], where: str) -> None:
    """One ValueError for the first tensor that `got` lacks, has too many, or has in another shape."""
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing:
        raise ValueError(f"{where} lacks {len(missing)} tensor(s) of this model, the first {missing[0]}")
    if extra:
        raise ValueError(f"{where} holds {len(extra)} tensor(s) this model has not, the first {extra[0]}")
    for name, tensor in got.items():
        if tuple(tensor.shape) != tuple(want[name].shape):
            raise ValueError(f"{where}: {name} has shape {tuple(tensor.shape)}, this model's "
                             f"{tuple(want[name].shape)}")
