"""ntk: NTK-Attention as a PEFT method, and the NTK theory of two papers, reproduced and checked.

The library face: NTK-Attention is a peft method, registered with peft when this package is imported.

    from peft import get_peft_model
    from ntkcli import NTKAttentionConfig
    model = get_peft_model(base_model, NTKAttentionConfig(task_type="SEQ_CLS"))
"""

__version__ = "0.1.0"

from .adapters.context import attending, compress_context, context_memory  # noqa: E402
from .adapters.ntk import NTKAttentionConfig, NTKAttentionModel, NTKOptions  # noqa: E402
from .adapters.ntk import calibrate  # noqa: E402
from .attention import compress_prefix, ntk_attention  # noqa: E402

__all__ = ["NTKAttentionConfig", "NTKAttentionModel", "NTKOptions", "attending", "calibrate", "compress_prefix",
           "compress_context", "context_memory", "ntk_attention", "__version__"]
