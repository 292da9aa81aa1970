"""Tokenizer built from GGUF metadata, giving the ids llama.cpp gives.

`gpt2` vocabularies are byte-level BPE behind the pre-tokenizer named by
`tokenizer.ggml.pre`; `llama` vocabularies are SentencePiece with byte
fallback. Special-token text is cut out of the input before either runs:
user-defined tokens always, control tokens only with parse_special.
"""
from __future__ import annotations

import codecs
from typing import Any, Iterable, Mapping

from ..errors import UserError
from .pretokenize import PreTokenizer, pre_settings
from .bpe import BpeModel, byte_decode, parse_merges
from .spm import SPACE, SpmModel
from .vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_LSTRIP,
    ATTR_NORMAL,
    ATTR_RSTRIP,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    SpecialIds,
    derive_specials,
    token_attrs,
)

_HIDDEN = ATTR_CONTROL | ATTR_UNKNOWN  # not rendered unless asked for
_C_SPACE = " \t\n\x0b\x0c\r"  # C isspace(), used by the lstrip/rstrip token attributes


def _texts(values: Iterable[Any]) -> list[str]:
    return [v.decode("utf-8", "surrogateescape") if isinstance(v, (bytes, bytearray)) else str(v)
            for v in values]


def _byte_value(text: str) -> int:
    """A byte token's value from its "<0xNN>" text, read as llama.cpp reads it
    (strtol of the two characters after "<0x"): a malformed one gives what its
    leading hex digits say, or 0, never an error."""
    digits = ""
    for ch in text[3:5]:
        if ch not in "0123456789abcdefABCDEF":
            break
        digits += ch
    return int(digits, 16) if digits else 0


class StreamDecoder:
    """Turns generated ids into text deltas that never split a UTF-8 character."""

    def __init__(self, tok: "Tokenizer", special: bool = False):
        self._tok = tok
        self._special = special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:
        return self._dec.decode(self._tok.piece(id, self._special))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class Tokenizer:
    def __init__(self, meta: Mapping[str, Any]):
        model = meta.get("tokenizer.ggml.model")
        if not isinstance(model, str) or model not in ("gpt2", "llama"):
            raise UserError(f"unsupported tokenizer model '{model}' (tokenizer.ggml.model): "
                            "only gpt2 (BPE) and llama (SentencePiece) vocabularies are supported")
        tokens = meta.get("tokenizer.ggml.tokens")
        if tokens is None or len(tokens) == 0:
            raise UserError("the model file has no vocabulary (tokenizer.ggml.tokens)")
        self.model = model
        self.tokens = _texts(tokens)
        # llama.cpp keeps files with empty tokens loadable by renaming them
        self.tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(self.tokens)]
        n = self.n_vocab = len(self.tokens)
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}
        if len(self.token_to_id) != n:
            raise UserError("the vocabulary (tokenizer.ggml.tokens) holds duplicate tokens")
        scores = meta.get("tokenizer.ggml.scores")
        if scores is not None and len(scores) < n:
            raise UserError("tokenizer.ggml.scores is shorter than the vocabulary")
        self.scores = [float(s) for s in scores[:n]] if scores is not None else [0.0] * n
        types = meta.get("tokenizer.ggml.token_type")
        if types is not None and len(types) < n:
            raise UserError("tokenizer.ggml.token_type is shorter than the vocabulary")
        self.attrs = token_attrs(types, n)

        if model == "gpt2":
            family, ignore_merges, add_bos = pre_settings(meta.get("tokenizer.ggml.pre"))
            self.pre = PreTokenizer(family)
            merges = meta.get("tokenizer.ggml.merges")
            if merges is None:
                raise UserError("the BPE vocabulary has no merges (tokenizer.ggml.merges)")
            self._bpe = BpeModel(self.token_to_id, parse_merges(_texts(merges)), ignore_merges)
            space_prefix = False
            default_bos = default_eos = 11  # llama.cpp's defaults for gpt2 vocabularies
        else:
            add_bos = space_prefix = True
            self._spm = SpmModel(self.token_to_id, self.scores)
            default_bos, default_eos = 1, 2
        # SentencePiece: prefix each text that follows a special token (or starts) with a space
        self.add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", space_prefix))
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))

        sp: SpecialIds = derive_specials(meta, self.tokens, self.token_to_id, self.attrs,
                                         default_bos, default_eos)
        self.bos_id, self.eos_id, self.eot_id = sp.bos, sp.eos, sp.eot
        self.eog_ids: frozenset[int] = sp.eog
        if self.add_bos and self.bos_id is None:
            raise UserError("the model asks for a BOS token but names none (tokenizer.ggml.bos_token_id)")
        # the text of these is cut out of the input first, longest first
        special = [i for i in range(n) if self.attrs[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        special.sort(key=lambda i: (-len(self.tokens[i].encode("utf-8", "surrogateescape")), i))
        self._special = special
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        return cls(meta)

    # ---- encoding ----

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        frags: list[str | int] = [text]
        for tid in self._special:
            attr = self.attrs[tid]
            if not parse_special and attr & _HIDDEN:
                continue
            t = self.tokens[tid]
            if t not in text:
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or t not in f:
                    out.append(f)
                    continue
                parts = f.split(t)
                for k, part in enumerate(parts):
                    if k > 0 and attr & ATTR_RSTRIP:
                        part = part.lstrip(_C_SPACE)
                    if k < len(parts) - 1 and attr & ATTR_LSTRIP:
                        part = part.rstrip(_C_SPACE)
                    if part:
                        out.append(part)
                    if k < len(parts) - 1:
                        out.append(tid)
            frags = out
        return frags

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        frags = self._partition(text, parse_special) if text else []
        if self.model == "gpt2":
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    continue
                for word in self.pre.split(f):
                    out.extend(self._bpe.encode_word(word))
        else:
            prev_special = True  # the first text gets the space prefix too
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    f = " " + f
                try:
                    self._spm.encode(f.replace(" ", SPACE), out)
                except ValueError as e:
                    raise UserError(f"cannot tokenize the text: {e}") from None
                prev_special = False
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise UserError("the model asks for an EOS token but names none")
            out.append(self.eos_id)
        return out

    # ---- decoding ----

    def _check(self, id: int) -> int:
        id = int(id)
        if not 0 <= id < self.n_vocab:
            raise ValueError(f"token id {id} is outside the vocabulary (0..{self.n_vocab - 1})")
        return id

    def token_bytes(self, id: int) -> bytes:
        """The bytes a token stands for; control tokens give their text."""
        id = self._check(id)
        p = self._pieces.get(id)
        if p is None:
            p = self._pieces[id] = self._render(id)
        return p

    def _render(self, id: int) -> bytes:
        attr, text = self.attrs[id], self.tokens[id]
        if attr & (_HIDDEN | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & ATTR_NORMAL:
            if self.model == "llama":
                return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")
            return byte_decode(text)
        if attr & ATTR_BYTE:
            return bytes([_byte_value(text)])
        return b""  # unused / undefined tokens render as nothing, as in llama.cpp

    def piece(self, id: int, special: bool = False) -> bytes:
        """llama.cpp's token_to_piece: control and unknown tokens are empty unless special."""
        id = self._check(id)
        if not special and self.attrs[id] & _HIDDEN:
            return b""
        return self.token_bytes(id)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of a sequence. With a space-prefixing SentencePiece vocabulary the
        leading space of the first token is dropped, as llama.cpp's detokenizer does."""
        buf = bytearray()
        for k, id in enumerate(ids):
            p = self.piece(id, special)
            if k == 0 and self.add_space_prefix and p.startswith(b" "):
                p = p[1:]
            buf += p
        return buf.decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, special)

    def is_control(self, id: int) -> bool:
        """True for control and unknown tokens: llama.cpp does not render them in text."""
        return bool(self.attrs[self._check(id)] & _HIDDEN)

    def is_eog(self, id: int) -> bool:
        return int(id) in self.eog_ids

    def token_text(self, id: int) -> str:
        return self.tokens[self._check(id)]
