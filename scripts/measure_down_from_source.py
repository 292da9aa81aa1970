"""What running the critical experts' down projection from the source file's
own K-quant tensor (instead of the pack's D4 copy) would save: pack bytes,
conversion time, and what the CPU's down GEMV costs either way.

For each model shape (layers, experts, hidden, expert FFN width) and each source
type of ffn_down_exps (Q4_K, Q5_K, Q6_K: what Q4_K_M / Q5_K_M / Q6_K files hold),
with random valid blocks:
  disk   the D4 part of every expert (what the pack would not hold), absolute
         and as a share of the pack's expert bytes
  time   converting one expert (gate+up -> WQ+WR, down -> WQ+D4, from the
         source type), and the D4 step alone (best of several runs each)
  gemv   one token through k down projections: D4 (int8 activations) vs the
         source type (ggml_expert_matmul), bytes read per expert either way

Usage: python scripts/measure_down_from_source.py [--experts 8] [--threads N]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as G

from rapidmoe.engine import kernels
from rapidmoe.engine.pack.convert import convert_expert

SHAPES = {  # name: (MoE layers, experts, hidden, expert FFN width, routed per token)
    "Qwen3-30B-A3B": (48, 128, 2048, 768, 8),
    "DeepSeek-V3": (58, 256, 7168, 2048, 8),
}
# offsets of the f16 super-block scales in each block (the rest may be any bits)
SCALE_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def kquant(rng, name: str, rows: int, n: int) -> np.ndarray:
    """[rows, row bytes] of random valid blocks of a K-quant type, weights of about 0.02."""
    block, size = GGML_QUANT_SIZES[G[name]]
    nb = rows * n // block
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    for off in SCALE_FIELDS[name]:
        d = (np.abs(rng.standard_normal(nb, dtype=np.float32)) * 1e-3 + 1e-4).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, -1)


def per_expert_seconds(fn, n: int) -> float:
    """The fastest of n calls fn(0..n-1): the least disturbed by other work on the machine."""
    fn(0)  # warm
    best = float("inf")
    for e in range(n):
        t0 = time.perf_counter()
        fn(e)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=8, help="experts timed per measurement")
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (default: all usable cores)")
    args = ap.parse_args()
    kernels.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"isa {kernels.isa_info().get('active')}, {kernels.num_threads()} threads")
    for model, (L, E, H, F, k) in SHAPES.items():
        n_exp = L * E
        b_wq = sum(kernels.resplit_row_bytes("wq", m) * r for r, m in ((F, H), (F, H), (H, F)))
        b_wr = 2 * kernels.resplit_row_bytes("wr", H) * F
        b_d4 = kernels.resplit_row_bytes("d4", F) * H
        gate = [kquant(rng, "Q4_K", F, H) for _ in range(args.experts)]
        for src in ("Q4_K", "Q5_K", "Q6_K"):
            downs = [kquant(rng, src, H, F) for _ in range(args.experts)]
            b_src = downs[0].nbytes

            def full(e):
                convert_expert(gate[e % len(gate)], int(G.Q4_K), "gate", F, H)
                convert_expert(gate[e % len(gate)], int(G.Q4_K), "up", F, H)
                convert_expert(downs[e % len(downs)], int(G[src]), "down", H, F)

            ws = [kernels.ggml_dequantize(d, int(G[src]), H * F).reshape(H, F) for d in downs]

            def d4_step(e):
                kernels.resplit_quantize("d4", ws[e % len(ws)])

            t_full = per_expert_seconds(full, args.experts)
            t_nod4 = t_full - per_expert_seconds(d4_step, 2 * args.experts)
            # one decode token through k down projections, either way
            d4 = np.stack([kernels.resplit_quantize("d4", w) for w in ws])
            stack = np.stack(downs)
            ids = np.arange(min(k, args.experts), dtype=np.int32)
            x = rng.standard_normal((len(ids), F), dtype=np.float32)
            t_d4 = per_expert_seconds(lambda _: kernels.resplit_expert_matmul("d4", d4, F, ids, x), 50)
            t_src = per_expert_seconds(lambda _: kernels.ggml_expert_matmul(stack, int(G[src]), ids, x), 50)
            pack_experts = n_exp * (b_wq + b_wr + b_d4)
            print(f"{model} down in {src}: D4 part {b_d4 * n_exp / 2**30:.2f} GiB of {pack_experts / 2**30:.2f} GiB "
                  f"expert bytes ({b_d4 / (b_wq + b_wr + b_d4):.0%}); source down {b_src * 8 / (H * F):.2f} bpw "
                  f"vs D4 {b_d4 * 8 / (H * F):.2f} bpw | convert {t_full * 1e3:.1f} ms/expert, without D4 "
                  f"{t_nod4 * 1e3:.1f} ms ({1 - t_nod4 / t_full:.0%} less; model {t_full * n_exp / 60:.1f} -> "
                  f"{t_nod4 * n_exp / 60:.1f} min) | down GEMV x{len(ids)}: D4 {t_d4 * 1e6:.0f} us, "
                  f"{src} {t_src * 1e6:.0f} us", flush=True)


if __name__ == "__main__":
    main()
