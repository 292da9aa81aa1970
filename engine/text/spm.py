"""SentencePiece-style tokenization (GGUF `tokenizer.ggml.model` = "llama").

Spaces are escaped to U+2581 ("▁") by the caller. Starting from single
characters, the adjacent pair whose concatenation is a vocabulary token with
the highest score is merged (leftmost on ties), until no pair forms a token.
Characters that end up as no token fall back to byte tokens <0xNN>.
"""
from __future__ import annotations

import heapq
from typing import Sequence

SPACE = "\u2581"


class SpmModel:
    def __init__(self, token_to_id: dict[str, int], scores: Sequence[float]):
        self.token_to_id = token_to_id
        self.scores = scores
        self._byte_ids: list[int | None] = []
        for b in range(256):
            tid = token_to_id.get(f"<0x{b:02X}>")
            if tid is None and b < 0x80:  # llama.cpp then tries the byte as a one-char token
                tid = token_to_id.get(chr(b))
            self._byte_ids.append(tid)

    def byte_id(self, b: int) -> int | None:
        return self._byte_ids[b]

    def encode(self, text: str, out: list[int]) -> None:
        n = len(text)
        if n == 0:
            return
        t2i, scores = self.token_to_id, self.scores
        sym = list(text)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int]] = []

        def push(i: int, j: int) -> None:
            tid = t2i.get(sym[i] + sym[j])
            if tid is not None:
                # highest score first, then leftmost; the lengths identify stale entries
                heapq.heappush(heap, (-scores[tid], i, len(sym[i]) + len(sym[j])))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, i, size = heapq.heappop(heap)
            j = nxt[i]
            if j < 0 or not sym[i] or len(sym[i]) + len(sym[j]) != size:
                continue
            sym[i] += sym[j]
            sym[j] = ""
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prv[nxt[j]] = i
            if prv[i] >= 0:
                push(prv[i], i)
            if nxt[i] >= 0:
                push(i, nxt[i])

        for s in sym:
            if not s:
                continue
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for b in s.encode("utf-8", "surrogatepass"):
                bid = self._byte_ids[b]
                if bid is None:
                    raise ValueError(f"the vocabulary has no token for byte 0x{b:02X}")
                out.append(bid)
