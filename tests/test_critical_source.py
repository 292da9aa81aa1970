"""Critical experts run from the source file's own tensors (CPU plans, experts of a type
with an int8 kernel): exact to the file where the pack's W_R + D4 approximate it, and
the pack's residual tensors are never read."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rapidmoe.engine.loader import load_model
from rapidmoe.engine.plan.planner import PlanRequest
from rapidmoe.engine.synth.model import write_synthetic


def log_softmax(a: np.ndarray) -> np.ndarray:
    a = a - a.max(-1, keepdims=True)
    return a - np.log(np.exp(a).sum(-1, keepdims=True))


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp, lq = log_softmax(p_logits.astype(np.float64)), log_softmax(q_logits.astype(np.float64))
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("src") / "q4.gguf", "qwen3moe", seed=7, dtype="f32",
                           expert_dtype="q4_0", n_layer=3, n_embd=128, head_dim=32)


def logits(path, critical, critical_from=None):
    m = load_model(path, n_ctx=64, critical=critical,
                   placement=None if critical is None else PlanRequest(mode="cpu", critical_from=critical_from))
    toks = torch.tensor([3, 17, 5, 9, 40, 2, 11, 23, 31, 8, 14, 6])
    cache = m.runner.new_cache(64)
    rows = [m.runner.prefill(toks[:8], 0, cache)[0]]
    rows += [m.runner.decode(int(t), 8 + i, cache)[0][None] for i, t in enumerate(toks[8:])]
    return m, torch.cat(rows).numpy()


def test_all_critical_from_the_file_is_full_precision_and_reads_no_residual(q4_model):
    _, full = logits(q4_model, None)
    m, src = logits(q4_model, "k", "source")
    _, pack = logits(q4_model, "k", "pack")
    assert m.plan.critical_from == "source"
    # the same weights and int8 activations as the full-precision path: only f32 rounding
    # differs (the pack's W_Q + W_R and D4 approximate the file)
    assert kl(full, src) < 0.05 * kl(full, pack), (kl(full, src), kl(full, pack))
    assert (full.argmax(-1) == src.argmax(-1)).all()
    # the pack's W_R and D4 are never touched; the file's experts are what runs
    assert not [n for n in m.weights.used if n.endswith((".wr", ".d4"))]
    assert {n for n in m.weights.source.used} == {f"blk.{i}.ffn_{p}_exps.weight" for i in range(3)
                                                  for p in ("gate", "up", "down")}


def test_some_critical_from_the_file_is_closer_than_from_the_pack(q4_model):
    _, full = logits(q4_model, None)
    _, src = logits(q4_model, 2, "source")
    _, pack = logits(q4_model, 2, "pack")
    assert kl(full, src) < kl(full, pack)


def test_bench_says_where_the_critical_experts_come_from():
    import json
    import subprocess
    import sys

    def bench(*extra):
        r = subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", "bench", "-m", "demo", "--critical", "2",
                            "-p", "8", "-n", "4", "--json", *extra], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)[1]  # the decode row

    # the demo asks for the pack's critical path (it shows the residual split); the flag
    # reaches bench's child process
    auto, src = bench(), bench("--critical-from", "source")
    assert "critical experts from the model file" in src["placement"]
    assert "model file" not in auto["placement"]
    assert auto["bytes_per_token"] != src["bytes_per_token"]


def test_where_the_int8_kernels_are_off_the_plan_takes_the_pack(q4_model):
    import os
    import subprocess
    import sys

    env = dict(os.environ, RAPIDMOE_GGML_F32ACT="1")  # GGUF matmuls on f32 activations: no int8 GEMV
    base = [sys.executable, "-m", "rapidmoe.app.cli", "-m", str(q4_model), "-p", "hi", "--critical", "2", "-n", "2",
            "--temp", "0", "--no-history", "--json"]
    r = subprocess.run(base, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert "model file" not in r.stdout  # auto: the pack's residuals
    r = subprocess.run(base + ["--critical-from", "source"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot run from the file" in r.stderr
