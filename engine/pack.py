"""The RESplit pack: a GGUF in the user cache dir holding the source model's
metadata and non-expert tensors (in their source types) plus, for every routed
expert stack, its residual-split parts:

    blk.N.ffn_gate_exps.wq / .wr   [E, ff, row bytes]   gate:  W ≈ deq(WQ) + deq(WR)
    blk.N.ffn_up_exps.wq   / .wr   [E, ff, row bytes]   up:    likewise
    blk.N.ffn_down_exps.wq         [E, H,  row bytes]   down at WQ (non-critical experts)
    blk.N.ffn_down_exps.d4         [E, H,  row bytes]   down's CPU copy (critical experts)

stored as I8 byte tensors (formats in engine/quant/resplit_oracle.py). A pack is
keyed by the source file's identity and the format version, written to a
.partial file (resumable by layer), fsynced and renamed; it is verified before
use, so an interrupted convert never passes for a pack.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock

from . import kernels
from .config import ModelConfig, config_from_metadata
from .errors import ModelFileError, UserError
from .gguf.reader import GGUFFile
from .gguf.writer import TensorSlot, build_header, encode_kv
from .paths import cache_dir, fsync_dir

PACK_VERSION = 1  # the pack's layout; the expert formats carry their own version
I8 = 24  # GGML type id used for raw byte tensors
EXPERT_KINDS = ("gate", "up", "down")
PARTS = (("gate", "wq"), ("gate", "wr"), ("up", "wq"), ("up", "wr"), ("down", "wq"), ("down", "d4"))


def source_identity(path: Path) -> dict:
    files = GGUFFile(path).parts
    st = [f.stat() for f in files]
    return {"name": path.name, "size": sum(s.st_size for s in st), "mtime_ns": max(s.st_mtime_ns for s in st)}


def pack_path(src: Path) -> Path:
    ident = source_identity(src)
    key = hashlib.sha256(json.dumps([str(Path(src).resolve()), ident, PACK_VERSION,
                                     kernels.resplit_format_version()]).encode()).hexdigest()[:16]
    stem = src.name[:-5] if src.name.endswith(".gguf") else src.name
    return cache_dir() / "packs" / f"{stem}.{key}.rmpack.gguf"


def expert_layers(cfg: ModelConfig, g: GGUFFile) -> list[int]:
    return [il for il in range(cfg.n_layer) if f"blk.{il}.ffn_gate_exps.weight" in g.tensors]


def _expert_slots(cfg: ModelConfig, il: int) -> list[TensorSlot]:
    H, F, E = cfg.n_embd, cfg.n_ff_exp, cfg.n_expert
    slots = []
    for kind, fmt in PARTS:
        rows, n = (H, F) if kind == "down" else (F, H)
        rb = kernels.resplit_row_bytes(fmt, n)
        slots.append(TensorSlot(f"blk.{il}.ffn_{kind}_exps.{fmt}", I8, (rb, rows, E), rb * rows * E))
    return slots


def _index_digest(slots: list[TensorSlot], offsets: list[int]) -> str:
    h = hashlib.sha256()
    for s, o in zip(slots, offsets):
        h.update(f"{s.name}|{s.ggml_type}|{s.ne}|{s.nbytes}|{o};".encode())
    return h.hexdigest()


@dataclass
class PackPlan:
    src: GGUFFile
    cfg: ModelConfig
    layers: list[int]
    copied: list[TensorSlot]  # non-expert tensors, source bytes
    slots: list[TensorSlot]  # copied + expert parts, file order
    header: bytes
    offsets: list[int]
    size: int
    weights: int  # routed expert weights to quantize


def plan_pack(src_path: Path, ident: dict) -> PackPlan:
    g = GGUFFile(src_path)
    cfg = config_from_metadata(g.metadata, str(src_path))
    layers = expert_layers(cfg, g)
    if not layers:
        raise ModelFileError(src_path, "no routed expert tensors to convert")
    expert_names = {f"blk.{il}.ffn_{k}_exps.weight" for il in layers for k in EXPERT_KINDS}
    copied = [TensorSlot(t.name, t.ggml_type, t.ne, t.nbytes) for t in g.tensors.values() if t.name not in expert_names]
    slots = copied + [s for il in layers for s in _expert_slots(cfg, il)]
    raw = [g.raw_kv(k) for k in g.metadata if not k.startswith("split.") and k != "general.alignment"]
    ours = {"rapidmoe.pack.version": PACK_VERSION, "rapidmoe.pack.format_version": kernels.resplit_format_version(),
            "rapidmoe.pack.source_name": ident["name"],
            "rapidmoe.pack.source_path": str(Path(src_path).resolve()),
            "rapidmoe.pack.source_size": ident["size"], "rapidmoe.pack.source_mtime_ns": ident["mtime_ns"],
            "rapidmoe.pack.layers": layers}
    # the index digest covers names, types, shapes and offsets, which do not depend on it
    head0, offsets, size = build_header(raw + [encode_kv(k, v) for k, v in ours.items()]
                                        + [encode_kv("rapidmoe.pack.index_sha256", "0" * 64)], slots)
    ours["rapidmoe.pack.index_sha256"] = _index_digest(slots, offsets)
    header, offsets2, size2 = build_header(raw + [encode_kv(k, v) for k, v in ours.items()], slots)
    assert (offsets2, size2) == (offsets, size)
    n_w = len(layers) * 3 * cfg.n_expert * cfg.n_ff_exp * cfg.n_embd
    return PackPlan(g, cfg, layers, copied, slots, header, offsets, size, n_w)


def verify_pack(path: Path, ident: dict) -> GGUFFile:
    """Open a pack and check version, source identity and the tensor index digest."""
    g = GGUFFile(path)  # also proves every tensor lies inside the file
    m = g.metadata
    bad = None
    if m.get("rapidmoe.pack.version") != PACK_VERSION:
        bad = f"pack layout {m.get('rapidmoe.pack.version')} (this version reads {PACK_VERSION})"
    elif m.get("rapidmoe.pack.format_version") != kernels.resplit_format_version():
        bad = (f"expert format {m.get('rapidmoe.pack.format_version')} "
               f"(this version reads {kernels.resplit_format_version()})")
    elif (m.get("rapidmoe.pack.source_size"), m.get("rapidmoe.pack.source_mtime_ns")) != (ident["size"], ident["mtime_ns"]):
        bad = "made from another version of the source file"
    else:
        slots = [TensorSlot(t.name, t.ggml_type, t.ne, t.nbytes) for t in g.tensors.values()]
        offsets = [t.offset for t in g.tensors.values()]
        if _index_digest(slots, offsets) != m.get("rapidmoe.pack.index_sha256"):
            bad = "tensor index does not match its checksum"
    if bad:
        g.close()
        raise ModelFileError(path, f"not a usable pack: {bad}")
    return g


def _free_bytes(d: Path) -> int:
    return shutil.disk_usage(d).free


def convert(src_path: Path, progress=None, log=None) -> Path:
    """Source GGUF -> verified pack path (converting when there is none yet).
    progress(step, done, total) during conversion; log(str) for one-off notes."""
    src_path = Path(src_path)
    ident = source_identity(src_path)
    out = pack_path(src_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if out.exists():
            try:
                verify_pack(out, ident).close()
                return out
            except ModelFileError as e:
                if log:
                    log(f"rebuilding the pack: {e.problem}")
                out.unlink()
        _write(src_path, ident, out, progress, log)
    return out


def _write(src_path: Path, ident: dict, out: Path, progress, log) -> None:
    plan = plan_pack(src_path, ident)
    partial = out.with_name(out.name + ".partial")
    done_file = out.with_name(out.name + ".done-layers")
    header_sha = hashlib.sha256(plan.header).hexdigest()
    done: set[int] = set()
    if partial.exists() and done_file.exists():
        try:
            rec = json.loads(done_file.read_text())
            if rec.get("header_sha256") == header_sha and partial.stat().st_size == plan.size:
                done = set(rec["layers"])
        except (ValueError, KeyError, OSError):
            done = set()
    if not done:
        partial.unlink(missing_ok=True)
        need = plan.size
        free = _free_bytes(out.parent)
        if free < need + (64 << 20):
            raise UserError(
                f"not enough disk for the pack: it needs {need / 1e9:.2f} GB in {out.parent}, {free / 1e9:.2f} GB free "
                f"(the source is {ident['size'] / 1e9:.2f} GB; it can be removed once the pack is verified)")
    elif log:
        log(f"resuming the conversion ({len(done)} of {len(plan.layers)} layers done)")
    t0 = time.monotonic()
    try:
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not done:
                os.ftruncate(fd, 0)
                _reserve(fd, plan.size)
                # no magic until the end: a partial file is never a GGUF, let alone a pack
                os.pwrite(fd, b"\0\0\0\0" + plan.header[4:], 0)
                idx = {s.name: i for i, s in enumerate(plan.slots)}
                for s in plan.copied:
                    os.pwrite(fd, plan.src.raw(s.name), plan.offsets[idx[s.name]])
            _write_experts(fd, plan, done, done_file, header_sha, progress)
            os.fsync(fd)
            os.pwrite(fd, plan.header[:4], 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, out)
        done_file.unlink(missing_ok=True)
        fsync_dir(out.parent)
    except OSError as e:
        if e.errno == 28:  # ENOSPC
            raise UserError(f"disk full while writing the pack ({plan.size / 1e9:.2f} GB needed in {out.parent}); "
                            f"free space and run again: the conversion resumes") from None
        raise
    dt = time.monotonic() - t0
    if log and dt > 0:
        log(f"converted {plan.weights / 1e6:.1f} M expert weights in {dt:.1f} s "
            f"({plan.weights / dt / 1e6:.1f} M weights/s, source type {_expert_type(plan)})")


def _expert_type(plan: PackPlan) -> str:
    t = plan.src.tensors[f"blk.{plan.layers[0]}.ffn_gate_exps.weight"]
    return t.type_name


def _reserve(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)  # fails now, not mid-write, when the disk is short
    except OSError as e:
        if e.errno in (22, 95):  # filesystem without fallocate
            os.ftruncate(fd, size)
        else:
            raise


def _write_experts(fd: int, plan: PackPlan, done: set[int], done_file: Path, header_sha: str, progress) -> None:
    cfg, g = plan.cfg, plan.src
    idx = {s.name: i for i, s in enumerate(plan.slots)}
    per_layer = 3 * cfg.n_expert * cfg.n_ff_exp * cfg.n_embd
    n_done = len(done) * per_layer
    for il in plan.layers:
        if il in done:
            continue
        for kind in EXPERT_KINDS:
            t = g.tensors[f"blk.{il}.ffn_{kind}_exps.weight"]
            E, rows, n = t.shape
            raw = g.raw(t.name).reshape(E, -1)
            fmts = ("wq", "wr") if kind != "down" else ("wq", "d4")
            offs = [plan.offsets[idx[f"blk.{il}.ffn_{kind}_exps.{f}"]] for f in fmts]
            rbs = [kernels.resplit_row_bytes(f, n) * rows for f in fmts]
            for e in range(E):  # one expert at a time bounds memory on huge models
                w = kernels.ggml_dequantize(raw[e], t.ggml_type, rows * n).reshape(rows, n)
                if kind == "down":
                    parts = (kernels.resplit_quantize("wq", w), kernels.resplit_quantize("d4", w))
                else:
                    parts = kernels.resplit_quantize_wq_wr(w)
                for off, rb, q in zip(offs, rbs, parts):
                    os.pwrite(fd, np.ascontiguousarray(q).data, off + e * rb)
                n_done += rows * n
                if progress:
                    progress("convert", n_done, plan.weights)
        os.fsync(fd)
        done.add(il)
        done_file.write_text(json.dumps({"header_sha256": header_sha, "layers": sorted(done)}))
