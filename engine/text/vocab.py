"""Token attributes and special ids derived from GGUF metadata as llama.cpp does.

GGUF files carry a token type per token, but not which tokens end a turn:
llama.cpp recognises those by their text (<|im_end|>, <|eot_id|>, ...), marks
them as control tokens, and stops generating on any of them. The same rules
live here so that generation stops exactly where llama.cpp's would.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# GGUF token_type values: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
_TYPE_TO_ATTR = {1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL, 4: ATTR_USER_DEFINED,
                 5: ATTR_UNUSED, 6: ATTR_BYTE}

# end-of-turn texts, picked when the file names no eot token
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_FIM_PRE_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                  "<|code_prefix|>", "<|prefix|>")
_FIM_SUF_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                  "<|code_suffix|>", "<|suffix|>")
_FIM_MID_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                  "<|code_middle|>", "<|middle|>")
# every token with one of these texts ends generation
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
              "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
              "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def token_attrs(types: Sequence[int] | None, n: int) -> list[int]:
    if types is None:
        return [ATTR_NORMAL] * n
    return [_TYPE_TO_ATTR.get(int(t), ATTR_UNDEFINED) for t in types[:n]]


@dataclass(frozen=True)
class SpecialIds:
    bos: int | None
    eos: int | None
    eot: int | None
    eog: frozenset[int]


def _key_id(meta: Mapping[str, Any], name: str, default: int | None, n: int) -> int | None:
    """A special id from its key; an id outside the vocabulary keeps the default."""
    if default is not None and not 0 <= default < n:
        default = None
    v = meta.get(f"tokenizer.ggml.{name}_token_id")
    if v is None:
        return default
    v = int(v) & 0xFFFFFFFF  # read as u32 like llama.cpp, so -1 is out of range
    return v if v < n else default


def derive_specials(meta: Mapping[str, Any], tokens: Sequence[str], token_to_id: Mapping[str, int],
                    attrs: list[int], default_bos: int, default_eos: int) -> SpecialIds:
    """Fills in special ids; marks text-recognised ones as control in `attrs`."""
    n = len(tokens)
    bos = _key_id(meta, "bos", default_bos, n)
    eos = _key_id(meta, "eos", default_eos, n)
    ids = {k: _key_id(meta, k, None, n) for k in ("eot", "eom", "fim_pad", "fim_rep", "fim_sep")}
    for k, names in (("fim_pre", "prefix"), ("fim_suf", "suffix"), ("fim_mid", "middle")):
        ids[k] = _key_id(meta, k, None, n)
        if ids[k] is None:
            ids[k] = _key_id(meta, names, None, n)  # deprecated key names

    def find(texts: Sequence[str]) -> int | None:
        # llama.cpp takes the first match in hash order; the lowest id is the stable choice
        found = [token_to_id[t] for t in texts if t in token_to_id]
        return min(found) if found else None

    def mark_control(tid: int) -> None:
        attrs[tid] |= ATTR_CONTROL

    # recognised by text only where the file names none; the one found becomes control
    for key, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), ("fim_pre", _FIM_PRE_TEXTS),
                       ("fim_suf", _FIM_SUF_TEXTS), ("fim_mid", _FIM_MID_TEXTS),
                       ("fim_pad", _FIM_PAD_TEXTS), ("fim_rep", _FIM_REP_TEXTS),
                       ("fim_sep", _FIM_SEP_TEXTS)):
        if ids[key] is None:
            ids[key] = find(texts)
            if ids[key] is not None:
                mark_control(ids[key])

    for tid in range(n):  # control tokens named "unused" count as unused
        if attrs[tid] & ATTR_CONTROL and "unused" in tokens[tid]:
            attrs[tid] |= ATTR_UNUSED

    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for t in _EOG_TEXTS:
        tid = token_to_id.get(t)
        if tid is not None:
            eog.add(tid)
            mark_control(tid)
    for t in _ALWAYS_RENDERED:
        if t in token_to_id:
            attrs[token_to_id[t]] = ATTR_USER_DEFINED
    eog.update(i for i in (eos, ids["eot"], ids["eom"]) if i is not None)

    texts = {tokens[i]: i for i in eog}
    # harmony-style vocabularies end a message with <|end|> but stop on <|return|> / <|call|>
    if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                               or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    # where </s> is an ordinary token (gemma4, plamo2)
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = ATTR_NORMAL

    _name_rules(meta, tokens, token_to_id, attrs)
    return SpecialIds(bos=bos, eos=eos, eot=ids["eot"], eog=frozenset(eog))


def _name_rules(meta: Mapping[str, Any], tokens: Sequence[str], token_to_id: Mapping[str, int],
                attrs: list[int]) -> None:
    """Per-model token attributes that GGUF files do not carry (strip spaces around
    special tokens); llama.cpp keys them on the model name."""
    name = str(meta.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        for i, a in enumerate(attrs):
            if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
                attrs[i] |= ATTR_RSTRIP
        for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if t in token_to_id:
                i = token_to_id[t]
                attrs[i] = attrs[i] | ATTR_RSTRIP if on else attrs[i] & ~ATTR_RSTRIP
