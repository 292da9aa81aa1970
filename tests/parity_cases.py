"""The models the llama.cpp parity references are made from (shared by
scripts/make_parity_refs.py and tests/test_parity.py)."""
from __future__ import annotations

from pathlib import Path

PROMPT = ("The quick brown fox jumps over the lazy dog. In 2024, 3 experts routed 1,024 tokens; "
          "café naïve — 東京 🚀\n    def f(x):\n        return x * 2\n")

# name -> (synthetic preset, dtype) or "demo"
CASES: dict[str, object] = {
    "qwen3moe": ("qwen3moe", "f32"),
    "qwen2moe": ("qwen2moe", "f32"),
    "llama_moe": ("llama_moe", "f32"),
    "olmoe": ("olmoe", "f32"),
    "qwen3moe_f16": ("qwen3moe", "f16"),
    # deepseek2 (engine/synth_deepseek2.py): V2-Lite, V3 with and without expert
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


def build_case(name: str, tmp: Path) -> Path:
    case = CASES[name]
    if case == "demo":
        from rapidmoe.engine.demo import demo_model_path

        return demo_model_path()
    from rapidmoe.engine.synth import write_synthetic

    preset, dtype = case
    return write_synthetic(tmp / f"{name}.gguf", preset, seed=SEED, dtype=dtype)
