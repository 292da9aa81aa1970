"""The models the llama.cpp parity references are made from (shared by
scripts/make_parity_refs.py and tests/test_parity.py)."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

PROMPT = ("The quick brown fox jumps over the lazy dog. In 2024, 3 experts routed 1,024 tokens; "
          "café naïve — 東京 🚀\n    def f(x):\n        return x * 2\n")

# name -> (synthetic preset, dtype) or "demo"
CASES: dict[str, object] = {
    "qwen3moe": ("qwen3moe", "f32"),
    "qwen2moe": ("qwen2moe", "f32"),
    "llama_moe": ("llama_moe", "f32"),
    "olmoe": ("olmoe", "f32"),
    "qwen3moe_f16": ("qwen3moe", "f16"),
    # deepseek2 (engine/synth/deepseek2.py): V2-Lite, V3 with and without expert
    # groups, V3 in the legacy attn_kv_b layout, V3 with an MTP block, Lite with
    # the per-position query temperature
    "ds2_lite": ("ds2_lite", "f32"),
    "ds2_v3": ("ds2_v3", "f32"),
    "ds2_v3_nogroup": ("ds2_v3_nogroup", "f32"),
    "ds2_v3_legacy": ("ds2_v3_legacy", "f32"),
    "ds2_v3_mtp": ("ds2_v3_mtp", "f32"),
    "ds2_lite_temp": ("ds2_lite_temp", "f32"),
    "demo": "demo",
}
SEED = 1234

# Quantized files, made by llama.cpp's own quantizer (llama_model_quantize) from
# the f32 synthetic file of the preset: name -> (preset, llama.cpp file type).
# The presets are widened to n_embd 256 so that rows hold whole K-quant blocks
# (narrower rows fall back to Q5_0/Q8_0 in llama.cpp), and ds2_lite keeps one
# dense and one MoE block to keep the committed files small. token_embd and output
# are kept F32 (the quantizer's token_embedding_type / output_tensor_type), and
# the committed tests/refs/quant_<name>.gguf holds every other tensor exactly
# as llama.cpp wrote it, with the file's metadata minus the tokenizer; the test
# file is that plus the tokenizer and the two F32 tensors of the f32 file.
# qwen2moe, llama_moe (Mixtral layout) and olmoe keep one block of four small
# experts for the same reason (a block holds every kind of tensor they have), and
# olmoe, whose attention cannot be grouped, only Q4_K_M and Q6_K (its Q8_0 file
# alone would be 390 kB; the other two hold Q8_0 tensors too).
_ONE_BLOCK = {"n_embd": 256, "n_layer": 1, "n_ff_exp": 32, "n_expert": 4}
QUANT_SHAPE = {"qwen3moe": {"n_embd": 256}, "ds2_lite": {"n_embd": 256, "n_layer": 2},
               "qwen2moe": {**_ONE_BLOCK, "n_head": 8, "head_dim": 32, "n_head_kv": 1, "n_ff_shexp": 32},
               "llama_moe": {**_ONE_BLOCK, "n_head": 8, "head_dim": 32, "n_head_kv": 1},
               "olmoe": {**_ONE_BLOCK, "head_dim": 64}}
FTYPES = {"Q8_0": 7, "Q4_K_M": 15, "Q6_K": 18}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*
QUANT_FTYPES = {"olmoe": ("Q4_K_M", "Q6_K")}  # the others: all of FTYPES
QUANT_CASES: dict[str, tuple[str, str]] = {
    f"{preset}_{ftype.lower()}": (preset, ftype)
    for preset in QUANT_SHAPE for ftype in QUANT_FTYPES.get(preset, FTYPES)
}
CASES.update({name: ("quant", *case) for name, case in QUANT_CASES.items()})
KEPT_F32 = ("token_embd.weight", "output.weight")
REFS = Path(__file__).resolve().parent / "refs"


def quant_base(preset: str, tmp: Path) -> Path:
    """The f32 file llama.cpp quantizes for `preset`."""
    from rapidmoe.engine.synth.model import write_synthetic

    path = tmp / f"{preset}_f32_wide.gguf"
    if not path.exists():
        write_synthetic(path, preset, seed=SEED, dtype="f32", **QUANT_SHAPE[preset])
    return path


def _kv_tuples(reader, keep):
    """A reader's key/values as (key, value, type, sub type), GGUF.* and the architecture left out."""
    from gguf import GGUFValueType

    out = []
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or not keep(f.name):
            continue
        vtype = f.types[0]
        out.append((f.name, f.contents(), vtype, f.types[-1] if vtype == GGUFValueType.ARRAY else None))
    return out


def write_gguf(path: Path, arch: str, kvs, tensors) -> Path:
    """kvs: (key, value, type, sub type) ...; tensors: (name, ne, ggml type, bytes-like) ..."""
    from gguf import GGUFWriter

    w = GGUFWriter(path, arch)
    for key, val, vtype, sub in kvs:
        w.add_key_value(key, val, vtype, sub_type=sub)
    for name, ne, qtype, data in tensors:
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), len(data), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    for _, _, _, data in tensors:
        w.write_padding(fout, fout.tell())
        fout.write(data)
    w.write_padding(fout, fout.tell())
    w.close()
    return path


def tensor_rows(reader):
    return [(t.name, [int(n) for n in t.shape], t.tensor_type, memoryview(np.ascontiguousarray(t.data)).cast("B"))
            for t in reader.tensors]


def strip_quantized(full: Path, out: Path) -> Path:
    """llama.cpp's quantized file -> the committed part (no tokenizer, no F32 token_embd/output)."""
    from gguf import GGUFReader

    r = GGUFReader(full)
    arch = r.fields["general.architecture"].contents()
    return write_gguf(out, arch, _kv_tuples(r, lambda k: not k.startswith("tokenizer.")),
                      [t for t in tensor_rows(r) if t[0] not in KEPT_F32])


@functools.lru_cache(maxsize=2)
def _f32_part(preset: str):
    """What the test file takes from the f32 synthetic file of `preset` (the same
    bytes write_synthetic writes): tokenizer key/values, tensor order, F32 tensors."""
    from rapidmoe.engine.synth import model as synth

    plan = synth.plan_synthetic(preset, dtype="f32", **QUANT_SHAPE[preset])
    tok = [kv for kv in plan.kvs if kv[0].startswith("tokenizer.")]
    kept = {spec.name: (list(spec.ne), q, b"".join(c.tobytes() for c in synth._chunks(spec, q, plan.shape, SEED)))
            for spec, q in plan.tensors if spec.name in KEPT_F32}
    return tok, [spec.name for spec, _ in plan.tensors], kept


def assemble_quantized(part: Path, preset: str, out: Path) -> Path:
    """The committed part + the f32 file's tokenizer and token_embd/output -> the test file."""
    from gguf import GGUFReader

    p = GGUFReader(part)
    tok, order, kept = _f32_part(preset)
    quant = {t[0]: t for t in tensor_rows(p)}
    tensors = [(name, *kept[name]) if name in kept else quant.pop(name) for name in order
               if name in kept or name in quant]
    assert not quant, f"{part}: tensors not in the f32 file: {sorted(quant)}"
    return write_gguf(out, p.fields["general.architecture"].contents(), _kv_tuples(p, lambda k: True) + tok, tensors)


def build_case(name: str, tmp: Path) -> Path:
    case = CASES[name]
    if isinstance(case, tuple) and case[0] == "quant":
        return assemble_quantized(REFS / f"quant_{name}.gguf", case[1], tmp / f"{name}.gguf")
    if case == "demo":
        from rapidmoe.engine.hub.demo import demo_model_path

        return demo_model_path()
    from rapidmoe.engine.synth.model import write_synthetic

    preset, dtype = case
    return write_synthetic(tmp / f"{name}.gguf", preset, seed=SEED, dtype=dtype)
