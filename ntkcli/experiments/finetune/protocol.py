"""What the training loop (train.py) and its Trainer (trainer.py) agree on: the column of row ids, the precision
flags, and the failure that records nothing. Both import it; it imports neither."""

from __future__ import annotations

import warnings

import torch

from ...errors import UserError
from .recipe import TrainSpec

ROW = "row"  # the column whose ids travel with each evaluation row through the batches


def precision(spec: TrainSpec, device: torch.device) -> dict:
    """The Trainer's bf16/fp16 flags: auto is bf16 on a GPU that has it, else fp32."""
    mode = spec.precision
    if mode == "auto":
        mode = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if mode == "bf16" and device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        warnings.warn("bf16 on a CPU without native bf16 (AVX512-BF16 or AMX) is emulated: training runs several "
                      "times slower than fp32 (precision: auto picks fp32 on a CPU)", stacklevel=2)
    return {"bf16": mode == "bf16", "fp16": mode == "fp16"}


class TrainingFailed(Exception):
    """Training produced nothing worth recording (a non-finite loss, no optimizer step taken, or an evaluation
    whose predictions do not line up with its rows)."""


class MethodFailed(UserError):
    """A method's run failed (TrainingFailed), named for the user; a caller that records failures catches it."""
