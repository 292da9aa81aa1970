"""Real models' layouts as GGUF files whose header is real and whose data is a
hole (sparse file): a 671B-parameter layout costs no disk, and anything reading
weights would see zeros. The planner needs only the header."""
from __future__ import annotations

from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from rapidmoe.engine.synth import deepseek2 as synth_deepseek2
from rapidmoe.engine.gguf.writer import TensorSlot, build_header, encode_kv

# DeepSeek-V3/R1-671B: 61 layers (3 dense), 256 experts of 2048, top-8, MLA, 129K vocab
V3 = dict(n_embd=7168, n_layer=61, n_head=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope=128, qk_rope=64,
          v_head=128, n_ff=18432, n_ff_exp=2048, n_expert=256, n_expert_used=8, n_expert_shared=1,
          n_layer_dense_lead=3, n_group=8, n_group_used=4, n_vocab=129280, n_ctx=163840)


def write_shape_only(path: Path, arch: str, kvs, tensors) -> Path:
    slots = []
    for spec, q in tensors:
        block, size = GGML_QUANT_SIZES[q]
        slots.append(TensorSlot(spec.name, int(q), spec.ne, spec.n_elements // block * size))
    raw = [encode_kv("general.architecture", arch)] + [encode_kv(k, v) for k, v, _ in kvs]
    head, _, size = build_header(raw, slots)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def with_types(tensors, expert=Q.Q4_K, dense=Q.Q8_0):
    """A tensor plan's specs with GGUF types as Q4_K_M-like files have them."""
    return [(t, Q.F32 if t.role in ("norm", "bias", "router", "gate_vec") else expert if t.role == "expert" else dense)
            for t in tensors]


def write_v3_shape(path: Path) -> Path:
    s = synth_deepseek2.resolve_shape("ds2_v3", **V3)
    return write_shape_only(path, "deepseek2", synth_deepseek2.hparam_kvs(s), with_types(synth_deepseek2.tensor_plan(s)))
