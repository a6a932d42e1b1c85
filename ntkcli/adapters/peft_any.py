"""Any method of the peft package as a baseline, one recipe entry each: `{method: peft, peft_type: IA3, …}`.

The entry's other fields are the fields of that method's peft config class (IA3Config, PromptTuningConfig,
LoHaConfig, VeraConfig, …), checked against it when the recipe is read. The task type is sequence
classification and the task head is trained in full (modules_to_save), unless the entry says otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import typing

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from torch import nn

from ..errors import first_line
from .common import Options, head_modules, missing_modules

NAME = "peft"


class PeftOptions(Options):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    peft_type: str = Field(..., description="a peft method (peft.PeftType), e.g. IA3, PROMPT_TUNING, LOHA, VERA")

    @model_validator(mode="after")
    def _peft_accepts(self) -> "PeftOptions":
        self.config()
        return self

    def config(self, head: list[str] | None = None):
        """The peft config of this entry (its fields checked by peft's own config class)."""
        from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

        kind, fields = self.peft_type.upper(), dict(self.model_extra or {})
        if kind not in PEFT_TYPE_TO_CONFIG_MAPPING:
            raise ValueError(f"unknown peft_type {self.peft_type!r}; peft has {', '.join(sorted(PEFT_TYPE_TO_CONFIG_MAPPING))}")
        cls = PEFT_TYPE_TO_CONFIG_MAPPING[kind]
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - names)
        if unknown:
            raise ValueError(f"{cls.__name__} has no field {unknown[0]!r}")
        for name, value in fields.items():
            _check_field(cls, name, value)
        defaults = {"task_type": "SEQ_CLS", "modules_to_save": head or None}
        fields.update({k: v for k, v in defaults.items() if k in names and k not in fields and v is not None})
        try:
            return cls(**fields)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{cls.__name__}: {first_line(err)}") from None


def _check_field(cls, name: str, value) -> None:
    """One field of a peft config: of its declared type (peft's dataclasses do not check), finite, and in range: a
    rank or a count (r, num_…) at least 1, a dropout in [0, 1)."""
    try:
        hint = typing.get_type_hints(cls).get(name)
    except (NameError, TypeError):  # a hint that names what this Python cannot resolve: only the ranges are checked
        hint = None
    where = f"{cls.__name__}.{name}"
    if hint is not None:
        try:
            TypeAdapter(hint, config=ConfigDict(allow_inf_nan=False)).validate_python(value)
        except ValidationError as err:
            raise ValueError(f"{where}: {err.errors()[0]['msg'].lower()} (got {value!r})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not math.isfinite(value):
        raise ValueError(f"{where} must be finite (got {value!r})")
    if (name == "r" or name.startswith("num_")) and value < 1:
        raise ValueError(f"{where} must be at least 1 (got {value!r})")
    if "dropout" in name and not 0 <= value < 1:
        raise ValueError(f"{where} must be in [0, 1) (got {value!r})")


OPTIONS = PeftOptions


def check(model: nn.Module, opts: PeftOptions, image: bool) -> None:
    """What peft would refuse once the run had started: a method that learns virtual tokens of a text model on an
    image model, and whatever get_peft_model raises (target modules the model lacks, …), tried on `model`."""
    config = opts.config(head_modules(model))
    if config.is_prompt_learning and image:
        raise ValueError(f"{opts.peft_type} learns virtual input tokens of a text model; an image model takes pixels")
    for field in ("target_modules", "feedforward_modules"):
        missing = missing_modules(model, getattr(config, field, None))
        if missing:
            raise ValueError(f"{field}: {type(model).__name__} has no module {missing[0]!r}")
    try:
        get_peft_model_quietly(model, config)
    except Exception as err:  # noqa: BLE001 — peft's own refusal, as one line
        raise ValueError(f"{type(config).__name__}: {first_line(err)}") from None


def get_peft_model_quietly(model: nn.Module, config):
    import warnings

    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(model, config)


def inject(model: nn.Module, opts: PeftOptions) -> nn.Module:
    """The model wrapped by peft with this entry's method; the task head trained in full."""
    from peft import get_peft_model

    return get_peft_model(model, opts.config(head_modules(model)))
