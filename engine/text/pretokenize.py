"""Pre-tokenizers of byte-level BPE vocabularies, selected by `tokenizer.ggml.pre`.

Each pre-tokenizer is a list of regexes applied one after another, as
llama.cpp does: every regex splits each piece left by the previous one into
its matches *and* the gaps between them, so a leading digit regex such as
`\\p{N}` isolates digits before the main regex ever sees them.

llama.cpp matches `\\s` as the Unicode White_Space set and folds `\\p{Lu}` ...
`\\p{Lo}` into "any letter" (its regex engine only knows categories), so the
patterns are rewritten the same way before they are compiled here.
"""
from __future__ import annotations

import regex

from ..errors import UserError

# Unicode White_Space: what llama.cpp's \s means (no \x1c-\x1f, unlike Python's re)
WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

# Characters assigned in Unicode 16.0 and 17.0 (with the gaps between them). llama.cpp's
# category tables are Unicode 15.1, so to it these are unassigned, while the regex module
# knows them as letters, marks, symbols...; they are matched as an unassigned character
# (U+0378) instead, so that the words come out as llama.cpp cuts them.
_NEWER = regex.compile("["
    "\U0000088F\U00000897\U00000C5C\U00000CDC\U00001ACF-\U00001AEB\U00001B4E-\U00001B4F"
    "\U00001B7F\U00001C89-\U00001C8A\U000020C1\U00002427-\U00002429\U00002B96"
    "\U000031E4-\U000031E5\U0000A7CB-\U0000A7CF\U0000A7D2\U0000A7D4\U0000A7DA-\U0000A7F1"
    "\U0000FBC3-\U0000FBD2\U0000FD90-\U0000FD91\U0000FDC8-\U0000FDCE\U000105C0-\U000105F3"
    "\U00010940-\U00010959\U00010D40-\U00010D8F\U00010EC2-\U00010EFC\U00011380-\U000113E2"
    "\U000116D0-\U000116E3\U00011B60-\U00011BF9\U00011DB0-\U00011DE9\U00011F5A"
    "\U00013460-\U000143FA\U00016100-\U00016139\U00016D40-\U00016D79\U00016EA0-\U00016ED3"
    "\U00016FF2-\U00016FF6\U000187F8-\U000187FF\U00018CFF\U00018D09-\U00018DF2"
    "\U0001CC00-\U0001CEF0\U0001E5D0-\U0001E6FF\U0001F6D8\U0001F777-\U0001F77A"
    "\U0001F8B2-\U0001F8D8\U0001FA54-\U0001FA57\U0001FA89-\U0001FA8F\U0001FABE"
    "\U0001FAC6-\U0001FACD\U0001FADC-\U0001FADF\U0001FAE9-\U0001FAEF\U0001FBCB-\U0001FBEF"
    "\U0001FBFA\U0002B73A-\U0002B73F\U0002CEA2-\U0002CEAD\U000323B0-\U00033479"
    "]")
_UNASSIGNED = "\u0378"

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_WORD = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
               r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?")

# family -> regex list (in llama.cpp's order)
FAMILIES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    # llama.cpp's hand-written gpt2 splitter also ends in a bare \s+ branch
    "gpt2": (_GPT2 + r"|\s+",),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "starcoder": (r"\p{N}", _GPT2 + r"|\s+"),
    "deepseek3": (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
                       r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "chatglm4": (_LLAMA3,),
    "poro": (r" ?[^(\s|.,!?…。，、।۔،)]+",),
    "viking": (r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"),
    "gpt4o": (_GPT4O_WORD + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "tekken": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
        r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}

# tokenizer.ggml.pre -> (family, ignore_merges, add_bos default)
_PRE: dict[str, tuple[str, bool, bool]] = {}


def _reg(family: str, names: str, ignore_merges: bool = False, add_bos: bool = False) -> None:
    for name in names.split():
        _PRE[name] = (family, ignore_merges, add_bos)


_reg("default", "default")
_reg("llama3", "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", True, True)
_reg("llama3", "dbrx smaug-bpe")
_reg("deepseek-coder", "deepseek-coder")
_reg("deepseek3", "deepseek-v3 hunyuan-dense joyai-llm hy_v4")
_reg("falcon", "falcon")
_reg("starcoder", "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2")
_reg("gpt2", "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
     "jina-v1-en jina-v2-code roberta-bpe mpt olmo jais exaone4 trillion granite-docling")
_reg("qwen2", "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open")
_reg("qwen35", "qwen35")
_reg("poro", "poro-chat bloom gpt3-finnish")
_reg("chatglm4", "chatglm-bpe")
_reg("chatglm4", "glm4 glm5", True)
_reg("viking", "viking")
_reg("tekken", "tekken", True, True)
_reg("gpt4o", "gpt-4o llama4 kanana2 talkie minimax-m2")
_reg("seed-coder", "seed-coder")
_reg("bailingmoe", "bailingmoe bailingmoe2 llada-moe")
_reg("qwen2", "grok-2")
_reg("minicpm5", "minicpm5", True)


def pre_settings(pre: str | None) -> tuple[str, bool, bool]:
    """-> (family, ignore_merges, default add_bos) for a `tokenizer.ggml.pre` value."""
    if not pre:
        return _PRE["default"]
    try:
        return _PRE[pre]
    except KeyError:
        raise UserError(f"unsupported pre-tokenizer type '{pre}' (tokenizer.ggml.pre)") from None


def _translate(pattern: str) -> str:
    r"""Rewrite a pattern to llama.cpp's meaning: \s/\S as White_Space, $ as end of
    text, \d as ASCII digits, and letter subcategories as any letter."""
    out = []
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            n = pattern[i + 1]
            if n == "s":
                out.append(WS if in_class else f"[{WS}]")
            elif n == "S":
                out.append(f"[^{WS}]")
            elif n == "d":
                out.append("0-9" if in_class else "[0-9]")
            elif n == "p" and pattern.startswith(("{Lu}", "{Ll}", "{Lt}", "{Lm}", "{Lo}"), i + 2):
                out.append(r"\p{L}")
                i += 6
                continue
            else:
                out.append(c + n)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class and pattern[i - 1] != "[" and pattern[i - 2:i] != "[^":
            in_class = False
        elif c == "$" and not in_class:
            c = r"\Z"
        out.append(c)
        i += 1
    return "".join(out)


class PreTokenizer:
    """Splits text into the words that BPE merges never cross."""

    def __init__(self, family: str):
        self.family = family
        # (compiled, uses Unicode categories): only those see the Unicode 15.1 view of the text
        self._regexes = [(regex.compile(_translate(p)), "\\p{" in p) for p in FAMILIES[family]]

    def split(self, text: str) -> list[str]:
        if not text:
            return []
        old = _NEWER.sub(_UNASSIGNED, text) if _NEWER.search(text) else text
        spans = [(0, len(text))]
        for rx, categories in self._regexes:
            view = old if categories else text
            out: list[tuple[int, int]] = []
            for a, b in spans:
                pos = a
                for m in rx.finditer(view, a, b):
                    s, e = m.span()
                    if s > pos:
                        out.append((pos, s))  # a gap is a piece of its own
                    if e > s:
                        out.append((s, e))
                    pos = e
                if pos < b:
                    out.append((pos, b))
            spans = out
        return [text[a:b] for a, b in spans]
