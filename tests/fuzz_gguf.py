"""The GGUF files the fuzz corpus damages, as plain data (tests/fuzz_corpus.py).

A Doc is a file's key/values (each with its GGUF value type) and tensors (shape,
ggml type, bytes, optionally an explicit offset), plus byte-level damage: a cut
and flipped bits. encode() writes any Doc, valid or not, as a writer lays a file
out; file_doc() reads a GGUF file back into one.
"""
from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
       U64: "<Q", I64: "<q", F64: "<d"}
ALIGN = 32


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
            np.asarray(items, dtype=np.dtype(FMT[sub])).tobytes()
        return struct.pack("<IQ", sub, len(items)) + body
    return struct.pack(FMT[vtype], v)


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
        return take(FMT[vt])

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
