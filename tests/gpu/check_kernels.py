"""Device check, part 1: every CUDA kernel against its reference, the NVRTC
build against the nvcc one, and bandwidth (device copy vs W_Q GEMV)."""
from __future__ import annotations

import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from rapidmoe.engine import kernels
from rapidmoe.engine.gpu import cuda_kernels as gk

from dsv3 import FF, H, random_q8_0, random_wq

# Stated bounds (relative error, Frobenius): W_Q GEMV quantizes x to int16 per
# 32-block (expected ~1e-5); the GGUF GEMV quantizes x to int8 per 32-block
# (expected ~5e-3 against float x, as llama.cpp's q8_1; against the int8 x it
# used, float rounding only: ~1e-7); dequantize-to-bf16 must equal the reference
# rounded to bf16 exactly.
BOUND_WQ, BOUND_GGML, BOUND_GGML_ARITH = 1e-3, 1e-2, 1e-5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _random_kquant(qtype: int, rows: int, n: int, gen, dev) -> torch.Tensor:
    nbytes = {12: 144, 13: 176, 14: 210}[qtype]
    nb = n // 256
    q = torch.randint(0, 256, (rows, nb, nbytes), dtype=torch.uint8, device=dev, generator=gen)
    d = (torch.rand(rows, nb, device=dev, generator=gen) * 1e-3).to(torch.float16).view(torch.uint8).reshape(rows, nb, 2)
    for off in ((0, 2) if qtype in (12, 13) else (208,)):
        q[..., off:off + 2] = d
    return q.reshape(rows, nb * nbytes)


def wq_case(seed: int = 1):
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    E, R = 6, 512
    wg, wu = random_wq((E, R), H, gen, dev), random_wq((E, R), H, gen, dev)
    wd = random_wq((E, H), R, gen, dev)
    x = torch.randn(3, H, device=dev, generator=gen) * 2
    eid = torch.tensor([0, 3, 5, 3], dtype=torch.int32, device=dev)
    xrow = torch.tensor([0, 1, 2, 2], dtype=torch.int32, device=dev)
    return wg, wu, wd, x, eid, xrow


def check_wq(out: list) -> bool:
    wg, wu, wd, x, eid, xrow = wq_case()
    E, R, _ = wg.shape
    deq = {k: torch.from_numpy(kernels.resplit_dequantize("wq", t.cpu().numpy(), n)).double()
           for k, t, n in (("g", wg, H), ("u", wu, H), ("d", wd, R))}
    e, xr = eid.long().cpu(), xrow.long().cpu()
    xs = x.double().cpu()[xr]
    g_ref = torch.einsum("srn,sn->sr", deq["g"][e], xs)
    u_ref = torch.einsum("srn,sn->sr", deq["u"][e], xs)
    prep = gk.wq_prep(x)
    g, u = gk.wq_gate_up(wg, wu, eid, xrow, prep, swiglu=False)
    h = gk.wq_gate_up(wg, wu, eid, xrow, prep, swiglu=True)
    h_ref = F.silu(g_ref) * u_ref
    scale = torch.tensor([0.5, 1.0, 2.0, -1.0], device="cuda")
    rows = torch.arange(4, dtype=torch.int32, device="cuda")
    y = gk.wq_gemv(wd, eid, rows, gk.wq_prep(h_ref.float().cuda().contiguous()), scale)
    y_ref = torch.einsum("shf,sf->sh", deq["d"][e], h_ref) * scale.double().cpu()[:, None]
    bf = gk.wq_dequant_bf16(wg, eid, H)
    ok = True
    for name, a, b, bound in (("wq_gemv_gate_up g", g, g_ref, BOUND_WQ), ("wq_gemv_gate_up u", u, u_ref, BOUND_WQ),
                              ("wq_gemv_gate_up silu(g)*u", h, h_ref, BOUND_WQ), ("wq_gemv down (scaled)", y, y_ref, BOUND_WQ)):
        err = rel(a, b)
        ok &= err <= bound
        out.append((name, f"{err:.2e}", f"<= {bound:.0e}", "ok" if err <= bound else "FAIL"))
    same = torch.equal(bf.cpu(), deq["g"][e].float().to(torch.bfloat16))
    ok &= same
    out.append(("wq_dequant_bf16", "exact" if same else "differs", "== ref in bf16", "ok" if same else "FAIL"))
    return ok


def check_ggml(out: list) -> bool:
    """ggml_gemv against float64 on the CPU dequantizer, both with the float x (the
    int8 activations' error) and with the int8 x the kernel used (its arithmetic);
    T = 1, 2, 5, 11 reach every entry point's token capacity (1, 2, 8, 8 + 4)."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(2)
    R, n = 1024, H
    ok = True

    def row(name, err, bound):
        out.append((name, f"{err:.2e}", f"<= {bound:.0e}", "ok" if err <= bound else "FAIL"))
        return err <= bound

    for qtype, name in ((8, "Q8_0"), (12, "Q4_K"), (13, "Q5_K"), (14, "Q6_K")):
        raw = random_q8_0(R, n, gen, dev) if qtype == 8 else _random_kquant(qtype, R, n, gen, dev)
        ref = torch.from_numpy(kernels.ggml_dequantize(raw.cpu().numpy(), qtype, R * n).reshape(R, n)).double()
        for T in (1, 2, 5, 11):
            x = torch.randn(T, n, device=dev, generator=gen)
            y = gk.ggml_gemv(raw, qtype, n, x)
            XQ, XS = gk.ggml_quant_x(x)
            xh = (XQ.view(torch.int8).double().cpu().view(T, -1, 32) * XS[:, ::2, :1].double().cpu()).view(T, n)
            ok &= row(f"ggml_gemv {name} T={T}", rel(y, x.double().cpu() @ ref.T), BOUND_GGML)
            ok &= row(f"ggml_gemv {name} T={T} vs its int8 x", rel(y, xh @ ref.T), BOUND_GGML_ARITH)
        # MLA's per-head stacks: R rows as 8 heads of R/8, each head on its own slice of x
        heads = 8
        n_h = n // heads if (n // heads) % (32 if qtype == 8 else 256) == 0 else n
        xs = torch.randn(2, heads * n_h, device=dev, generator=gen)
        raw_h = raw[:, :raw.shape[1] * n_h // n].contiguous() if n_h != n else raw
        ref_h = torch.from_numpy(kernels.ggml_dequantize(raw_h.cpu().numpy(), qtype, R * n_h)
                                 .reshape(heads, R // heads, n_h)).double()
        want = torch.einsum("thi,hoi->tho", xs.double().cpu().view(2, heads, n_h), ref_h).reshape(2, R)
        ok &= row(f"ggml_gemv {name} {heads} heads T=2", rel(gk.ggml_gemv(raw_h, qtype, n_h, xs, heads=heads), want),
                  BOUND_GGML)
        same = torch.equal(gk.ggml_dequant_bf16(raw, qtype, n).cpu(), ref.float().to(torch.bfloat16))
        ok &= same
        out.append((f"ggml_dequant_bf16 {name}", "exact" if same else "differs", "== ref in bf16",
                    "ok" if same else "FAIL"))
    return ok


NVRTC_SNIPPET = """
import sys, torch
sys.path.insert(0, {here!r})
from check_kernels import wq_case
from rapidmoe.engine.gpu import kernels as gk
wg, wu, wd, x, eid, xrow = wq_case()
g, u = gk.wq_gate_up(wg, wu, eid, xrow, gk.wq_prep(x), swiglu=False)
torch.save(torch.stack([g, u]).cpu(), {path!r})
"""


def check_nvrtc(out: list, tmp: str) -> bool:
    """The NVRTC toolchain (no toolkit needed) builds the same kernels: same results as nvcc's."""
    path = os.path.join(tmp, "nvrtc_gu.pt")
    env = dict(os.environ, RAPIDMOE_CUDA_COMPILER="nvrtc")
    code = NVRTC_SNIPPET.format(here=os.path.dirname(os.path.abspath(__file__)), path=path)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        out.append(("NVRTC build + run", "failed", r.stderr.strip().splitlines()[-1][:60] if r.stderr else "", "FAIL"))
        return False
    wg, wu, wd, x, eid, xrow = wq_case()
    g, u = gk.wq_gate_up(wg, wu, eid, xrow, gk.wq_prep(x), swiglu=False)
    err = rel(torch.load(path), torch.stack([g, u]))
    good = err <= 1e-6
    out.append(("NVRTC-built wq_gemv_gate_up", f"{err:.2e}", "<= 1e-06 vs nvcc", "ok" if good else "FAIL"))
    return good


def _time_ms(fn, iters: int) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn(0)
    torch.cuda.synchronize()
    a.record()
    for i in range(iters):
        fn(i)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def _graph_ms(fn, iters: int) -> float:
    """Per-call time of fn with launch overhead taken out: iters calls captured in
    a CUDA graph and replayed (plain timing if capture is refused)."""
    try:
        fn(0)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(iters):
                fn(i)
        g.replay()
        torch.cuda.synchronize()
        return _time_ms(lambda i: g.replay(), 3) / iters
    except Exception as e:  # noqa: BLE001
        print(f"(graph capture refused: {e}; timing with launch overhead)")
        return _time_ms(fn, iters)


def _copy_ms(n: int) -> float:
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return _time_ms(lambda i: dst.copy_(src), 10)


def bandwidth(layer_q: dict) -> dict:
    """Device copy bandwidth (bytes read + written) and W_Q GEMV read bandwidth on
    one DeepSeek-V3 layer's W_Q (2.8 GB, far beyond L2), k=8 experts per launch
    with the expert set rotating so no launch finds its weights in L2; launches
    replayed from a CUDA graph, so the figures are the kernels' own."""
    n = 2 << 30
    res = {"copy_GBs": 2 * n / _copy_ms(n) / 1e6}
    _wq_bandwidth(layer_q, res)
    _ggml_bandwidth(res)
    return res


GGML_NAMES = {8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}


def _ggml_GBs(qtype: int, R: int, n: int, T: int = 1, tpr: int | None = None) -> float:
    """Weight bytes read per second by ggml_gemv (x quantization included), over
    copies of W rotated so that no call finds its weights in L2: 256 MB of copies,
    or for small W 24 calls' worth (> 100 MB for the shapes here) between two
    uses of one copy."""
    gen = torch.Generator(device="cuda").manual_seed(9)

    def make():
        return random_q8_0(R, n, gen, "cuda") if qtype == 8 else _random_kquant(qtype, R, n, gen, "cuda")

    w0 = make()
    ws = [w0] + [make() for _ in range(min(63, -(-(256 << 20) // w0.numel()) - 1))]
    x = torch.randn(T, n, device="cuda", generator=gen)
    ms = _graph_ms(lambda i: gk.ggml_gemv(ws[i % len(ws)], qtype, n, x, tpr=tpr), 24)
    return w0.numel() / ms / 1e6


def _ggml_bandwidth(res: dict) -> None:
    """The GGUF-type GEMV's read bandwidth against device copy: every type on the
    attn_output shape [7168, 16384] at T = 1 (the keys check.py prints), then the
    threads-per-row choices, more tokens, and the other DeepSeek-V3 shapes."""
    copy = res["copy_GBs"]
    lines = []
    for qtype, name in GGML_NAMES.items():
        res[f"ggml {name}"] = gbs = _ggml_GBs(qtype, H, 16384)
        lines.append(f"{name} [7168, 16384] T=1 (tpr {gk.ggml_tpr(qtype, 16384, H)}): {gbs:.0f} GB/s "
                     f"= {gbs / copy:.0%} of copy (bar 60%)")
    for tpr in (32, 64, 128, 256):
        gbs = _ggml_GBs(12, H, 16384, tpr=tpr)
        lines.append(f"Q4_K [7168, 16384] T=1 tpr {tpr}: {gbs:.0f} GB/s = {gbs / copy:.0%}")
    for T in (2, 4, 8):
        gbs = _ggml_GBs(12, H, 16384, T=T)
        lines.append(f"Q4_K [7168, 16384] T={T}: {gbs:.0f} GB/s = {gbs / copy:.0%}")
    for qtype, R, n in ((12, 18432, H), (12, 1536, H), (14, 24576, 1536), (8, 32768, 512), (8, 576, H)):
        gbs = _ggml_GBs(qtype, R, n)
        lines.append(f"{GGML_NAMES[qtype]} [{R}, {n}] T=1 (tpr {gk.ggml_tpr(qtype, n, R)}): {gbs:.0f} GB/s "
                     f"= {gbs / copy:.0%}")
    print(f"\n== GGUF-type GEMV bandwidth (weight bytes; device copy {copy:.0f} GB/s read+write)\n" + "\n".join(lines))


def _wq_bandwidth(layer_q: dict, res: dict) -> None:
    wg, wu, wd = (torch.from_numpy(layer_q[k]).cuda() for k in ("gate_q", "up_q", "down_q"))
    Ecount = wg.shape[0]
    perm = torch.randperm(Ecount, generator=torch.Generator().manual_seed(5))
    sets = [perm.roll(-8 * i)[:8].to(torch.int32).cuda() for i in range(Ecount // 8)]
    xrow = torch.zeros(8, dtype=torch.int32, device="cuda")
    prep_x = gk.wq_prep(torch.randn(1, H, device="cuda"))
    prep_h = gk.wq_prep(torch.randn(8, FF, device="cuda"))
    rows = torch.arange(8, dtype=torch.int32, device="cuda")
    gu_bytes = 2 * 8 * wg[0].numel()
    dn_bytes = 8 * wd[0].numel()
    for rpw in gk.GU_VARIANTS:  # every rows-per-warp variant, to pick the default from
        ms = _graph_ms(lambda i: gk.wq_gate_up(wg, wu, sets[i % len(sets)], xrow, prep_x, True, rpw=rpw), 32)
        res[f"gate_up rpw={rpw}"] = gu_bytes / ms / 1e6
    for rpw in gk.DN_VARIANTS:
        ms = _graph_ms(lambda i: gk.wq_gemv(wd, sets[i % len(sets)], rows, prep_h, rpw=rpw), 32)
        res[f"down rpw={rpw}"] = dn_bytes / ms / 1e6
    gu_ms = _graph_ms(lambda i: gk.wq_gate_up(wg, wu, sets[i % len(sets)], xrow, prep_x, True), 32)
    dn_ms = _graph_ms(lambda i: gk.wq_gemv(wd, sets[i % len(sets)], rows, prep_h), 32)
    res.update(gate_up_GBs=gu_bytes / gu_ms / 1e6, down_GBs=dn_bytes / dn_ms / 1e6,
               layer_k8_GBs=(gu_bytes + dn_bytes) / (gu_ms + dn_ms) / 1e6, gate_up_us=gu_ms * 1e3, down_us=dn_ms * 1e3)
    all_e = torch.arange(Ecount, dtype=torch.int32, device="cuda")  # every expert once: the whole layer
    xr0 = torch.zeros(Ecount, dtype=torch.int32, device="cuda")
    prep_all = gk.wq_prep(torch.randn(Ecount, FF, device="cuda"))
    all_ms = _time_ms(lambda i: (gk.wq_gate_up(wg, wu, all_e, xr0, prep_x, True),
                                 gk.wq_gemv(wd, all_e, all_e, prep_all)), 5)
    res["layer_all_GBs"] = (wg.numel() + wu.numel() + wd.numel()) / all_ms / 1e6
