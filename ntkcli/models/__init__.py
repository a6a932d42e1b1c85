"""Loading models and tokenizers for fine-tuning: hub ids, local folders, models shipped in packages, or a
random model from a config. ChatGLM3 checkpoints load natively (see chatglm3.py).

Every loaded model records its task head: the parameters its pretrained checkpoint did not have
(transformers reports them as missing or mismatched), kept in float32 whatever the backbone's dtype.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..adapters.common import set_task_head
from ..errors import UserError, first_line
from . import chatglm3, weights

if TYPE_CHECKING:
    from ..experiments.finetune.recipe import ModelSpec


def resolve(name: str) -> str:
    """A model location; pkg:<package>/<folder> is a folder inside an installed package."""
    if not name.startswith("pkg:"):
        return name
    package, _, folder = name[4:].partition("/")
    found = importlib.util.find_spec(package)
    if found is None or found.origin is None:
        raise UserError(f"package {package!r} is not installed (needed for model {name})")
    return str(Path(found.origin).parent / folder)


def source_of(spec: ModelSpec, source: str | None = None) -> str | None:
    """Where the weights come from: `source` (a pretrain cache), spec.name_or_path, or None (spec.config)."""
    return source or (resolve(spec.name_or_path) if spec.name_or_path else None)


def _failure(what: str, err: Exception) -> UserError:
    import transformers

    return UserError(f"{what} cannot be loaded with transformers {transformers.__version__} (not found offline, "
                     f"or not a classification model): {first_line(err)}")


def load_model(spec: ModelSpec, image: bool, num_labels: int, source: str | None = None):
    """A classification model from the hub/a folder, or randomly initialised from spec.config; its task head
    is recorded (set_task_head) and kept in float32."""
    from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForSequenceClassification

    auto = AutoModelForImageClassification if image else AutoModelForSequenceClassification
    source = source_of(spec, source)
    dtype = getattr(torch, spec.dtype)
    try:
        if source is None:
            model, head = auto.from_config(AutoConfig.for_model(**spec.config, num_labels=num_labels)), None
        elif not spec.trust_remote_code and chatglm3.is_chatglm3(source):
            model, head = chatglm3.load_chatglm3(source, num_labels, dtype)
        else:
            model, info = auto.from_pretrained(source, num_labels=num_labels, ignore_mismatched_sizes=True,
                                               trust_remote_code=spec.trust_remote_code, dtype=dtype,
                                               output_loading_info=True)
            head = list(info["missing_keys"]) + [name for name, *_ in info["mismatched_keys"]]
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 — whatever breaks inside from_pretrained is one line
        raise _failure(f"model {source!r}" if source else "model.config", err) from None
    set_task_head(model, head)
    return model


def model_config(spec: ModelSpec, source: str | None = None):
    """The model's configuration alone (no weights): spec.config, or config.json at the source, whose weight files
    are checked whole and (ChatGLM3) of the config's sizes without loading them."""
    from transformers import AutoConfig

    source = source_of(spec, source)
    try:
        if source is None:
            return AutoConfig.for_model(**spec.config)
        glm = not spec.trust_remote_code and chatglm3.is_chatglm3(source)
        config = chatglm3.load_config(source) if glm else \
            AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
    except Exception as err:  # noqa: BLE001
        raise _failure(f"model {source or 'config'!r}", err) from None
    try:  # the weight files are whole, and (ChatGLM3) hold the config's tensors at its sizes: headers read only
        if glm:
            chatglm3.check_checkpoint(source)
        elif Path(source).is_dir():
            weights.check_folder(Path(source))
    except (OSError, ValueError) as err:
        raise UserError(f"model {source!r}: {first_line(err)}") from None
    return config


def load_tokenizer(spec: ModelSpec):
    """The tokenizer at model.tokenizer (default: the model's location); ChatGLM3's without remote code. Text is
    always text: a literal '[SEP]', '[PAD]' or '</s>' in a data set is tokenized as characters, never turned into
    the control token it spells (split_special_tokens; the tokenizer still adds its own special tokens by id)."""
    from transformers import AutoTokenizer

    where = spec.tokenizer or spec.name_or_path
    if where is None:
        raise UserError("a text task built from model.config needs model.tokenizer")
    try:
        if not spec.trust_remote_code and chatglm3.is_chatglm3_tokenizer(resolve(where)):
            return chatglm3.load_tokenizer(resolve(where))
        return AutoTokenizer.from_pretrained(resolve(where), trust_remote_code=spec.trust_remote_code,
                                             split_special_tokens=True)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001
        raise UserError(f"tokenizer {where!r} cannot be loaded offline: {first_line(err)}") from None
