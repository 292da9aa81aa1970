"""Which experts' W_Q live on the GPU when not all fit (DESIGN.md §2, fallbacks):
the hottest (layer, expert) pairs first, within a byte budget; every other
expert runs W_Q on the CPU from the pack's bytes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def wq_expert_bytes(gate_q: np.ndarray, up_q: np.ndarray, down_q: np.ndarray) -> int:
    """Bytes of one expert's W_Q (gate + up + down)."""
    return int(gate_q[0].nbytes + up_q[0].nbytes + down_q[0].nbytes)


def choose_cached(n_layers: int, n_expert: int, expert_bytes: int, budget_bytes: int,
                  hotness: np.ndarray | None = None) -> list[np.ndarray]:
    """Expert ids to cache per layer, hottest first, total <= budget_bytes.
    hotness [n_layers, E]: routing counts or probabilities (None: all equal, so
    the budget is spread evenly over the layers)."""
    n_fit = max(0, min(n_layers * n_expert, budget_bytes // max(1, expert_bytes)))
    if hotness is None:
        hot = np.ones((n_layers, n_expert))
    else:
        hot = np.asarray(hotness, dtype=np.float64).reshape(n_layers, n_expert)
    share = hot / np.maximum(hot.sum(axis=1, keepdims=True), 1e-30)  # layers compare by share of their tokens
    layer, expert = np.meshgrid(np.arange(n_layers), np.arange(n_expert), indexing="ij")
    order = np.lexsort((layer.ravel(), expert.ravel(), -share.ravel()))[:n_fit]
    out = []
    for il in range(n_layers):
        sel = order[layer.ravel()[order] == il]
        e = expert.ravel()[sel]
        out.append(e[np.argsort(-share[il, e], kind="stable")].astype(np.int32))
    return out


def fraction_budget(n_layers: int, n_expert: int, expert_bytes: int, fraction: float) -> int:
    return int(round(fraction * n_layers * n_expert)) * expert_bytes


@dataclass
class LayerWQ:
    """One layer's cached W_Q on the device: gate/up [C, F, rb], down [C, H, rb];
    slot_of[e] = position of expert e in the cache, -1 when it is not cached."""
    gate: object
    up: object
    down: object
    slot_of: np.ndarray

    @property
    def n_cached(self) -> int:
        return int((self.slot_of >= 0).sum())


def build_layer_cache(device, gate_q: np.ndarray, up_q: np.ndarray, down_q: np.ndarray,
                      cached: np.ndarray) -> LayerWQ:
    E = gate_q.shape[0]
    slot_of = np.full(E, -1, dtype=np.int32)
    slot_of[cached] = np.arange(len(cached), dtype=np.int32)
    if len(cached) == E and np.array_equal(cached, np.arange(E)):
        parts = (gate_q, up_q, down_q)  # no gather copy of the whole stack
    else:
        parts = tuple(np.ascontiguousarray(a[cached]) for a in (gate_q, up_q, down_q))
    return LayerWQ(*(device.put(p) for p in parts), slot_of=slot_of)
