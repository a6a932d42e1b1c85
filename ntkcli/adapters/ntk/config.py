"""NTK-Attention's options: `NTKOptions` (pydantic, what recipes validate) and `NTKAttentionConfig`, the same
options as a peft `PeftConfig`, so that `get_peft_model(model, NTKAttentionConfig(...))` works and an adapter folder
is a normal peft folder (`peft_type: NTK_ATTENTION` in adapter_config.json)."""

from __future__ import annotations

from dataclasses import field, make_dataclass
from typing import Literal, Optional

from peft import PeftConfig
from peft.utils import PeftType
from pydantic import Field

from ...attention import FEATURE_MAPS
from ..common import Options

PEFT_NAME = "ntk_attention"  # peft's name of the method; its PeftType member is NTK_ATTENTION


class NTKOptions(Options):
    init: Literal["zeros", "paper", "prefix", "text"] = Field(
        "zeros", description="zeros: starts as the base model; paper: the released ChatGLM script's randn/1e4; "
        "prefix: Eq. (4) from a random prefix through the layer's own key/value projections; text: Eq. (4) from "
        "the keys and values of real training inputs through the frozen model (prefix_length tokens per layer)")
    feature_map: Literal[FEATURE_MAPS] = Field("elu", description="φ (elu is the paper's)")  # type: ignore[valid-type]
    num_features: int = Field(256, ge=1, description="random features of the favor map")
    prefix_length: int = Field(100, ge=1, description="m: the prefix that init 'prefix' draws, the tokens init 'text' "
                               "compresses")
    k_map: Literal["signed", "abs", "square"] = Field(
        "signed", description="k as a function of the trained κ: signed (k = κ), abs (|κ|, the released code: with a "
        "zero init it never moves), square (κ², never negative, so the denominator stays positive for φ ≥ 0)")
    scale: Literal["fixed", "calibrated"] = Field(
        "fixed", description="fixed: g is the init's own log-scale (0 for zeros and paper); calibrated: g per head "
        "from a batch of training inputs, so that k = 1 in every entry would hold half the attention mass of the "
        "median real query row (a unit step then moves the share visibly)")
    gate: bool = Field(False, description="train g too (its gradient needs a nonzero Z or k at init)")
    phi_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on φ(Q) while training (the released ViT "
                               "script's 0.2)")
    prefix_lr: float | None = Field(None, gt=0, description="AdamW step of Z, k and g; the task head keeps the "
                                    "method's step")
    seed: int = Field(0, ge=0, description="seed of the random init and of the favor features")

    @property
    def needs_batch(self) -> bool:
        """Whether the adapter reads training inputs when it is added (init text, calibrated scale)."""
        return self.init == "text" or self.scale == "calibrated"


def _extend_peft_type() -> None:
    """peft's PeftType is a closed enum and register_peft_method takes only its members: add NTK_ATTENTION."""
    from aenum import extend_enum

    if PEFT_NAME.upper() not in PeftType.__members__:
        extend_enum(PeftType, PEFT_NAME.upper(), PEFT_NAME.upper())


_extend_peft_type()


class _ConfigMethods(PeftConfig):
    """What NTKAttentionConfig adds to its fields (generated below from NTKOptions, so the two cannot drift)."""

    def __post_init__(self):
        super().__post_init__()
        self.peft_type = PeftType.NTK_ATTENTION
        self.options()  # every option checked now: an unknown value is one ValueError naming it

    def options(self) -> NTKOptions:
        """The config's options as the method's validated NTKOptions."""
        try:
            return NTKOptions(**{name: getattr(self, name) for name in NTKOptions.model_fields})
        except ValueError as err:  # pydantic's ValidationError
            first = err.errors()[0] if hasattr(err, "errors") else {"loc": (), "msg": str(err)}
            raise ValueError(f"NTKAttentionConfig.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None

    @classmethod
    def check_kwargs(cls, **kwargs):
        """A saved config with a field this version does not know is refused (peft would drop it with a warning,
        and an NTK-Attention adapter run without one of its options computes something else)."""
        unknown = sorted(set(kwargs) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"adapter_config.json has field(s) {unknown} that NTKAttentionConfig does not know (saved "
                             "by a newer ntkcli?); upgrade ntkcli to load it")
        return kwargs


NTKAttentionConfig = make_dataclass(
    "NTKAttentionConfig",
    [(name, info.annotation, field(default=info.default, metadata={"help": info.description}))
     for name, info in NTKOptions.model_fields.items()]
    + [("modules_to_save", Optional[list[str]], field(default=None, metadata={
        "help": "modules trained whole and saved beside (Z, k): peft sets the task head here for task_type SEQ_CLS"})),
       ("base_model_class", Optional[str], field(default=None, metadata={
           "help": "the class of the model the adapter was made for (filled in on injection, checked on loading)"}))],
    bases=(_ConfigMethods,))
NTKAttentionConfig.__module__ = __name__
NTKAttentionConfig.__doc__ = ("NTK-Attention as a peft method: every option of NTKOptions, plus modules_to_save and "
                              "the base model's class.")
