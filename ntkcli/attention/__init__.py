"""The NTK-Attention operator (Algorithm 1), exact long-prefix attention, feature maps, and (Z, k) from a prefix."""

from .core import attention_lse, merge, ntk_attention, ntk_combine
from .features import FEATURE_MAPS, Favor, elu, feature_map, identity, taylor2
from .prefix import (compress_prefix, fit_prefix_adam, fit_prefix_lstsq, infinite_prefix_limit,
                     prefix_attention, prefix_stats)

__all__ = [
    "attention_lse", "merge", "ntk_attention", "ntk_combine",
    "FEATURE_MAPS", "Favor", "elu", "feature_map", "identity", "taylor2",
    "compress_prefix", "fit_prefix_adam", "fit_prefix_lstsq", "infinite_prefix_limit",
    "prefix_attention", "prefix_stats",
]
