"""The CUDA kernels without a GPU, whole: launched through engine/gpu/cuda_kernels.py
on the emulation library (tests/emulator.py), against float64 numpy on the
engine's own dequantizers: the W_Q kernels, the GGUF-type GEMV and dequantizer,
GpuQWeight, and the residual-split schedule through the GPU code path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cuda_types import GGML
from rapidmoe.engine import kernels


def _rand_wq(rng, E, R, n):
    nb = -(-n // 32)
    q = rng.integers(0, 256, (E, R, nb, 8), dtype=np.uint8)
    code = rng.integers(0x480, 0x4C0, (E, R, nb))  # block scales 0.016..0.023
    q[..., 6] = (q[..., 6] & 0xF0) | (code & 0xF)
    q[..., 7] = code >> 4
    return q.reshape(E, R, nb * 8)


def _bf16(a) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16)


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


# ---------------------------------------------------------------- engine/gpu through the emulator
def test_gpu_kernel_wrappers_emulated(emulated_gpu):
    """The real kernels through engine/gpu/cuda_kernels.py (argument packing, grids,
    layouts), every rows-per-warp variant: rows not a multiple of a CTA's, lanes
    looping twice over a row (H = 1056), slots sharing experts and tokens."""
    gk = emulated_gpu
    rng = np.random.default_rng(8)
    E, F, H = 3, 40, 1056
    wg, wu = (torch.from_numpy(_rand_wq(rng, E, F, H)) for _ in range(2))
    x = torch.from_numpy((rng.standard_normal((2, H)) * 2).astype(np.float32))
    eid, xrow = torch.tensor([1, 2, 1], dtype=torch.int32), torch.tensor([0, 0, 1], dtype=torch.int32)
    Dg, Du = (torch.from_numpy(kernels.resplit_dequantize("wq", t.numpy(), H)).double() for t in (wg, wu))
    xs = x.double()[xrow.long()]
    g_ref = torch.einsum("srn,sn->sr", Dg[eid.long()], xs)
    u_ref = torch.einsum("srn,sn->sr", Du[eid.long()], xs)
    prep = gk.wq_prep(x)
    first = None
    for rpw in gk.GU_VARIANTS:
        g, u = gk.wq_gate_up(wg, wu, eid, xrow, prep, swiglu=False, rpw=rpw)
        assert _rel(g, g_ref.numpy()) < 1e-3 and _rel(u, u_ref.numpy()) < 1e-3
        first = first or (g, u)
        assert torch.equal(g, first[0]) and torch.equal(u, first[1])  # same per-row arithmetic
    h = gk.wq_gate_up(wg, wu, eid, xrow, prep, swiglu=True)
    assert _rel(h, (torch.nn.functional.silu(g_ref) * u_ref).numpy()) < 1e-3
    assert torch.equal(gk.wq_dequant_bf16(wg, eid, H), Dg[eid.long()].float().to(torch.bfloat16))
    # down: [E, 200, rb(40)] on 2 slots, scaled
    wd = torch.from_numpy(_rand_wq(rng, E, 200, F))
    Dd = torch.from_numpy(kernels.resplit_dequantize("wq", wd.numpy(), F)).double()
    hs = h[:2].contiguous()
    scale = torch.tensor([1.0, -0.5])
    y_ref = torch.einsum("shf,sf->sh", Dd[eid[:2].long()], hs.double()) * scale.double()[:, None]
    rows = torch.arange(2, dtype=torch.int32)
    for rpw in gk.DN_VARIANTS:
        y = gk.wq_gemv(wd, eid[:2].contiguous(), rows, gk.wq_prep(hs), scale, rpw=rpw)
        assert _rel(y, y_ref.numpy()) < 1e-3


def _rand_ggml(rng, qtype: int, R: int, nblk: int) -> np.ndarray:
    """[R, nblk * bytes] random blocks of a GGUF type with finite, varied f16 scales."""
    _, _, nbytes, f16_at = GGML[qtype]
    raw = rng.integers(0, 256, (R, nblk, nbytes), dtype=np.uint8)
    for o in f16_at:
        raw[..., o:o + 2] = (rng.random((R, nblk)) * 1e-3 + 1e-4).astype(np.float16).view(np.uint8).reshape(R, nblk, 2)
    return raw.reshape(R, -1)


def _quant_x_ref(x: np.ndarray):
    """ggml_quant_x in numpy, float32 as on the device: (q int8 [T, n], dx float32 [T, n/32])."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv[..., None]), -127, 127).astype(np.int8)
    return q.reshape(x.shape), (amax / np.float32(127)).astype(np.float32)


def test_ggml_quant_x_emulated(emulated_gpu):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 96)) * np.array([1.0, 1e-3, 50.0])[:, None]).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero block: dx = 0, q = 0
    XQ, XS = emulated_gpu.ggml_quant_x(torch.from_numpy(x))
    q, dx = _quant_x_ref(x)
    np.testing.assert_array_equal(XQ.numpy().view(np.int8), q)
    np.testing.assert_array_equal(XS[..., 0].numpy(), np.repeat(dx, 2, axis=1))
    s16 = q.reshape(3, -1, 16).astype(np.int32).sum(-1).astype(np.float32)
    np.testing.assert_array_equal(XS[..., 1].numpy(), np.repeat(dx, 2, axis=1) * s16)


def test_a_nan_activation_makes_its_row_nan_as_on_the_cpu(emulated_gpu):
    """W_Q prep and the GGUF int8 activations keep a NaN or an infinity: its block's scale
    is NaN, so the row's outputs are NaN (the CPU kernels' behaviour), never finite values
    made from it; the other rows are unchanged."""
    gk = emulated_gpu
    rng = np.random.default_rng(11)
    E, F, H = 2, 16, 96
    wg, wu, wd = (torch.from_numpy(_rand_wq(rng, E, F, H)) for _ in range(3))
    x = torch.from_numpy(rng.standard_normal((4, H)).astype(np.float32))
    bad = x.clone()
    bad[1, 40] = float("nan")
    bad[3, 3] = float("inf")
    eid, rows = torch.tensor([1, 0, 1, 0], dtype=torch.int32), torch.arange(4, dtype=torch.int32)
    clean, y = (gk.wq_gemv(wd, eid, rows, gk.wq_prep(a)) for a in (x, bad))
    sf = gk.wq_prep(bad)[1]
    assert torch.isnan(sf[1, 1, 0]) and torch.isnan(sf[3, 0, 0]) and torch.isnan(y[[1, 3]]).all()
    assert torch.equal(y[[0, 2]], clean[[0, 2]])
    g, u = gk.wq_gate_up(wg, wu, eid, rows, gk.wq_prep(bad), swiglu=False)
    assert torch.isnan(g[[1, 3]]).all() and torch.isnan(u[[1, 3]]).all() and torch.isfinite(g[[0, 2]]).all()
    qtype, n = 8, 96  # Q8_0
    raw = torch.from_numpy(_rand_ggml(rng, qtype, 5, n // 32))
    XQ, XS = gk.ggml_quant_x(bad)
    assert torch.isnan(XS[1, 2:4]).all() and torch.isnan(XS[3, 0:2]).all() and torch.isfinite(XS[[0, 2]]).all()
    clean, y = (gk.ggml_gemv(raw, qtype, n, a) for a in (x, bad))
    assert torch.isnan(y[[1, 3]]).all() and torch.equal(y[[0, 2]], clean[[0, 2]])


# (R, K-quant blocks per row, T, threads per row): one block per row; rows not a
# multiple of a CTA's (256 / tpr); 8..256 threads per row, reducing by shuffles
# only or also through shared memory (items reaching 2, 3, 8 warps); threads
# looping over a row; T = 1..8 (every entry point's token capacity) and 11 (two
# launches); None: the wrapper's own choice. Q8_0 rows take 4b + 1 blocks (one
# when b = 1): as many 16-byte items, on every 2-byte alignment.
GG_CASES = [(5, 1, 1, 8), (37, 3, 2, 16), (9, 5, 8, 64), (3, 40, 5, 256), (19, 1, 3, 32), (6, 5, 11, None),
            (40, 2, 4, 8), (4, 9, 6, 128), (11, 12, 7, 8)]


@pytest.mark.parametrize("qtype", sorted(GGML), ids=lambda t: GGML[t][0])
def test_ggml_gemv_emulated(emulated_gpu, qtype):
    """ggml_gemv against float64 numpy on the engine's own dequantizer, two ways.
    1. The kernel's arithmetic: against W . x^ with x^ = dx * q, the int8 activations
       the kernel itself uses, within float rounding (1e-6 of |W| . |x^|; measured
       3e-8 at most).
    2. The int8 activations' error, honestly bounded: |y - W . x| <= sum over
       32-blocks of dx/2 * sum |w| (each x is off by at most half a step), and the
       relative error over all outputs below 1e-2 (measured: 4e-3..6e-3 per type,
       no output past 0.3 of its bound; the kind of error llama.cpp accepts for
       its q8_1 activations).
    Odd block counts put Q8_0 and Q6_K rows on every 2-byte alignment."""
    _, blk, nbytes, _ = GGML[qtype]
    rng = np.random.default_rng(qtype + 100)
    errs = []
    for R, nblk, T, tpr in GG_CASES:
        nblk = 4 * nblk + 1 if qtype == 8 and nblk > 1 else nblk
        n = blk * nblk
        raw = _rand_ggml(rng, qtype, R, nblk)
        W = kernels.ggml_dequantize(raw, qtype, R * n).reshape(R, n).astype(np.float64)
        x = (rng.standard_normal((T, n)) * rng.choice([0.1, 1.0, 30.0], (T, 1))).astype(np.float32)
        y = emulated_gpu.ggml_gemv(torch.from_numpy(raw), qtype, n, torch.from_numpy(x), tpr=tpr).numpy()
        assert y.shape == (T, R)
        q, dx = _quant_x_ref(x)
        xh = (q.reshape(T, -1, 32) * dx[..., None].astype(np.float64)).reshape(T, n)
        case = f"R={R} n={n} T={T} tpr={tpr}"
        exact = xh @ W.T
        assert np.all(np.abs(y - exact) <= 1e-6 * (np.abs(xh) @ np.abs(W).T) + 1e-30), case
        ref = x.astype(np.float64) @ W.T
        absw = np.abs(W).reshape(R, -1, 32).sum(-1)  # [R, n/32]
        bound = (dx.astype(np.float64) / 2) @ absw.T + 1e-5 * (np.abs(x) @ np.abs(W).T)
        assert np.all(np.abs(y - ref) <= 1.01 * bound), (case, float((np.abs(y - ref) / bound).max()))
        errs.append((np.sum((y - ref) ** 2), np.sum(ref ** 2)))
        assert _rel(y, ref) < 3e-2, case  # few outputs: the relative error scatters
    d2, r2 = np.sum(errs, axis=0)
    print(f"{GGML[qtype][0]}: relative error {np.sqrt(d2 / r2):.1e} over all cases")
    assert np.sqrt(d2 / r2) < 1e-2


@pytest.mark.parametrize("qtype", sorted(GGML), ids=lambda t: GGML[t][0])
def test_ggml_gemv_per_head_stacks_emulated(emulated_gpu, qtype):
    """heads > 1 (MLA's attn_k_b / attn_v_b): one launch whose head h multiplies its own
    matrix by its own slice of x is bit for bit each head's own GEMV (x's 32-blocks
    never straddle two heads); GpuQWeight.per_head takes it up to 8 tokens, a bf16
    einsum beyond, both near the float64 product."""
    from rapidmoe.engine.gpu.placement import GpuQWeight

    _, blk, _, _ = GGML[qtype]
    rng = np.random.default_rng(qtype + 300)
    heads, R, nblk = 5, 12, 2 if blk == 256 else 5
    n = blk * nblk
    raw = _rand_ggml(rng, qtype, heads * R, nblk)  # [heads * R, rb]
    for T, tpr in ((1, 16), (3, 32), (8, 8)):
        x = rng.standard_normal((T, heads * n)).astype(np.float32)
        y = emulated_gpu.ggml_gemv(torch.from_numpy(raw), qtype, n, torch.from_numpy(x), tpr=tpr, heads=heads)
        assert y.shape == (T, heads * R)
        for h in range(heads):
            own = emulated_gpu.ggml_gemv(torch.from_numpy(raw[h * R:(h + 1) * R].copy()), qtype, n,
                                         torch.from_numpy(x[:, h * n:(h + 1) * n].copy()), tpr=tpr)
            assert torch.equal(y[:, h * R:(h + 1) * R], own), (T, h)
    W = kernels.ggml_dequantize(raw, qtype, heads * R * n).reshape(heads, R, n).astype(np.float64)
    stack = GpuQWeight(raw, qtype, (heads, R, n), device="cpu")
    for T, bound in ((3, 1e-2), (12, 1e-2)):  # int8 x in the GEMV, bf16 in the einsum
        x = torch.randn(T, heads, n, generator=torch.Generator().manual_seed(T))
        ref = np.einsum("thi,hoi->tho", x.double().numpy(), W)
        got = stack.per_head(x)
        assert got.shape == (T, heads, R) and _rel(got, ref) < bound, T
    with pytest.raises(ValueError, match="disagree"):
        emulated_gpu.ggml_gemv(torch.from_numpy(raw), qtype, n, torch.zeros(1, heads * n), heads=4)


def test_ggml_gemv_rejects_what_it_cannot_read(emulated_gpu):
    raw = torch.zeros(4 * 144 + 2, dtype=torch.uint8)[2:].view(4, 144)  # Q4_K rows starting 2 bytes in
    with pytest.raises(ValueError, match="16-byte"):
        emulated_gpu.ggml_gemv(raw, 12, 256, torch.zeros(1, 256))
    with pytest.raises(ValueError, match="disagree"):
        emulated_gpu.ggml_gemv(torch.zeros(4, 144, dtype=torch.uint8), 12, 512, torch.zeros(1, 512))


@pytest.mark.parametrize("qtype", sorted(GGML), ids=lambda t: GGML[t][0])
def test_ggml_dequant_bf16_emulated(emulated_gpu, qtype):
    _, blk, _, _ = GGML[qtype]
    R, n = 20, 512
    raw = _rand_ggml(np.random.default_rng(qtype + 200), qtype, R, n // blk)
    ref = kernels.ggml_dequantize(raw, qtype, R * n).reshape(R, n)
    assert torch.equal(emulated_gpu.ggml_dequant_bf16(torch.from_numpy(raw), qtype, n), _bf16(ref))


def test_gpu_gguf_weights_emulated(emulated_gpu):
    """GpuQWeight (placement.py): GEMV up to 8 tokens a launch, bf16 GEMM beyond."""
    from rapidmoe.engine.gpu.placement import GpuQWeight, gpu_linear

    rng = np.random.default_rng(9)
    R, n = 24, 512
    raw = rng.integers(0, 256, (R, n // 256, 144), dtype=np.uint8)  # Q4_K
    for o in (0, 2):
        raw[..., o:o + 2] = (rng.random((R, n // 256)) * 1e-3).astype(np.float16).view(np.uint8).reshape(R, -1, 2)
    w = GpuQWeight(raw.reshape(R, -1), 12, (R, n), device="cpu")
    ref = torch.from_numpy(kernels.ggml_dequantize(raw, 12, R * n).reshape(R, n)).double()
    for T, bound in ((3, 1e-2), (8, 1e-2), (12, 1e-2)):  # int8 x in the GEMV, bf16 in the GEMM
        x = torch.randn(T, n, generator=torch.Generator().manual_seed(T))
        y = gpu_linear(x, w)  # GEMV up to DECODE_MAX_TOKENS (8) a launch, bf16 GEMM from 12
        assert _rel(y, (x.double() @ ref.T).numpy()) < bound


@pytest.mark.parametrize("T", [2, 16])
@pytest.mark.parametrize("r, cached", [(0, "all"), (2, "some")])
def test_schedule_on_emulated_gpu(emulated_gpu, T, r, cached, monkeypatch):
    """The residual-split schedule through the GPU code path (GEMV at T=2, the
    dequantize + GEMM prefill path at T=16) against the float64 oracle. With every
    slot on the device (r=0, all cached) only the GPU's own rounding is left; with
    CPU slots in the mix the CPU kernels' int8 activations (~1%) come in too. In
    prefill each used expert's W_Q gate/up is dequantized once, critical or not."""
    from rapidmoe.engine.gpu import cuda_kernels as gk
    from rapidmoe.engine.gpu.device import EmulatedGpuDevice
    from rapidmoe.engine.gpu.reference import split_layer_reference
    from rapidmoe.engine.gpu.schedule import SplitSchedule
    from rapidmoe.engine.gpu.wq_cache import build_layer_cache
    from rapidmoe.engine.moe.resplit import FixedCritical
    from rapidmoe.engine.step import Step

    rng = np.random.default_rng(T)
    E, H, F, k = 8, 256, 64, 4
    gq, gr = kernels.resplit_quantize_wq_wr((rng.standard_normal((E, F, H)) * 0.05).astype(np.float32))
    uq, ur = kernels.resplit_quantize_wq_wr((rng.standard_normal((E, F, H)) * 0.05).astype(np.float32))
    down = (rng.standard_normal((E, H, F)) * 0.05).astype(np.float32)
    p = {"gate_q": gq, "up_q": uq, "down_q": kernels.resplit_quantize("wq", down), "gate_r": gr, "up_r": ur,
         "down4": kernels.resplit_quantize("d4", down)}
    g = torch.Generator().manual_seed(T)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    w = torch.softmax(torch.randn(T, k, generator=g), 1)
    x = torch.randn(T, H, generator=g)
    order = torch.argsort(w, dim=1, descending=True, stable=True)
    ref = split_layer_reference(p, x.numpy(), ids.gather(1, order).numpy(), w.gather(1, order).numpy(),
                                np.full(T, r))
    dev = EmulatedGpuDevice()
    ids_cached = np.arange(E, dtype=np.int32) if cached == "all" else np.array([0, 2, 4, 5, 7, 1], np.int32)
    cache = build_layer_cache(dev, p["gate_q"], p["up_q"], p["down_q"], ids_cached)
    sched = SplitSchedule(0, p, dev, cache)
    dequantized: list[int] = []
    real = gk.wq_dequant_bf16

    def counted(wq, ids_dev, n):
        if n == H:  # gate and up (down's rows are H long too, but its n is F)
            dequantized.extend(ids_dev.tolist())
        return real(wq, ids_dev, n)
    monkeypatch.setattr(gk, "wq_dequant_bf16", counted)
    out = dev.result(sched(x, ids, w, Step(FixedCritical(r), prefill=T > 1))).double().numpy()
    err = _rel(out, ref)
    used = {int(cache.slot_of[e]) for e in ids.reshape(-1).tolist() if cache.slot_of[e] >= 0}
    # T=16: gate and up of each used cached expert exactly once; T=2: the GEMV, no dequantization
    assert sorted(dequantized) == (sorted(2 * list(used)) if T == 16 else []), dequantized
    if cached == "all":
        assert sched.stats.groups["C"] == T * k
        assert err < (1e-3 if T == 2 else 1e-2), err  # int16 x in the GEMV; bf16 GEMMs in prefill
    else:
        gs = sched.stats.groups
        assert gs["A"] > 0 and gs["C"] > 0 and gs["B"] + gs["D"] > 0, gs
        assert err < 3e-2, err
