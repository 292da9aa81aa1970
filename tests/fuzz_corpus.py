"""A seeded corpus of damaged model files for the fuzz tests.

Base files are the synthetic models (engine/synth/, every architecture) with
a small slice of a real vocabulary, so each is a few hundred KB and loads in a
fraction of a second; the demo can be added as a base too. Each corpus file is
one base with one mutation: structural (a tensor dropped, renamed, reshaped,
retyped or moved; a key dropped, duplicated, retyped or set to an extreme; the
tokenizer's arrays broken) or byte-level (truncation, flipped header bytes).
The same seed gives the same files. The documents and their encoding are in
tests/fuzz_gguf.py, the mutations in tests/fuzz_mutations.py; the base files and
the corpus are here, and the fuzz tests import all of it from here.

    docs = base_docs()
    for name, data in corpus(docs, n=300, seed=0): ...
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from fuzz_gguf import ARR, F32, I32, KV, STR, U32, U64, Doc, Tensor, encode, file_doc
from fuzz_mutations import HEADER_MUTATIONS, MUTATIONS

__all__ = ["ARR", "F32", "I32", "STR", "U32", "U64", "KV", "Doc", "Tensor", "encode", "file_doc", "MUTATIONS",
           "HEADER_MUTATIONS", "small_vocab", "BASES", "synth_doc", "base_docs", "corpus", "write_corpus"]


def small_vocab(n: int = 640) -> tuple:
    """The first n tokens of SmolLM2's vocabulary with the merges among them: a
    real byte-level BPE tokenizer small enough for many tiny files."""
    from gguf import GGUFValueType

    from rapidmoe.engine.synth.tokenizer import tokenizer_kvs

    kvs = tokenizer_kvs("smollm2")
    tokens = dict((k, v) for k, v, _, _ in kvs)["tokenizer.ggml.tokens"][:n]
    keep = set(tokens)
    out = []
    for k, v, vt, sub in kvs:
        if k == "tokenizer.ggml.tokens":
            v = tokens
        elif k == "tokenizer.ggml.token_type":
            v = list(v)[:n]
        elif k == "tokenizer.ggml.merges":
            v = [m for m in v if len(m.split(" ")) == 2 and set(m.split(" ")) <= keep
                 and m.replace(" ", "") in keep]
        out.append((k, v, GGUFValueType(vt), sub))
    return tuple(out)


BASES = (("qwen3moe", {}), ("qwen2moe", {}), ("llama_moe", {}), ("olmoe", {}), ("ds2_lite", {}),
         ("ds2_v3", {}), ("qwen3moe", {"expert_dtype": "q8_0"}), ("llama_moe", {"dtype": "f16"}),
         ("ds2_v3", {"expert_dtype": "q4_0"}), ("qwen2moe", {"dtype": "q5_1"}))


def synth_doc(preset: str, seed: int = 0, **kw) -> Doc:
    from rapidmoe.engine.synth import model as synth

    plan = synth.plan_synthetic(preset, tokenizer=small_vocab(), **kw)
    kvs = [KV("general.architecture", STR, plan.arch)]
    kvs += [KV(k, int(vt), list(v) if isinstance(v, (list, tuple)) else v,
               None if sub is None else int(sub)) for k, v, vt, sub in plan.kvs]
    tensors = []
    for spec, q in plan.tensors:
        data = b"".join(np.ascontiguousarray(c).tobytes() for c in synth._chunks(spec, q, plan.shape, seed))
        tensors.append(Tensor(spec.name, tuple(spec.ne), int(q), data))
    tag = preset + "".join(f"-{v}" for v in kw.values())
    return Doc(tag, kvs, tensors)


def base_docs(demo: Path | None = None) -> list[Doc]:
    docs = [synth_doc(p, **kw) for p, kw in BASES]
    if demo is not None:
        docs.append(file_doc(demo, "demo"))
    return docs


def corpus(docs: list[Doc], n: int, seed: int = 0,
           mutations: tuple[Callable, ...] = MUTATIONS) -> Iterator[tuple[str, bytes]]:
    """n (label, file bytes) pairs: each a random base with one random mutation."""
    rng = random.Random(seed)
    k = 0
    while k < n:
        base = rng.choice(docs)
        d = rng.choice(mutations)(rng, base)
        if d is None:
            continue
        yield f"{base.label}: {d.label}", encode(d)
        k += 1


def write_corpus(out: Path, docs: list[Doc], n: int, seed: int = 0, mutations: tuple[Callable, ...] = MUTATIONS,
                 prefix: str = "fuzz") -> list[tuple[Path, str]]:
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for k, (label, data) in enumerate(corpus(docs, n, seed, mutations)):
        p = out / f"{prefix}-{k:04d}.gguf"
        p.write_bytes(data)
        files.append((p, label))
    return files
