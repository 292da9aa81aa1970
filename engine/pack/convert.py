"""Converting a source GGUF into its RESplit pack (the layout: engine/pack/layout.py)
and opening it. A pack is keyed by the source file's content
(engine/pack/identity.py) and the format version, written to a .partial file
(resumable by layer, its record replaced atomically), fsynced, given its magic
last and renamed; at load its header, index and a random sample of its
checksummed units are verified, and a pack that fails is rebuilt: neither an
interrupted convert nor a damaged pack is ever used.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
from filelock import FileLock

from .. import kernels
from ..errors import ModelFileError, UserError
from ..gguf.reader import GGUFFile
from ..gguf.validate import padded
from ..gguf.writer import TensorSlot
from ..paths import fault_point, fsync_dir
from . import check as pack_check
from . import cost as pack_cost
from .identity import locate_pack, packs_dir, source_identity
from .layout import (
    EXPERT_KINDS,
    PACK_VERSION,
    PackPlan,
    content_key,
    convert_expert,
    index_digest,
    pack_path,
    plan_pack,
)

__all__ = ["PACK_VERSION", "convert", "open_pack", "pack_path", "source_identity", "verify_pack"]


def verify_pack(path: Path, ident: dict, sample: int | None = pack_check.SAMPLE_UNITS, progress=None) -> GGUFFile:
    """Open a pack and check its version, source, tensor index digest and the
    checksums of a random sample of its units (all of them when sample is None)."""
    g = GGUFFile(path)  # also proves every tensor lies inside the file
    m = g.metadata
    bad = None
    if m.get("rapidmoe.pack.version") != PACK_VERSION:
        bad = f"pack layout {m.get('rapidmoe.pack.version')} (this version reads {PACK_VERSION})"
    elif m.get("rapidmoe.pack.format_version") != kernels.resplit_format_version():
        bad = (f"expert format {m.get('rapidmoe.pack.format_version')} "
               f"(this version reads {kernels.resplit_format_version()})")
    elif m.get("rapidmoe.pack.source_digest") != ident["digest"]:
        bad = "made from another source file"
    elif pack_check.CRC_TENSOR not in g.tensors:
        bad = "no checksum table"
    else:
        ts = list(g.tensors.values())
        slots = [TensorSlot(t.name, t.ggml_type, t.ne, t.nbytes) for t in ts]
        if index_digest(slots, [t.offset for t in ts]) != m.get("rapidmoe.pack.index_sha256"):
            bad = "tensor index does not match its checksum"
        else:
            table = np.frombuffer(g.raw(pack_check.CRC_TENSOR).tobytes(), dtype="<u4")
            bad = pack_check.check(path, [(t.name, t.ne, t.offset, t.nbytes) for t in ts],
                                   min(t.offset for t in ts), table, sample, progress)
    if bad:
        g.close()
        raise ModelFileError(path, f"not a usable pack: {bad}")
    return g


def _free_bytes(d: Path) -> int:
    return shutil.disk_usage(d).free


def open_pack(src: GGUFFile, progress=None, log=None, full_check: bool = False) -> GGUFFile:
    """An open source GGUF -> its verified pack, open (converting it when there is
    none yet, or when the one there fails verification). progress(step, done,
    total) during conversion; log(str) for one-off notes."""
    ident = source_identity(src)
    key = content_key(ident)
    packs_dir().mkdir(parents=True, exist_ok=True)
    # one lock per content: two copies of a model loading at once make one pack
    with FileLock(str(packs_dir() / f"{key}.lock")):
        out = locate_pack(ident, key)
        if out.exists():
            try:
                g = (verify_pack(out, ident, None, progress) if full_check  # every unit: a visible step
                     else verify_pack(out, ident))
                _record_path(out).unlink(missing_ok=True)  # a crash after the rename can leave it
                return g
            except ModelFileError as e:
                if log:
                    log(f"rebuilding the pack: {e.problem}")
                fault_point()
                out.unlink()
        _write(src, ident, out, progress, log)
        return verify_pack(out, ident)


def convert(src_path: Path, progress=None, log=None, full_check: bool = False) -> Path:
    """Source GGUF path -> verified pack path (see open_pack)."""
    with GGUFFile(src_path) as src:
        pk = open_pack(src, progress, log, full_check)
    pk.close()
    return Path(pk.path)


def _record_path(out: Path) -> Path:
    return out.with_name(out.name + ".done-layers")


def _read_record(rec_file: Path, header_sha: str) -> tuple[set[int], dict[int, int]]:
    """The layers an interrupted convert finished and the checksums of what it wrote."""
    try:
        rec = json.loads(rec_file.read_text())
        if rec.get("header_sha256") == header_sha:
            return set(rec["layers"]), {int(a): int(c) for a, c in rec["crc"]}
    except (ValueError, KeyError, TypeError, OSError):
        pass
    return set(), {}


def _write_record(rec_file: Path, header_sha: str, done: set[int], crcs: dict[int, int]) -> None:
    tmp = rec_file.with_name(rec_file.name + ".tmp")
    fault_point()
    tmp.write_text(json.dumps({"header_sha256": header_sha, "layers": sorted(done), "crc": sorted(crcs.items())}))
    fault_point()
    os.replace(tmp, rec_file)


def _write(src: GGUFFile, ident: dict, out: Path, progress, log) -> None:
    plan = plan_pack(src, ident)
    partial = out.with_name(out.name + ".partial")
    rec_file = _record_path(out)
    header_sha = hashlib.sha256(plan.header).hexdigest()
    done, crcs = set(), {}
    if partial.exists() and partial.stat().st_size == plan.size:
        done, crcs = _read_record(rec_file, header_sha)
    if not done:
        fault_point()
        partial.unlink(missing_ok=True)
        need = plan.size
        free = _free_bytes(out.parent)
        if free < need + (64 << 20):
            raise UserError(
                f"not enough disk for the pack: it needs {need / 1e9:.2f} GB in {out.parent}, {free / 1e9:.2f} GB free "
                f"(the source is {ident['size'] / 1e9:.2f} GB; it can be removed once the pack is verified)")
        if log:
            log(pack_cost.first_use_note(plan.weights, plan.size, out.parent, src))
    elif log:
        log(f"resuming the conversion ({len(done)} of {len(plan.layers)} layers done)")
    t0 = time.monotonic()
    n_new = plan.weights - len(done) * plan.weights // len(plan.layers)
    try:
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not done:
                fault_point()
                os.ftruncate(fd, 0)
                _reserve(fd, plan.size)
                # no magic until the end: a partial file is never a GGUF, let alone a pack
                fault_point()
                os.pwrite(fd, b"\0\0\0\0" + plan.header[4:], 0)
                crcs = {4: pack_check.crc(plan.header[4:])}
                for s in plan.copied:
                    raw, off = src.raw(s.name), plan.offset(s.name)
                    for a in range(0, s.nbytes, pack_check.CHUNK):
                        chunk = raw[a:a + pack_check.CHUNK]
                        fault_point()
                        os.pwrite(fd, chunk.data, off + a)
                        crcs[off + a] = pack_check.crc(chunk.data)
                    src.release(s.name)
            _write_experts(fd, plan, done, crcs, rec_file, header_sha, progress)
            table = np.array([crcs[a] for a, _ in plan.units], dtype="<u4")
            fault_point()
            os.pwrite(fd, table.tobytes(), plan.offset(pack_check.CRC_TENSOR))
            fault_point()
            os.fsync(fd)
            fault_point()
            os.pwrite(fd, plan.header[:4], 0)
            fault_point()
            os.fsync(fd)
        finally:
            os.close(fd)
        fault_point()
        os.replace(partial, out)
        fault_point()
        rec_file.unlink(missing_ok=True)
        fault_point()
        fsync_dir(out.parent)
    except OSError as e:
        if e.errno == 28:  # ENOSPC
            raise UserError(f"disk full while writing the pack ({plan.size / 1e9:.2f} GB needed in {out.parent}); "
                            f"free space and run again: the conversion resumes") from None
        raise
    dt = time.monotonic() - t0
    pack_cost.record_rate(n_new, dt)
    if log and dt > 0:
        log(f"converted {n_new / 1e6:.1f} M expert weights in {dt:.1f} s "
            f"({n_new / dt / 1e6:.1f} M weights/s on {_threads(kernels.num_threads())}, source type {_expert_type(plan)})")


def _threads(n: int) -> str:
    return "1 thread" if n == 1 else f"{n} threads"


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


def _write_experts(fd: int, plan: PackPlan, done: set[int], crcs: dict[int, int], rec_file: Path,
                   header_sha: str, progress) -> None:
    cfg, g = plan.cfg, plan.src
    per_layer = 3 * cfg.n_expert * cfg.n_ff_exp * cfg.n_embd
    n_done = len(done) * per_layer
    for il in plan.layers:
        if il in done:
            continue
        for kind in EXPERT_KINDS:
            t = g.tensors[f"blk.{il}.ffn_{kind}_exps.weight"]
            n, rows, E = padded(t.ne)[:3]  # {n, rows, E} and {n, rows, E, 1} alike, as llama.cpp reads them
            raw = g.raw(t.name).reshape(E, -1)
            fmts = ("wq", "wr") if kind != "down" else ("wq", "d4")
            offs = [plan.offset(f"blk.{il}.ffn_{kind}_exps.{f}") for f in fmts]
            rbs = [kernels.resplit_row_bytes(f, n) * rows for f in fmts]
            for e in range(E):  # one expert at a time bounds memory on huge models
                for off, rb, q in zip(offs, rbs, convert_expert(raw[e], t.ggml_type, kind, rows, n)):
                    data = np.ascontiguousarray(q).data
                    fault_point()
                    os.pwrite(fd, data, off + e * rb)
                    crcs[off + e * rb] = pack_check.crc(data)
                n_done += rows * n
                if progress:
                    progress("convert", n_done, plan.weights)
            g.release(t.name)
        fault_point()
        os.fsync(fd)
        done.add(il)
        _write_record(rec_file, header_sha, done, crcs)
