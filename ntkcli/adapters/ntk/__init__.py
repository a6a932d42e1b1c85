"""NTK-Attention, a peft tuner folder like peft's tuners/<method>/: config.py (NTKOptions, NTKAttentionConfig),
layer.py (the adapted attention: Algorithm 1 with a trained (Z, k) per head), model.py (the BaseTuner). Importing it
registers the method with peft (`register_peft_method`), so `get_peft_model`, `PeftModel.from_pretrained`,
`AutoPeftModelFor…` and the Trainer take NTKAttentionConfig as they take LoraConfig."""

from peft.mapping import PEFT_TYPE_TO_TUNER_MAPPING
from peft.utils import PeftType, register_peft_method

from .config import PEFT_NAME, NTKAttentionConfig, NTKOptions
from .layer import (NAME, OPTIONS, STATE, NTKAttentionLayer, add_parameters, calibrate, feature_dim, footprint,
                    forward, key_map, mean_share, modules_of, probe, share, statistics, with_state)
from .model import NTKAttentionModel

if PeftType.NTK_ATTENTION not in PEFT_TYPE_TO_TUNER_MAPPING:  # once, whatever imports this first
    register_peft_method(name=PEFT_NAME, config_cls=NTKAttentionConfig, model_cls=NTKAttentionModel,
                         prefix=NTKAttentionModel.prefix)

__all__ = ["NAME", "OPTIONS", "STATE", "NTKAttentionConfig", "NTKAttentionLayer", "NTKAttentionModel", "NTKOptions",
           "add_parameters", "calibrate", "feature_dim", "footprint", "forward", "key_map", "mean_share",
           "modules_of", "probe", "share", "statistics", "with_state"]
