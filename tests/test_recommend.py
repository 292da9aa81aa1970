"""Recommended Hub models in the picker: planned from their header keys alone,
fits / does not fit decided by `plan` on the machine's record."""
from __future__ import annotations

from rapidmoe.engine.hparams import config_from_metadata
from rapidmoe.engine.plan.hardware import GPUInfo, HardwareRecord
from rapidmoe.engine.plan.recommend import recommendations
from rapidmoe.engine.plan.sizes import expert_part_bytes

GB = 10**9


def machine(gpus_gb=(), dram_gb=64) -> HardwareRecord:
    gpus = tuple(GPUInfo(i, f"GPU {i}", int(g * GB), int(g * GB), (9, 0)) for i, g in enumerate(gpus_gb))
    return HardwareRecord(gpus=gpus, dram_total_bytes=int(dram_gb * GB), dram_available_bytes=int(dram_gb * GB),
                          physical_cores=16, usable_cores=16)


def test_fit_follows_the_machine():
    small = {r.title: r for r in recommendations(machine([], 16))}
    big = {r.title: r for r in recommendations(machine([80, 80], 512))}
    assert small["OLMoE 1B-7B Instruct"].plan.fits and small["OLMoE 1B-7B Instruct"].plan.mode == "cpu"
    assert not small["Qwen3 235B-A22B"].plan.fits and small["Qwen3 235B-A22B"].plan.over_budget()
    assert big["Qwen3 235B-A22B"].plan.fits and big["Qwen3 235B-A22B"].plan.mode.startswith("gpu")
    # a bigger model never needs less memory than a smaller one of the same family
    assert small["Qwen3 235B-A22B"].sizes.source_bytes > small["Qwen3 30B-A3B"].sizes.source_bytes


def test_expert_bytes_are_the_packs():
    # the pack's expert parts come from the same formula the converter lays out
    meta = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 48, "qwen3moe.embedding_length": 2048,
            "qwen3moe.attention.head_count": 32, "qwen3moe.attention.head_count_kv": 4,
            "qwen3moe.attention.key_length": 128, "qwen3moe.attention.value_length": 128,
            "qwen3moe.expert_feed_forward_length": 768, "qwen3moe.expert_count": 128,
            "qwen3moe.expert_used_count": 8, "qwen3moe.context_length": 40960, "qwen3moe.vocab_size": 151936}
    q3 = next(r for r in recommendations(machine([], 64)) if r.title == "Qwen3 30B-A3B")
    assert (q3.sizes.wq_bytes, q3.sizes.wr_bytes, q3.sizes.d4_bytes) == expert_part_bytes(config_from_metadata(meta))


def test_picker_lists_them_with_fit():
    from rapidmoe.app.catalog import recommended_models

    rows = dict(recommended_models(machine([], 16)))
    assert "fits (CPU-centric)" in rows["unsloth/OLMoE-1B-7B-0924-Instruct-GGUF:Q4_K_M"]
    assert "does not fit: DRAM: needs" in rows["unsloth/Qwen3-235B-A22B-GGUF:Q4_K_M"]
