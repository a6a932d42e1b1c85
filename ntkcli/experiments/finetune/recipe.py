"""The recipe of `ntk finetune`: the model, the data, the training, the methods (one entry each) and seeds."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ...adapters import lora, lora_ntk, ntk, peft_any, ptuning_v2
from ...adapters.common import Options
from ...recipes import Recipe, Section, Seed


class ModelSpec(Section):
    name_or_path: str | None = Field(None, description="hub id, local folder, or pkg:<package>/<folder> for a "
                                     "model shipped inside an installed package")
    config: dict[str, Any] | None = Field(None, description="instead: a randomly initialised model from this config "
                                          "(model_type and sizes), or the architecture `pretrain` trains")
    tokenizer: str | None = Field(None, description="tokenizer location; defaults to name_or_path")
    trust_remote_code: bool = Field(False, description="run modelling code downloaded from the hub (avoid it: "
                                    "ChatGLM3 loads natively without it)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if (self.name_or_path is None) == (self.config is None):
            raise ValueError("give exactly one of name_or_path and config")
        return self


class DataSpec(Section):
    name: str | None = Field(None, description="hub data set (e.g. aps/super_glue), or 'digits' (scikit-learn, offline)")
    config: str | None = Field(None, description="hub configuration (e.g. rte)")
    path: str | None = Field(None, description="local folder or file instead of the hub: JSONL, TSV, CSV, parquet, "
                             "or image folders per split")
    text_fields: list[str] = Field([], max_length=2, description="one or two fields, or templates like "
                                   "'{premise} What was the {question}?'")
    image_field: str | None = Field(None, description="the image column of an image task")
    label_field: str = "label"
    label_names: list[str] | None = Field(None, description="label strings in class order (local files)")
    num_labels: int = Field(..., ge=2)
    classes: list[int] | None = Field(None, description="keep only these labels, renumbered 0, 1, … (digits 5–9)")
    train_split: str = "train"
    eval_split: str = "validation"
    eval_fraction: float = Field(0.3, gt=0, lt=1, description="digits: share held out for evaluation")
    max_length: int = Field(128, ge=8, description="tokens per text field")
    max_train_samples: int | None = Field(None, ge=1)
    max_eval_samples: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _has_inputs(self) -> "DataSpec":
        if self.name is None and self.path is None:
            raise ValueError("give a hub name (or 'digits') or a local path")
        if bool(self.text_fields) == (self.image_field is not None):
            raise ValueError("give text_fields for a text task or image_field for an image task")
        if self.classes is not None and len(self.classes) != self.num_labels:
            raise ValueError(f"classes lists {len(self.classes)} labels but num_labels is {self.num_labels}")
        return self


class TrainSpec(Section):
    epochs: int = Field(3, ge=1, le=100_000)
    batch_size: int = Field(32, ge=1, le=1_000_000)
    eval_batch_size: int = Field(64, ge=1, le=1_000_000)
    lr: float = Field(1e-3, gt=0, description="AdamW step of the PEFT methods (the paper's 1e-3)")
    fft_lr: float = Field(5e-5, gt=0, description="AdamW step of full fine-tuning")
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field("auto", description="auto: bf16 on a GPU that has it, else fp32")


class PretrainSpec(Section):
    """Train the `model.config` architecture from scratch on other classes first (cached in the run folder)."""

    classes: list[int] = Field(..., min_length=2)
    epochs: int = Field(20, ge=1, le=100_000)
    batch_size: int = Field(64, ge=1, le=1_000_000)
    lr: float = Field(1e-3, gt=0)


class _MethodCommon(Section):
    lr: float | None = Field(None, gt=0, description="overrides train.lr / train.fft_lr")
    label: str | None = Field(None, description="name in tables; defaults to the method and its size")


class NTKMethod(ntk.NTKOptions, _MethodCommon):
    method: Literal["ntk"]


class LoraNTKMethod(lora_ntk.LoraNTKOptions, _MethodCommon):
    """LoRA + NTK-Attention, one method: NTK-Attention's options, and `lora: {r: 8, …}` for the LoRA under it."""

    method: Literal["lora+ntk"]


class PTuningMethod(ptuning_v2.PTuningOptions, _MethodCommon):
    method: Literal["ptuning-v2"]


class LoraMethod(lora.LoraOptions, _MethodCommon):
    method: Literal["lora"]


class PeftMethod(peft_any.PeftOptions, _MethodCommon):
    """Any peft method: peft_type and that method's config fields."""

    model_config = peft_any.PeftOptions.model_config
    method: Literal["peft"]


class FFTMethod(Options, _MethodCommon):
    method: Literal["fft"]


class HeadMethod(Options, _MethodCommon):
    """The task head alone on the frozen backbone (a linear probe): what any method adds is measured against it."""

    method: Literal["head"]


MethodSpec = Annotated[NTKMethod | LoraNTKMethod | PTuningMethod | LoraMethod | PeftMethod | FFTMethod | HeadMethod,
                       Field(discriminator="method")]


def method_label(spec) -> str:
    """The method's name in tables: its label, or the method and its size (ptuning-v2 m=10, lora r=8)."""
    if spec.label:
        return spec.label
    if spec.method == "ptuning-v2":
        return f"ptuning-v2 m={spec.prefix_length}"
    if spec.method == "lora":
        return f"lora r={spec.r}"
    if spec.method == "lora+ntk":
        return f"lora r={spec.lora.r} + ntk"
    if spec.method == "peft":
        return f"peft {spec.peft_type.lower()}"
    return spec.method


def method_options(spec) -> dict[str, Any]:
    return spec.model_dump(exclude={"method", "lr", "label"})


class FinetuneRecipe(Recipe):
    """§5, Tables 1–2: NTK-Attention vs P-Tuning v2 vs LoRA vs full fine-tuning, several seeds."""

    model: ModelSpec
    data: DataSpec
    methods: list[MethodSpec] = Field(..., min_length=1)  # type: ignore[valid-type]
    train: TrainSpec = TrainSpec()
    seeds: list[Seed] = Field([0, 1, 2], min_length=1)
    pretrain: PretrainSpec | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "FinetuneRecipe":
        labels = [method_label(m) for m in self.methods]
        if len(set(labels)) != len(labels):
            raise ValueError(f"method labels must differ (got {labels}); set a label per method")
        if self.pretrain is not None and self.model.config is None:
            raise ValueError("pretrain trains model.config from scratch; give model.config, not name_or_path")
        return self
