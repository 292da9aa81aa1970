"""Resplit kernels (expert GEMV/GEMM, MoE layer) against the numpy oracle, on every ISA path.

Tolerance: the kernels decode weights exactly as the oracle does and sum in
float32; against a float64 reference the error is bounded by ~n*eps*sum|x*w|
(n <= 1408 here), so rtol 1e-4 of the largest output is a safe, tight bound.
The SIMD paths run WQ, WR and D4 on int8 activations (per 32: sx = max|x|/127,
rint(x/sx)); their reference applies the same rounding to x (oracle q8_activations), so
the bound holds. On the SIMD paths (isa_info()["wq_z"]), non-critical rows outside the
int8 GEMM run WQ on coarser z activations (sx = max|x|/L, L = isa_info()["wq_z_levels"]:
31 with VNNI, 16 without), and their reference rounds x and h the same way. Where the int8 GEMM runs (isa_info()["i8_gemm_min_tokens"] > 0), MoE
groups of that many tokens or more use weights requantized by the same rule (WQ + WR
summed first for critical gate/up), and so does their reference. Critical experts run
from the source file's tensors (`source`) take the GGUF int8 GEMV's activations (ggml_oracle
q8: llama.cpp's q8_0 / q8_K per type) for x and h, and their reference does the same.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from gguf import GGMLQuantizationType as G

import ggml_oracle as go
from isa_paths import cpu_isa, runnable_paths
from rapidmoe.engine import kernels
from rapidmoe.engine.quant import resplit_oracle as o


def close(y, ref):
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def wq_x(x):
    return x if kernels.isa_info()["active"] == "scalar" else o.q8_activations(x)


def z_x(x):
    return o.q8_activations(x, kernels.isa_info()["wq_z_levels"])


def wr_x(x):
    return o.q8_activations(x) if kernels.isa_info()["wr_int8"] else x


def silu(g):
    return g / (1.0 + np.exp(-g))


def make_layer(rng, E, H, F):
    gate = (rng.standard_t(4, (E, F, H)) * 0.05).astype(np.float32)
    up = (rng.standard_normal((E, F, H)) * 0.05).astype(np.float32)
    down = (rng.standard_normal((E, H, F)) * 0.05).astype(np.float32)
    gq, gr = kernels.resplit_quantize_wq_wr(gate)
    uq, ur = kernels.resplit_quantize_wq_wr(up)
    return dict(gate_q=gq, up_q=uq, down_q=kernels.resplit_quantize("wq", down), gate_r=gr, up_r=ur,
                down4=kernels.resplit_quantize("d4", down))


def make_source(rng, E, H, F, types):
    """Source-file experts of GGUF types (gate, up, down): raw [E, rows, rb] each."""
    return [go.random_tensor(rng, t, E * rows, n).reshape(E, rows, -1)
            for t, rows, n in zip(types, (F, F, H), (H, H, F))]


def source_args(raws, types):
    return tuple((r.reshape(-1, r.shape[-1]), int(t)) for r, t in zip(raws, types))


def moe_reference(L, x, ids, wts, ncrit, H, F, src=None):
    deq = lambda f, q, n: o.dequantize(f, q, n).astype(np.float64)  # noqa: E731
    min_tok = kernels.isa_info()["i8_gemm_min_tokens"]
    groups = {}
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            key = (ids[t, j], j < ncrit[t])
            groups[key] = groups.get(key, 0) + 1
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            crit = j < ncrit[t]
            src_i8 = min_tok and kernels.isa_info()["i8_gemm_source"] and groups[(e, crit)] >= min_tok
            if crit and src is not None and not src_i8:
                # the source's tensors on the GGUF int8 GEMV's activations
                (gr, gt), (ur, ut), (dr, dt) = src
                xq = lambda v, qt: go.q8(v[None], go.q8_group(qt))[0]  # noqa: E731
                g = go.oracle(gr[e], gt).astype(np.float64) @ xq(x[t], gt)
                u = go.oracle(ur[e], ut).astype(np.float64) @ xq(x[t], ut)
                h = (silu(g) * u).astype(np.float32)
                out[t] += wts[t, j] * (go.oracle(dr[e], dt).astype(np.float64) @ xq(h, dt))
                continue
            if min_tok and groups[(e, crit)] >= min_tok:  # requantized int8 GEMM
                w8 = lambda *parts: o.q8_activations(sum(o.dequantize(*p) for p in parts)).astype(np.float64)  # noqa: E731
                xq = o.q8_activations(x[t]).astype(np.float64)
                if crit and src is not None:  # the source's tensors, requantized the same way
                    (gr, gt), (ur, ut), (dr, dt) = src
                    q8w = lambda raw, qt: o.q8_activations(go.oracle(raw, qt)).astype(np.float64)  # noqa: E731
                    h = (silu(q8w(gr[e], gt) @ xq) * (q8w(ur[e], ut) @ xq)).astype(np.float32)
                    out[t] += wts[t, j] * (q8w(dr[e], dt) @ o.q8_activations(h))
                    continue
                res = lambda name: [("wr", L[name][e], H)] if crit else []  # noqa: E731
                g = w8(("wq", L["gate_q"][e], H), *res("gate_r")) @ xq
                u = w8(("wq", L["up_q"][e], H), *res("up_r")) @ xq
                h = (silu(g) * u).astype(np.float32)
                down = ("d4", L["down4"][e], F) if crit else ("wq", L["down_q"][e], F)
                out[t] += wts[t, j] * (w8(down) @ o.q8_activations(h))
                continue
            # non-critical rows outside the int8 GEMM run WQ on z activations where they exist
            ax = z_x if (not crit and kernels.isa_info()["wq_z"]) else wq_x
            xq = ax(x[t]).astype(np.float64)
            xr = wr_x(x[t]).astype(np.float64)
            g = deq("wq", L["gate_q"][e], H) @ xq + (deq("wr", L["gate_r"][e], H) @ xr if crit else 0)
            u = deq("wq", L["up_q"][e], H) @ xq + (deq("wr", L["up_r"][e], H) @ xr if crit else 0)
            h = (silu(g) * u).astype(np.float32)
            y = deq("d4", L["down4"][e], F) @ wq_x(h) if crit else deq("wq", L["down_q"][e], F) @ ax(h)
            out[t] += wts[t, j] * y
    return out


def check_all(seed=0):
    """Every kernel of the active ISA path against the oracle (also run per ISA in a subprocess)."""
    rng = np.random.default_rng(seed)
    _check_expert_matmul(rng)
    _check_moe_forward(rng)
    _check_residual_forward(rng)
    _check_moe_from_source(rng)
    _check_nan(rng)


def _check_expert_matmul(rng):
    """Each format's expert GEMV / GEMM: decode, ragged prefill groups, every row count and tail."""
    for fmt, (out_dim, in_dim) in (("wq", (40, 96)), ("wr", (24, 576)), ("d4", (33, 1408)), ("wq", (7, 100)), ("wq", (9, 1408)), ("wr", (5, 704)),
                                ("wr", (6, 128)), ("wr", (3, 2048)), ("wr", (9, 100)), ("wr", (4, 256))):
        E = 5
        w = (rng.standard_normal((E, out_dim, in_dim)) * 0.1).astype(np.float32)
        if fmt == "wr":
            q = kernels.resplit_quantize_wq_wr(w)[1]
        else:
            q = kernels.resplit_quantize(fmt, w)
        deq = o.dequantize(fmt, q, in_dim)
        # this path's row decoder (the prefill GEMM's repack) gives the oracle's floats exactly
        assert np.array_equal(kernels.resplit_dequantize(fmt, q.reshape(-1, q.shape[-1]), in_dim),
                              deq.reshape(-1, in_dim)), fmt
        dense = deq.astype(np.float64)
        ax = wq_x if fmt in ("wq", "d4") else wr_x
        # decode: one activation row per slot, repeated experts allowed
        ids = np.array([3, 0, 3, 4], np.int32)
        x = rng.standard_normal((4, in_dim)).astype(np.float32)
        y = kernels.resplit_expert_matmul(fmt, q, in_dim, ids, x)
        close(y, np.stack([dense[e] @ ax(x[s]) for s, e in enumerate(ids)]))
        # prefill: ragged token groups per expert, an empty one included
        counts = np.array([17, 0, 1, 15], np.int64)  # token tiles of 16 (WQ), 8, 4, 2 and 1
        xs = rng.standard_normal((33, in_dim)).astype(np.float32)
        y = kernels.resplit_expert_matmul(fmt, q, in_dim, ids, xs, counts)
        owner = np.repeat(ids, counts)
        close(y, np.stack([dense[e] @ ax(xs[i]) for i, e in enumerate(owner)]))
        if fmt == "wq":  # on z activations (where they exist), one token at a time
            az = z_x if kernels.isa_info()["wq_z"] else ax
            y = kernels.resplit_expert_matmul(fmt, q, in_dim, ids, xs, counts, z=True)
            close(y, np.stack([dense[e] @ az(xs[i]) for i, e in enumerate(owner)]))
    # decode GEMV (one token) over every row count of a row group (rows taken 4 or 2 at a
    # time, the last ones alone) and every tail of blocks (WQ steps of 4 blocks, WR groups
    # of 3, D4 pairs)
    for fmt, in_dims in (("wq", (96, 160, 224, 256, 300)), ("wr", (128, 192, 256)), ("d4", (64, 96, 160))):
        for in_dim in in_dims:
            w = (rng.standard_normal((2, 9, in_dim)) * 0.1).astype(np.float32)
            q = kernels.resplit_quantize_wq_wr(w)[1] if fmt == "wr" else kernels.resplit_quantize(fmt, w)
            ax = wr_x if fmt == "wr" else wq_x
            for rows in range(1, 10):
                qr = np.ascontiguousarray(q[:, :rows])
                dense = o.dequantize(fmt, qr, in_dim).astype(np.float64)
                x = rng.standard_normal((2, in_dim)).astype(np.float32)
                y = kernels.resplit_expert_matmul(fmt, qr, in_dim, np.array([1, 0], np.int32), x)
                close(y, np.stack([dense[e] @ ax(x[s]) for s, e in enumerate((1, 0))]))


def _check_moe_forward(rng):
    """The whole MoE layer: decode and prefill groups, every critical count, a WQ-only layer."""
    E, H, F, T, k = 6, 128, 96, 5, 3
    L = make_layer(rng, E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    wts = rng.random((T, k)).astype(np.float32)
    for ncrit in (np.zeros(T, np.int32), np.full(T, k, np.int32), np.array([0, 1, 2, 3, 1], np.int32)):
        out = kernels.resplit_moe_forward(x, ids, wts, ncrit, **L)
        close(out, moe_reference(L, x, ids, wts, ncrit, H, F))
    # prefill: groups of many tokens next to small ones (the int8 GEMM where it runs), odd sizes
    E, H, F, T, k = 5, 200, 72, 37, 3
    L = make_layer(rng, E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    first = np.where(np.arange(T) % 9 == 0, rng.integers(0, E, T), 0)  # expert 0 leads most tokens
    ids = np.array([[f, *rng.permutation(np.delete(np.arange(E), f))[:k - 1]] for f in first], np.int32)
    wts = rng.random((T, k)).astype(np.float32)
    for ncrit in (np.zeros(T, np.int32), np.full(T, k, np.int32), rng.integers(0, k + 1, T).astype(np.int32)):
        out = kernels.resplit_moe_forward(x, ids, wts, ncrit, **L)
        close(out, moe_reference(L, x, ids, wts, ncrit, H, F))
    E, H, F, T, k = 6, 128, 96, 5, 3
    L = make_layer(rng, E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    wts = rng.random((T, k)).astype(np.float32)
    nc = dict(L, gate_r=None, up_r=None, down4=None)  # WQ-only layer needs no residual tensors
    close(kernels.resplit_moe_forward(x, ids, wts, np.zeros(T, np.int32), **nc),
          moe_reference(L, x, ids, wts, np.zeros(T, np.int32), H, F))
    # decode (one token): odd widths, so row groups end in 4, 2 and single rows and blocks
    # in partial groups of 8; every critical count
    E, H, F, k = 7, 99, 45, 4
    L = make_layer(rng, E, H, F)
    x = rng.standard_normal((1, H)).astype(np.float32)
    ids = rng.permutation(E)[None, :k].astype(np.int32)
    wts = rng.random((1, k)).astype(np.float32)
    for r in range(k + 1):
        ncrit = np.array([r], np.int32)
        close(kernels.resplit_moe_forward(x, ids, wts, ncrit, **L), moe_reference(L, x, ids, wts, ncrit, H, F))


def _check_residual_forward(rng):
    """Critical slots on W_Q partials computed elsewhere (the GPU's): W_R added to them, D4
    down, the weighted sum per token; decode and prefill (experts repeated across tokens),
    odd widths."""
    for E, H, F, T, n in ((7, 99, 45, 1, 3), (5, 200, 72, 6, 13)):
        L = make_layer(rng, E, H, F)
        x = rng.standard_normal((T, H)).astype(np.float32)
        tok = np.sort(rng.integers(0, T, n)).astype(np.int32)
        ids = rng.integers(0, E, n).astype(np.int32)
        wts = rng.random(n).astype(np.float32)
        gq, uq = (rng.standard_normal((2, n, F)) * 0.5).astype(np.float32)
        ref = np.zeros((T, H))
        for i, (t, e) in enumerate(zip(tok, ids)):
            xr = wr_x(x[t]).astype(np.float64)
            g = gq[i] + o.dequantize("wr", L["gate_r"][e], H).astype(np.float64) @ xr
            u = uq[i] + o.dequantize("wr", L["up_r"][e], H).astype(np.float64) @ xr
            h = (silu(g) * u).astype(np.float32)
            ref[t] += wts[i] * (o.dequantize("d4", L["down4"][e], F).astype(np.float64) @ wq_x(h))
        close(kernels.resplit_residual_forward(x, tok, ids, wts, gq, uq, L), ref)


def _check_moe_from_source(rng):
    """Critical experts run from the source file's tensors: decode at every critical count,
    prefill groups on both sides of the int8 GEMM's threshold (above it, where the GEMM takes
    them, the source's rows requantized as the pack's are), gate and up of different
    activation layouts; a token's result does not depend on the batch. (Q4_1 / Q5_1 are left
    out: their min term rounds a product to f16, which q8's reference does not model; the GEMV
    itself is checked per type in test_ggml_int8.py.)"""
    for (E, H, F), types in (((5, 256, 256), (G.Q4_K, G.Q4_K, G.Q6_K)), ((4, 256, 512), (G.Q4_K, G.Q8_0, G.Q5_K)),
                             ((6, 96, 160), (G.Q4_0, G.Q5_0, G.Q8_0))):
        L = make_layer(rng, E, H, F)
        raws = make_source(rng, E, H, F, types)
        src = source_args(raws, types)
        ref_src = list(zip(raws, types))
        k = 3
        x = rng.standard_normal((1, H)).astype(np.float32)
        ids = rng.permutation(E)[None, :k].astype(np.int32)
        wts = rng.random((1, k)).astype(np.float32)
        for r in range(k + 1):
            nc = np.array([r], np.int32)
            no_res = dict(L, gate_r=None, up_r=None, down4=None)  # the residuals are not needed
            out = kernels.resplit_moe_forward(x, ids, wts, nc, **no_res, source=src)
            close(out, moe_reference(L, x, ids, wts, nc, H, F, ref_src))
        T = 29
        x = rng.standard_normal((T, H)).astype(np.float32)
        first = np.where(np.arange(T) % 7 == 0, rng.integers(0, E, T), 0)  # expert 0 leads most tokens
        ids = np.array([[f, *rng.permutation(np.delete(np.arange(E), f))[:k - 1]] for f in first], np.int32)
        wts = rng.random((T, k)).astype(np.float32)
        for nc in (np.full(T, k, np.int32), rng.integers(0, k + 1, T).astype(np.int32)):
            out = kernels.resplit_moe_forward(x, ids, wts, nc, **L, source=src)
            close(out, moe_reference(L, x, ids, wts, nc, H, F, ref_src))
        # all critical, no group big enough for the int8 GEMM: each token alone gives the
        # same bits as the batch
        T = 2
        nc = np.full(T, k, np.int32)
        batch = kernels.resplit_moe_forward(x[:T], ids[:T], wts[:T], nc, **L, source=src)
        alone = np.concatenate([kernels.resplit_moe_forward(x[t:t + 1], ids[t:t + 1], wts[t:t + 1], nc[t:t + 1], **L,
                                                            source=src) for t in range(T)])
        np.testing.assert_array_equal(batch, alone)


def _check_nan(rng):
    """A NaN activation makes its own row's outputs NaN, an infinite one NaN or infinite
    (the int8 paths make the block's scale NaN, as the GPU and the GGUF int8 GEMV do), and
    every other row stays as it was: never a finite number made up from either."""
    E, H, F, k = 4, 96, 64, 2
    L = make_layer(rng, E, H, F)
    x = rng.standard_normal((4, H)).astype(np.float32)
    bad = x.copy()
    bad[1, 37] = np.nan
    bad[3, 2] = -np.inf
    ids = np.array([2, 0, 2, 1], np.int32)
    for fmt, w, z in (("wq", L["gate_q"], False), ("wq", L["gate_q"], True), ("wr", L["gate_r"], False),
                      ("d4", L["down4"], False)):
        xx, bb = (x, bad) if fmt != "d4" else (x[:, :F], bad[:, :F])
        n = H if fmt != "d4" else F
        clean = kernels.resplit_expert_matmul(fmt, w, n, ids, xx, z=z)
        y = kernels.resplit_expert_matmul(fmt, w, n, ids, bb, z=z)
        assert np.isnan(y[1]).all() and not np.isfinite(y[3]).any(), (fmt, z)  # f32 paths: inf * w is inf
        np.testing.assert_array_equal(y[[0, 2]], clean[[0, 2]])
    for T in (1, 13):  # decode, and a prefill whose groups reach the int8 GEMM where it runs
        x = rng.standard_normal((T, H)).astype(np.float32)
        ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
        ids[:, 0] = 1  # one expert for all: a group of T tokens
        wts = rng.random((T, k)).astype(np.float32)
        ncrit = rng.integers(0, k + 1, T).astype(np.int32)
        clean = kernels.resplit_moe_forward(x, ids, wts, ncrit, **L)
        bad = x.copy()
        bad[T // 2, 5] = np.nan
        out = kernels.resplit_moe_forward(bad, ids, wts, ncrit, **L)
        assert np.isnan(out[T // 2]).all(), T
        keep = np.arange(T) != T // 2
        np.testing.assert_array_equal(out[keep], clean[keep])


def test_kernels_active_path():
    check_all(0)


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx2-novnni", "avx512", "avx512-novbmi", "avx512-novnni"])
def test_kernels_every_isa_path(isa):
    # avx512-novbmi / -novnni: AVX-512 without VBMI / without VNNI and VBMI (WR by the AVX2 kernel);
    # avx2: with AVX-VNNI where the CPU has it (6-bit z activations), avx2-novnni: without (5-bit)
    path = isa.split("-")[0]
    if path not in runnable_paths():
        pytest.skip(f"this CPU cannot run {isa}")
    info = cpu_isa()
    vnni = not isa.endswith("novnni") and info["avx512_vnni" if path == "avx512" else "avx_vnni"]
    levels = 0 if path == "scalar" else 31 if vnni else 16
    env = dict(os.environ, RAPIDMOE_ISA=isa)
    code = ("import sys; sys.path.insert(0, %r); import test_resplit_kernels as t; "
            "from rapidmoe.engine import kernels; assert kernels.isa_info()['active'] == %r; "
            "assert kernels.isa_info()['wr_int8'] == %r; assert kernels.isa_info()['wq_z'] == %r; "
            "assert kernels.isa_info()['wq_z_levels'] == %r; "
            "t.check_all(1); print('ok')" % (os.path.dirname(__file__), path, path != "scalar", path != "scalar", levels))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_moe_forward_rejects_bad_input():
    rng = np.random.default_rng(0)
    L = make_layer(rng, 2, 64, 32)
    x = np.zeros((1, 64), np.float32)
    part = np.zeros((1, 32), np.float32)
    one = np.ones(1, np.float32)
    with pytest.raises(ValueError, match="expert id"):
        kernels.resplit_residual_forward(x, np.zeros(1), np.array([2]), one, part, part, L)
    with pytest.raises(ValueError, match="token out of range"):
        kernels.resplit_residual_forward(x, np.ones(1), np.zeros(1), one, part, part, L)
    with pytest.raises(ValueError, match="gq, uq"):
        kernels.resplit_residual_forward(x, np.zeros(1), np.zeros(1), one, part[:, :16], part[:, :16], L)
    with pytest.raises(ValueError, match="expert id"):
        kernels.resplit_moe_forward(x, np.array([[2]]), np.ones((1, 1)), np.zeros(1), **L)
    with pytest.raises(ValueError, match="critical"):
        kernels.resplit_moe_forward(x, np.array([[1]]), np.ones((1, 1)), np.ones(1),
                                    **dict(L, gate_r=None))
    # the source's experts: a type without an int8 GEMV, or shapes that are not the pack's
    raws = make_source(rng, 2, 64, 32, (G.Q8_0, G.Q8_0, G.Q8_0))
    bad_type = list(source_args(raws, (G.Q8_0,) * 3))
    bad_type[2] = (np.zeros((64, 32 * 2), np.uint8), int(G.F16))
    with pytest.raises(ValueError, match="source down: its GGUF type has no int8 GEMV"):
        kernels.resplit_moe_forward(x, np.array([[1]]), np.ones((1, 1)), np.ones(1), **L, source=tuple(bad_type))
    wrong = source_args(make_source(rng, 3, 64, 32, (G.Q8_0,) * 3), (G.Q8_0,) * 3)  # 3 experts, the pack has 2
    with pytest.raises(ValueError, match="source gate: expected"):
        kernels.resplit_moe_forward(x, np.array([[1]]), np.ones((1, 1)), np.ones(1), **L, source=wrong)
