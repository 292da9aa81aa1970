"""Validate, then time the GGUF-type CPU kernels (rapidmoe.engine.kernels.ggml_*).

Per type and ISA path (each path in its own process, RAPIDMOE_ISA), 1 and 2
threads:
  * GEMV (T=1) GB/s of weight bytes on 2048 x 8192 matrices, cycling through
    enough copies that the set is several times the last-level cache, next to a
    STREAM-like read bandwidth measured in the same process;
  * GEMM at T=512 in GFLOP/s next to torch's f32 matmul of the dequantized matrix.

    python scripts/bench_ggml_kernels.py [--types Q4_K,Q8_0] [--isa avx512] [--threads 1,2] [--act int8,f32]

--act: the GEMV's activations, int8 (the default kernels for T <= 8 of the
integer types) or f32 (RAPIDMOE_GGML_F32ACT=1, the exact f32 path), run one
after the other per setting; a summary gives int8 / f32 per type. The ISA
avx512-novnni is the AVX-512 int8 path without VNNI instructions.

Figures are wall clock, best of a few runs; in parentheses the same work over
the calling thread's CPU time, which other processes on a shared machine do not
inflate.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import gguf
import numpy as np
from gguf import GGMLQuantizationType as G

ALL_TYPES = ["Q8_0", "Q4_K", "Q6_K", "F16", "BF16", "F32", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K"]
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
ROWS, K, T_GEMM = 2048, 8192, 512
WORKING_SET = 160 << 20  # bytes of distinct weights cycled through by the GEMV timing


def random_tensor(rng, name: str, rows: int, k: int) -> np.ndarray:
    qtype = G[name]
    if name == "F32":
        return rng.standard_normal((rows, k), dtype=np.float32).view(np.uint8)
    if name == "F16":
        return rng.standard_normal((rows, k), dtype=np.float32).astype(np.float16).view(np.uint8)
    if name == "BF16":
        return (rng.standard_normal((rows, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * k // block
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        raw[:, off:off + 2] = (rng.standard_normal(nb, dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, -1)


def best_time(fn, reps: int, clock=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def best_times(fn, reps: int) -> tuple[float, float]:
    """(wall, cpu) best of reps. The cpu figure is the calling thread's CPU time,
    which on a shared machine is not inflated by other processes; with n threads
    the caller runs 1/n of the rows, so it still stands for the whole call."""
    return best_time(fn, reps), best_time(fn, reps, time.thread_time)


def read_bandwidth() -> float:
    """STREAM-like DRAM read GB/s with the kernel threads (the probe `bench` uses)."""
    from rapidmoe.engine import kernels

    return max(kernels.read_bandwidth_gbs(1 << 29) for _ in range(2))


def validate(kernels, name: str) -> None:
    rng = np.random.default_rng(7)
    w = random_tensor(rng, name, 48, 512)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    wf = gguf.quants.dequantize(w, G[name]).astype(np.float32)
    got = kernels.ggml_dequantize(w, int(G[name]), wf.size)
    if not np.array_equal(got.view(np.uint32), wf.reshape(-1).view(np.uint32)):
        raise SystemExit(f"{name}: dequantize differs from gguf-py")
    xr, w64 = x.astype(np.float64), wf.astype(np.float64)
    if name == "F16":  # llama.cpp's vec_dot_type: the activations are rounded to the weight's type first
        xr = x.astype(np.float16).astype(np.float64)
    elif name == "BF16":  # round to nearest even, as the kernels do
        u = x.view(np.uint32).astype(np.uint64)
        xr = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    ref = xr @ w64.T
    mag = np.abs(xr) @ np.abs(w64).T
    if os.environ.get("RAPIDMOE_GGML_F32ACT") != "1" and name in INT8_TYPES:
        # the int8 path computes deq(W) @ q8(x); Q4_1 / Q5_1 take their min times q8_1's sum term s
        xr, s = q8(x, 256 if name.endswith("_K") else 32)
        if name in ("Q4_1", "Q5_1"):
            blocks = w.reshape(-1, gguf.GGML_QUANT_SIZES[G[name]][1]).copy()
            m = blocks[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(w.shape[0], -1)
            blocks[:, 2:4] = 0  # d * c alone
            w64 = gguf.quants.dequantize(blocks.reshape(w.shape), G[name]).astype(np.float64)
            ref = xr @ w64.T + s @ m.T
            mag = np.abs(xr) @ np.abs(w64).T + np.abs(s) @ np.abs(m).T
        else:
            ref = xr @ w64.T
            mag = np.abs(xr) @ np.abs(w64).T
    err = np.abs(kernels.ggml_matmul(w, int(G[name]), x) - ref)
    if np.any(err > 1e-5 * mag):
        raise SystemExit(f"{name}: matmul error above bound")


INT8_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def q8(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Activations as the int8 GEMV sees them (llama.cpp's q8_0 / q8_1 / q8_K): per
    group d = amax/127 (rounded to f16 for groups of 32), q = rint(x * 127/amax).
    Returns d * q [T, k] and, per group, s = f16(d * sum q) (float64)."""
    T, k = x.shape
    xg = x.reshape(T, k // group, group)
    amax = np.abs(xg).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xg * inv)
    d = amax / np.float32(127)
    s = (d * q.sum(-1, keepdims=True, dtype=np.float32)).astype(np.float16).astype(np.float64)
    if group == 32:
        d = d.astype(np.float16).astype(np.float32)
    return (d.astype(np.float64) * q).reshape(T, k), s.reshape(T, -1)


def worker(types: list[str], threads: list[int], gemm: bool) -> None:
    import torch

    from rapidmoe.engine import kernels

    (n,) = threads
    kernels.set_num_threads(n)  # before any parallel work
    torch.set_num_threads(n)
    isa = kernels.isa_info()["active"]
    rng = np.random.default_rng(0)
    for name in types:
        validate(kernels, name)
        qtype = int(G[name])
        w0 = random_tensor(rng, name, ROWS, K)
        copies = [w0] + [random_tensor(rng, name, ROWS, K) for _ in range(max(0, WORKING_SET // w0.nbytes - 1))]
        x1 = rng.standard_normal((1, K)).astype(np.float32)
        for n in threads:
            reps = 3 if isa != "scalar" else 1

            def gemv_all():
                for w in copies:
                    kernels.ggml_matmul(w, qtype, x1)

            gemv_all()
            nbytes = sum(w.nbytes for w in copies)
            wall, cpu = best_times(gemv_all, reps)
            bw = read_bandwidth()  # next to each GEMV timing: the load of a shared machine drifts
            act = "f32" if os.environ.get("RAPIDMOE_GGML_F32ACT") == "1" or name not in INT8_TYPES else "int8"
            if os.environ.get("RAPIDMOE_ISA") == "avx512-novnni":
                isa = "avx512-novnni"
            row = {"type": name, "isa": isa, "act": act, "threads": n, "gemv_gbs": nbytes / wall / 1e9,
                   "gemv_gbs_cpu": nbytes / cpu / 1e9, "read_gbs": bw, "weight_mb": w0.nbytes / 1e6}
            row["gemv_frac"] = row["gemv_gbs"] / bw
            if gemm and isa != "scalar":
                x = rng.standard_normal((T_GEMM, K)).astype(np.float32)
                flop = 2.0 * T_GEMM * ROWS * K
                kernels.ggml_matmul(w0, qtype, x)
                wall, cpu = best_times(lambda: kernels.ggml_matmul(w0, qtype, x), 2)
                row["gemm_gflops"], row["gemm_gflops_cpu"] = flop / wall / 1e9, flop / cpu / 1e9
                wt = torch.from_numpy(kernels.ggml_dequantize(w0, qtype, ROWS * K).reshape(ROWS, K))
                xt = torch.from_numpy(x)
                torch.matmul(xt, wt.T)
                wall, cpu = best_times(lambda: torch.matmul(xt, wt.T), 2)
                row["torch_f32_gflops"], row["torch_f32_gflops_cpu"] = flop / wall / 1e9, flop / cpu / 1e9
            print(json.dumps(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(ALL_TYPES))
    ap.add_argument("--isa", default="scalar,avx2,avx512")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--act", default="int8,f32", help="GEMV activations: int8 and/or f32")
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print JSON rows only")
    args = ap.parse_args()
    types = args.types.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    if args.worker:
        worker(types, threads, not args.no_gemm)
        return 0
    from rapidmoe.engine import kernels

    info = kernels.isa_info()
    rows = []
    for isa in args.isa.split(","):
        base = isa.split("-")[0]
        if base != "scalar" and not info.get(base):
            print(f"skipping {isa}: not available on this CPU", file=sys.stderr)
            continue
        for n in threads:  # one process per setting: the ISA is fixed per process, threads set before any work
            for act in args.act.split(","):
                if act == "f32" and isa.endswith("novnni"):
                    continue  # the same f32 kernels as avx512
                cmd = [sys.executable, __file__, "--worker", "--types", args.types, "--threads", str(n)]
                if args.no_gemm:
                    cmd.append("--no-gemm")
                env = dict(os.environ, RAPIDMOE_ISA=isa, RAPIDMOE_GGML_F32ACT="1" if act == "f32" else "0")
                with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
                    for line in proc.stdout:
                        rows.append(report(line, args.json))
                if proc.returncode != 0:
                    return proc.returncode or 1
    if args.json:
        print(json.dumps(rows))
    else:
        summary(rows)
    return 0


def summary(rows: list[dict]) -> None:
    """int8 / f32 GEMV speed per type, ISA and thread count (wall, and CPU time in parentheses)."""
    f32 = {(r["type"], r["isa"].split("-")[0], r["threads"]): r for r in rows if r["act"] == "f32"}
    lines = []
    for r in rows:
        o = f32.get((r["type"], r["isa"].split("-")[0], r["threads"]))
        if r["act"] == "int8" and o:
            lines.append(f"{r['type']:5} {r['isa']:13} {r['threads']}t | int8 {r['gemv_gbs']:5.1f} ({r['gemv_gbs_cpu']:5.1f})"
                         f" vs f32 {o['gemv_gbs']:5.1f} ({o['gemv_gbs_cpu']:5.1f}) GB/s = x{r['gemv_gbs'] / o['gemv_gbs']:.2f}"
                         f" (x{r['gemv_gbs_cpu'] / o['gemv_gbs_cpu']:.2f})")
    if lines:
        print("\nGEMV T=1, int8 vs f32 activations, GB/s of weights, wall (cpu):")
        print("\n".join(lines))


def report(line: str, quiet: bool) -> dict:
    r = json.loads(line)
    if not quiet:
        gemm = (f" | gemm T=512 {r['gemm_gflops']:5.1f} ({r['gemm_gflops_cpu']:5.1f}) GFLOP/s,"
                f" torch f32 {r['torch_f32_gflops']:5.1f} ({r['torch_f32_gflops_cpu']:5.1f})"
                if "gemm_gflops" in r else "")
        print(f"{r['type']:5} {r['isa']:13} {r['act']:4} {r['threads']}t | gemv {r['gemv_gbs']:5.2f} ({r['gemv_gbs_cpu']:5.2f}) GB/s"
              f" = {100 * r['gemv_frac']:3.0f}% of read {r['read_gbs']:5.2f}{gemm}", flush=True)
    return r


if __name__ == "__main__":
    raise SystemExit(main())
