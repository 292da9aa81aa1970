"""The RESplit pack's layout: a GGUF in the user cache dir holding the source model's
metadata and non-expert tensors (in their source types) plus, for every routed
expert stack, its residual-split parts:

    blk.N.ffn_gate_exps.wq / .wr   [E, ff, row bytes]   gate:  W ≈ deq(WQ) + deq(WR)
    blk.N.ffn_up_exps.wq   / .wr   [E, ff, row bytes]   up:    likewise
    blk.N.ffn_down_exps.wq         [E, H,  row bytes]   down at WQ (non-critical experts)
    blk.N.ffn_down_exps.d4         [E, H,  row bytes]   down's CPU copy (critical experts)
    rapidmoe.pack.crc32            [4 × units]          checksums (engine/pack/check.py)

stored as I8 byte tensors (formats in engine/quant/resplit_oracle.py), after the
source's metadata and tensors, in the order `plan_pack` lays out.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import kernels
from ..errors import ModelFileError
from ..gguf.reader import GGUFFile
from ..gguf.validate import check_model
from ..gguf.writer import TensorSlot, build_header, encode_kv
from ..hparams import ModelConfig
from . import check as pack_check
from .identity import locate_pack, pack_key, source_identity

PACK_VERSION = 2  # the pack's layout (2: content-keyed, checksummed); the expert formats carry their own version
I8 = 24  # GGML type id used for raw byte tensors
EXPERT_KINDS = ("gate", "up", "down")
PARTS = (("gate", "wq"), ("gate", "wr"), ("up", "wq"), ("up", "wr"), ("down", "wq"), ("down", "d4"))


def content_key(ident: dict) -> str:
    return pack_key(ident, PACK_VERSION, kernels.resplit_format_version())


def pack_path(src: Path | GGUFFile) -> Path:
    """The pack (made or to be made) of a source GGUF, given its path or open file."""
    if isinstance(src, GGUFFile):
        ident = source_identity(src)
    else:
        with GGUFFile(src) as g:
            ident = source_identity(g)
    return locate_pack(ident, content_key(ident))


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


def index_digest(slots: list[TensorSlot], offsets: list[int]) -> str:
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
    ours["rapidmoe.pack.index_sha256"] = index_digest(slots, offsets)
    header, offsets2, size2 = build_header(raw + [encode_kv(k, v) for k, v in ours.items()], slots)
    assert (offsets2, size2) == (offsets, size)
    us = pack_check.units([(s.name, s.ne, o, s.nbytes) for s, o in zip(slots, offsets)], len(header))
    assert len(us) == n_units
    n_w = len(layers) * 3 * cfg.n_expert * cfg.n_ff_exp * cfg.n_embd
    return PackPlan(g, cfg, layers, copied, slots, header, offsets, size, n_w, us)


def convert_expert(raw_e: np.ndarray, ggml_type: int, kind: str, rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One expert's source bytes -> its two pack parts ((wq, wr), or (wq, d4) for down)."""
    w = kernels.ggml_dequantize(raw_e, ggml_type, rows * n).reshape(rows, n)
    if kind == "down":
        return kernels.resplit_quantize("wq", w), kernels.resplit_quantize("d4", w)
    return kernels.resplit_quantize_wq_wr(w)
