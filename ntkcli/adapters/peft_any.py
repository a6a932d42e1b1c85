"""Any method of the peft package as a baseline, one recipe entry each: `{method: peft, peft_type: IA3, …}`.

The entry's other fields are the fields of that method's peft config class (IA3Config, PromptTuningConfig,
LoHaConfig, VeraConfig, …), checked against it when the recipe is read. The task type is sequence
classification and the task head is trained in full (modules_to_save), unless the entry says otherwise.
"""

from __future__ import annotations

import dataclasses

from pydantic import ConfigDict, Field, model_validator
from torch import nn

from ..errors import first_line
from .common import Options, head_modules

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
        defaults = {"task_type": "SEQ_CLS", "modules_to_save": head or None}
        fields.update({k: v for k, v in defaults.items() if k in names and k not in fields and v is not None})
        try:
            return cls(**fields)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{cls.__name__}: {first_line(err)}") from None


OPTIONS = PeftOptions


def inject(model: nn.Module, opts: PeftOptions) -> nn.Module:
    """The model wrapped by peft with this entry's method; the task head trained in full."""
    from peft import get_peft_model

    return get_peft_model(model, opts.config(head_modules(model)))
