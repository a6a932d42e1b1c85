"""LoRA through the peft package, with target modules chosen per architecture."""

from __future__ import annotations

from pydantic import Field
from torch import nn

from .common import Options, head_modules, missing_modules

NAME = "lora"
# (projection names) per architecture family, tried in order: BERT/ViT, Llama/Qwen/GLM (ChatGLM3 too)/…, GPT-2
TARGETS = (("query", "value"), ("q_proj", "v_proj"), ("c_attn",))


class LoraOptions(Options):
    r: int = Field(8, ge=1, description="rank")
    alpha: float = Field(16, gt=0, description="scaling numerator (ΔW = alpha/r · BA)")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout on the LoRA input")
    target_modules: list[str] | None = Field(None, description="module names; null picks query/value per architecture")


def default_targets(model: nn.Module) -> list[str]:
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    for family in TARGETS:
        if all(n in names for n in family):
            return list(family)
    raise ValueError("cannot tell this model's attention projections; set target_modules for lora")


def check(model: nn.Module, opts: LoraOptions) -> None:
    """Every target module exists in the model (peft would report only the first, once the run had started)."""
    missing = missing_modules(model, opts.target_modules or default_targets(model))
    if missing:
        raise ValueError(f"target_modules: {type(model).__name__} has no module {missing[0]!r}")


def inject(model: nn.Module, opts: LoraOptions) -> nn.Module:
    """The model wrapped by peft: LoRA on the targets, the task head trained in full."""
    from peft import LoraConfig, get_peft_model

    head = head_modules(model)
    config = LoraConfig(r=opts.r, lora_alpha=opts.alpha, lora_dropout=opts.dropout,
                        target_modules=opts.target_modules or default_targets(model), modules_to_save=head or None)
    return get_peft_model(model, config)
