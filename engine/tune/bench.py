"""Speed and memory of one setting (model x critical-set policy x threads), as
llama-bench measures: pp (prompt tokens/s from an empty context, one batch) and
tg (decode tokens/s from an empty context), plus the bytes each decode token
reads and the machine's own read bandwidth."""
from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import numpy as np
import psutil
import torch
from filelock import FileLock

from .. import kernels
from ..generate import PREFILL_CHUNK
from ..gpu.profile import busy_fraction
from ..paths import cache_dir
from ..synth.arch import BENCH

BENCH_SEED = 0


def bench_model_path(progress=None) -> Path:
    """The synthetic qwen3moe with Qwen3-30B-A3B layer shapes (8 layers, 32
    experts, top-8, f16), written once into the cache dir."""
    from ..synth.model import write_synthetic  # deferred: loads gguf

    d = cache_dir() / "bench"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"bench-qwen3moe-a3b-shapes-s{BENCH_SEED}-ctx{BENCH['n_ctx']}.f16.gguf"
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            if progress:
                progress("bench model", 0, 1)
            write_synthetic(path, "bench", seed=BENCH_SEED)
            if progress:
                progress("bench model", 1, 1)
    return path


def decode_bytes_per_token(model, mean_r: float) -> int:
    """Weight bytes one decode token reads: every non-expert matrix (not the
    embedding table: one row) plus, per MoE layer, k experts' worth in the
    formats the critical-set size implies (a critical expert: W_Q + W_R gate/up and D4
    down, or the source file's gate/up/down where the plan runs it from there)."""
    W = model.weights
    cfg = model.cfg
    total = 0
    expert_names = set()
    for name in W.used:
        t = W.gguf.tensors[name]
        if "_exps." in name:
            expert_names.add(name)
        elif name != "token_embd.weight":
            total += t.nbytes
    if "output.weight" not in W.used:  # tied head reads the whole table
        total += W.gguf.tensors["token_embd.weight"].nbytes
    k = cfg.n_expert_used
    per_layer = 0.0
    layers = {n.split(".")[1] for n in expert_names}
    for il in layers:
        def per_expert(name, g=W.gguf):
            t = g.tensors.get(f"blk.{il}.{name}")
            return t.nbytes / cfg.n_expert if t is not None else 0.0
        if model.critical is None:
            per_layer += k * sum(per_expert(f"ffn_{p}_exps.weight") for p in ("gate", "up", "down"))
        else:
            wq = sum(per_expert(f"ffn_{p}_exps.wq") for p in ("gate", "up", "down"))
            crit = (per_expert("ffn_gate_exps.wq") + per_expert("ffn_up_exps.wq") + per_expert("ffn_gate_exps.wr")
                    + per_expert("ffn_up_exps.wr") + per_expert("ffn_down_exps.d4"))
            if W.source is not None:
                crit = sum(per_expert(f"ffn_{p}_exps.weight", W.source.gguf) for p in ("gate", "up", "down"))
            per_layer += mean_r * crit + (k - mean_r) * wq
    return int(total + per_layer)


def resident_model_bytes(model) -> int:
    W = model.weights
    src = W.source
    return int(sum(W.gguf.tensors[n].nbytes for n in W.used)
               + (sum(src.gguf.tensors[n].nbytes for n in src.used) if src is not None else 0))


def run_setting(spec, critical, threads: int, n_prompt: int, n_gen: int, rss0: int,
                read_gbs: float | None, placement=None, depth: int = 0) -> list[dict]:
    """read_gbs: the machine's read bandwidth, measured by the caller (the probe's
    buffer must not count in this process's peak RSS); None when not measured.
    placement: the plan request (engine.plan.planner.PlanRequest) the model loads with.
    depth: context filled (untimed, in prefill chunks) before both tests, as
    llama-bench's -d: tg runs at positions depth.., pp over them."""
    from ..loader import load_model  # deferred: loads gguf

    kernels.set_num_threads(threads)
    torch.set_num_threads(threads)
    bw = read_gbs
    model = load_model(spec, n_ctx=depth + n_prompt + n_gen + 1, critical=critical, placement=placement)
    # touch every weight once so pages are resident before timing (as mmap + warm-up does)
    rng = np.random.default_rng(0)
    V = model.cfg.n_vocab
    prompt = torch.from_numpy(rng.integers(10, V - 10, n_prompt))
    run = model.runner
    cache = run.new_cache(model.n_ctx)
    run.prefill(prompt[:16], 0, cache, last_only=True)  # warm-up: weights paged in
    # decode first, so its peak RSS is read before prefill's larger activations exist
    cache = run.new_cache(model.n_ctx)
    fill = rng.integers(10, V - 10, depth)
    for i in range(0, depth, PREFILL_CHUNK):
        run.prefill(torch.from_numpy(fill[i:i + PREFILL_CHUNK]), i, cache, last_only=True)
    toks = rng.integers(10, V - 10, n_gen)
    run.decode(int(toks[0]), depth, cache)  # warm-up token at position depth
    traces = []
    t0 = time.perf_counter()
    for i in range(n_gen):
        traces.append(run.decode(int(toks[i]), depth + i + 1, cache)[1])
    t_tg = time.perf_counter() - t0
    rs = [t.mean_r for t in traces]
    peak_decode = _peak_rss()
    t0 = time.perf_counter()  # the prompt over the same filled context (the decoded rows are overwritten)
    pp_r = run.prefill(prompt, depth, cache, last_only=True)[1].mean_r
    t_pp = time.perf_counter() - t0
    peak = _peak_rss()
    r_vals = [r for r in rs if r is not None]
    mean_r = float(np.mean(r_vals)) if r_vals else None
    bpt = decode_bytes_per_token(model, mean_r if mean_r is not None else 0.0)
    base = {"model": Path(model.path).name, "critical": model.critical if model.critical is not None else -1,
            "precision": "full" if model.critical is None else "split",
            "policy": None if model.critical is None else "umia" if model.critical == "auto" else "fixed",
            "threads": threads, "placement": model.placement,
            "peak_rss_bytes": int(peak), "rss_after_imports_bytes": int(rss0),
            "model_bytes": resident_model_bytes(model), "kv_type": run.kv_type, "kv_bytes": cache.nbytes,
            "depth": depth,
            "read_bandwidth_gbs": round(bw, 2) if bw else None}
    tg = n_gen / t_tg
    at = f" @ d{depth}" if depth else ""
    rows = [
        {**base, "test": f"pp{n_prompt}" + at, "tokens_per_s": round(n_prompt / t_pp, 2), "bytes_per_token": None,
         "achieved_gbs": None, "mean_r": pp_r},
        {**base, "test": f"tg{n_gen}" + at, "peak_rss_bytes": int(peak_decode), "tokens_per_s": round(tg, 2), "bytes_per_token": bpt,
         "achieved_gbs": round(bpt * tg / 1e9, 2), "mean_r": mean_r},
    ]
    if run.gpu_step:
        rows[1]["gpu_step"] = gpu_step_figures(model, traces, cache, n_gen + 1, int(toks[0]))
    return rows


def gpu_step_figures(model, traces, cache, pos: int, token: int) -> dict:
    """Per decode token of the GPU step: the CPU's expert work per MoE layer, host
    waits, orchestration (host time neither computing experts nor waiting) and, on
    a real GPU, how busy it was over one more step."""
    n_moe = max(1, len(model.net.moe_layers()))
    step = float(np.mean([t.seconds for t in traces]))
    orch = float(np.mean([t.orchestration_s for t in traces]))
    out = {"step_ms": round(step * 1e3, 3),
           "cpu_expert_ms_per_layer": round(float(np.mean([t.cpu_expert_s for t in traces])) / n_moe * 1e3, 4),
           "host_wait_ms": round(float(np.mean([t.host_wait_s for t in traces])) * 1e3, 3),
           "orchestration_ms": round(orch * 1e3, 3), "orchestration_frac": round(orch / step, 4) if step else None,
           "gpu_busy_frac": None, "decode_graphs": model.runner.graph_summary()}
    if torch.cuda.is_available() and model.plan is not None and model.plan.mode != "cpu" \
            and model.plan.gpu_layers and not model.placement.startswith("stand-in"):
        busy, wall = busy_fraction(lambda: model.runner.decode(token, pos, cache))
        out["gpu_busy_frac"] = round(busy / wall, 4) if wall else None
    return out


def _peak_rss() -> int:
    """This process's own RSS high-water mark. ru_maxrss is not it: an exec'd
    child starts from its parent's mark."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_now() -> int:
    return psutil.Process(os.getpid()).memory_info().rss
