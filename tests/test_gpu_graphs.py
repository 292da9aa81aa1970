"""The GPU step's decode graph segments (engine/gpu/graphs.py). A segment reads the
decode position from a device tensor and attends over a fixed bucket of cache rows
with the rows past the position masked, so that one capture serves every position
of the bucket. Off a GPU the segments run eagerly through the same static buffers:
these tests hold that formulation to the per-position one, on the stand-in GPU."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from rapidmoe.engine.gpu.graphs import KV_BUCKET, DecodeGraphs, kv_bucket
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.moe.block import MoEFFN
from rapidmoe.engine.plan.planner import PlanRequest
from rapidmoe.engine.synth.model import write_synthetic
from rapidmoe.engine.tune.evaluate import divergence

N_CTX = 2 * KV_BUCKET + 32


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("graphs")
    return {"qwen3moe": str(write_synthetic(d / "q3.gguf", "qwen3moe", seed=4, n_ctx=N_CTX)),
            "deepseek2": str(write_synthetic(d / "ds2.gguf", "ds2_v3", seed=4, kv_lora_rank=64, qk_rope=32))}


def test_kv_bucket_grows_by_steps_and_stops_at_the_context():
    got = [kv_bucket(s, 8192) for s in (1, 256, 257, 1024, 1025, 1100, 2048, 2049, 5000)]
    assert got == [256, 256, 512, 1024, 1152, 1152, 2048, 2304, 5120]
    assert kv_bucket(300, 300) == 300 and kv_bucket(1, 64) == 64
    for s in range(1, 5000, 37):  # never fewer rows than written, at most 1/8 (or one bucket) more
        b = kv_bucket(s, 1 << 20)
        assert s <= b <= max(s + KV_BUCKET - 1, s * 9 // 8 + 1)


def test_a_refused_capture_leaves_the_segments_eager():
    """Where the driver refuses a capture, that segment and the later ones run eagerly
    (one line kept for --verbose), the results unchanged."""
    g = DecodeGraphs(torch.device("cpu"))
    g.capture = True  # as on a GPU, with a capture that fails

    def refuse(fn, statics):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
    g._capture = refuse
    x = torch.arange(4.0)
    assert torch.equal(g.run(("a",), lambda v: v * 2, x), x * 2)
    assert torch.equal(g.run(("a",), lambda v: v * 2, x + 1), (x + 1) * 2)  # the static input takes the new x
    assert g.failed == "operation not permitted when stream is capturing" and g.captures == 0
    assert torch.equal(g.run(("b",), lambda v: v - 1, x), x - 1) and g.n_segments == 2


def test_the_cpu_step_makes_no_segments(files):
    m = load_model(files["qwen3moe"], n_ctx=64, critical=2, placement=PlanRequest(mode="cpu"))
    cache = m.runner.new_cache(64)
    m.runner.decode(5, 0, cache)
    assert not m.runner.gpu_step and len(m.runner._graphs) == 0 and m.runner.graph_summary() is None


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_attention_at_a_device_position_over_a_bucket(files, arch, kv_type):
    """Positions 0..N_CTX-1, across two bucket boundaries: the rows written are the same
    bytes, and the output over the masked bucket equals the per-position attention."""
    m = load_model(files[arch], n_ctx=N_CTX, critical=2, placement=PlanRequest(kv_type=kv_type, mode="cpu"))
    attn = m.net.blocks[1].attn
    by_int, by_tensor = m.runner.new_cache(N_CTX), m.runner.new_cache(N_CTX)
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    for pos in range(N_CTX):
        x = torch.randn(1, m.cfg.n_embd, generator=gen)
        a = attn(x, pos, by_int)
        b = attn(x, torch.tensor([pos]), by_tensor, kv_bucket(pos + 1, N_CTX))
        worst = max(worst, float((a - b).abs().max() / a.abs().max()))
    rows = (lambda c: c.kv) if arch == "deepseek2" else (lambda c: c.k + c.v)
    for r1, r2 in zip(rows(by_int), rows(by_tensor)):
        assert torch.equal(r1.data, r2.data)
    assert worst <= 2e-5, worst


def _decode(model, toks, pos0, cache):
    return np.stack([model.runner.decode(int(t), pos0 + i, cache)[0].numpy() for i, t in enumerate(toks)])


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_segments_on_the_standin_equal_the_eager_gpu_step(files, arch, monkeypatch):
    """The stand-in's GPU step with and without graph segments, decoding across a bucket
    boundary after a prefill: the same logits, and one segment per layer and bucket."""
    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")
    m = load_model(files[arch], n_ctx=N_CTX, critical=2, placement=PlanRequest(kv_type="f32"))
    assert m.runner.gpu_step
    rng = np.random.default_rng(2)
    prompt = rng.integers(5, m.cfg.n_vocab - 5, KV_BUCKET - 4)
    toks = rng.integers(5, m.cfg.n_vocab - 5, 8)  # positions 252..259: buckets 256 and 512

    def run(graphs: str):
        monkeypatch.setenv("RAPIDMOE_GPU_GRAPHS", graphs)
        cache = m.runner.new_cache(N_CTX)
        m.runner.prefill(prompt, 0, cache)
        return _decode(m, toks, len(prompt), cache), cache

    eager, c0 = run("0")
    seg, c1 = run("1")
    d = divergence(eager, seg)
    assert d.kl_mean <= 1e-6 and d.top1 == 1.0, d
    assert c0 not in m.runner._graphs
    (g,) = m.runner._graphs[c1].values()  # one device: the stand-in GPU 0
    n = len(m.net.blocks)
    moe = [il for il, b in enumerate(m.net.blocks) if isinstance(b.ffn, MoEFFN)]
    shared = [il for il in moe if m.net.blocks[il].ffn.shared is not None]
    want = ({("attn", il, b) for il in range(n) for b in (256, 512)} | {("route", il) for il in moe}
            | {("ffn", il) for il in range(n) if il not in moe} | {("shared", il) for il in shared} | {("head",)})
    assert set(g._seg) == want
    assert int(g.pos) == len(prompt) + len(toks) - 1


def test_expert_segments_on_the_emulated_gpu(files, emulated_gpu, monkeypatch):
    """The GPU step as a real GPU runs it (its CUDA kernels on the emulator): a decode
    token's cached W_Q runs as two segments per MoE layer, keyed by the group sizes
    (critical gate/up, then the rest's gate/up, down and sum), with the same logits
    as the eager schedule's launches."""
    from rapidmoe.engine.gpu import device as gd

    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")
    monkeypatch.setattr(gd, "StandInDevice", gd.EmulatedGpuDevice)
    m = load_model(files["qwen3moe"], n_ctx=64, critical=2, placement=PlanRequest(kv_type="f32"))
    toks = np.random.default_rng(3).integers(5, m.cfg.n_vocab - 5, 6)

    def run(graphs: str):
        monkeypatch.setenv("RAPIDMOE_GPU_GRAPHS", graphs)
        cache = m.runner.new_cache(64)
        return _decode(m, toks, 0, cache), cache

    eager, _ = run("0")
    seg, cache = run("1")
    d = divergence(eager, seg)
    assert d.kl_mean <= 1e-6 and d.top1 == 1.0, d
    (g,) = m.runner._graphs[cache].values()
    k = m.cfg.n_expert_used
    moe = [il for il, b in enumerate(m.net.blocks) if isinstance(b.ffn, MoEFFN)]
    assert {key for key in g._seg if key[0].startswith("wq")} == (
        {("wq-critical", il, 2) for il in moe} | {("wq-rest", il, 2, k - 2) for il in moe})


def test_bench_on_the_standin_says_how_the_step_ran(files):
    """`bench` on a GPU plan prints the GPU step's figures and how its decode segments ran."""
    env = dict(os.environ, RAPIDMOE_STANDIN_GPU="24")
    r = subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", "bench", "-m", files["qwen3moe"], "--critical", "2",
                        "-p", "8", "-n", "4", "--threads", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("GPU step r=2:"))
    assert re.search(r"orchestration [\d.]+ ms .*; decode graphs: \d+ segments, run eagerly \(no CUDA device\)$", line), line
