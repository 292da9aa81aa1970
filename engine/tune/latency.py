"""The latency model R(r) of this machine: seconds one MoE layer's split
execution takes with r critical experts per token, for decode (one token) and
prefill (per token of a chunk), timed on the real kernel with real routing; plus
what the rest of a decode step costs. UMIA's calibration spends its budget with it.

Decode's cost per critical expert comes from whole decode steps at several fixed
r, interleaved: what a budget buys is a share of a whole step, and a kernel timed
alone leaves out what the rest of the step does to its memory traffic.

The model is timed on the step the loaded plan runs. The CPU step's split layers
are also timed one by one (the kernel alone splits decode's intercept and gives
prefill's per-layer cost); the GPU step's layers are a schedule across two
devices, so there both phases come from whole steps only."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..errors import UserError

PREFILL_CHUNK = 64  # tokens per timed prefill call
QUIET_PCT = 20  # percentile of repeated timings taken as the cost
DECODE_STEPS = 40  # whole decode steps timed per fixed r


@dataclass(frozen=True)
class LatencyModel:
    decode: tuple[float, ...]  # R_decode(r), r = 0..k: seconds per layer per token
    prefill: tuple[float, ...]  # R_prefill(r): seconds per layer per token in a chunk
    decode_other_s: float  # per decode token: attention, router, head (everything but routed experts)
    n_moe_layers: int
    threads: int

    def to_json(self) -> dict:
        return {"decode_layer_s": list(self.decode), "prefill_layer_s": list(self.prefill),
                "decode_other_s": self.decode_other_s, "n_moe_layers": self.n_moe_layers, "threads": self.threads}

    @classmethod
    def from_json(cls, d: dict) -> "LatencyModel":
        return cls(tuple(float(v) for v in d["decode_layer_s"]), tuple(float(v) for v in d["prefill_layer_s"]),
                   float(d["decode_other_s"]), int(d["n_moe_layers"]), int(d["threads"]))

    def token_time(self, r_per_layer: list[np.ndarray], prefill: bool) -> float:
        """Mean seconds per token given the r each MoE layer chose for each token
        (r_per_layer: one int array [T] per MoE layer)."""
        R = np.asarray(self.prefill if prefill else self.decode)
        moe = sum(float(R[np.asarray(r)].mean()) for r in r_per_layer)
        return moe + (0.0 if prefill else self.decode_other_s)

    def fixed_time(self, r: int, prefill: bool) -> float:
        R = self.prefill if prefill else self.decode
        return self.n_moe_layers * R[r] + (0.0 if prefill else self.decode_other_s)


def line(r, v) -> tuple[float, float]:
    """(a, b) of v ≈ a + b·r by least squares, b >= 0: each critical expert adds the
    same work, and a straight line through noisy percentiles of a shared machine
    keeps the search from seeing free steps or negative costs."""
    b, a = np.polyfit(np.asarray(r, dtype=np.float64), np.asarray(v, dtype=np.float64), 1)
    return (float(a), float(b)) if b >= 0 else (float(np.mean(v)), 0.0)


def linear_fit(v) -> np.ndarray:
    """R(r) for r = 0..len(v)-1: the line through v[r]."""
    r = np.arange(len(v), dtype=np.float64)
    a, b = line(r, v)
    return np.maximum(a + b * r, 1e-9)


def decode_points(k: int) -> list[int]:
    """The fixed r whose whole decode steps are timed: 0, k and three between."""
    return sorted({round(k * i / 4) for i in range(5)})


def split_decode(step_a: float, step_b: float, layer_a: float, n_layers: int, k: int):
    """Whole decode steps cost step_a + step_b·r: per layer R(r) = a + (step_b / L)·r,
    with a the kernel's own per-layer cost at r = 0 (at most step_a / L) and the
    rest of step_a outside the experts. -> (R_decode [k + 1], other)."""
    a = min(max(layer_a, 0.0), step_a / n_layers)
    b = step_b / n_layers
    return np.maximum(a + b * np.arange(k + 1), 1e-9), max(0.0, step_a - n_layers * a)


def measure(model, ids_by_layer: dict[int, np.ndarray], w_by_layer: dict[int, np.ndarray],
            reps: int = 7, steps: int = DECODE_STEPS, progress=None) -> LatencyModel:
    """ids_by_layer/w_by_layer: routing recorded on real text, [N, k] per MoE layer
    (w sorted descending, ids in the same order). Times every MoE layer at every r,
    the r values interleaved so that load on a shared machine spreads evenly; then
    `steps` whole decode steps at each of decode_points(k), interleaved, for decode's
    cost per critical expert and what lies outside the experts."""
    if model.runner.gpu_step:
        return _measure_whole_steps(model, reps, steps, progress)
    experts = model.runner.split_layers()
    if not experts:
        raise UserError(f"{model.path.name} has no residual-split layers to time")
    k = model.cfg.n_expert_used
    H = model.cfg.n_embd
    rng = np.random.default_rng(0)
    dec = np.zeros((reps, k + 1, len(experts)))
    pre = np.zeros((reps, k + 1, len(experts)))
    points = decode_points(k)
    total = reps * (k + 1) + steps
    for rep in range(reps):
        for i, r in enumerate(rng.permutation(k + 1)):
            for j, e in enumerate(experts):
                ids, w = ids_by_layer[e.layer], w_by_layer[e.layer]
                t = rng.integers(0, max(1, len(ids) - PREFILL_CHUNK))
                parts = e.kernel_args
                x1 = rng.standard_normal((1, H), dtype=np.float32)
                t0 = time.perf_counter()
                kernels.resplit_moe_forward(x1, ids[t:t + 1], w[t:t + 1], np.full(1, r, np.int32), **parts)
                dec[rep, r, j] = time.perf_counter() - t0
                sl = slice(t, t + PREFILL_CHUNK)
                n = len(ids[sl])
                xc = rng.standard_normal((n, H), dtype=np.float32)
                t0 = time.perf_counter()
                kernels.resplit_moe_forward(xc, ids[sl], w[sl], np.full(n, r, np.int32), **parts)
                pre[rep, r, j] = (time.perf_counter() - t0) / n
            if progress:
                progress("latency", rep * (k + 1) + i + 1, total)
    # a low percentile over repetitions: what other processes on a shared machine
    # add only ever lengthens a call; then the mean over layers
    layer_a, _ = line(range(k + 1), np.percentile(dec, QUIET_PCT, axis=0).mean(axis=1))
    pre = linear_fit(np.percentile(pre, QUIET_PCT, axis=0).mean(axis=1))
    done = reps * (k + 1)
    step = _decode_steps(model, points, steps,
                         (lambda i: progress("latency", done + i, total)) if progress else None)
    dec, other = split_decode(*line(points, step), layer_a, len(experts), k)
    return LatencyModel(tuple(map(float, dec)), tuple(map(float, pre)), other, len(experts), kernels.num_threads())


def _measure_whole_steps(model, reps: int, steps: int, progress=None) -> LatencyModel:
    """The GPU step: decode from `steps` whole decode steps at each of
    decode_points(k), prefill from `reps` whole prefill calls of PREFILL_CHUNK
    tokens at each; both fitted by a line in r and shared evenly by the MoE layers
    (prefill's per-layer cost then holds its share of attention and the head)."""
    k = model.cfg.n_expert_used
    n_layers = len(model.net.moe_layers())
    points = decode_points(k)
    total = reps * len(points) + steps
    pre = _prefill_steps(model, points, reps, (lambda i: progress("latency", i, total)) if progress else None)
    a, b = line(points, pre)
    pre_r = np.maximum((a + b * np.arange(k + 1)) / n_layers, 1e-9)
    done = reps * len(points)
    step = _decode_steps(model, points, steps,
                         (lambda i: progress("latency", done + i, total)) if progress else None)
    dec, other = split_decode(*line(points, step), 0.0, n_layers, k)
    return LatencyModel(tuple(map(float, dec)), tuple(map(float, pre_r)), other, n_layers, kernels.num_threads())


def _prefill_steps(model, rs: list[int], reps: int, progress=None) -> list[float]:
    """Seconds per token of a whole prefill call of PREFILL_CHUNK tokens at each
    fixed r: `reps` calls each (after one warm-up round), the r values in a fresh
    random order every round, every call from position 0 of its own cache."""
    from ..moe.resplit import FixedCritical  # deferred: loads torch

    run = model.runner
    n = max(1, min(model.n_ctx, PREFILL_CHUNK))
    rng = np.random.default_rng(2)
    toks = [int(t) for t in rng.integers(0, model.cfg.n_vocab, n)]
    cache = run.new_cache(n)
    times: dict[int, list[float]] = {r: [] for r in rs}
    for i in range(reps + 1):
        for r in rng.permutation(rs):
            t0 = time.perf_counter()
            run.prefill(toks, 0, cache, FixedCritical(int(r)), last_only=True)
            if i:  # the first round warms up
                times[r].append((time.perf_counter() - t0) / n)
        if progress and i:
            progress(i * len(rs))
    return [float(np.percentile(times[r], QUIET_PCT)) for r in rs]


def _decode_steps(model, rs: list[int], n: int, progress=None) -> list[float]:
    """Time of one whole decode step at each fixed r: n steps each, the r values
    in a fresh random order every round, all at the same position (it wraps at n_ctx)."""
    from ..moe.resplit import FixedCritical  # deferred: loads torch

    run = model.runner
    ctx = max(1, min(model.n_ctx, n + 1))
    caches = {r: run.new_cache(ctx) for r in rs}
    policies = {r: FixedCritical(int(r)) for r in rs}
    times: dict[int, list[float]] = {r: [] for r in rs}
    rng = np.random.default_rng(1)
    for i in range(n + 1):
        pos = i % ctx
        for r in rng.permutation(rs):
            t0 = time.perf_counter()
            run.decode(17 + pos, pos, caches[r], policies[r])
            if i:  # the first round warms up
                times[r].append(time.perf_counter() - t0)
        if progress and i:
            progress(i)
    return [float(np.percentile(times[r], QUIET_PCT)) for r in rs]
