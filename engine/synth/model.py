"""Tiny synthetic GGUF MoE models in llama.cpp's exact layout, bit-for-bit
reproducible from a seed, carrying a real tokenizer so they tokenize and chat
like real models.

    write_synthetic(path, "qwen3moe", seed=0)                  # a tiny fixture
    write_synthetic(path, "olmoe", seed=1, expert_dtype="q8_0")
    write_synthetic(path, "bench", seed=0)                     # Qwen3-30B-A3B layer shapes

Every tensor draws from its own stream keyed by (seed, tensor name), so values
do not depend on the order of tensors or on numpy's version (see rng.py).
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf import quants

from . import arch as synth_arch
from . import deepseek2 as synth_deepseek2
from .rng import Stream
from .arch import BENCH, FIXTURES, PRESETS, SynthShape, TensorSpec
from .tokenizer import tokenizer_kvs, vocab_size

__all__ = ["write_synthetic", "plan_synthetic", "FIXTURES", "BENCH", "PRESETS", "DTYPES",
           "SynthShape", "TensorSpec", "SynthPlan"]

DTYPES: dict[str, GGMLQuantizationType] = {
    "f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16, "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1,
    "q5_0": GGMLQuantizationType.Q5_0, "q5_1": GGMLQuantizationType.Q5_1,
}
_ALWAYS_F32 = ("norm", "bias", "router", "gate_vec")  # as llama.cpp's converters keep them
_CHUNK = 1 << 24  # elements generated at a time, so the bench preset fits in memory


class SynthPlan:
    """Everything a synthetic file will hold, without writing it."""

    def __init__(self, shape: SynthShape, tensors: list[tuple[TensorSpec, GGMLQuantizationType]],
                 kvs: list[tuple[str, object, GGUFValueType, GGUFValueType | None]]):
        self.shape, self.tensors, self.kvs = shape, tensors, kvs

    @property
    def arch(self) -> str:
        return self.shape.arch

    def metadata(self) -> dict[str, object]:
        return {k: v for k, v, _, _ in self.kvs}

    def nbytes(self) -> int:
        return sum(_nbytes(spec, q) for spec, q in self.tensors)


def _qtype(name: str) -> GGMLQuantizationType:
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def _nbytes(spec: TensorSpec, q: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[q]
    return spec.n_elements // block * size


def plan_synthetic(arch: str, *, dtype: str | None = None, expert_dtype: str | None = None,
                   tokenizer: "str | tuple" = "smollm2", name: str | None = None,
                   **shape_overrides) -> SynthPlan:
    """The tensors (with ggml types) and metadata write_synthetic would write."""
    if dtype is not None:
        shape_overrides["dtype"] = dtype
    tok = tokenizer_kvs(tokenizer) if isinstance(tokenizer, str) else tuple(tokenizer)  # or the KVs themselves
    layout = synth_deepseek2 if arch in synth_deepseek2.PRESETS else synth_arch
    shape = layout.resolve_shape(arch, n_vocab=vocab_size(tok), **shape_overrides)
    dense_q = _qtype(shape.dtype)
    expert_q = _qtype(expert_dtype or shape.dtype)
    tensors = []
    for spec in layout.tensor_plan(shape):
        q = GGMLQuantizationType.F32 if spec.role in _ALWAYS_F32 else \
            expert_q if spec.role == "expert" else dense_q
        block = GGML_QUANT_SIZES[q][0]
        if spec.ne[0] % block:
            raise ValueError(f"{spec.name}: rows of {spec.ne[0]} do not fit {q.name} blocks of {block}")
        tensors.append((spec, q))
    vt = {"u32": GGUFValueType.UINT32, "f32": GGUFValueType.FLOAT32, "bool": GGUFValueType.BOOL,
          "str": GGUFValueType.STRING}
    kvs: list = [("general.name", name or f"rapidmoe synthetic {arch}", GGUFValueType.STRING, None)]
    kvs += [(k, v, vt[t], None) for k, v, t in layout.hparam_kvs(shape)]
    kvs += list(tok)
    return SynthPlan(shape, tensors, kvs)


def _values(spec: TensorSpec, s: SynthShape, seed: int, start: int, n: int) -> np.ndarray:
    """Elements start..start+n of a tensor, flat, as float32."""
    stream = Stream(seed, spec.name)
    if spec.role == "norm":  # near 1, as trained norms are
        return (1.0 + 0.1 * stream.normal(n, start)).astype(np.float32)
    if spec.role == "bias":
        return (0.1 * stream.normal(n, start)).astype(np.float32)
    z = stream.student_t(n, s.weight_df, start) if s.weight_df else stream.normal(n, start)
    return (z * _std(spec, s)).astype(np.float32)


def _std(spec: TensorSpec, s: SynthShape) -> float:
    if spec.role == "embed":  # tied: it is the lm head too, scaled like one
        return s.output_scale / np.sqrt(s.n_embd) if s.tie_embeddings else 1.0
    if spec.role == "output":
        return s.output_scale / np.sqrt(s.n_embd)
    if spec.role == "router":  # spread enough that each token picks its own top-k
        return s.router_scale / np.sqrt(s.n_embd)
    return 1.0 / np.sqrt(spec.ne[0])  # activations stay O(1) through the layers


# Random valid blocks: (bytes per block, std of the block's integer values)
_RANDOM_BLOCKS = {GGMLQuantizationType.Q8_0: (34, 73.6), GGMLQuantizationType.Q4_0: (18, 4.61)}


def _random_blocks(spec: TensorSpec, q: GGMLQuantizationType, s: SynthShape, seed: int) -> Iterator[np.ndarray]:
    """Blocks of uniformly random quants with the scale that gives the tensor its
    std: valid files of any size in seconds, for speed tests (no accuracy meaning)."""
    size, q_std = _RANDOM_BLOCKS[q]
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    d = np.array([_std(spec, s) / q_std], np.float16).view(np.uint8)
    n_blocks = spec.n_elements // 32
    per = max(1, _CHUNK // 32)
    for b0 in range(0, n_blocks, per):
        blocks = rng.integers(0, 256, (min(per, n_blocks - b0), size), dtype=np.uint8)
        blocks[:, 0:2] = d
        if q == GGMLQuantizationType.Q8_0:
            blocks[:, 2:][blocks[:, 2:] == 128] = 129  # int8 -128 out: values in [-127, 127]
        yield blocks


def _encode(x: np.ndarray, q: GGMLQuantizationType) -> np.ndarray:
    if q == GGMLQuantizationType.F32:
        return x
    if q == GGMLQuantizationType.F16:
        return x.astype(np.float16)
    return quants.quantize(x, q)


def _chunks(spec: TensorSpec, q: GGMLQuantizationType, s: SynthShape, seed: int,
            random_blocks: bool = False) -> Iterator[np.ndarray]:
    if random_blocks and q in _RANDOM_BLOCKS and not isinstance(spec, synth_deepseek2.DerivedSpec):
        yield from _random_blocks(spec, q, s, seed)
        return
    row = spec.ne[0]
    if isinstance(spec, synth_deepseek2.DerivedSpec):  # made from other tensors' values (small)
        parts = [_values(src, s, seed, 0, src.n_elements) for src in spec.sources]
        yield _encode(spec.combine(*parts).reshape(-1, row), q)
        return
    rows_per = max(1, _CHUNK // row)
    n_rows = spec.n_elements // row
    for r0 in range(0, n_rows, rows_per):
        r1 = min(n_rows, r0 + rows_per)
        x = _values(spec, s, seed, r0 * row, (r1 - r0) * row).reshape(r1 - r0, row)
        yield _encode(x, q)


def write_synthetic(path: str | os.PathLike, arch: str, *, seed: int, dtype: str | None = None,
                    expert_dtype: str | None = None, tokenizer: str = "smollm2",
                    name: str | None = None, random_blocks: bool = False, **shape_overrides) -> Path:
    """Write a synthetic MoE GGUF and return its path. The same arguments give the
    same bytes. ``arch`` is a preset: qwen3moe, qwen2moe, llama_moe (alias llama),
    olmoe, bench, or a deepseek2 one (synth_deepseek2.PRESETS). ``dtype`` (f32,
    f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1) is used by the matrices,
    ``expert_dtype`` (default: dtype) by the stacked experts; norms, biases and
    routers stay F32. ``shape_overrides`` are SynthShape fields. ``random_blocks``:
    Q8_0/Q4_0 tensors as random valid blocks of the right scale (fast, for speed
    tests of big shapes; not the same values as without it).
    """
    plan = plan_synthetic(arch, dtype=dtype, expert_dtype=expert_dtype, tokenizer=tokenizer,
                          name=name, **shape_overrides)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = GGUFWriter(tmp, plan.arch)
    try:
        for key, val, vtype, sub in plan.kvs:
            writer.add_key_value(key, val, vtype, sub_type=sub)
        for spec, q in plan.tensors:
            # numpy order is ggml's reversed; F32 element shapes are passed with raw_dtype
            writer.add_tensor_info(spec.name, tuple(reversed(spec.ne)), np.dtype(np.float32),
                                   _nbytes(spec, q), raw_dtype=q)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        for spec, q in plan.tensors:
            writer.write_padding(fout, fout.tell())
            for chunk in _chunks(spec, q, plan.shape, seed, random_blocks):
                chunk.tofile(fout)
            writer.write_padding(fout, fout.tell())
        writer.close()
        os.replace(tmp, path)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return path
