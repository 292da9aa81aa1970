"""The GPU path's device check (run by tests/gpu/check.sh; about 6 minutes on one
H200): kernels vs references, NVRTC vs nvcc, bandwidth, GPU-vs-CPU split
correctness with forced routing, and one table of decode / prefill speed on
DeepSeek-V3-shaped layers. `--standin` runs the same flow with CPU tensors in
place of the GPU (small expert count), to test the script itself anywhere."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import dsv3  # noqa: E402
from dsv3 import H, K  # noqa: E402
from rapidmoe.engine import kernels  # noqa: E402
from rapidmoe.engine.gpu.device import CudaDevice, StandInDevice  # noqa: E402
from rapidmoe.engine.gpu.reference import split_layer_reference  # noqa: E402
from rapidmoe.engine.gpu.schedule import SplitSchedule  # noqa: E402
from rapidmoe.engine.gpu.wq_cache import build_layer_cache, choose_cached, fraction_budget  # noqa: E402
from rapidmoe.engine.moe.resplit import FixedCritical, ResplitExperts  # noqa: E402
from rapidmoe.engine.step import Step  # noqa: E402

BOUND_SPLIT = 1e-2  # GPU path vs CPU split path, same routing: relative error of the layer output
N_LAYERS_V3 = 61


def table(rows, head):
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([line(head), line(["-" * x for x in w])] + [line(r) for r in rows])


def umia_policy():
    try:
        from rapidmoe.engine.moe.umia import DEFAULT_ALPHA_RANGE, DEFAULT_BETA, DEFAULT_SHARE, UmiaPolicy, UmiaProfile, smooth_alpha
    except ImportError:
        return None
    prof = UmiaProfile(alpha=smooth_alpha(N_LAYERS_V3, *DEFAULT_ALPHA_RANGE), beta_prefill=DEFAULT_BETA["prefill"],
                       beta_decode=DEFAULT_BETA["decode"], theta=DEFAULT_SHARE * dsv3.SCALE / K, r_min=1, r_max=K)
    return UmiaPolicy(prof, K)


def caches(dev, layers, fraction):
    nbytes = layers[0].wq_bytes_per_expert
    E = layers[0].E
    chosen = choose_cached(len(layers), E, nbytes, fraction_budget(len(layers), E, nbytes, fraction))
    return [build_layer_cache(dev, L.parts["gate_q"], L.parts["up_q"], L.parts["down_q"], c) for L, c in zip(layers, chosen)]


CASES = [  # (tokens, r, W_Q cache fraction, experts routed to: None = all 256)
    (1, 2, 1.0, None), (1, K, 0.25, None), (4, 0, 0.25, None), (4, 3, 1.0, None),
    (64, 2, 1.0, 16), (64, K, 0.25, 16),  # 64 tokens over 16 experts: the prefill GEMM path
]


def correctness(layer, dev, cache_sets, devname, out, against_oracle: bool = True) -> bool:
    """GPU split vs CPU split (ResplitExperts) vs the float64 oracle, routing forced.
    against_oracle=False: only GPU vs CPU counts (the stand-in's 'GPU' is the CPU)."""
    ok = True
    g = torch.Generator().manual_seed(11)
    p = layer.parts
    for T, r, frac, n_used in CASES:
        pool = torch.randperm(layer.E, generator=g)[: n_used or layer.E]
        ids = torch.stack([pool[torch.randperm(len(pool), generator=g)[:K]] for _ in range(T)])
        w = torch.softmax(torch.randn(T, K, generator=g), 1) * dsv3.SCALE
        h = dsv3.rms(torch.randn(T, H, generator=g))
        st = Step(FixedCritical(r), prefill=T > 1, fused=False)
        ex = ResplitExperts(0, p["gate_q"], p["up_q"], p["down_q"], p["gate_r"], p["up_r"], p["down4"])
        if against_oracle:
            cpu = ex(h, ids, w, st).double()
        else:  # the stand-in runs the CPU's per-row kernels: each token alone takes them
            cpu = torch.cat([ex(h[t:t + 1], ids[t:t + 1], w[t:t + 1], st) for t in range(T)]).double()
        sched = SplitSchedule(3, p, dev, cache_sets[frac][0])
        got = dev.result(sched(h.to(devname), ids.to(devname), w.to(devname), st)).cpu().double()
        order = torch.argsort(w, dim=1, descending=True, stable=True)
        ref = torch.from_numpy(split_layer_reference(p, h.numpy(), ids.gather(1, order).numpy(),
                                                     w.gather(1, order).numpy(), np.full(T, r)))
        e_gc, e_go, e_co = (float((a - b).norm() / b.norm()) for a, b in ((got, cpu), (got, ref), (cpu, ref)))
        good = e_gc <= BOUND_SPLIT and (e_go <= BOUND_SPLIT or not against_oracle)
        ok &= good
        out.append((f"T={T} r={r} cache={frac:.0%}" + (f" ({n_used} experts)" if n_used else ""),
                    f"{e_gc:.2e}", f"{e_go:.2e}", f"{e_co:.2e}", f"<= {BOUND_SPLIT:.0e}", "ok" if good else "FAIL"))
    return ok


CORR_HEAD = ["case", "GPU vs CPU split", "GPU vs oracle", "CPU vs oracle", "bound (first two)", ""]


def correctness_only() -> int:
    """Run in a subprocess with RAPIDMOE_ISA=scalar: the CPU kernels then use float
    activations, so the comparison isolates the GPU path (the SIMD CPU kernels'
    int8 activations alone move outputs by ~1%)."""
    kernels.set_num_threads(0)
    dev = CudaDevice("cuda")
    layer = dsv3.Layer(100, torch.device("cuda"))
    cache_sets = {f: caches(dev, [layer], f) for f in (1.0, 0.25)}
    rows = []
    ok = bool(guarded("split correctness", correctness, layer, dev, cache_sets, "cuda", rows))
    print(f"\n== GPU split vs CPU split, forced routing (CPU kernels: {kernels.isa_info().get('active')})\n"
          + table(rows, CORR_HEAD))
    return 0 if ok else 1


def correctness_subprocess() -> bool:
    import subprocess

    env = dict(os.environ, RAPIDMOE_ISA="scalar")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--correctness-only"], env=env, timeout=300)
    return r.returncode == 0


def sync(devname):
    if devname == "cuda":
        torch.cuda.synchronize()


def run_decode(layers, scheds, dev, devname, steps, pol, trace):
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(1)).to(devname)
    for _ in range(2):
        x = dsv3.step(layers, scheds, dev, x, pol)
    sync(devname)
    t0 = time.perf_counter()
    for _ in range(steps):
        x = dsv3.step(layers, scheds, dev, x, pol, trace)
    sync(devname)
    return (time.perf_counter() - t0) / steps, x


def run_prefill(layers, scheds, dev, devname, T, pol):
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(2)).to(devname)
    dsv3.step(layers, scheds, dev, x[:16], pol)  # warm the prefill paths
    sync(devname)
    t0 = time.perf_counter()
    dsv3.step(layers, scheds, dev, x, pol)
    sync(devname)
    return time.perf_counter() - t0


def gpu_busy_s(layers, scheds, dev, x, pol) -> float:
    """GPU busy seconds over one decode step (CUPTI)."""
    from rapidmoe.engine.gpu.profile import busy_fraction

    return busy_fraction(lambda: dsv3.step(layers, scheds, dev, x, pol))[0]


def guarded(what: str, fn, *args):
    """Run one part of the check; a crash is reported and the rest still runs."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - one device run must report as much as it can
        import traceback

        print(f"\n!! {what} crashed:\n{traceback.format_exc()}")
        return None


def measure_mode(layers, dev, devname, a, name, pol, cache_layers):
    """One row of the table: (cells, seconds per layer per decode token)."""
    scheds = [SplitSchedule(3 + i, L.parts, dev, c) for i, (L, c) in enumerate(zip(layers, cache_layers))]
    trace: list = []
    t_dec, x = run_decode(layers, scheds, dev, devname, a.steps, pol, trace)
    r_mean = float(np.mean([r.mean() for st in trace for r in st.r.values()]))
    cpu_ms = 1e3 * float(np.mean([s.stats.cpu_s for s in scheds]))
    busy = f"{gpu_busy_s(layers, scheds, dev, x, pol) / t_dec:.0%}" if devname == "cuda" else "n/a"
    t_pre = run_prefill(layers, scheds, dev, devname, a.prefill, pol)
    per_layer = t_dec / a.layers
    return [name, r_mean, f"{1 / t_dec:.1f}", f"{per_layer * 1e3:.2f}", f"{1 / (per_layer * N_LAYERS_V3):.2f}",
            per_layer, f"{a.prefill / t_pre:.0f}", busy, f"{cpu_ms:.2f}"]


def print_bandwidth(bw: dict, n_expert: int) -> None:
    """The bandwidth section of the report, from check_kernels.bandwidth's numbers."""
    print(f"\n== bandwidth\ndevice copy (read+write): {bw['copy_GBs']:.0f} GB/s\n"
          f"W_Q GEMV, k=8 experts, rotating sets: gate+up {bw['gate_up_GBs']:.0f} GB/s ({bw['gate_up_us']:.0f} us), "
          f"down {bw['down_GBs']:.0f} GB/s ({bw['down_us']:.0f} us), layer {bw['layer_k8_GBs']:.0f} GB/s "
          f"= {bw['layer_k8_GBs'] / bw['copy_GBs']:.0%} of copy (bar 60%)\n"
          f"W_Q GEMV over a whole layer ({n_expert} experts): {bw['layer_all_GBs']:.0f} GB/s "
          f"= {bw['layer_all_GBs'] / bw['copy_GBs']:.0%} of copy\nvariants (GB/s): "
          + ", ".join(f"{k} {v:.0f}" for k, v in bw.items() if "rpw" in k)
          + "\nGGUF-type GEMV, [7168, 16384], T=1 (GB/s): "
          + ", ".join(f"{k[5:]} {v:.0f}" for k, v in bw.items() if k.startswith("ggml ")))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--standin", action="store_true", help="CPU tensors stand in for the GPU (tests this script)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=dsv3.E)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--no-table", action="store_true",
                    help="skip the layer-level speed table (tests/gpu/product.py gives the product's)")
    ap.add_argument("--correctness-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.correctness_only:
        return correctness_only()
    devname = "cpu" if a.standin else "cuda"
    kernels.set_num_threads(0)
    t_start = time.perf_counter()
    print(f"torch {torch.__version__}, CPU kernel threads {kernels.num_threads()}, isa {kernels.isa_info().get('active')}")
    ok = True
    if not a.standin:
        from check_kernels import bandwidth, check_ggml, check_nvrtc, check_wq

        from rapidmoe.engine.gpu.cuda_build import build

        cap = torch.cuda.get_device_capability()
        print(f"device {torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}")
        t0 = time.perf_counter()
        build(cap[0] * 10 + cap[1], log=print)
        print(f"kernels built in {time.perf_counter() - t0:.1f} s")
        rows = []
        ok &= bool(guarded("W_Q kernels", check_wq, rows))
        ok &= bool(guarded("GGUF-type kernels", check_ggml, rows))
        with tempfile.TemporaryDirectory() as tmp:
            ok &= bool(guarded("NVRTC build", check_nvrtc, rows, tmp))
        print("\n== kernels vs references (relative error)\n" + table(rows, ["kernel", "error", "bound", ""]))
        ok &= bool(guarded("split correctness (scalar CPU)", correctness_subprocess))
    dev = StandInDevice() if a.standin else CudaDevice("cuda")
    t0 = time.perf_counter()
    layers = [dsv3.Layer(100 + i, torch.device(devname), standin=a.standin, n_expert=a.experts) for i in range(a.layers)]
    print(f"\n{a.layers} DeepSeek-V3-shaped layers written ({layers[0].E} experts each) in {time.perf_counter() - t0:.1f} s")
    bw = None if a.standin else guarded("bandwidth", bandwidth, layers[0].parts)
    if bw:
        print_bandwidth(bw, layers[0].E)
    cache_sets = {f: caches(dev, layers, f) for f in (1.0, 0.25, 0.0)}
    rows = []
    corr = guarded("split correctness", correctness, layers[0], dev, cache_sets, devname, rows, not a.standin)
    if a.standin:
        ok &= bool(corr)
    print(f"\n== the same with the CPU kernels in use here ({kernels.isa_info().get('active')}"
          f"{'' if a.standin else '; informational: int8 activations on SIMD CPUs'})\n" + table(rows, CORR_HEAD))

    if a.no_table:
        print(f"\nCheck {'PASSED' if ok else 'FAILED'} in {time.perf_counter() - t_start:.0f} s")
        return 0 if ok else 1
    umia = umia_policy()
    modes = [("KTransformers-style (routed experts on CPU)", FixedCritical(K), 0.0)]
    for frac in (1.0, 0.25):
        modes += [("residual split r=k", FixedCritical(K), frac), ("residual split r=2", FixedCritical(2), frac)]
        if umia is not None:
            modes.append(("residual split UMIA (default profile)", umia, frac))
    rows, base = [], None
    for name, pol, frac in modes:
        row = guarded(name, measure_mode, layers, dev, devname, a, name, pol, cache_sets[frac])
        if row is None:
            ok = False
            continue
        per_layer = row[5]
        base = base or per_layer
        row[5] = f"{base / per_layer:.2f}x"
        rows.append([row[0], f"{frac:.0%}", f"{row[1]:.2f}"] + row[2:])
    print(f"\n== DeepSeek-V3 shapes, {a.layers} layers (decode: {a.steps} steps after 2; prefill: {a.prefill} tokens)\n"
          + table(rows, ["mode", "W_Q cache", "mean r", "decode tok/s", "ms/layer", f"tok/s x{N_LAYERS_V3} layers",
                         "vs KT", "prefill tok/s", "GPU busy", "CPU ms/layer"]))
    print(f"\nattention is stood in for by its MLA-shaped Q8_0 projections (no KV math); 'x{N_LAYERS_V3} layers' "
          f"scales the per-layer time. Check {'PASSED' if ok else 'FAILED'} in {time.perf_counter() - t_start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
