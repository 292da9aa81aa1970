"""Writing GGUF headers for files whose tensor data are produced later (packs):
key/values copied byte-for-byte from a source file or encoded here, tensor
infos with aligned offsets. Data are then written at those offsets."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

ALIGN = 32


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def encode_kv(key: str, value) -> bytes:
    """bool -> BOOL, int -> INT64, float -> FLOAT64, str -> STRING, list[int] -> ARRAY of INT64."""
    if isinstance(value, bool):
        body = struct.pack("<I?", 7, value)
    elif isinstance(value, (int, np.integer)):
        body = struct.pack("<Iq", 11, int(value))
    elif isinstance(value, float):
        body = struct.pack("<Id", 12, value)
    elif isinstance(value, str):
        body = struct.pack("<I", 8) + _str(value)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, np.integer)) for v in value):
        body = struct.pack("<IIQ", 9, 11, len(value)) + np.asarray(value, dtype="<i8").tobytes()
    else:
        raise TypeError(f"cannot encode {key}={value!r}")
    return _str(key) + body


@dataclass(frozen=True)
class TensorSlot:
    name: str
    ggml_type: int
    ne: tuple[int, ...]
    nbytes: int


def build_header(raw_kvs: list[bytes], tensors: list[TensorSlot]) -> tuple[bytes, list[int], int]:
    """-> (header bytes padded to ALIGN, absolute offset of each tensor, total file size)."""
    infos, rel = [], 0
    offsets_rel = []
    for t in tensors:
        offsets_rel.append(rel)
        infos.append(_str(t.name) + struct.pack("<I", len(t.ne)) + struct.pack(f"<{len(t.ne)}Q", *t.ne)
                     + struct.pack("<IQ", t.ggml_type, rel))
        rel += (t.nbytes + ALIGN - 1) // ALIGN * ALIGN
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(raw_kvs)) + b"".join(raw_kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % ALIGN)
    return head, [len(head) + r for r in offsets_rel], len(head) + rel
