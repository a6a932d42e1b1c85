"""What a fine-tuning run would fail on, found before its folder exists: every method checked on the model built on
the meta device (no weights: target modules, text-only methods on an image model), and the memory each one needs
against the machine's (the GPU's for a CUDA run), from the model's configuration and the methods' options."""

from __future__ import annotations

from ...adapters import requirements
from ...errors import UserError
from ...memory import beyond_memory
from .recipe import TrainSpec, method_label, method_options

ACTIVATION_BYTES = 48  # per token, hidden unit and layer: what a forward and backward keep, roughly (float32)


def meta_model(config, image: bool, num_labels: int):
    """A function that builds the model of `config` on the meta device: parameters with shapes, no memory."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    auto = AutoModelForImageClassification if image else AutoModelForSequenceClassification
    config.num_labels = num_labels

    def build():
        with init_empty_weights():
            return auto.from_config(config)

    return build


def tokens_per_row(config, image: bool, max_length: int, pair: bool) -> int:
    """The sequence length a batch row reaches: patches and [CLS] for an image, the text fields' budget for a text."""
    if image:
        return (getattr(config, "image_size", 224) // getattr(config, "patch_size", 16)) ** 2 + 1
    return max_length * (2 if pair else 1)


def check_methods(config, methods: list, train: TrainSpec, *, image: bool, num_labels: int, tokens: int,
                  device: str, dtype_bytes: int = 4) -> None:
    """Every method on the meta model; the first that cannot run, or needs more memory than there is, is one line
    naming it (methods.N and its label) and the estimate."""
    build = meta_model(config, image, num_labels)
    model = build()
    params = sum(p.numel() for p in model.parameters())
    text = getattr(model.config, "text_config", None) or model.config
    layers = getattr(text, "num_hidden_layers", 1)
    activations = ACTIVATION_BYTES * max(train.batch_size, train.eval_batch_size) * tokens * text.hidden_size * layers
    for i, spec in enumerate(methods):
        where = f"methods.{i} ({method_label(spec)})"
        try:
            extra = requirements(build, spec.method, image=image, tokens=tokens, batch=train.batch_size,
                                 **method_options(spec))
        except ValueError as err:
            raise UserError(f"{where}: {err}") from None
        too_much = beyond_memory(params * dtype_bytes + activations + extra, device)
        if too_much:
            raise UserError(f"{where} {too_much} (the model's {params:,} parameters, the activations of a batch and "
                            "the method's own tensors); lower its sizes")


def dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2
