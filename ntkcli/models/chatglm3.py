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

SPECIAL_TOKENS = ("[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", "<|assistant|>",
                  "<|observation|>")  # ids n, n+1, … after the sentencepiece vocabulary, as ChatGLM3 numbers them
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")
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
            return [_hub_file(source, f) for f in sorted(set(weight_map["weight_map"].values()))]
    found = [path for path in (_hub_file(source, f) for f in SINGLE_FILES) if path]
    if not found:
        raise OSError(f"no {' or '.join(SINGLE_FILES)} (or their index) in {source}")
    return found[:1]


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

    config = load_config(source, num_labels)
    with init_empty_weights(include_buffers=False):
        model = _model_class()(config)
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


def _model_class():
    from transformers import GlmForSequenceClassification
    from transformers.modeling_outputs import SequenceClassifierOutputWithPast

    class ChatGLM3ForSequenceClassification(GlmForSequenceClassification):
        """transformers' GLM with ChatGLM3's pooling: the head reads each row's last real position, taken from the
        attention mask (GLM's own pooling takes the last id that is not the pad id 0, one token early for a text
        that really ends in <unk>, id 0). Only the pooled positions go through the head."""

        def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
            hidden = self.model(input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
            B, L = hidden.shape[:2]
            positions = torch.arange(L, device=hidden.device)
            last = positions.new_full((B,), L - 1) if attention_mask is None else \
                (positions * (attention_mask != 0)).argmax(-1)
            logits = self.score(hidden[torch.arange(B, device=hidden.device), last])
            loss = None if labels is None else self.loss_function(logits=logits, labels=labels, pooled_logits=logits,
                                                                   config=self.config)
            return SequenceClassifierOutputWithPast(loss=loss, logits=logits)

    return ChatGLM3ForSequenceClassification


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
    vocab = _hub_file(source, "tokenizer.model")
    if vocab is None:
        raise OSError(f"no tokenizer.model in {source}")
    config = _hub_json(source, "tokenizer_config.json") or {}
    return _tokenizer_class()(vocab_file=vocab, padding_side=config.get("padding_side", "left"))


def is_chatglm3_tokenizer(source: str) -> bool:
    config = _hub_json(source, "tokenizer_config.json")
    return bool(config) and config.get("tokenizer_class") == "ChatGLMTokenizer"


def _tokenizer_class():
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

    class ChatGLM3Tokenizer(SentencePieceBackend):
        """ChatGLM3's tokenizer: text becomes sentencepiece ids and nothing else (a word like 'people' or 'sophist',
        and a literal '[gMASK]', '<|user|>' or '</s>' in a text, stay text); the layout `[gMASK] sop A` or
        `[gMASK] sop A B </s>` is built by id; <unk> pads, on the left. The nine special tokens take the ids after
        the sentencepiece vocabulary, and vocab_size counts them, as ChatGLM3's own tokenizer does; decode is
        ChatGLM3's (see _decode). Checked against ChatGLM3's own tokenizer code, run under transformers 4.40 outside
        this project: the same ids, decodes and vocab_size, but for a piece spelled like a special token (see
        _convert_token_to_id_with_added_voc)."""

        vocab_files_names = {"vocab_file": "tokenizer.model"}
        model_input_names = ["input_ids", "attention_mask"]

        def __init__(self, vocab_file: str, **kwargs):
            import sentencepiece as spm
            from transformers import AddedToken

            pieces = spm.SentencePieceProcessor(model_file=vocab_file).get_piece_size()
            self.special_ids = {token: pieces + i for i, token in enumerate(SPECIAL_TOKENS)}  # even if a piece is
            # spelled like one of them (transformers would give such a token the piece's id)
            kwargs["added_tokens_decoder"] = {i: AddedToken(t, special=True, normalized=False)
                                              for t, i in self.special_ids.items()}
            kwargs.setdefault("padding_side", "left")
            super().__init__(vocab_file=vocab_file, unk_token="<unk>", pad_token="<unk>", bos_token="<s>",
                             eos_token="</s>", extra_special_tokens=list(SPECIAL_TOKENS), split_special_tokens=True,
                             **kwargs)

        @property
        def vocab_size(self) -> int:
            return self.sp_model.get_piece_size() + len(SPECIAL_TOKENS)

        def __len__(self) -> int:  # every id below vocab_size is a piece or a special token
            return self.vocab_size

        def get_vocab(self) -> dict[str, int]:
            vocab = {self.sp_model.id_to_piece(i): i for i in range(self.sp_model.get_piece_size())}
            return {**vocab, **self._added_tokens_encoder}

        def _convert_token_to_id_with_added_voc(self, token: str) -> int:
            """A piece's own id, even for a piece spelled like a special token (ChatGLM3's own code would give that
            one the special id); any other special token's name gives its id (see special_ids)."""
            piece = self.sp_model.piece_to_id(token)
            if self.sp_model.id_to_piece(piece) == token:
                return piece
            return self._added_tokens_encoder.get(token, self.sp_model.unk_id())

        def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
            prefix = [self.special_ids["[gMASK]"], self.special_ids["sop"]]
            return prefix + token_ids_0 + ([] if token_ids_1 is None else token_ids_1 + [self.sp_model.eos_id()])

        def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
            if already_has_special_tokens:
                return [int(i in self.special_ids.values() or i == self.sp_model.eos_id()) for i in token_ids_0]
            tail = [] if token_ids_1 is None else [0] * len(token_ids_1) + [1]
            return [1, 1] + [0] * len(token_ids_0) + tail

        def create_token_type_ids_from_sequences(self, token_ids_0, token_ids_1=None):
            return [0] * len(self.build_inputs_with_special_tokens(token_ids_0, token_ids_1))

        def _decode(self, token_ids, skip_special_tokens: bool = False, **kwargs) -> str:
            """As ChatGLM3 decodes: each id as its piece (the nine special tokens as their names, <unk>, <s> and
            </s> as nothing), the pieces joined by sentencepiece, so byte pieces become characters again. Like
            ChatGLM3's, skip_special_tokens drops only <unk> and </s>, the ids it registers as special."""
            names = {i: t for t, i in self.special_ids.items()}
            empty = {self.sp_model.unk_id(), self.sp_model.bos_id(), self.sp_model.eos_id()}
            skipped = {self.sp_model.unk_id(), self.sp_model.eos_id()} if skip_special_tokens else set()
            ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
            return self.sp_model.decode_pieces([names[i] if i in names else "" if i in empty else
                                                self.sp_model.id_to_piece(i) for i in ids if i not in skipped])

    return ChatGLM3Tokenizer
