"""The GPU path through the product's own doors on a stand-in GPU
(RAPIDMOE_STANDIN_GPU): plan -> load -> runner -> GPU step -> residual-split
schedule -> combine -> placement line, with the device work done on the CPU.
The stand-in's numbers are the CPU split path's own kernels, so its logits are
held to the CPU split path's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import pytest

from rapidmoe.engine.tune.evaluate import divergence
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.moe.umia import UmiaPolicy
from rapidmoe.engine.plan.planner import PlanRequest
from rapidmoe.engine.synth.model import write_synthetic

STANDIN = {"RAPIDMOE_STANDIN_GPU": "24"}
# The stand-in runs the CPU split path's per-row arithmetic (its decode kernels):
# one decode step is the same arithmetic on both paths (measured KL <= 1.1e-7).
KL_SAME = 1e-6
# A CPU prefill runs an expert's groups of >= 8 tokens through its int8 GEMM
# (weights requantized to int8, a critical expert's W_Q + W_R as one sum); the GPU
# schedule keeps a critical expert's W_Q (device) and W_R (host) apart as the
# per-row kernels do, so its prefill is the CPU's per-row arithmetic instead. The two
# CPU forms differ by KL 1e-4..2e-3 on these files (prefill vs decode of the same
# tokens); the stand-in is held to the per-row one.
KL_PREFILL_CLI = 5e-3


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_path")
    return {"qwen3moe": str(write_synthetic(d / "q3.gguf", "qwen3moe", seed=3, dtype="f16")),
            "deepseek2": str(write_synthetic(d / "ds2.gguf", "ds2_v3", seed=3))}


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")


def _plan_json(model, *flags, env=STANDIN) -> dict:
    r = cli("plan", "-m", model, "--json", *flags, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _per_layer_cached(model) -> dict[str, int]:
    out = {}
    for blk in model.net.blocks:
        ex = getattr(getattr(blk, "ffn", None), "experts", None)
        if ex is not None and hasattr(ex, "n_cached") and ex.n_cached:
            out[str(ex.layer)] = ex.n_cached
    return out


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_plan_json_and_the_loaded_placement_agree(files, arch, monkeypatch):
    """`plan --json` picks gpu-residual or gpu-partial as the budget says, and
    loading with the same flags places exactly that: mode, devices, W_Q cache per layer."""
    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")
    full = _plan_json(files[arch])
    assert full["mode"] == "gpu-residual" and full["gpu_layers"][0]["device"] == "cuda:0"
    wq = sum(c["bytes"] for c in full["components"] if c["name"].startswith("W_Q cache"))
    need = full["totals"]["per_device"]["cuda:0"]
    budget_gib = (need - wq // 2) / 2**30  # room for about half of the experts' W_Q
    partial = _plan_json(files[arch], "--vram-budget", f"{budget_gib:.9f}")
    assert partial["mode"] == "gpu-partial" and 0 < partial["wq_cache_fraction"] < 1
    for flags, want, req in (((), full, PlanRequest()),
                             (("--vram-budget", f"{budget_gib:.9f}"), partial,
                              PlanRequest(vram_budget=int(budget_gib * 2**30))),
                             (("--cache-fraction", "0.25"), None, PlanRequest(cache_fraction=0.25))):
        want = want or _plan_json(files[arch], *flags)
        m = load_model(files[arch], n_ctx=want["ctx"], critical=2, placement=req)
        got = m.plan.to_json()
        assert got["mode"] == want["mode"] and got["gpu_layers"] == want["gpu_layers"]
        assert got["wq_cache"] == want["wq_cache"]
        gpu = lambda p: [c for c in p["components"] if c["device"] != "cpu"]  # noqa: E731
        assert gpu(got) == gpu(want)
        assert _per_layer_cached(m) == want["wq_cache"]["per_layer"]
        assert m.placement.startswith("stand-in GPU 0: attention + KV + W_Q ")
        assert f"W_Q {want['wq_cache_fraction']:.0%}" in m.placement
        if want["mode"] == "gpu-partial":
            assert "CPU: residuals + W_Q" in m.placement


def _logits(model, toks, decode: bool, policy=None) -> np.ndarray:
    run = model.runner
    cache = run.new_cache(model.n_ctx)
    if not decode:
        return run.prefill(toks, 0, cache, policy)[0].numpy()
    return np.stack([run.decode(int(t), i, cache, policy)[0].numpy() for i, t in enumerate(toks)])


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
@pytest.mark.parametrize("critical", ["k", 2, "auto"])
def test_standin_logits_equal_the_cpu_split_path(files, arch, critical, monkeypatch):
    monkeypatch.delenv("RAPIDMOE_STANDIN_GPU", raising=False)
    # an f32 cache: f16 rounding would turn the two steps' last-bit differences in K into larger ones
    exact = PlanRequest(kv_type="f32")
    cpu = load_model(files[arch], n_ctx=64, critical=critical, placement=exact)
    assert cpu.plan.mode == "cpu" and not cpu.runner.gpu_step
    toks = list(np.random.default_rng(1).integers(5, cpu.cfg.n_vocab - 5, 48))
    ref = _logits(cpu, toks, True)
    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")
    gpu = load_model(files[arch], n_ctx=64, critical=critical, placement=exact)
    assert gpu.plan.mode == "gpu-residual" and gpu.runner.gpu_step
    d = divergence(ref, _logits(gpu, toks, True))
    assert d.kl_mean <= KL_SAME and d.top1 == 1.0, d
    # prefill (UMIA held to its decode phase, so both sides pick the same r)
    pol = gpu.policy if critical != "auto" else UmiaPolicy(gpu.policy.profile, gpu.policy.k, phase="decode")
    ref = _logits(cpu, toks, True, pol)
    d = divergence(ref, _logits(gpu, toks, False, pol))
    assert d.kl_mean <= KL_SAME and d.top1 == 1.0, d
    # the step trace: every MoE layer ran the schedule, on the device named by the plan
    cache = gpu.runner.new_cache(64)
    _, trace = gpu.runner.decode(toks[0], 0, cache)
    moe = [f.layer for f in gpu.net.moe_layers()]
    assert trace.where == "cuda:0" and sorted(trace.groups) == moe and sorted(trace.r) == moe
    k = gpu.cfg.n_expert_used
    for il in moe:
        g = trace.groups[il]
        assert sum(g.values()) == k and g["A"] == int(trace.r[il][0]) and g["B"] == g["D"] == 0


def test_eval_through_the_cli_on_the_standin(files, tmp_path):
    """eval --save-logits on the CPU, eval --kl-base on the stand-in GPU: the same text."""
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 6)
    base = tmp_path / "cpu.npz"
    r = cli("eval", "-m", files["qwen3moe"], "--text", str(text), "--critical", "2", "--save-logits", str(base),
            "--json", env={"RAPIDMOE_STANDIN_GPU": ""})
    assert r.returncode == 0, r.stderr
    r = cli("eval", "-m", files["qwen3moe"], "--text", str(text), "--critical", "2", "--kl-base", str(base),
            "--json", env=STANDIN)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["kl_mean"] <= KL_PREFILL_CLI and res["top1"] >= 0.9, res


# qwen3moe: 8 tokens, because its 9th greedy step is a near-tie (top two logits 0.005 apart
# on the CPU), which the GPU step's f16 products may break either way. The demo: 7 tokens
# ("The capital of France is Paris,"): its router weighs the 16 experts within a few percent
# of each other, so at `auto` a last-bit difference in the attention's sum order (the GPU
# step's masked bucket against the CPU's kernel) can swap a critical expert, which moves the
# logits by up to ~1; its 8th token leads by 0.27 only.
@pytest.mark.parametrize("model,critical,n", [("demo", "auto", 7), ("qwen3moe", "2", 8), ("deepseek2", "99", 12)])
def test_prompt_greedy_text_equal_and_placement(files, model, critical, n):
    spec = files.get(model, model)
    args = ("-m", spec, "-p", "What is the capital of France?", "--temp", "0", "--max-tokens", str(n),
            "--ctx", "256",
            "--critical", critical, "--json", "--verbose")
    a = cli(*args, env={"RAPIDMOE_STANDIN_GPU": ""})
    b = cli(*args, env=STANDIN)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["text"] == jb["text"] and ja["completion_tokens"] == jb["completion_tokens"]
    if model == "demo":
        assert "Paris" in jb["text"]
    assert ja["plan_mode"] == "cpu" and ja["placement"].startswith("CPU-centric")
    assert jb["plan_mode"] == "gpu-residual" and jb["placement"].startswith("stand-in GPU 0: attention + KV + W_Q 100%")
    assert f"placement: {jb['placement']}" in b.stderr
    assert "decode graphs: " in b.stderr and "decode graphs" not in a.stderr


def test_two_standin_gpus_split_the_layers_as_planned(files, monkeypatch):
    one = _plan_json(files["deepseek2"], "--ctx", "64")
    r = one["reserves"]
    fixed = r["cuda_context_bytes_per_gpu"] + r["gpu_activation_bytes_per_gpu"]
    comp = {c["name"].split(",")[0].split(":")[0].split(" (")[0]: c["bytes"] for c in one["components"]
            if c["device"] == "cuda:0"}
    n_layer = one["gpu_layers"][0]["last"] + 1
    layer = (comp["non-expert weights"] + comp["KV cache"] + comp["W_Q cache"]) / n_layer
    # layers go to GPUs in proportion to capacity, the head on the last: a first GPU with
    # room for two layers and a second with room for the rest and the head
    sizes = [(fixed + 2.2 * layer) / 2**30, (fixed + 2 * (comp["output head"] + n_layer * layer)) / 2**30]
    env = {"RAPIDMOE_STANDIN_GPU": ",".join(f"{g:.9f}" for g in sizes)}
    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", env["RAPIDMOE_STANDIN_GPU"])
    want = _plan_json(files["deepseek2"], "--ctx", "64", env=env)
    spans = [(g["device"], g["first"], g["last"]) for g in want["gpu_layers"]]
    assert [d for d, _, _ in spans] == ["cuda:0", "cuda:1"]
    m = load_model(files["deepseek2"], n_ctx=64, critical=2)
    assert m.plan.gpu_layers == tuple(spans) and m.runner.where == "cuda:0+cuda:1"
    devs = [b.ffn.experts.device for b in m.net.blocks if hasattr(b.ffn, "experts")]
    owner = {il: d for d, a, b in spans for il in range(a, b + 1)}
    moe = [f.layer for f in m.net.moe_layers()]
    by_dev = {}
    for il, dev in zip(moe, devs):
        by_dev.setdefault(owner[il], set()).add(id(dev))
    assert all(len(v) == 1 for v in by_dev.values()) and len({next(iter(v)) for v in by_dev.values()}) == len(by_dev)
    toks = list(range(5, 25))
    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")
    one = load_model(files["deepseek2"], n_ctx=64, critical=2)
    np.testing.assert_allclose(_logits(m, toks, True), _logits(one, toks, True), rtol=0, atol=1e-5)


def test_a_plan_that_does_not_fit_is_refused_before_converting(files, tmp_path):
    from rapidmoe.engine.pack.convert import pack_path

    # a model no test converted before (packs are keyed by content, not path)
    src = write_synthetic(tmp_path / "fresh.gguf", "qwen3moe", seed=14, dtype="f16")  # a seed no other test uses
    r = cli("-m", str(src), "-p", "hi", "--mode", "gpu-residual", "--vram-budget", "0.5", env=STANDIN)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not fit" in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not pack_path(src).exists()


def test_bad_standin_value_is_one_line(files):
    r = cli("plan", "-m", files["qwen3moe"], env={"RAPIDMOE_STANDIN_GPU": "lots"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "RAPIDMOE_STANDIN_GPU" in r.stderr


def test_doctor_names_the_standin():
    r = cli("doctor", env=STANDIN)
    assert r.returncode == 0, r.stderr
    assert "stand-in GPU" in r.stdout and "no real GPU is used" in r.stdout


def test_device_check_script_runs_on_the_standin():
    """tests/gpu/check.py, the device check, at a small size: never first exercised on the device."""
    script = Path(__file__).parent / "gpu" / "check.py"
    r = subprocess.run([sys.executable, str(script), "--standin", "--layers", "1", "--experts", "16", "--steps", "2",
                        "--prefill", "32"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Check PASSED" in r.stdout and "residual split r=2" in r.stdout


def test_tui_status_bar_names_the_standin_gpu(files, tmp_path, standin):
    """The TUI on the real engine with a stand-in GPU: the status bar's placement is the plan's."""
    import asyncio

    from tui_helpers import SIZE, make_app, send, wait_for

    from rapidmoe.app.tui.backend import EngineBackend

    async def main():
        app = make_app(tmp_path, EngineBackend(critical=2), model=files["qwen3moe"],
                       overrides={"temperature": 0.0, "max_tokens": 6})
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            await wait_for(pilot, lambda: scr.model is not None, timeout=120)
            assert scr.model.placement.startswith("stand-in GPU 0: attention + KV + W_Q 100%")
            assert "stand-in GPU 0" in str(scr.status.line_text())
            await send(pilot, "hello")
            await wait_for(pilot, lambda: not scr.generating, timeout=120)
            assert scr.last_final is not None and scr.last_final.completion_tokens > 0

    asyncio.run(main())


def test_product_device_script_runs_on_the_standin(tmp_path):
    """tests/gpu/product.py, the device check's product part, at a tiny size on a stand-in
    GPU: write, plan V3 (gpu-partial on an H200's memory), convert, -p, the bench table."""
    script = Path(__file__).parent / "gpu" / "product.py"
    r = subprocess.run([sys.executable, str(script), "--standin", "--prompt", "32", "--gen", "4", "--dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "plan for the full 61-layer DeepSeek-V3 on this GPU: gpu-partial" in out
    for row in ("(a) KTransformers-style", "(b) residual split", "(b) residual split, no graph segments",
                "(c) CPU only", "r=auto", "r=2"):
        assert row in out
    assert "graph segments: greedy text equal to the eager GPU step" in out
    assert "placement of the -p run: stand-in GPU 0" in out


def _assert_plan_counts_what_was_placed(gpu) -> None:
    """The plan's VRAM for the non-expert weights is what the GPU placement made of
    them, layer by layer and the head."""
    from rapidmoe.engine.gpu.placement import GpuQWeight

    def nbytes(v) -> int:
        return v.nbytes if isinstance(v, GpuQWeight) else v.numel() * v.element_size()

    def placed(*objs) -> int:
        return sum(nbytes(v) for obj in objs for k, v in vars(obj).items()
                   if k not in ("rope", "experts") and isinstance(v, (GpuQWeight, torch.Tensor)))
    per_layer = [placed(b, b.attn, b.ffn, *([b.ffn.shared] if getattr(b.ffn, "shared", None) else []))
                 for b in gpu.net.blocks]
    comps = {c.name: c.bytes for c in gpu.plan.components if c.device != "cpu"}
    assert comps[f"non-expert weights, layers 0-{len(per_layer) - 1}"] == sum(per_layer)
    assert comps["output head"] == nbytes(gpu.net.output) + nbytes(gpu.net.output_norm)


@pytest.mark.parametrize("arch, dtype", [("qwen3moe", "q4_0"), ("deepseek2", "f16"), ("qwen2moe", "q5_1")])
def test_the_plan_counts_what_the_gpu_placement_makes(tmp_path, arch, dtype, monkeypatch):
    """Types the GGUF GEMV lacks go to bf16 (Q4_0 and Q5_1 take 3.6 and 3.3 times their
    bytes), F16 ones too, vectors to f32: the plan counts that, not the source bytes."""
    from rapidmoe.engine.gpu import device as gd

    shape = dict(qk_nope=32, qk_rope=32, v_head=32, q_lora_rank=64) if arch == "deepseek2" else {}
    src = write_synthetic(tmp_path / "m.gguf", "ds2_v3" if arch == "deepseek2" else arch, seed=5, dtype=dtype,
                          **shape)
    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")
    monkeypatch.setattr(gd, "StandInDevice", gd.EmulatedGpuDevice)  # the GPU's placement, on CPU tensors
    gpu = load_model(src, n_ctx=32, critical=2)
    _assert_plan_counts_what_was_placed(gpu)
    from rapidmoe.engine.gguf.reader import GGUFFile
    from rapidmoe.engine.plan.sizes import sizes_from_gguf

    with GGUFFile(src) as g:
        s = sizes_from_gguf(g)
    if dtype != "f16":  # the source's own bytes would be far off
        assert sum(s.gpu_layer_bytes) > 2 * sum(s.layer_bytes)


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_gpu_step_with_the_gpu_placement_on_emulated_kernels(tmp_path, arch, emulated_gpu, monkeypatch):
    """The GPU step as a real GPU runs it, its CUDA kernels on the emulator: non-expert
    Q8_0 weights, MLA's per-head stacks included, as GpuQWeight (GGUF GEMV), F32/F16
    ones in torch types, W_Q through the GPU kernels. Close to the CPU split path:
    only the GPU's own rounding differs (a wiring fault gives KL > 0.1). The plan's
    VRAM for the non-expert weights is what was placed."""
    from rapidmoe.engine.gpu import device as gd
    from rapidmoe.engine.gpu.placement import GpuQWeight

    shape = dict(qk_nope=32, qk_rope=32, v_head=32, q_lora_rank=64) if arch == "deepseek2" else {}
    src = write_synthetic(tmp_path / "m.gguf", "ds2_v3" if arch == "deepseek2" else arch, seed=4, dtype="q8_0",
                          **shape)
    monkeypatch.delenv("RAPIDMOE_STANDIN_GPU", raising=False)
    # the cache type is not under test (f16 would add its own rounding); the CPU reference takes
    # the GPU step's critical path (W_Q + W_R, D4), not the file's own experts
    exact = PlanRequest(kv_type="f32", critical_from="pack")
    cpu = load_model(src, n_ctx=32, critical=2, placement=exact)
    toks = list(range(7, 19))
    ref_pre, ref_dec = _logits(cpu, toks, False), _logits(cpu, toks[:4], True)
    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")
    monkeypatch.setattr(gd, "StandInDevice", gd.EmulatedGpuDevice)
    gpu = load_model(src, n_ctx=32, critical=2, placement=exact)
    attn = gpu.net.blocks[0].attn
    assert isinstance(gpu.net.output, GpuQWeight) and isinstance(attn.wo, GpuQWeight)
    if arch == "deepseek2":  # MLA's per-head stacks in their GGUF type too
        assert isinstance(attn.k_b, GpuQWeight) and len(attn.k_b.shape) == 3 and isinstance(attn.v_b, GpuQWeight)

    _assert_plan_counts_what_was_placed(gpu)
    for got, ref in ((_logits(gpu, toks, False), ref_pre), (_logits(gpu, toks[:4], True), ref_dec)):
        d = divergence(ref, got)
        assert d.kl_mean < 5e-3 and d.top1 >= 0.9, d
