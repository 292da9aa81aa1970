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
from rapidmoe.engine.step import Step

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
                         parts["down4"])
    return ref(x, ids, w, Step(policy, prefill=x.shape[0] > 1))


def run_schedule(parts, policy, fraction, x, ids, w, hot=None):
    dev = StandInDevice()
    nbytes = wq_expert_bytes(parts["gate_q"], parts["up_q"], parts["down_q"])
    cached = choose_cached(1, E, nbytes, fraction_budget(1, E, nbytes, fraction), hot)[0]
    cache = build_layer_cache(dev, parts["gate_q"], parts["up_q"], parts["down_q"], cached)
    sched = SplitSchedule(0, parts, dev, cache)
    step = Step(policy, prefill=x.shape[0] > 1)
    out = dev.result(sched(x, ids, w, step))
    return out, sched, step


@pytest.mark.parametrize("fraction", [1.0, 0.25, 0.0])
@pytest.mark.parametrize("r", [0, 2, K])
@pytest.mark.parametrize("T", [1, 5])
def test_schedule_matches_cpu_split(parts, fraction, r, T):
    x, ids, w = routing(T, seed=10 * T + r)
    ref = reference(parts, FixedCritical(r), x, ids, w)
    out, sched, _ = run_schedule(parts, FixedCritical(r), fraction, x, ids, w)
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
    out, sched, step = run_schedule(parts, policy, 0.5, x, ids, w, hot=hot)
    assert (out - ref).norm() / ref.norm() < 1e-5
    assert list(step.r[0]) == [0, 1, 2, 3, 4, 1] and step.groups[0] == sched.stats.groups
    # with all four groups in play
    assert all(v > 0 for v in sched.stats.groups.values()), sched.stats.groups


def test_wrong_routing_is_detected(parts):
    """The comparison can fail: a different critical set changes the output."""
    x, ids, w = routing(2, seed=3)
    ref = reference(parts, FixedCritical(K), x, ids, w)
    out, _, _ = run_schedule(parts, FixedCritical(0), 1.0, x, ids, w)
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
