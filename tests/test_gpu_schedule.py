"""The GPU residual-split schedule with CPU tensors standing in for the device:
its combine must equal the CPU split path (ResplitExperts) under the same
routing, for every mix of critical / non-critical and cached / uncached slots."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rapidmoe.engine import kernels
from rapidmoe.engine.gpu.device import StandInDevice
from rapidmoe.engine.gpu.schedule import SplitSchedule, plan_slots
from rapidmoe.engine.gpu.wq_cache import build_layer_cache, choose_cached, fraction_budget, wq_expert_bytes
from rapidmoe.engine.moe.resplit import FixedCritical, ResplitExperts

E, H, FF, K = 16, 256, 128, 4


@pytest.fixture(scope="module")
def parts():
    rng = np.random.default_rng(7)
    gate = (rng.standard_normal((E, FF, H)) * 0.05).astype(np.float32)
    up = (rng.standard_normal((E, FF, H)) * 0.05).astype(np.float32)
    down = (rng.standard_normal((E, H, FF)) * 0.05).astype(np.float32)
    gq, gr = kernels.resplit_quantize_wq_wr(gate)
    uq, ur = kernels.resplit_quantize_wq_wr(up)
    return {"gate_q": gq, "up_q": uq, "down_q": kernels.resplit_quantize("wq", down),
            "gate_r": gr, "up_r": ur, "down4": kernels.resplit_quantize("d4", down)}


class PerToken:
    """A policy giving each token its own r (as UMIA does)."""

    def __init__(self, r):
        self.r = np.asarray(r, np.int32)

    def __call__(self, w, layer, prefill):
        return self.r[: w.shape[0]].copy()


def routing(T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])  # [T, K] distinct per token
    w = torch.softmax(torch.randn(T, K, generator=g), dim=1)
    x = torch.randn(T, H, generator=g)
    return x, ids, w


def reference(parts, policy, x, ids, w):
    ref = ResplitExperts(0, parts["gate_q"], parts["up_q"], parts["down_q"], parts["gate_r"], parts["up_r"],
                         parts["down4"], policy)
    return ref(x, ids, w)


def run_schedule(parts, policy, fraction, x, ids, w, hot=None):
    dev = StandInDevice()
    nbytes = wq_expert_bytes(parts["gate_q"], parts["up_q"], parts["down_q"])
    cached = choose_cached(1, E, nbytes, fraction_budget(1, E, nbytes, fraction), hot)[0]
    cache = build_layer_cache(dev, parts["gate_q"], parts["up_q"], parts["down_q"], cached)
    sched = SplitSchedule(0, parts, policy, dev, cache)
    out = dev.result(sched(x, ids, w))
    return out, sched


@pytest.mark.parametrize("fraction", [1.0, 0.25, 0.0])
@pytest.mark.parametrize("r", [0, 2, K])
@pytest.mark.parametrize("T", [1, 5])
def test_schedule_matches_cpu_split(parts, fraction, r, T):
    x, ids, w = routing(T, seed=10 * T + r)
    ref = reference(parts, FixedCritical(r), x, ids, w)
    out, sched = run_schedule(parts, FixedCritical(r), fraction, x, ids, w)
    rel = (out - ref).norm() / ref.norm()
    assert rel < 1e-5, rel
    g = sched.stats.groups
    assert g["A"] + g["B"] == T * r and sum(g.values()) == T * K
    if fraction == 1.0:
        assert g["B"] == g["D"] == 0
    if fraction == 0.0:
        assert g["A"] == g["C"] == 0


def test_per_token_r_and_hot_cache(parts):
    T = 6
    x, ids, w = routing(T, seed=99)
    policy = PerToken([0, 1, 2, 3, 4, 1])
    hot = np.zeros((1, E))
    hot[0, ids[:3].reshape(-1).numpy()] = 10.0  # the first tokens' experts are the hot ones
    ref = reference(parts, policy, x, ids, w)
    out, sched = run_schedule(parts, policy, 0.5, x, ids, w, hot=hot)
    assert (out - ref).norm() / ref.norm() < 1e-5
    assert list(sched.last_r) == [0, 1, 2, 3, 4, 1]
    # with all four groups in play
    assert all(v > 0 for v in sched.stats.groups.values()), sched.stats.groups


def test_wrong_routing_is_detected(parts):
    """The comparison can fail: a different critical set changes the output."""
    x, ids, w = routing(2, seed=3)
    ref = reference(parts, FixedCritical(K), x, ids, w)
    out, _ = run_schedule(parts, FixedCritical(0), 1.0, x, ids, w)
    assert (out - ref).norm() / ref.norm() > 1e-3


def test_choose_cached_hottest_first_within_budget():
    hot = np.array([[1, 9, 3, 0], [5, 5, 0, 10]], dtype=float)
    got = choose_cached(2, 4, expert_bytes=100, budget_bytes=450, hotness=hot)
    assert sum(len(c) for c in got) == 4
    # shares of their layer's tokens: L0 e1 .69, L1 e3 .50, L1 e0 .25, L1 e1 .25 beat L0 e2 .23
    assert list(got[0]) == [1] and list(got[1]) == [3, 0, 1]
    even = choose_cached(3, 8, expert_bytes=10, budget_bytes=10 * 12)
    assert [len(c) for c in even] == [4, 4, 4]
    assert choose_cached(2, 4, 100, 10**9)[0].tolist() == [0, 1, 2, 3]
    assert all(len(c) == 0 for c in choose_cached(2, 4, 100, 99))


def test_plan_slots_groups():
    ids = np.array([[3, 1, 2], [0, 3, 1]])
    w = np.array([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]], np.float32)
    slot_of = np.array([0, -1, 1, 2], np.int32)  # expert 1 uncached
    plan = plan_slots(ids, w, np.array([1, 2]), slot_of)
    assert plan.crit.tolist() == [True, False, False, True, True, False]
    assert plan.group(True, True).tolist() == [0, 3, 4]
    assert plan.group(False, False).tolist() == [1, 5]
    assert plan.group(False, True).tolist() == [2]


def test_attach_gpu_experts_to_a_loaded_model(tmp_path):
    """A whole residual-split model with its experts moved onto the (stand-in)
    device, a quarter of W_Q cached: same logits as the CPU split path."""
    from rapidmoe.engine.gpu.executor import GpuSplitExperts, attach_gpu_experts
    from rapidmoe.engine.model import load_model
    from rapidmoe.engine.synth import write_synthetic

    src = write_synthetic(tmp_path / "m.gguf", "qwen3moe", seed=5, dtype="f16", n_layer=2)
    m = load_model(src, n_ctx=16, critical=2)
    toks = torch.tensor([1, 40, 300, 7, 9])
    ref = m.net.forward(toks, 0, m.net.new_cache(16))
    ex = m.net.blocks[0].ffn.experts
    per_layer = wq_expert_bytes(ex.gate_q, ex.up_q, ex.down_q) * ex.gate_q.shape[0]
    placed = attach_gpu_experts(m.net, StandInDevice(), budget_bytes=per_layer // 2)  # half of one of two layers
    assert placed.layers == 2 and placed.cached_experts == ex.gate_q.shape[0] // 2
    assert all(isinstance(b.ffn.experts, GpuSplitExperts) for b in m.net.blocks)
    out = m.net.forward(toks, 0, m.net.new_cache(16))
    assert float((out - ref).norm() / ref.norm()) < 1e-5
    assert m.net.critical_sizes() == (2, 2)


def test_layers_split_across_devices(tmp_path):
    from rapidmoe.engine.gpu.executor import attach_gpu_experts
    from rapidmoe.engine.model import load_model
    from rapidmoe.engine.synth import write_synthetic

    src = write_synthetic(tmp_path / "m.gguf", "qwen3moe", seed=6, dtype="f16", n_layer=3)
    m = load_model(src, n_ctx=16, critical=1)
    toks = torch.tensor([3, 9, 27])
    ref = m.net.forward(toks, 0, m.net.new_cache(16))
    devs = [StandInDevice(), StandInDevice()]
    placed = attach_gpu_experts(m.net, devs, budget_bytes=10**12)
    assert placed.layers == 3 and placed.cached_experts == placed.total_experts
    assert [b.ffn.experts.device for b in m.net.blocks] == [devs[0], devs[1], devs[1]]
    out = m.net.forward(toks, 0, m.net.new_cache(16))
    assert float((out - ref).norm() / ref.norm()) < 1e-5
