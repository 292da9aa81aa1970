"""A memory-mapped GGUF reader that treats the file as untrusted input.

Every length and count is checked against the bytes that are really there
before anything is allocated, so a corrupt or hostile file gives one
ModelFileError naming the file and the problem, never a huge allocation or a
traceback. Tensor data are zero-copy numpy views into the mapping. Keys,
string values and tensor names must be UTF-8 text (one line naming the string
otherwise); vocabulary pieces may be any bytes (BYTE_STRING_KEYS).

Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor count,
u64 key/value count, the key/values, the tensor infos (name, u32 n_dims,
u64 ne[n_dims], u32 type, u64 offset), padding to `general.alignment`, data.
"""
from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelFileError

MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_STRING = 1 << 26  # 64 MiB: a chat template or a token is far smaller
# Arrays whose strings are byte sequences, not text: a vocabulary may hold pieces
# that are not UTF-8 on their own (llama.cpp and gguf-py's writer take tokens as
# raw bytes), and merges name those pieces. Every other string must be UTF-8.
BYTE_STRING_KEYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges"})
SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# value type id -> (struct format, size); 8 = string, 9 = array
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
       6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    ne: tuple[int, ...]  # ggml order: ne[0] is the contiguous dimension
    offset: int  # absolute offset in its file
    nbytes: int
    part: int  # index of the split part holding it

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy/PyTorch order: (ne[n-1], ..., ne[0])."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)


class _Cursor:
    def __init__(self, buf, path: str, end: int):
        self.buf, self.path, self.pos, self.end = buf, path, 0, end

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise ModelFileError(self.path, f"truncated file (header ends inside {what})")

    def scalar(self, vtype: int, what: str):
        fmt, size = _SCALARS[vtype]
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str, raw_bytes: bool = False, index: int | None = None) -> str:
        """A length-prefixed string (item `index` of the array `what`). It must be
        UTF-8 text, unless raw_bytes: then bytes that are not UTF-8 come back as
        surrogate escapes (lossless: encode with "surrogateescape" to get them back)."""
        start = self.pos
        n = self.u64(what)
        if n > MAX_STRING or n > self.end - self.pos:
            what = what if index is None else f"{what}[{index}]"  # named only when wrong: arrays are long
            if n > MAX_STRING:
                raise ModelFileError(self.path, f"absurd string length {n} in {what}")
            self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if raw_bytes:
                return raw.decode("utf-8", "surrogateescape")
            if index is not None:
                what = f"{what}[{index}]"
            shown = raw[:48] + (b"..." if len(raw) > 48 else b"")
            raise ModelFileError(self.path, f"{what} is not valid UTF-8 text: {shown!r} (byte 0x{raw[e.start]:02x} "
                                            f"at position {e.start}; the string starts at byte {start})") from None

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype, key)
        if vtype == 8:
            return self.string(f"metadata {key}")
        if vtype == 9:
            itype = self.u32(key)
            count = self.u64(key)
            if itype in _SCALARS:
                size = _SCALARS[itype][1]
                if count > (self.end - self.pos) // size:
                    raise ModelFileError(self.path, f"absurd array length {count} for {key}")
                arr = np.frombuffer(self.buf, dtype=_NP[itype], count=count, offset=self.pos).copy()
                self.pos += size * count
                return arr
            if itype == 8:
                if count > (self.end - self.pos) // 8:  # each string takes at least its u64 length
                    raise ModelFileError(self.path, f"absurd array length {count} for {key}")
                what, raw_ok = f"metadata {key}", key in BYTE_STRING_KEYS
                return [self.string(what, raw_ok, i) for i in range(count)]
            raise ModelFileError(self.path, f"unsupported array item type {itype} for {key}")
        raise ModelFileError(self.path, f"unknown value type {vtype} for key {key}")


def _parse_header(path: str, buf, size: int) -> tuple[dict, list[tuple], int, dict, int]:
    """-> (metadata, [(name, type, ne, rel_offset)], data_start, {key: (start, end) of its bytes}, alignment)."""
    c = _Cursor(buf, path, size)
    c.need(4, "magic")
    if bytes(buf[0:4]) != MAGIC:
        raise ModelFileError(path, "not a GGUF file (wrong magic)")
    c.pos = 4
    version = c.u32("version")
    if version not in (2, 3):
        raise ModelFileError(path, f"unsupported GGUF version {version}")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("key/value count")
    # a key/value needs >= 12 bytes, a tensor info >= 24: refuse counts the file cannot hold
    if n_kv > (size - c.pos) // 12:
        raise ModelFileError(path, f"absurd key/value count {n_kv}")
    if n_tensors > (size - c.pos) // 24:
        raise ModelFileError(path, f"absurd tensor count {n_tensors}")
    meta: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    for _ in range(n_kv):
        start = c.pos
        key = c.string(f"metadata key #{len(meta)}")
        if key in meta:  # llama.cpp refuses these too: which value would count is anyone's guess
            raise ModelFileError(path, f"duplicate metadata key {key}")
        vtype = c.u32(key)
        meta[key] = c.value(vtype, key)
        spans[key] = (start, c.pos)
    infos = []
    for i in range(n_tensors):
        name = c.string(f"the name of tensor #{i}")
        n_dims = c.u32(name)
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelFileError(path, f"tensor {name}: bad dimension count {n_dims}")
        ne = tuple(c.u64(name) for _ in range(n_dims))
        ttype = c.u32(name)
        offset = c.u64(name)
        infos.append((name, ttype, ne, offset))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ModelFileError(path, f"bad general.alignment {align!r}")
    data_start = (c.pos + align - 1) // align * align
    return meta, infos, data_start, spans, align


def _tensor_nbytes(path: str, name: str, ttype: int, ne: tuple[int, ...]) -> int:
    try:
        block, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):
        raise ModelFileError(path, f"tensor {name}: unknown tensor type {ttype}") from None
    if any(d <= 0 or d > 1 << 40 for d in ne):
        raise ModelFileError(path, f"tensor {name}: absurd shape {list(ne)}")
    if ne[0] % block:
        raise ModelFileError(path, f"tensor {name}: row of {ne[0]} is not a multiple of the {block}-element block")
    n = ne[0] // block * tsize
    for d in ne[1:]:
        n *= d
    return n


def split_parts(path: Path) -> list[Path]:
    """All parts of a split GGUF given any part's path (or [path] if not split)."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count = int(m["count"])
    parts = [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for p in parts:
        if not p.is_file():
            raise ModelFileError(path, f"split part missing: {p.name}")
    return parts


class _Part:
    def __init__(self, path: Path):
        self.path = path
        if not path.exists():
            raise ModelFileError(path, "no such file")
        if not path.is_file():
            raise ModelFileError(path, "not a regular file")
        self.size = path.stat().st_size
        if self.size < 24:
            raise ModelFileError(path, "truncated file (too short for a GGUF header)")
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.meta, self.infos, self.data_start, self.kv_spans, self.align = _parse_header(str(path), self.mm, self.size)


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """Key/values of a GGUF (first part of a split), without touching tensor data:
    works on files whose tensor data are missing or truncated."""
    p = _Part(Path(path))
    try:
        return p.meta
    finally:
        p.mm.close()


class GGUFFile:
    """A GGUF model (all split parts), memory-mapped. `metadata` holds the first
    part's key/values; `tensors` maps names to TensorInfo across parts."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        parts = split_parts(self.path)
        self._parts = [_Part(p) for p in parts]
        self.metadata = self._parts[0].meta
        want = self.metadata.get("split.count")
        if want is not None and int(want) != len(parts):
            raise ModelFileError(self.path, f"split.count says {want} parts, found {len(parts)}")
        self.tensors: dict[str, TensorInfo] = {}
        for idx, part in enumerate(self._parts):
            expect = 0  # as llama.cpp lays tensors out and checks them: one after another, each padded
            for name, ttype, ne, rel in part.infos:
                nbytes = _tensor_nbytes(str(part.path), name, ttype, ne)
                if rel != expect:
                    raise ModelFileError(part.path, f"tensor {name} has data offset {rel}, expected {expect} "
                                                    "(the previous tensor's end, padded to the alignment)")
                expect += -(-nbytes // part.align) * part.align
                start = part.data_start + rel
                if start + nbytes > part.size:
                    raise ModelFileError(part.path, f"truncated file (tensor {name} needs bytes up to {start + nbytes}, file has {part.size})")
                if name in self.tensors:
                    raise ModelFileError(part.path, f"duplicate tensor {name}")
                self.tensors[name] = TensorInfo(name, ttype, ne, start, nbytes, idx)

    def raw_kv(self, key: str) -> bytes:
        """One key/value exactly as encoded in the (first part's) header."""
        part = self._parts[0]
        a, b = part.kv_spans[key]
        return bytes(part.mm[a:b])

    @property
    def parts(self) -> list[Path]:
        return [p.path for p in self._parts]

    @property
    def size_bytes(self) -> int:
        return sum(p.size for p in self._parts)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a zero-copy uint8 view [nbytes]."""
        t = self.tensors[name]
        return np.frombuffer(self._parts[t.part].mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def release(self, name: str) -> None:
        """Drop the tensor's pages from this process's resident set (they stay in the
        page cache; a later read maps them again): a pass over a whole model, as
        the pack converter makes, then holds one tensor at a time, not the file."""
        t = self.tensors[name]
        page = mmap.PAGESIZE
        a = t.offset // page * page
        end = min(-(-(t.offset + t.nbytes) // page) * page, self._parts[t.part].size)
        if end > a and hasattr(mmap, "MADV_DONTNEED"):
            self._parts[t.part].mm.madvise(mmap.MADV_DONTNEED, a, end - a)

    def close(self) -> None:
        for p in self._parts:
            try:
                p.mm.close()
            except BufferError:  # views still alive: the mapping goes when they do
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
