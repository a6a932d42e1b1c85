"""ChatGLM3's tokenizer and classification head on transformers' native GLM, without ChatGLM3's remote code (see
chatglm3.py, which imports this module when it loads one: it imports transformers at the top)."""

from __future__ import annotations

import sentencepiece as spm
import torch
from transformers import AddedToken, GlmForSequenceClassification
from transformers.modeling_outputs import SequenceClassifierOutputWithPast
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

SPECIAL_TOKENS = ("[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", "<|assistant|>",
                  "<|observation|>")  # ids n, n+1, … after the sentencepiece vocabulary, as ChatGLM3 numbers them


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
