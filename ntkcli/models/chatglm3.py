"""ChatGLM3 without its remote code: its checkpoint read into transformers' native GLM, and its tokenizer.

ChatGLM3-6B's hub folder holds `config.json` (model_type chatglm, its own field names), `transformer.*`
weights (safetensors or .bin shards) and a sentencepiece `tokenizer.model`; its modelling code no
longer loads under transformers 5. The architecture is transformers' `Glm` exactly: RMSNorm before
attention and MLP, grouped-query attention with a bias on q/k/v only, rotary position embedding on
the first half of each head in interleaved pairs (base 10000·rope_ratio), SwiGLU with the gate and
up projections fused in that order. So the config is translated field by field and the fused
query_key_value is split into q/k/v while the shards stream in; nothing runs from the hub.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from .weights import INDEXES, SINGLE_FILES, tensor_shapes

# ChatGLM3 name → GLM name; the fused query_key_value is split separately
RENAMES = (
    (r"transformer\.embedding\.word_embeddings\.weight", "model.embed_tokens.weight"),
    (r"transformer\.encoder\.final_layernorm\.weight", "model.norm.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight", r"model.layers.\1.\2.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.self_attention\.dense\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.mlp\.dense_h_to_4h\.weight", r"model.layers.\1.mlp.gate_up_proj.weight"),
    (r"transformer\.encoder\.layers\.(\d+)\.mlp\.dense_4h_to_h\.weight", r"model.layers.\1.mlp.down_proj.weight"),
)
QKV = re.compile(r"transformer\.encoder\.layers\.(\d+)\.self_attention\.query_key_value\.(weight|bias)")
UNUSED = re.compile(r"transformer\.(output_layer\.weight|rotary_pos_emb\.inv_freq)")  # LM head, recomputed buffer
# ChatGLM3 options that GLM does not have: (field, the value GLM's architecture fixes)
FIXED = (("rmsnorm", True), ("add_bias_linear", False), ("apply_residual_connection_post_layernorm", False),
         ("post_layer_norm", True), ("original_rope", True))


def _hub_file(source: str, name: str) -> str | None:
    """A file of a local folder or hub repository, or None when it has no such file."""
    from transformers.utils import cached_file

    return cached_file(source, name, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False)


def _hub_json(source: str, name: str) -> dict | None:
    path = _hub_file(source, name)
    return json.loads(Path(path).read_text()) if path else None


def is_chatglm3(source: str) -> bool:
    """Whether `source` holds a ChatGLM checkpoint (config.json with model_type chatglm)."""
    config = _hub_json(source, "config.json")
    return bool(config) and config.get("model_type") == "chatglm"


def glm_config(raw: dict, num_labels: int):
    """ChatGLM3's config.json as a GlmConfig; a variant GLM cannot express is a ValueError."""
    from transformers import GlmConfig

    for field, value in FIXED:
        if raw.get(field, value) != value:
            raise ValueError(f"ChatGLM config has {field} = {raw[field]}; the native GLM needs {value}")
    sizes = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "padded_vocab_size")
    bad = next((f for f in sizes if not isinstance(raw.get(f), int) or raw[f] < 1), None)
    if bad is not None:
        raise ValueError(f"ChatGLM config has {bad} = {raw.get(bad)!r}; it must be a positive integer")
    heads = raw["num_attention_heads"]
    return GlmConfig(
        vocab_size=raw["padded_vocab_size"], hidden_size=raw["hidden_size"], intermediate_size=raw["ffn_hidden_size"],
        num_hidden_layers=raw["num_layers"], num_attention_heads=heads,
        num_key_value_heads=raw["multi_query_group_num"] if raw.get("multi_query_attention") else heads,
        head_dim=raw.get("kv_channels") or raw["hidden_size"] // heads, hidden_act="silu",
        rms_norm_eps=raw["layernorm_epsilon"], max_position_embeddings=raw.get("seq_length", 8192),
        attention_bias=raw.get("add_qkv_bias", False), attention_dropout=raw.get("attention_dropout", 0.0),
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0 * raw.get("rope_ratio", 1.0),
                         "partial_rotary_factor": 0.5},
        pad_token_id=raw.get("pad_token_id") or 0, eos_token_id=raw.get("eos_token_id", 2),
        tie_word_embeddings=False, num_labels=num_labels)


def load_config(source: str, num_labels: int = 2):
    """The GlmConfig of the ChatGLM checkpoint at `source`."""
    return glm_config(_hub_json(source, "config.json"), num_labels)


def convert(name: str, tensor: torch.Tensor, config) -> list[tuple[str, torch.Tensor]]:
    """One checkpoint tensor under GLM's names (query_key_value becomes q, k and v)."""
    qkv = QKV.fullmatch(name)
    if qkv:
        layer, kind = qkv.groups()
        d = config.head_dim
        sizes = [config.num_attention_heads * d, config.num_key_value_heads * d, config.num_key_value_heads * d]
        parts = torch.split(tensor, sizes, dim=0)
        return [(f"model.layers.{layer}.self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", parts)]
    if UNUSED.fullmatch(name):
        return []
    for pattern, target in RENAMES:
        if re.fullmatch(pattern, name):
            return [(re.sub(pattern, target, name), tensor)]
    raise ValueError(f"unexpected tensor {name!r} in the ChatGLM checkpoint")


def _shards(source: str) -> list[str]:
    for index in INDEXES:
        weight_map = _hub_json(source, index)
        if weight_map:
            names = sorted(set(weight_map["weight_map"].values()))
            missing = [n for n, path in zip(names, (_hub_file(source, n) for n in names)) if path is None]
            if missing:
                raise OSError(f"the shard {missing[0]} that {index} names is not in {source}")
            return [_hub_file(source, f) for f in names]
    found = [path for path in (_hub_file(source, f) for f in SINGLE_FILES) if path]
    if not found:
        raise OSError(f"no {' or '.join(SINGLE_FILES)} (or their index) in {source}")
    return found[:1]


def expected_shapes(raw: dict) -> dict[str, tuple[int, ...]]:
    """name → shape of every tensor a ChatGLM3 checkpoint must hold for its config.json (the LM head and the rotary
    buffer may be there too; nothing reads them)."""
    h, heads, d = raw["hidden_size"], raw["num_attention_heads"], raw.get("kv_channels") or raw["hidden_size"] // raw["num_attention_heads"]
    groups = raw["multi_query_group_num"] if raw.get("multi_query_attention") else heads
    ffn, qkv = raw["ffn_hidden_size"], (heads + 2 * groups) * d
    out = {"transformer.embedding.word_embeddings.weight": (raw["padded_vocab_size"], h),
           "transformer.encoder.final_layernorm.weight": (h,)}
    for i in range(raw["num_layers"]):
        p = f"transformer.encoder.layers.{i}."
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attention.query_key_value.weight": (qkv, h), p + "self_attention.dense.weight": (h, heads * d),
                p + "mlp.dense_h_to_4h.weight": (2 * ffn, h), p + "mlp.dense_4h_to_h.weight": (h, ffn)}
        if raw.get("add_qkv_bias", False):
            out[p + "self_attention.query_key_value.bias"] = (qkv,)
    return out


def check_checkpoint(source: str) -> None:
    """A ChatGLM3 checkpoint that can load: every weight file readable and whole (headers read, no weights loaded),
    every tensor its config.json needs present at the size the config gives. A ValueError says what is wrong."""
    raw = _hub_json(source, "config.json")
    found = {name: shape for path in _shards(source) for name, shape in tensor_shapes(path).items()}
    for name, shape in expected_shapes(raw).items():
        if name not in found:
            raise ValueError(f"the checkpoint lacks {name}")
        if tuple(found[name]) != shape:
            raise ValueError(f"the checkpoint's {name} is {list(found[name])}; its config.json says {list(shape)}")


def _read(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of one shard, one at a time where the format allows it."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    else:
        yield from torch.load(path, map_location="cpu", mmap=True, weights_only=True).items()


def load_chatglm3(source: str, num_labels: int, dtype: torch.dtype) -> tuple[nn.Module, list[str]]:
    """GlmForSequenceClassification holding ChatGLM3's weights, and the names of what the checkpoint lacked
    (the new task head, initialised in float32 or wider). The parameters are created empty and filled shard by shard."""
    from accelerate import init_empty_weights

    from .glm import ChatGLM3ForSequenceClassification

    config = load_config(source, num_labels)
    with init_empty_weights(include_buffers=False):
        model = ChatGLM3ForSequenceClassification(config)
    loaded: set[str] = set()
    for path in _shards(source):
        state = {new: t.to(dtype) for name, tensor in _read(path) for new, t in convert(name, tensor, config)}
        unknown = sorted(set(state) - set(model.state_dict()))
        if unknown:
            raise ValueError(f"the checkpoint's {unknown[0]} has no place in the GLM model")
        model.load_state_dict(state, strict=False, assign=True)
        loaded |= set(state)
    missing = [n for n, _ in model.named_parameters() if n not in loaded]
    heads = {n.rsplit(".", 1)[0] for n in missing}
    if heads != {"score"}:
        raise ValueError(f"the checkpoint lacks backbone weights ({sorted(heads - {'score'})[0]} …)")
    model.score = nn.Linear(config.hidden_size, num_labels, dtype=torch.promote_types(dtype, torch.float32))
    nn.init.normal_(model.score.weight, std=config.initializer_range)
    nn.init.zeros_(model.score.bias)
    missing.append("score.bias")
    model.model.register_forward_pre_hook(_positions_after_padding, with_kwargs=True)
    return model, missing


def _positions_after_padding(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Position ids as ChatGLM3's tokenizer gives them: 0, 1, … from the first real token of a left-padded
    sequence (GLM would count the padding). Rotary attention scores do not see the shift, but a prefix does:
    ntk's φ(Q) and ptuning-v2's Q·P_K depend on each query's absolute rotation."""
    mask = kwargs.get("attention_mask")
    if kwargs.get("position_ids") is None and mask is not None and mask.dim() == 2:
        kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return args, kwargs


def load_tokenizer(source: str):
    """ChatGLM3's sentencepiece tokenizer (see ChatGLM3Tokenizer), from a folder or hub repository."""
    from .glm import ChatGLM3Tokenizer

    vocab = _hub_file(source, "tokenizer.model")
    if vocab is None:
        raise OSError(f"no tokenizer.model in {source}")
    config = _hub_json(source, "tokenizer_config.json") or {}
    return ChatGLM3Tokenizer(vocab_file=vocab, padding_side=config.get("padding_side", "left"))


def is_chatglm3_tokenizer(source: str) -> bool:
    config = _hub_json(source, "tokenizer_config.json")
    return bool(config) and config.get("tokenizer_class") == "ChatGLMTokenizer"
