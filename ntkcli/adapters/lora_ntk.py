"""LoRA + NTK-Attention as one method: peft's LoRA on the attention projections, then NTK-Attention's (Z, k) on the
attention modules of that LoRA model; both trained (the task head too)."""

from __future__ import annotations

from pydantic import Field

from .lora import LoraOptions
from .ntk import NTKOptions

NAME = "lora+ntk"


class LoraNTKOptions(NTKOptions):
    """NTK-Attention's options, and `lora`: the LoRA under it."""

    lora: LoraOptions = Field(default_factory=LoraOptions, description="the LoRA under NTK-Attention (r, alpha, "
                              "dropout, target_modules)")

    def parts(self) -> tuple[LoraOptions, dict]:
        """(LoRA's options, NTK-Attention's options)."""
        return self.lora, self.model_dump(exclude={"lora"})
