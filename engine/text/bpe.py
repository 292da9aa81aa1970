"""Byte-level BPE (GGUF `tokenizer.ggml.model` = "gpt2").

Every byte of a pre-tokenized word is first mapped to a printable character
(the GPT-2 byte encoding), then adjacent symbols are merged lowest merge rank
first, leftmost first on ties: the order llama.cpp's priority queue yields.
"""
from __future__ import annotations

import heapq
from typing import Sequence


def _byte_chars() -> list[str]:
    """byte -> the character that stands for it inside byte-level BPE tokens."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


BYTE_TO_CHAR = _byte_chars()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table: a latin-1 decoded byte string -> its byte-level characters
_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_ENCODE_TABLE)


def byte_decode(text: str) -> bytes:
    """Token text -> raw bytes. A character outside the byte alphabet cannot come from
    a real vocabulary; it is rendered the way llama.cpp renders it: the character's
    UTF-8 in hex (a byte that was not UTF-8 in the file, kept here as a surrogate
    escape, reads as U+FFFD there), then the whole token's bytes."""
    out = bytearray()
    for ch in text:
        b = CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            code = "efbfbd" if 0xDC80 <= ord(ch) <= 0xDCFF else ch.encode("utf-8").hex()
            out += b"[UNK_BYTE_0x" + code.encode() + text.encode("utf-8", "surrogateescape") + b"]"
    return bytes(out)


def parse_merges(merges: Sequence[str]) -> dict[tuple[str, str], int]:
    ranks: dict[tuple[str, str], int] = {}
    for i, m in enumerate(merges):
        pos = m.find(" ", 1)  # a first part may itself start with a space
        pair = (m[:pos], m[pos + 1:]) if pos >= 0 else ("", "")
        ranks.setdefault(pair, i)  # the first rank of a repeated pair wins
    return ranks


class BpeModel:
    def __init__(self, token_to_id: dict[str, int], ranks: dict[tuple[str, str], int],
                 ignore_merges: bool):
        self.token_to_id = token_to_id
        self.ranks = ranks
        self.ignore_merges = ignore_merges
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode_word(self, word: str) -> tuple[int, ...]:
        """One pre-tokenized word (raw text) -> ids."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        enc = byte_encode(word)
        tid = self.token_to_id.get(enc) if self.ignore_merges else None
        if tid is not None:
            ids: tuple[int, ...] = (tid,)
        else:
            ids = tuple(self._symbols_to_ids(self._merge(enc)))
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def _merge(self, enc: str) -> list[str]:
        n = len(enc)
        if n < 2:
            return [enc] if n else []
        ranks = self.ranks
        sym = list(enc)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        nxt[-1] = -1
        heap: list[tuple[int, int, str]] = []
        for i in range(n - 1):
            r = ranks.get((sym[i], sym[i + 1]))
            if r is not None:
                heap.append((r, i, sym[i] + sym[i + 1]))
        heapq.heapify(heap)
        while heap:
            r, i, text = heapq.heappop(heap)
            j = nxt[i]
            # stale: one side was merged away or grew since this pair was queued
            if j < 0 or not sym[i] or sym[i] + sym[j] != text:
                continue
            sym[i] = text
            sym[j] = ""
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prv[nxt[j]] = i
            p, q = prv[i], nxt[i]
            if p >= 0:
                rr = ranks.get((sym[p], text))
                if rr is not None:
                    heapq.heappush(heap, (rr, p, sym[p] + text))
            if q >= 0:
                rr = ranks.get((text, sym[q]))
                if rr is not None:
                    heapq.heappush(heap, (rr, i, text + sym[q]))
        return [s for s in sym if s]

    def _symbols_to_ids(self, symbols: list[str]) -> list[int]:
        out = []
        t2i = self.token_to_id
        for s in symbols:
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
                continue
            # not a token: llama.cpp looks up each UTF-8 byte of the symbol on its own and
            # drops the bytes that are no token
            for b in s.encode("utf-8", "surrogateescape"):
                tid = t2i.get(chr(b) if b < 0x80 else chr(0xDC00 + b))
                if tid is not None:
                    out.append(tid)
        return out
