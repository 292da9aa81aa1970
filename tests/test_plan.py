"""The planner on hand-written hardware records (machines we do not have) and
real GGUF headers: model sizes agree with a real converted pack; placements
fit their budgets; refusals name a plan that fits; --json's schema; plan never
converts (the cache stays as it was)."""
from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from shapes import with_types, write_shape_only, write_v3_shape

from rapidmoe.app.cli import main
from rapidmoe.engine.synth import arch as synth_arch
from rapidmoe.engine.errors import UserError
from rapidmoe.engine.gguf.reader import GGUFFile
from rapidmoe.engine.plan.hardware import GiB, GPUInfo, HardwareRecord
from rapidmoe.engine.kv_types import KV_TYPES
from rapidmoe.engine.plan.planner import CUDA_CONTEXT_BYTES, dram_reserve_bytes, plan
from rapidmoe.engine.plan.sizes import load_expert_frequencies, sizes_from_gguf

GB = 10**9


def machine(gpus_gb=(), dram_gb=64, free_frac=1.0) -> HardwareRecord:
    gpus = tuple(GPUInfo(i, f"GPU {i}", int(g * GB), int(g * GB * free_frac), (9, 0)) for i, g in enumerate(gpus_gb))
    return HardwareRecord(gpus=gpus, dram_total_bytes=int(dram_gb * GB), dram_available_bytes=int(dram_gb * GB),
                          physical_cores=16, usable_cores=16)


MACHINES = {
    "24GB+128GB": machine([24], 128),
    "2x80GB+512GB": machine([80, 80], 512),
    "noGPU+64GB": machine([], 64),
    "tiny-4GB+8GB": machine([4], 8),
}


@pytest.fixture(scope="module")
def v3_file(tmp_path_factory) -> Path:
    """DeepSeek-V3/R1-671B's layout (tests/shapes.py)."""
    return write_v3_shape(tmp_path_factory.mktemp("v3") / "DeepSeek-V3-shape.gguf")


@pytest.fixture(scope="module")
def a3b_file(tmp_path_factory) -> Path:
    """Qwen3-30B-A3B's layout: 48 layers, 128 experts of 768, top-8, 151K vocab."""
    s = synth_arch.resolve_shape("qwen3moe", n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128,
                                 n_ff_exp=768, n_expert=128, n_expert_used=8, n_vocab=151936, n_ctx=40960)
    kvs = synth_arch.hparam_kvs(s) + [("qwen3moe.vocab_size", 151936, "u32")]
    return write_shape_only(tmp_path_factory.mktemp("a3b") / "Qwen3-30B-A3B-shape.gguf", "qwen3moe", kvs,
                            with_types(synth_arch.tensor_plan(s)))


def sizes_of(path):
    with GGUFFile(path) as g:
        return sizes_from_gguf(g)


def check_consistent(p, hw: HardwareRecord):
    """Totals are the sum of components; every GPU carries its context; a plan
    that says it fits is within every budget."""
    j = p.to_json()
    assert j["totals"]["dram_bytes"] == sum(c["bytes"] for c in j["components"] if c["device"] == "cpu")
    assert j["totals"]["vram_bytes"] == sum(c["bytes"] for c in j["components"] if c["device"] != "cpu")
    for dev in p.vram_budget:
        assert any(c.name == "CUDA context" and c.device == dev and c.bytes == CUDA_CONTEXT_BYTES for c in p.components)
    if p.fits:
        assert p.dram_bytes <= p.dram_budget <= hw.dram_total_bytes - dram_reserve_bytes(hw.dram_total_bytes)
        for dev, cap in p.vram_budget.items():
            g = next(g for g in hw.gpus if f"cuda:{g.index}" == dev)
            assert p.bytes_on(dev) <= cap <= g.total_bytes
        assert p.suggestion is None
    else:
        assert p.suggestion


def test_sizes_match_a_real_pack(tmp_path):
    """The planner's per-expert bytes are the pack converter's: convert a tiny model and compare."""
    from rapidmoe.engine.pack.convert import convert
    from rapidmoe.engine.synth.model import write_synthetic

    src = write_synthetic(tmp_path / "tiny.gguf", "qwen3moe", seed=3) or tmp_path / "tiny.gguf"
    s = sizes_of(src)
    with GGUFFile(convert(src)) as pk:
        t = pk.tensors
        E = s.n_expert
        for il in s.expert_layers:
            part = lambda k, f: t[f"blk.{il}.ffn_{k}_exps.{f}"].nbytes // E  # noqa: E731
            assert part("gate", "wq") + part("up", "wq") + part("down", "wq") == s.wq_bytes
            assert part("gate", "wr") + part("up", "wr") == s.wr_bytes
            assert part("down", "d4") == s.d4_bytes
        # the pack's checksum table is read once, when it is verified, never mapped for use
        non_expert = sum(x.nbytes for x in t.values() if "_exps." not in x.name and x.name != "rapidmoe.pack.crc32")
        assert non_expert == s.nonexpert_bytes
        # the CPU plan's mmapped bytes are exactly what the engine maps from the pack
        p = plan(s, MACHINES["noGPU+64GB"], 256)
        mapped = sum(c.bytes for c in p.components if "mmapped" in c.name)
        assert mapped == sum(x.nbytes for x in t.values() if x.name != "rapidmoe.pack.crc32")
    # ... and what load_model maps and allocates for that plan
    from rapidmoe.engine.tune.bench import resident_model_bytes
    from rapidmoe.engine.loader import load_model

    m = load_model(src, n_ctx=256, critical="k")
    assert resident_model_bytes(m) == mapped
    kv_of = {}
    for kv_type in KV_TYPES:  # the plan's KV cache is the one the model allocates, in each type
        q = plan(s, MACHINES["noGPU+64GB"], 256, kv_type=kv_type)
        kv = next(c for c in q.components if c.name.startswith("KV cache"))
        assert kv_type in kv.name and kv.bytes == m.net.new_cache(256, kv_type=kv_type).nbytes
        kv_of[kv_type] = kv.bytes
    assert kv_of["f32"] == 2 * kv_of["f16"] and kv_of["q8_0"] == kv_of["f16"] * 17 // 32


@pytest.mark.parametrize("name", list(MACHINES))
@pytest.mark.parametrize("model", ["v3", "a3b"])
def test_placements_fit_their_budgets(name, model, v3_file, a3b_file):
    hw = MACHINES[name]
    s = sizes_of(v3_file if model == "v3" else a3b_file)
    p = plan(s, hw, 8192)
    check_consistent(p, hw)
    if p.mode != "cpu":
        # every layer on exactly one GPU, in contiguous runs, in order
        covered = [i for _, a, b in p.gpu_layers for i in range(a, b + 1)]
        assert covered == list(range(s.n_layer))
        assert len(p.cached) == round(p.wq_cache_fraction * s.n_moe_layers * s.n_expert)


def test_expected_modes(v3_file, a3b_file):
    v3, a3b = sizes_of(v3_file), sizes_of(a3b_file)
    # Qwen3-30B-A3B: all W_Q (7.2 GB) fits a 24 GB GPU
    p = plan(a3b, MACHINES["24GB+128GB"], 8192)
    assert (p.mode, p.fits, p.wq_cache_fraction) == ("gpu-residual", True, 1.0)
    # no GPU: the CPU fallback, with its reason
    p = plan(a3b, MACHINES["noGPU+64GB"], 8192)
    assert (p.mode, p.fits) == ("cpu", True) and "no GPU" in p.reason
    # DeepSeek-V3 on 2x80 GB + 512 GB: most experts' W_Q cached, layers split over both GPUs
    p = plan(v3, MACHINES["2x80GB+512GB"], 8192)
    assert p.mode == "gpu-partial" and p.fits and 0.5 < p.wq_cache_fraction < 1.0
    assert [d for d, _, _ in p.gpu_layers] == ["cuda:0", "cuda:1"]
    assert abs(p.bytes_on("cuda:0") - p.bytes_on("cuda:1")) < 0.1 * p.bytes_on("cuda:0")  # split by VRAM
    # on 24 GB + 128 GB, V3's W_R and D4 alone exceed DRAM: refused, nothing smaller fits
    p = plan(v3, MACHINES["24GB+128GB"], 8192)
    assert not p.fits and p.suggestion.startswith("nothing fits")


def test_gpu_split_follows_free_vram(v3_file):
    s = sizes_of(v3_file)
    hw = HardwareRecord(gpus=(GPUInfo(0, "a", 80 * GB, 80 * GB), GPUInfo(1, "b", 48 * GB, 40 * GB)),
                        dram_total_bytes=768 * GB, dram_available_bytes=700 * GB, physical_cores=32, usable_cores=32)
    p = plan(s, hw, 4096)
    check_consistent(p, hw)
    a, b = p.bytes_on("cuda:0"), p.bytes_on("cuda:1")
    assert a > 1.5 * b and b <= 40 * GB  # the free VRAM, not the total, bounds GPU 1
    only1 = plan(s, hw, 4096, gpus=[1])
    assert list(only1.vram_budget) == ["cuda:1"] and only1.wq_cache_fraction < p.wq_cache_fraction
    with pytest.raises(UserError, match="no GPU 2"):
        plan(s, hw, 4096, gpus=[2])


def test_refusal_names_the_nearest_plan_that_fits(a3b_file):
    s = sizes_of(a3b_file)
    hw = MACHINES["24GB+128GB"]
    # forcing every W_Q into a 10 GiB budget at a long context: fewer cached experts fit
    p = plan(s, hw, 32768, vram_budget=10 * GiB, mode="gpu-residual")
    assert not p.fits and p.suggestion.startswith("fewer cached experts")
    q = plan(s, hw, p.suggested["ctx"], vram_budget=10 * GiB, cache_fraction=p.suggested["wq_cache_fraction"])
    assert q.fits and q.mode == "gpu-partial"
    # a DRAM budget the KV cache overflows in CPU mode: a smaller context
    p = plan(s, hw, 32768, mode="cpu", dram_budget=22 * GB)
    assert not p.fits and "smaller context" in p.suggestion
    q = plan(s, hw, p.suggested["ctx"], mode="cpu", dram_budget=22 * GB)
    assert q.fits and q.ctx < 32768
    assert not plan(s, hw, q.ctx + 256, mode="cpu", dram_budget=22 * GB).fits  # the largest that fits, near enough
    # a GPU mode on a machine without one: the CPU fallback
    p = plan(s, MACHINES["noGPU+64GB"], 4096, mode="gpu-partial")
    assert not p.fits and p.suggested["mode"] == "cpu"


def test_hottest_experts_are_cached_first(a3b_file, tmp_path):
    s = sizes_of(a3b_file)
    import numpy as np

    rng = np.random.default_rng(0)
    counts = [rng.integers(0, 1000, s.n_expert).tolist() for _ in range(s.n_layer)]
    f = tmp_path / "cal.json"
    f.write_text(json.dumps({"version": 1, "expert_frequency": counts}))
    freqs = load_expert_frequencies(f, s)
    p = plan(s, MACHINES["24GB+128GB"], 8192, vram_budget=6 * GiB, freqs=freqs)
    assert p.mode == "gpu-partial" and p.cache_order.startswith("activation frequency")
    cached = set(p.cached)
    hot = min(counts[il][e] for il, e in cached)
    cold = max(counts[il][e] for il in s.expert_layers for e in range(s.n_expert) if (il, e) not in cached)
    assert hot >= cold
    # without calibration: layer order
    p = plan(s, MACHINES["24GB+128GB"], 8192, vram_budget=6 * GiB)
    assert p.cache_order == "layer order" and p.cached[:3] == ((0, 0), (0, 1), (0, 2))
    f.write_text("{not json")
    assert load_expert_frequencies(f, s) is None


def _cli(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _tree(d: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(d)), p.stat().st_size) for p in d.rglob("*")) if d.exists() else []


def test_cli_json_schema_refusal_and_no_pack_written(v3_file, tmp_path):
    from rapidmoe.engine.paths import cache_dir

    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({"hardware": MACHINES["2x80GB+512GB"].to_dict()}))
    before = _tree(cache_dir())
    rc, out, err = _cli(["plan", "-m", str(v3_file), "--hardware", str(hw), "--ctx", "16384", "--json"])
    assert rc == 0, err
    j = json.loads(out)
    assert set(j) >= {"mode", "reason", "components", "totals", "wq_cache_fraction", "fits", "suggestion"}
    assert j["mode"] in ("gpu-residual", "gpu-partial", "cpu") and j["fits"] is True and j["suggestion"] is None
    assert all(set(c) == {"name", "bytes", "device"} and isinstance(c["bytes"], int) for c in j["components"])
    assert set(j["totals"]) >= {"vram_bytes", "dram_bytes"} and isinstance(j["wq_cache_fraction"], float)
    # refused: exit 2, the object still printed with fits false and a suggestion
    rc, out, err = _cli(["plan", "-m", str(v3_file), "--hardware", str(hw), "--dram-budget", "200", "--json"])
    j = json.loads(out)
    assert rc == 2 and j["fits"] is False and j["suggestion"] and "does not fit" in err
    # the text form, refused: reason and nearest plan on stderr
    rc, out, err = _cli(["plan", "-m", str(v3_file), "--hardware", str(hw), "--mode", "gpu-residual"])
    assert rc == 2 and "component" in out and "nearest plan that fits: fewer cached experts" in err
    assert _tree(cache_dir()) == before  # nothing converted, nothing written


def test_cpu_plan_runs_critical_experts_from_the_file_where_it_can(a3b_file, tmp_path):
    """A CPU plan counts the source file's experts instead of W_R + D4 when their types have
    an int8 kernel and DRAM holds them; else the pack's, saying why; a request is honoured."""
    s = sizes_of(a3b_file)
    hw = MACHINES["noGPU+64GB"]
    with GGUFFile(a3b_file) as g:
        file_experts = sum(t.nbytes for t in g.tensors.values() if "_exps." in t.name)
    n = s.n_moe_layers * s.n_expert
    assert n * s.src_expert_bytes == file_experts
    src = plan(s, hw, 4096)
    pack = plan(s, hw, 4096, critical_from="pack")
    check_consistent(src, hw)
    assert (src.critical_from, pack.critical_from) == ("source", "pack")
    names = lambda p: [c.name for c in p.components]  # noqa: E731
    assert not any("W_R" in c or "D4" in c for c in names(src)) and any("model file" in c for c in names(src))
    assert any("W_R" in c for c in names(pack)) and not any("model file" in c for c in names(pack))
    assert src.dram_bytes - pack.dram_bytes == file_experts - n * (s.wr_bytes + s.d4_bytes)
    assert "critical experts from the model file" in src.describe() and src.to_json()["critical_from"] == "source"
    # DRAM for the pack's plan but not the file's: the pack's, and a note of what the file would need
    between = (pack.dram_bytes + src.dram_bytes) // 2
    auto = plan(s, hw, 4096, dram_budget=between)
    assert auto.fits and auto.critical_from == "pack" and "would need" in auto.notes[0]
    forced = plan(s, hw, 4096, dram_budget=between, critical_from="source")
    assert not forced.fits and forced.critical_from == "source"
    # a file that asks for the pack's critical path (the demo does) gets it, unless asked otherwise
    from dataclasses import replace

    asks = replace(s, prefers_pack=True)
    assert plan(asks, hw, 4096).critical_from == "pack" and "as the model file asks" in plan(asks, hw, 4096).notes[0]
    assert plan(asks, hw, 4096, critical_from="source").critical_from == "source"
    # GPU plans keep W_R + D4 in DRAM (the GPU computes every expert's W_Q)
    assert plan(s, MACHINES["24GB+128GB"], 4096).critical_from == "pack"
    # experts of a type without an int8 kernel (F32 here): never from the file; asking is one line
    from rapidmoe.engine.synth.model import write_synthetic

    f32 = sizes_of(write_synthetic(tmp_path / "f32.gguf", "qwen3moe", seed=3))
    assert f32.src_expert_bytes == 0 and plan(f32, hw, 256).critical_from == "pack"
    with pytest.raises(UserError, match="cannot run from the file"):
        plan(f32, hw, 256, critical_from="source")
    rc, out, _ = _cli(["plan", "-m", str(a3b_file), "--hardware", str(_hw_file(tmp_path)), "--mode", "cpu",
                       "--critical-from", "pack", "--json"])
    assert rc == 0 and json.loads(out)["critical_from"] == "pack"
    rc, _, err = _cli(["plan", "-m", str(tmp_path / "f32.gguf"), "--critical-from", "source"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "cannot run from the file" in err


def test_cli_on_this_machine_and_bad_input(a3b_file, tmp_path):
    rc, out, err = _cli(["plan", "-m", str(a3b_file), "--ctx", "2048"])
    assert rc in (0, 2) and "KV cache" in out and "W_R" in out
    # sizes in binary units, as `list`, `bench` and the TUI print them
    assert " GiB" in out and " MiB" in out and not re.search(r"\d (GB|MB)\b", out + err), out
    rc, _, err = _cli(["plan", "-m", str(a3b_file), "--gpus", "7", "--hardware", str(_hw_file(tmp_path))])
    assert rc == 2 and "no GPU 7" in err
    rc, _, err = _cli(["plan", "-m", str(a3b_file), "--ctx", "999999"])
    assert rc == 2 and "exceeds the model's trained context" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [], "dram": 1}')
    rc, _, err = _cli(["plan", "-m", str(a3b_file), "--hardware", str(bad)])
    assert rc == 2 and "not a hardware description" in err


def _hw_file(tmp_path) -> Path:
    f = tmp_path / "hw24.json"
    f.write_text(json.dumps(MACHINES["24GB+128GB"].to_dict()))
    return f


RSS_CHILD = r"""
import json, sys
import numpy as np, torch
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.plan.sizes import use_planned_allocator

if sys.argv[3] == "planned":
    assert use_planned_allocator()

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024

def library_pages():  # resident pages of shared libraries (code the run faults in)
    kb, lib = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            p = line.split()
            if not p[0].endswith(":"):
                lib = len(p) > 5 and (p[5].endswith(".so") or ".so." in p[5])
            elif p[0] == "Rss:" and lib:
                kb += int(p[1])
    return kb * 1024

rss0, lib0 = status("VmRSS:"), library_pages()  # after imports, as bench reports it
ctx, chunk = int(sys.argv[1]), int(sys.argv[2])
m = load_model(sys.argv[4], n_ctx=ctx, critical="k")
cache = m.runner.new_cache(ctx)
toks = torch.from_numpy(np.random.default_rng(0).integers(10, m.cfg.n_vocab - 10, ctx))
n_prompt = ctx - 8
for i in range(0, n_prompt, chunk):  # the chat session's chunked prefill, filling the context
    m.runner.prefill(toks[i:min(i + chunk, n_prompt)], i, cache, last_only=True)
for i in range(n_prompt, ctx):
    m.runner.decode(int(toks[i]), i, cache)
print(json.dumps({"peak_minus_imports": status("VmHWM:") - rss0, "library_pages": library_pages() - lib0}))
"""


@pytest.mark.parametrize("model", ["demo", "qwen-vocabulary"])
def test_cpu_plan_matches_what_the_engine_allocates(model, tmp_path):
    """The bar: on this machine, peak RSS minus RSS after imports of a run that
    fills the planned context is within 15% of the plan's DRAM total: the demo, and
    a synthetic qwen3moe with Qwen2's 152K-entry vocabulary (three times the demo's)
    and f16 matrices, so the per-model parts (tokenizer, head) are checked twice.
    The child converts its pack when the cache has none (as a first use does)."""
    import subprocess
    import sys

    from rapidmoe.engine.hub.demo import demo_model_path
    from rapidmoe.engine.plan.hardware import detect
    from rapidmoe.engine.synth.model import write_synthetic

    ctx = 1024
    path = demo_model_path() if model == "demo" else write_synthetic(
        tmp_path / "qwen-vocab.gguf", "qwen3moe", seed=3, dtype="f16", tokenizer="qwen", n_embd=128, n_layer=4,
        n_expert=16, n_ff_exp=128, n_ctx=4096)
    p = plan(sizes_of(path), detect(amx=False), ctx, mode="cpu")  # what the CPU engine runs
    # under the allocator setting the plan assumes (plan_sizes.use_planned_allocator)
    r = subprocess.run([sys.executable, "-c", RSS_CHILD, str(ctx), "256", "planned", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    measured = out["peak_minus_imports"]
    print(f"{model}, ctx {ctx}: plan DRAM {p.dram_bytes / 1e6:.1f} MB, measured {measured / 1e6:.1f} MB "
          f"({measured / p.dram_bytes:.3f}x), of which library code paged in {out['library_pages'] / 1e6:.1f} MB")
    assert abs(measured / p.dram_bytes - 1) <= 0.15
