"""Which pack belongs to a source GGUF: the file's content, not its path.

A copy of a model (another path, another name, the demo copied elsewhere) finds
the pack its original made. The identity is cheap on a 100+ GB file: the parts'
sizes, every key/value exactly as encoded, every tensor's name, type, shape and
offset, and a few 4 KiB samples of each tensor's data (one per tensor, up to 8
spread over a big one): about 10 MiB read for the largest models, never the
whole file. Two files that differ only outside every sample (an edit to part of
one tensor, same size) would share a pack; finetunes and requantizations change
every tensor, and so the samples.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..gguf.reader import GGUFFile
from ..paths import cache_dir

SAMPLE = 4096
MAX_SAMPLES = 8  # per tensor
SAMPLE_SPACING = 256 << 20  # one more sample per 256 MiB of a tensor, up to MAX_SAMPLES
PACK_SUFFIX = ".rmpack.gguf"


_seen: dict[tuple, dict] = {}  # (each part's path, size, mtime) -> its identity: one hashing per process


def source_identity(g: GGUFFile) -> dict:
    """An open source GGUF -> {"name", "size", "digest"}; equal digests mean the same content."""
    parts = tuple((str(p.resolve()), st.st_size, st.st_mtime_ns) for p in g.parts for st in (p.stat(),))
    if parts in _seen:
        return dict(_seen[parts], name=g.path.name)
    h = hashlib.sha256()
    h.update(json.dumps([p.stat().st_size for p in g.parts]).encode())
    for key in g.metadata:
        h.update(g.raw_kv(key))
    for t in sorted(g.tensors.values(), key=lambda t: (t.part, t.offset)):
        h.update(f"{t.name}|{t.ggml_type}|{t.ne}|{t.part}|{t.offset};".encode())
        raw = g.raw(t.name)
        n = min(MAX_SAMPLES, 1 + t.nbytes // SAMPLE_SPACING)
        for i in range(n):  # evenly spread, the middle when there is one sample
            a = max(0, min(t.nbytes - SAMPLE, (2 * i + 1) * t.nbytes // (2 * n) - SAMPLE // 2))
            h.update(raw[a:a + SAMPLE].tobytes())
        g.release(t.name)  # a read maps more than the sample (fault-around): none of it stays
    _seen[parts] = {"name": g.path.name, "size": g.size_bytes, "digest": h.hexdigest()}
    return dict(_seen[parts])


def pack_key(ident: dict, pack_version: int, format_version: int) -> str:
    return hashlib.sha256(json.dumps([ident["digest"], pack_version, format_version]).encode()).hexdigest()[:16]


def packs_dir() -> Path:
    return cache_dir() / "packs"


def _stem(name: str) -> str:
    stem = name[:-5] if name.endswith(".gguf") else name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:80] or "model"


def locate_pack(ident: dict, key: str) -> Path:
    """The pack of this content: the finished one when there is one (whatever the
    name of the file it was made from), else the one an interrupted convert left
    to resume, else a new name from this source's file name."""
    d = packs_dir()
    for pattern in (f"*.{key}{PACK_SUFFIX}", f"*.{key}{PACK_SUFFIX}.partial"):
        found = sorted(d.glob(pattern)) if d.is_dir() else []
        if found:
            p = found[0]
            return p if p.name.endswith(PACK_SUFFIX) else p.with_name(p.name[: -len(".partial")])
    return d / f"{_stem(ident['name'])}.{key}{PACK_SUFFIX}"
