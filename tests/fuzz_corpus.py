"""A seeded corpus of damaged model files for the fuzz tests.

Base files are the synthetic models (engine/synth/, every architecture) with
a small slice of a real vocabulary, so each is a few hundred KB and loads in a
fraction of a second; the demo can be added as a base too. Each corpus file is
one base with one mutation: structural (a tensor dropped, renamed, reshaped,
retyped or moved; a key dropped, duplicated, retyped or set to an extreme; the
tokenizer's arrays broken) or byte-level (truncation, flipped header bytes).
The same seed gives the same files.

    docs = base_docs()
    for name, data in corpus(docs, n=300, seed=0): ...
"""
from __future__ import annotations

import dataclasses
import math
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
        U64: "<Q", I64: "<q", F64: "<d"}
ALIGN = 32
# ggml type ids: F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, IQ2_XXS, I8, BF16, and ids that do not exist
TYPE_IDS = (0, 1, 2, 8, 12, 14, 16, 24, 30, 39, 99, 1 << 31)


@dataclass(frozen=True)
class KV:
    key: str
    vtype: int
    value: Any
    sub: int | None = None  # element type of an array


@dataclass(frozen=True)
class Tensor:
    name: str
    ne: tuple[int, ...]
    ggml_type: int
    data: bytes | memoryview
    offset: int | None = None  # None: the running padded sum, as writers lay it out


@dataclass
class Doc:
    label: str
    kvs: list[KV]
    tensors: list[Tensor]
    version: int = 3
    cut: int | None = None  # truncate the encoded file to this many bytes
    flips: list[tuple[int, int]] = field(default_factory=list)  # (byte offset, xor mask)

    def copy(self, label: str) -> "Doc":
        return Doc(label, list(self.kvs), list(self.tensors), self.version, self.cut, list(self.flips))

    def kv_index(self, key: str) -> int:
        return next(i for i, kv in enumerate(self.kvs) if kv.key == key)


# ---- encoding ----

def _s(text: str | bytes) -> bytes:
    b = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, v: Any, sub: int | None) -> bytes:
    if vtype == STR:
        return _s(v)
    if vtype == ARR:
        items = list(v)
        body = b"".join(_value(sub, x, None) for x in items) if sub in (STR, ARR) else \
            np.asarray(items, dtype=np.dtype(_FMT[sub])).tobytes()
        return struct.pack("<IQ", sub, len(items)) + body
    return struct.pack(_FMT[vtype], v)


def type_nbytes(ggml_type: int, ne: tuple[int, ...]) -> int | None:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return None
    if ne[0] % block:
        return None
    return ne[0] // block * size * math.prod(ne[1:])


def encode(doc: Doc) -> bytes:
    head = [b"GGUF", struct.pack("<IQQ", doc.version, len(doc.tensors), len(doc.kvs))]
    for kv in doc.kvs:
        head += [_s(kv.key), struct.pack("<I", kv.vtype), _value(kv.vtype, kv.value, kv.sub)]
    align = next((kv.value for kv in doc.kvs if kv.key == "general.alignment" and kv.vtype == U32), ALIGN)
    align = align if isinstance(align, int) and 0 < align <= 1 << 16 and not align & (align - 1) else ALIGN
    rel, placed = 0, []
    for t in doc.tensors:
        off = rel if t.offset is None else t.offset
        placed.append(off)
        head += [_s(t.name), struct.pack("<I", len(t.ne)), struct.pack(f"<{len(t.ne)}Q", *t.ne),
                 struct.pack("<IQ", t.ggml_type, off)]
        rel += (len(t.data) + align - 1) // align * align
    out = bytearray(b"".join(head))
    out += b"\0" * (-len(out) % align)
    base = len(out)
    out += b"\0" * rel
    for t, off in zip(doc.tensors, placed):
        if base + off + len(t.data) <= len(out):
            out[base + off:base + off + len(t.data)] = t.data
    for pos, mask in doc.flips:
        if pos < len(out):
            out[pos] ^= mask
    return bytes(out[:doc.cut] if doc.cut is not None else out)


def header_size(doc: Doc) -> int:
    return len(encode(dataclasses.replace(doc.copy(doc.label), tensors=[
        dataclasses.replace(t, data=b"") for t in doc.tensors])))


# ---- base files ----

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


def file_doc(path: Path, label: str) -> Doc:
    """A GGUF file's key/values (types kept) and tensors (data as views of its bytes)."""
    buf = memoryview(Path(path).read_bytes())
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal pos
        n = take("<Q")
        s = bytes(buf[pos:pos + n]).decode("utf-8")
        pos += n
        return s

    def value(vt):
        if vt == STR:
            return string()
        if vt == ARR:
            sub, n = take("<I"), take("<Q")
            return sub, [value(sub) for _ in range(n)]
        return take(_FMT[vt])

    assert bytes(buf[:4]) == b"GGUF"
    pos = 4
    version, n_t, n_kv = take("<I"), take("<Q"), take("<Q")
    kvs = []
    for _ in range(n_kv):
        key, vt = string(), take("<I")
        v = value(vt)
        kvs.append(KV(key, vt, v[1], v[0]) if vt == ARR else KV(key, vt, v))
    infos = []
    for _ in range(n_t):
        name, nd = string(), take("<I")
        ne = tuple(take("<Q") for _ in range(nd))
        infos.append((name, ne, take("<I"), take("<Q")))
    start = pos + (-pos % ALIGN)
    tensors = [Tensor(n, ne, tt, buf[start + off:start + off + type_nbytes(tt, ne)]) for n, ne, tt, off in infos]
    return Doc(label, kvs, tensors, version)


def base_docs(demo: Path | None = None) -> list[Doc]:
    docs = [synth_doc(p, **kw) for p, kw in BASES]
    if demo is not None:
        docs.append(file_doc(demo, "demo"))
    return docs


# ---- mutations: (rng, doc) -> doc, or None when it does not apply ----

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
    numeric = [i for i, kv in enumerate(doc.kvs) if kv.vtype in _FMT and kv.vtype != BOOL]
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
