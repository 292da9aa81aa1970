"""Rewrite a GGUF with edits (drop/reshape/retype a tensor, change keys, split
into parts) to produce the bad and unusual files the reader must handle."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from rapidmoe.engine.gguf.reader import GGUFFile


def _vtype(v):
    if isinstance(v, bool):
        return GGUFValueType.BOOL, None
    if isinstance(v, int):
        return (GGUFValueType.INT32 if -2**31 <= v < 2**31 else GGUFValueType.INT64), None
    if isinstance(v, float):
        return GGUFValueType.FLOAT32, None
    if isinstance(v, str):
        return GGUFValueType.STRING, None
    if isinstance(v, list):
        return GGUFValueType.ARRAY, GGUFValueType.STRING
    if isinstance(v, np.ndarray):
        sub = {np.dtype(np.float32): GGUFValueType.FLOAT32, np.dtype(np.int32): GGUFValueType.INT32,
               np.dtype(np.uint32): GGUFValueType.UINT32, np.dtype(np.int64): GGUFValueType.INT64}[v.dtype]
        return GGUFValueType.ARRAY, sub
    raise TypeError(type(v))


def rewrite(src: Path, dst: Path, *, drop=(), set_kv=None, del_kv=(), ne=None, ggml_type=None,
            split_max_tensors: int = 0) -> Path:
    """ne / ggml_type: {tensor name: new ne (ggml order) / new type id} (bytes are
    zero-filled to the new size)."""
    ne, ggml_type, set_kv = ne or {}, ggml_type or {}, set_kv or {}
    g = GGUFFile(src)
    meta = dict(g.metadata)
    arch = set_kv.get("general.architecture", meta["general.architecture"])
    w = GGUFWriter(dst, arch, split_max_tensors=split_max_tensors)
    for k, v in {**meta, **set_kv}.items():
        if k in del_kv or k == "general.architecture" or k.startswith("split."):
            continue
        if isinstance(v, np.ndarray) and v.dtype == np.uint8:
            v = v.astype(np.uint32)
        vt, sub = _vtype(v)
        w.add_key_value(k, v.tolist() if isinstance(v, np.ndarray) else v, vt, sub_type=sub)
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, t in g.tensors.items():
        if name in drop:
            continue
        raw = np.array(g.raw(name))
        shape_ne = ne.get(name, t.ne)
        ttype = GGMLQuantizationType(ggml_type.get(name, t.ggml_type))
        if name in ne or name in ggml_type:
            blk, size = GGML_QUANT_SIZES[ttype]
            n = shape_ne[0] // blk * size * int(np.prod(shape_ne[1:]))
            raw = np.zeros(n, dtype=np.uint8)
        blk, size = GGML_QUANT_SIZES[ttype]
        byte_shape = (*reversed(shape_ne[1:]), shape_ne[0] // blk * size)
        w.add_tensor(name, raw.reshape(byte_shape), raw_dtype=ttype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g.close()
    return dst
