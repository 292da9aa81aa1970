"""Timing harness of the resplit kernels: validates against the oracle, then times.

Decode GEMV over a layer's worth of experts (default 8 experts x gate/up/down of
2048 x 768; each call takes other experts, so weights stream from DRAM), GB/s of
weight bytes per format and ISA path (each path in its own process: the path is
fixed at first use; avx2-novnni is AVX2 without AVX-VNNI), and quantizer throughput. Usage: python scripts/bench_resplit_kernels.py [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


CHILD = r"""
import json, sys, time
import numpy as np
from rapidmoe.engine import kernels
from rapidmoe.engine.quant import resplit_oracle as o
threads, E, H, F, reps = (int(a) for a in sys.argv[1:6])
kernels.set_num_threads(threads)
rng = np.random.default_rng(0)
res = {"isa": kernels.isa_info()["active"], "threads": kernels.num_threads()}
# 128 experts stored (well over the L3), selected ids spread out so weights come from DRAM.
W = (rng.standard_normal((4, F, H)) * 0.02).astype(np.float32)
base_q, base_r = kernels.resplit_quantize_wq_wr(W)
base_d4 = kernels.resplit_quantize("d4", (rng.standard_normal((4, H, F)) * 0.02).astype(np.float32))
mats = {"wq": (np.tile(base_q, (32, 1, 1)), H), "wr": (np.tile(base_r, (32, 1, 1)), H), "d4": (np.tile(base_d4, (32, 1, 1)), F)}
# Each call takes a different set of E of the 128 experts (disjoint sets cycle), so the
# weights come from DRAM as in a model, not from the last level cache; a low percentile is kept.
sets = np.arange(128 // E * E, dtype=np.int32).reshape(-1, E)
# "wqz": WQ of non-critical rows on z activations (isa_info()["wq_z_levels"]), where the path has them
zq = kernels.isa_info()["wq_z"]
for name, (q, n) in [*mats.items(), *([("wqz", mats["wq"])] if zq else [])]:
    fmt, z = ("wq", True) if name == "wqz" else (name, False)
    x = rng.standard_normal((E, n)).astype(np.float32)
    ids = sets[0]
    y = kernels.resplit_expert_matmul(fmt, q, n, ids, x, z=z)
    int8 = kernels.isa_info()["wr_int8"] if fmt == "wr" else res["isa"] != "scalar"
    xr = o.q8_activations(x, kernels.isa_info()["wq_z_levels"] if z else 127) if int8 else x  # SIMD WQ/D4 (and WR with VBMI) run on int8 x
    ref = np.stack([o.dequantize(fmt, q[e], n).astype(np.float64) @ xr[s] for s, e in enumerate(ids)])
    assert np.allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max()), name
    nbytes = sum(q[e].nbytes for e in ids)
    times = []
    for i in range(reps * len(sets)):
        t = time.perf_counter()
        kernels.resplit_expert_matmul(fmt, q, n, sets[i % len(sets)], x, z=z)
        times.append(time.perf_counter() - t)
    res[name] = nbytes / float(np.percentile(times, 20)) / 1e9
# quantizer throughput (weights per CPU-second, i.e. per core)
Wq = (rng.standard_normal((256, 2048)) * 0.02).astype(np.float32)
for name, fn in (("wq+wr", lambda: kernels.resplit_quantize_wq_wr(Wq)), ("wq", lambda: kernels.resplit_quantize("wq", Wq)),
                 ("d4", lambda: kernels.resplit_quantize("d4", Wq))):
    # CPU time of this process: on a shared machine wall time also counts other jobs' turns.
    fn(); t = time.process_time(); fn(); dt = time.process_time() - t
    res["quant_" + name] = Wq.size / dt / 1e6
# One MoE layer per token (decode), split execution with r critical of k = 8.
L = {}
for name, (shape, fmt) in {"gate": ((F, H), "qr"), "up": ((F, H), "qr"), "down": ((H, F), "q4")}.items():
    w = (rng.standard_normal((4,) + shape) * 0.02).astype(np.float32)
    if fmt == "qr":
        q, r = kernels.resplit_quantize_wq_wr(w)
        L[name + "_q"], L[name + "_r"] = np.tile(q, (16, 1, 1)), np.tile(r, (16, 1, 1))
    else:
        L["down_q"] = np.tile(kernels.resplit_quantize("wq", w), (16, 1, 1))
        L["down4"] = np.tile(kernels.resplit_quantize("d4", w), (16, 1, 1))
x = rng.standard_normal((1, H)).astype(np.float32)
lsets = np.arange(64, dtype=np.int32).reshape(8, 8)  # of 64 experts (> L3), a different 8 each call
wts = np.full((1, 8), 0.125, np.float32)
per = lambda k: L[k][0].nbytes  # noqa: E731
for r in (0, 2, 8):
    nbytes = (8 - r) * (per("gate_q") + per("up_q") + per("down_q")) + r * (
        per("gate_q") + per("up_q") + per("gate_r") + per("up_r") + per("down4"))
    nc = np.array([r], np.int32)
    kernels.resplit_moe_forward(x, lsets[:1], wts, nc, **L)
    times = []
    for i in range(reps * len(lsets)):
        t = time.perf_counter()
        kernels.resplit_moe_forward(x, lsets[i % len(lsets)][None, :], wts, nc, **L)
        times.append(time.perf_counter() - t)
    best = float(np.percentile(times, 20))
    res[f"layer_r{r}"] = (nbytes / 1e6, best * 1e3, nbytes / best / 1e9)
print(json.dumps(res))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    print(f"decode GEMV, {a.experts} experts x (ffn {a.ffn} x hidden {a.hidden}), {a.threads} threads; "
          "GB/s of weight bytes read; quantizers in M weights per CPU-second")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("WQ: on int8 activations (critical rows); WQ z: on z activations (non-critical rows), where there are")
    print(f"{'isa':>12} {'WQ GB/s':>9} {'WQ z':>9} {'WR GB/s':>9} {'D4 GB/s':>9} {'q WQ+WR':>9} {'q WQ':>9} "
          f"{'q D4':>9}")
    layers = []
    for isa in ("scalar", "avx2-novnni", "avx2", "avx512"):
        env = dict(os.environ, RAPIDMOE_ISA=isa)
        r = subprocess.run([sys.executable, "-c", CHILD, str(a.threads), str(a.experts), str(a.hidden), str(a.ffn),
                            str(a.reps)], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{isa:>12} failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        if d["isa"] != isa.split("-")[0]:
            print(f"{isa:>12} not available on this CPU (runs {d['isa']})")
            continue
        wqz = f"{d['wqz']:9.2f}" if "wqz" in d else f"{'-':>9}"
        print(f"{isa:>12} {d['wq']:9.2f} {wqz} {d['wr']:9.2f} {d['d4']:9.2f} {d['quant_wq+wr']:9.1f} "
              f"{d['quant_wq']:9.1f} {d['quant_d4']:9.1f}")
        layers.append((isa, d))
    print(f"\nMoE layer decode (moe_forward, 1 token, k = 8 of 64 experts, other experts each call, "
          f"hidden {a.hidden}, ffn {a.ffn})")
    print(f"{'isa':>12} " + " ".join(f"{'r=' + str(r) + ' MB / ms / GB/s':>24}" for r in (0, 2, 8)))
    for isa, d in layers:
        cells = [f"{d[f'layer_r{r}'][0]:6.2f} {d[f'layer_r{r}'][1]:7.3f} {d[f'layer_r{r}'][2]:7.2f}".rjust(24)
                 for r in (0, 2, 8)]
        print(f"{isa:>12} " + " ".join(cells))


if __name__ == "__main__":
    main()
