"""The fuzz corpus's mutations (tests/fuzz_corpus.py): each takes (rng, doc) and
returns a damaged copy of the doc, or None when it does not apply to it.

Structural ones drop, rename, reshape, retype or move a tensor; drop, duplicate or
retype a key or set it to an extreme; break the tokenizer's arrays. Byte-level ones
truncate the file or flip bits in its header.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable

from fuzz_gguf import (
    ALIGN,
    ARR,
    BOOL,
    F32,
    F64,
    FMT,
    I32,
    I64,
    KV,
    STR,
    U8,
    U16,
    U32,
    U64,
    Doc,
    encode,
    header_size,
    type_nbytes,
)

# ggml type ids: F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, IQ2_XXS, I8, BF16, and ids that do not exist
TYPE_IDS = (0, 1, 2, 8, 12, 14, 16, 24, 30, 39, 99, 1 << 31)


def _pick_tensor(rng: random.Random, doc: Doc) -> int:
    return rng.randrange(len(doc.tensors))


def _set_tensor(doc: Doc, i: int, label: str, **changes) -> Doc:
    d = doc.copy(label)
    d.tensors[i] = dataclasses.replace(d.tensors[i], **changes)
    return d


def m_drop_tensor(rng, doc):
    i = _pick_tensor(rng, doc)
    d = doc.copy(f"drop tensor {doc.tensors[i].name}")
    del d.tensors[i]
    return d


def m_rename_tensor(rng, doc):
    i = _pick_tensor(rng, doc)
    name = doc.tensors[i].name
    new = rng.choice([name.replace("ffn_gate_exps", "ffn_gate_up_exps"), name + ".x", name.upper(),
                      name.replace("blk.", "blk.9"), "blk.x." + name, ""])
    return _set_tensor(doc, i, f"rename {name} -> {new}", name=new)


def m_duplicate_tensor(rng, doc):
    i = _pick_tensor(rng, doc)
    d = doc.copy(f"duplicate tensor {doc.tensors[i].name}")
    d.tensors.insert(rng.randrange(len(d.tensors) + 1), doc.tensors[i])
    return d


def m_swap_names(rng, doc):
    i, j = _pick_tensor(rng, doc), _pick_tensor(rng, doc)
    a, b = doc.tensors[i], doc.tensors[j]
    d = doc.copy(f"swap names {a.name} <-> {b.name}")
    d.tensors[i], d.tensors[j] = dataclasses.replace(a, name=b.name), dataclasses.replace(b, name=a.name)
    return d


def m_reshape(rng, doc):
    """Same bytes, another shape: a dimension merged, transposed, or a trailing 1 added."""
    i = _pick_tensor(rng, doc)
    t = doc.tensors[i]
    ne = list(t.ne)
    how = rng.choice(["merge", "transpose", "trailing1", "leading1"])
    if how == "merge" and len(ne) >= 2:
        ne = ne[:-2] + [ne[-2] * ne[-1]]
    elif how == "transpose" and len(ne) >= 2:
        ne[0], ne[1] = ne[1], ne[0]
    elif how == "leading1" and len(ne) < 4:
        ne = [1] + ne
    elif len(ne) < 4:
        ne = ne + [1]
    if type_nbytes(t.ggml_type, tuple(ne)) != len(t.data):
        return None
    return _set_tensor(doc, i, f"{how} {t.name} {list(t.ne)} -> {ne}", ne=tuple(ne))


def m_resize(rng, doc):
    """One dimension changed; data sized to match (zeros) or left as they were."""
    i = _pick_tensor(rng, doc)
    t = doc.tensors[i]
    ne = list(t.ne)
    k = rng.randrange(len(ne))
    ne[k] = rng.choice([0, 1, ne[k] + 1, ne[k] - 1, ne[k] * 2, 32, 1 << 31, (1 << 63) + 5, (1 << 64) - 1])
    n = type_nbytes(t.ggml_type, tuple(ne)) if all(0 < x < 1 << 24 for x in ne) else None
    data = bytes(n) if n is not None and rng.random() < 0.7 else t.data
    return _set_tensor(doc, i, f"resize {t.name} {list(t.ne)} -> {ne}", ne=tuple(ne), data=data)


def m_ndims(rng, doc):
    i = _pick_tensor(rng, doc)
    t = doc.tensors[i]
    ne = rng.choice([(), t.ne[:1], t.ne + (1, 1, 1, 1), t.ne + (2,)])
    return _set_tensor(doc, i, f"dims {t.name} -> {list(ne)}", ne=tuple(ne))


def m_retype(rng, doc):
    i = _pick_tensor(rng, doc)
    t = doc.tensors[i]
    new = rng.choice(TYPE_IDS)
    n = type_nbytes(new, t.ne)
    data = bytes(n) if n is not None and rng.random() < 0.8 else t.data
    return _set_tensor(doc, i, f"retype {t.name} {t.ggml_type} -> {new}", ggml_type=new, data=data)


def m_offset(rng, doc):
    i = _pick_tensor(rng, doc)
    t = doc.tensors[i]
    total = sum((len(x.data) + ALIGN - 1) // ALIGN * ALIGN for x in doc.tensors)
    off = rng.choice([total, total + 4096, 1 << 40, (1 << 64) - 8, 1, 31, 0, total - 32])
    return _set_tensor(doc, i, f"offset {t.name} -> {off}", offset=off)


def _hparam_keys(doc: Doc) -> list[int]:
    return [i for i, kv in enumerate(doc.kvs) if kv.key != "general.architecture"]


def m_drop_key(rng, doc):
    i = rng.choice(_hparam_keys(doc))
    d = doc.copy(f"drop key {doc.kvs[i].key}")
    del d.kvs[i]
    return d


def m_duplicate_key(rng, doc):
    i = rng.randrange(len(doc.kvs))
    kv = doc.kvs[i]
    d = doc.copy(f"duplicate key {kv.key}")
    twin = kv if rng.random() < 0.5 or kv.vtype == ARR else KV(kv.key, STR, f"synthetic-{kv.key}")
    d.kvs.insert(rng.randrange(len(d.kvs) + 1), twin)
    return d


def m_retype_key(rng, doc):
    i = rng.randrange(len(doc.kvs))
    kv = doc.kvs[i]
    new = rng.choice([KV(kv.key, STR, f"synthetic-{rng.randrange(100)}"), KV(kv.key, F32, 2.5),
                      KV(kv.key, I64, -3), KV(kv.key, ARR, [1, 2, 3], I32), KV(kv.key, ARR, ["a", "b"], STR),
                      KV(kv.key, BOOL, True), KV(kv.key, ARR, [], U8), KV(kv.key, F64, float("nan"))])
    return _set_kv(doc, i, f"retype key {kv.key} -> {new.vtype}", new)


def _set_kv(doc: Doc, i: int, label: str, kv: KV) -> Doc:
    d = doc.copy(label)
    d.kvs[i] = kv
    return d


_INTS = (0, 1, 2, 3, 7, 1 << 20, 1 << 30, (1 << 31) - 1, (1 << 32) - 1, 10 ** 12, (1 << 63) - 1)
_FLOATS = (0.0, -1.0, 1e-30, 1e38, float("inf"), float("-inf"), float("nan"))


def m_extreme_value(rng, doc):
    numeric = [i for i, kv in enumerate(doc.kvs) if kv.vtype in FMT and kv.vtype != BOOL]
    i = rng.choice(numeric)
    kv = doc.kvs[i]
    if kv.vtype in (F32, F64):
        new = KV(kv.key, kv.vtype, rng.choice(_FLOATS))
    else:
        v = rng.choice(_INTS)
        new = KV(kv.key, U64 if v >= 1 << 32 else U32, v) if rng.random() < 0.8 else KV(kv.key, I32, -1)
    return _set_kv(doc, i, f"{kv.key} = {new.value}", new)


def m_key_targets(rng, doc):
    """Values aimed at what sizes memory: counts, context, vocabulary, per-layer arrays."""
    arch = doc.kvs[doc.kv_index("general.architecture")].value
    key, val = rng.choice([("expert_count", 1 << 30), ("expert_count", 1 << 20), ("context_length", (1 << 32) - 1),
                           ("context_length", 1 << 28), ("block_count", 100000), ("embedding_length", 1 << 19),
                           ("attention.head_count", 4096), ("attention.key_length", 1 << 16),
                           ("expert_used_count", 1 << 20), ("vocab_size", 1 << 31),
                           ("expert_feed_forward_length", [32, 64]), ("attention.head_count_kv", [2, 2]),
                           ("expert_group_count", 3), ("rope.dimension_count", 1 << 20)])
    full = f"{arch}.{key}"
    kv = KV(full, ARR, val, U32) if isinstance(val, list) else KV(full, U64 if val >= 1 << 32 else U32, val)
    d = doc.copy(f"{full} = {val}")
    try:
        d.kvs[d.kv_index(full)] = kv
    except StopIteration:
        d.kvs.append(kv)
    return d


def m_tokenizer(rng, doc):
    """The tokenizer's arrays and ids of the wrong type, length or form."""
    p = "tokenizer.ggml."
    try:
        n = len(doc.kvs[doc.kv_index(p + "tokens")].value)
    except StopIteration:
        return None
    merges = p + "merges"
    choices = [
        KV(p + "tokens", ARR, list(range(n)), I32), KV(p + "tokens", ARR, ["a"] * n, STR),
        KV(p + "tokens", ARR, [f"t{i}" for i in range(n // 2)], STR), KV(p + "tokens", STR, "abc"),
        KV(p + "tokens", ARR, [], STR), KV(p + "tokens", ARR, [""] * 3 + [f"t{i}" for i in range(n - 3)], STR),
        KV(p + "token_type", ARR, ["1"] * n, STR), KV(p + "token_type", ARR, [1] * (n - 7), I32),
        KV(p + "token_type", ARR, [99] * n, I32), KV(p + "token_type", ARR, [-1] * n, I32),
        KV(p + "token_type", I32, 1), KV(p + "token_type", ARR, [6] * n, I32),
        KV(p + "scores", ARR, [0.5] * (n - 1), F32), KV(p + "scores", ARR, ["x"] * n, STR),
        KV(p + "scores", ARR, [float("nan")] * n, F32),
        KV(merges, ARR, list(range(10)), I32), KV(merges, ARR, ["abc", "", "a b c", " x", "x "], STR),
        KV(merges, ARR, ["zzz qqq", "Ġ t"], STR), KV(merges, I32, 5), KV(merges, STR, "a b"),
        KV(p + "model", STR, "bogus"), KV(p + "model", I32, 3), KV(p + "model", STR, "llama"),
        KV(p + "pre", STR, "weird-pre"), KV(p + "pre", I32, 1),
        KV(p + "bos_token_id", U32, (1 << 32) - 1), KV(p + "bos_token_id", I32, -1),
        KV(p + "bos_token_id", STR, "1"), KV(p + "eos_token_id", U64, 1 << 40),
        KV(p + "eos_token_id", F32, 1.5), KV(p + "add_bos_token", STR, "yes"), KV(p + "add_bos_token", BOOL, True),
        KV("tokenizer.chat_template", I32, 7), KV("tokenizer.chat_template", STR, "{{ bad"),
        KV("tokenizer.chat_template", ARR, ["x"], STR),
    ]
    kv = rng.choice(choices)
    d = doc.copy(f"tokenizer {kv.key} := {kv.vtype}:{str(kv.value)[:24]}")
    try:
        d.kvs[d.kv_index(kv.key)] = kv
    except StopIteration:
        d.kvs.append(kv)
    return d


def m_alignment(rng, doc):
    v = rng.choice([0, 3, 1 << 31, 64, 1])
    d = doc.copy(f"general.alignment = {v}")
    d.kvs.append(KV("general.alignment", U32, v) if rng.random() < 0.8 else KV("general.alignment", STR, "32"))
    return d


def m_version(rng, doc):
    d = doc.copy("version")
    d.version = rng.choice([0, 1, 4, 1 << 31])
    return d


def m_split_keys(rng, doc):
    d = doc.copy("split keys")
    d.kvs.append(KV("split.count", U16, rng.choice([0, 2, 65535])))
    return d


def m_truncate(rng, doc):
    size = len(encode(doc)) if rng.random() < 0.3 else header_size(doc)
    d = doc.copy("")
    d.cut = rng.randrange(0, size)
    d.label = f"truncate at {d.cut}"
    return d


def m_flip_header(rng, doc):
    size = header_size(doc)
    d = doc.copy("")
    d.flips = [(rng.randrange(4, size), 1 << rng.randrange(8)) for _ in range(rng.choice([1, 1, 2, 4, 16]))]
    d.label = f"flip header bytes {[p for p, _ in d.flips][:4]}"
    return d


def m_flip_counts(rng, doc):
    """The tensor or key/value count, or a string length, off by a little or a lot."""
    d = doc.copy("")
    pos = rng.choice([8, 16, 24])  # tensor count, kv count, first key's length
    d.flips = [(pos + rng.randrange(8), 1 << rng.randrange(8))]
    d.label = f"flip count field at {d.flips[0][0]}"
    return d


MUTATIONS: tuple[Callable, ...] = (
    m_drop_tensor, m_rename_tensor, m_duplicate_tensor, m_swap_names, m_reshape, m_reshape, m_resize, m_resize,
    m_ndims, m_retype, m_retype, m_offset, m_drop_key, m_drop_key, m_duplicate_key, m_retype_key, m_retype_key,
    m_extreme_value, m_extreme_value, m_key_targets, m_key_targets, m_tokenizer, m_tokenizer, m_tokenizer,
    m_alignment, m_version, m_split_keys, m_truncate, m_flip_header, m_flip_header, m_flip_counts)


# what leaves the tensor data alone (for big bases such as the demo)
HEADER_MUTATIONS: tuple[Callable, ...] = (
    m_drop_tensor, m_rename_tensor, m_duplicate_tensor, m_drop_key, m_duplicate_key, m_retype_key, m_extreme_value,
    m_key_targets, m_tokenizer, m_tokenizer, m_truncate, m_flip_header, m_flip_counts)
