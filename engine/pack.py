"""The RESplit pack: a GGUF in the user cache dir holding the source model's
metadata and non-expert tensors (in their source types) plus, for every routed
expert stack, its residual-split parts:

    blk.N.ffn_gate_exps.wq / .wr   [E, ff, row bytes]   gate:  W ≈ deq(WQ) + deq(WR)
    blk.N.ffn_up_exps.wq   / .wr   [E, ff, row bytes]   up:    likewise
    blk.N.ffn_down_exps.wq         [E, H,  row bytes]   down at WQ (non-critical experts)
    blk.N.ffn_down_exps.d4         [E, H,  row bytes]   down's CPU copy (critical experts)
    rapidmoe.pack.crc32            [4 × units]          checksums (engine/pack_check.py)

stored as I8 byte tensors (formats in engine/quant/resplit_oracle.py). A pack is
keyed by the source file's content (engine/pack_identity.py) and the format
version, written to a .partial file (resumable by layer, its record replaced
atomically), fsynced, given its magic last and renamed; at load its header,
index and a random sample of its checksummed units are verified, and a pack
that fails is rebuilt: neither an interrupted convert nor a damaged pack is
ever used.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock

from . import kernels, pack_check
from .config import ModelConfig
from .errors import ModelFileError, UserError
from .gguf.reader import GGUFFile
from .gguf.validate import check_model, padded
from .gguf.writer import TensorSlot, build_header, encode_kv
from .pack_identity import locate_pack, pack_key, packs_dir, source_identity
from .paths import fsync_dir

__all__ = ["PACK_VERSION", "convert", "open_pack", "pack_path", "source_identity", "verify_pack"]

PACK_VERSION = 2  # the pack's layout (2: content-keyed, checksummed); the expert formats carry their own version
I8 = 24  # GGML type id used for raw byte tensors
EXPERT_KINDS = ("gate", "up", "down")
PARTS = (("gate", "wq"), ("gate", "wr"), ("up", "wq"), ("up", "wr"), ("down", "wq"), ("down", "d4"))
_KILL_AT = int(os.environ.get("RAPIDMOE_FAULT_KILL_AT") or 0)
_steps = 0


def _step() -> None:
    """Called before every write, fsync, rename and unlink of a conversion. The
    crash tests set RAPIDMOE_FAULT_KILL_AT=N to SIGKILL the process before the
    N-th: a kill -9 at an exact point, repeatable."""
    global _steps
    _steps += 1
    if _steps == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


def _key(ident: dict) -> str:
    return pack_key(ident, PACK_VERSION, kernels.resplit_format_version())


def pack_path(src: Path | GGUFFile) -> Path:
    """The pack (made or to be made) of a source GGUF, given its path or open file."""
    if isinstance(src, GGUFFile):
        ident = source_identity(src)
    else:
        with GGUFFile(src) as g:
            ident = source_identity(g)
    return locate_pack(ident, _key(ident))


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
    slots: list[TensorSlot]  # copied + expert parts + checksum table, file order
    header: bytes
    offsets: list[int]
    size: int
    weights: int  # routed expert weights to quantize
    units: list[tuple[int, int]]  # checksum units (pack_check.units)

    def offset(self, name: str) -> int:
        if not hasattr(self, "_index"):
            self._index = {s.name: o for s, o in zip(self.slots, self.offsets)}
        return self._index[name]


def plan_pack(g: GGUFFile, ident: dict) -> PackPlan:
    cfg = check_model(g, tokenizer=False)  # presence, type and shape of every tensor before any is converted
    layers = expert_layers(cfg, g)
    if not layers:
        raise ModelFileError(g.path, "no routed expert tensors to convert")
    expert_names = {f"blk.{il}.ffn_{k}_exps.weight" for il in layers for k in EXPERT_KINDS}
    copied = [TensorSlot(t.name, t.ggml_type, t.ne, t.nbytes) for t in g.tensors.values() if t.name not in expert_names]
    slots = copied + [s for il in layers for s in _expert_slots(cfg, il)]
    n_units = 1 + sum(s.ne[2] if s.name.endswith(pack_check.EXPERT_PART_SUFFIXES) else math.ceil(s.nbytes / pack_check.CHUNK)
                      for s in slots)
    slots.append(TensorSlot(pack_check.CRC_TENSOR, I8, (4 * n_units,), 4 * n_units))
    raw = [g.raw_kv(k) for k in g.metadata if not k.startswith("split.") and k != "general.alignment"]
    ours = {"rapidmoe.pack.version": PACK_VERSION, "rapidmoe.pack.format_version": kernels.resplit_format_version(),
            "rapidmoe.pack.source_name": ident["name"],
            "rapidmoe.pack.source_path": str(Path(g.path).resolve()),
            "rapidmoe.pack.source_size": ident["size"], "rapidmoe.pack.source_digest": ident["digest"],
            "rapidmoe.pack.layers": layers}
    # the index digest covers names, types, shapes and offsets, which do not depend on it
    head0, offsets, size = build_header(raw + [encode_kv(k, v) for k, v in ours.items()]
                                        + [encode_kv("rapidmoe.pack.index_sha256", "0" * 64)], slots)
    ours["rapidmoe.pack.index_sha256"] = _index_digest(slots, offsets)
    header, offsets2, size2 = build_header(raw + [encode_kv(k, v) for k, v in ours.items()], slots)
    assert (offsets2, size2) == (offsets, size)
    us = pack_check.units([(s.name, s.ne, o, s.nbytes) for s, o in zip(slots, offsets)], len(header))
    assert len(us) == n_units
    n_w = len(layers) * 3 * cfg.n_expert * cfg.n_ff_exp * cfg.n_embd
    return PackPlan(g, cfg, layers, copied, slots, header, offsets, size, n_w, us)


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
        if _index_digest(slots, [t.offset for t in ts]) != m.get("rapidmoe.pack.index_sha256"):
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
    key = _key(ident)
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
                _step()
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
    _step()
    tmp.write_text(json.dumps({"header_sha256": header_sha, "layers": sorted(done), "crc": sorted(crcs.items())}))
    _step()
    os.replace(tmp, rec_file)


def _write(src: GGUFFile, ident: dict, out: Path, progress, log) -> None:
    from . import pack_cost

    plan = plan_pack(src, ident)
    partial = out.with_name(out.name + ".partial")
    rec_file = _record_path(out)
    header_sha = hashlib.sha256(plan.header).hexdigest()
    done, crcs = set(), {}
    if partial.exists() and partial.stat().st_size == plan.size:
        done, crcs = _read_record(rec_file, header_sha)
    if not done:
        _step()
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
                _step()
                os.ftruncate(fd, 0)
                _reserve(fd, plan.size)
                # no magic until the end: a partial file is never a GGUF, let alone a pack
                _step()
                os.pwrite(fd, b"\0\0\0\0" + plan.header[4:], 0)
                crcs = {4: pack_check.crc(plan.header[4:])}
                for s in plan.copied:
                    raw, off = src.raw(s.name), plan.offset(s.name)
                    for a in range(0, s.nbytes, pack_check.CHUNK):
                        chunk = raw[a:a + pack_check.CHUNK]
                        _step()
                        os.pwrite(fd, chunk.data, off + a)
                        crcs[off + a] = pack_check.crc(chunk.data)
            _write_experts(fd, plan, done, crcs, rec_file, header_sha, progress)
            table = np.array([crcs[a] for a, _ in plan.units], dtype="<u4")
            _step()
            os.pwrite(fd, table.tobytes(), plan.offset(pack_check.CRC_TENSOR))
            _step()
            os.fsync(fd)
            _step()
            os.pwrite(fd, plan.header[:4], 0)
            _step()
            os.fsync(fd)
        finally:
            os.close(fd)
        _step()
        os.replace(partial, out)
        _step()
        rec_file.unlink(missing_ok=True)
        _step()
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


def convert_expert(raw_e: np.ndarray, ggml_type: int, kind: str, rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One expert's source bytes -> its two pack parts ((wq, wr), or (wq, d4) for down)."""
    w = kernels.ggml_dequantize(raw_e, ggml_type, rows * n).reshape(rows, n)
    if kind == "down":
        return kernels.resplit_quantize("wq", w), kernels.resplit_quantize("d4", w)
    return kernels.resplit_quantize_wq_wr(w)


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
                    _step()
                    os.pwrite(fd, data, off + e * rb)
                    crcs[off + e * rb] = pack_check.crc(data)
                n_done += rows * n
                if progress:
                    progress("convert", n_done, plan.weights)
        _step()
        os.fsync(fd)
        done.add(il)
        _write_record(rec_file, header_sha, done, crcs)
