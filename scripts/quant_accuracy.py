"""Accuracy table of the resplit formats against Q4_K (relative RMSE).

Gaussian and Student-t (nu=4) weights, rows of 2048; Q4_K is the numpy port
(engine/quant/q4k_ref.py) decoded by gguf-py's own Q4_K dequantizer.
Usage: python scripts/quant_accuracy.py [--rows 64] [--seed 0]
"""
from __future__ import annotations

import argparse

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from rapidmoe.engine.quant import q4k_ref
from rapidmoe.engine.quant import resplit_joint
from rapidmoe.engine.quant import resplit_oracle as o


def rel_rmse(w: np.ndarray, d: np.ndarray) -> float:
    return float(np.sqrt(((w - d) ** 2).sum() / (w ** 2).sum()))


def table(rows: int, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for name, w in (("gaussian", rng.standard_normal((rows, n))),
                    ("student-t4", rng.standard_t(4, (rows, n)))):
        w = (w * 0.02).astype(np.float32)
        q4k = rel_rmse(w, gguf_dequantize(q4k_ref.quantize_q4k(w), GGMLQuantizationType.Q4_K).reshape(w.shape))
        wq, wr = resplit_joint.quantize_wq_wr(w)
        dq = o.dequantize_wq(wq, n)
        out.append({
            "weights": name,
            "Q4_K": q4k,
            "WQ alone (best scale)": rel_rmse(w, o.dequantize_wq(o.quantize_wq(w), n)),
            "WQ (joint, gate/up)": rel_rmse(w, dq),
            "WQ+WR": rel_rmse(w, dq + o.dequantize_wr(wr, n)),
            "D4": rel_rmse(w, o.dequantize_d4(o.quantize_d4(w), n)),
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(f"bits/weight at n={a.n}: WQ {o.bits_per_weight('wq', a.n):.3f}  WR {o.bits_per_weight('wr', a.n):.3f}  "
          f"D4 {o.bits_per_weight('d4', a.n):.3f}  Q4_K 4.500")
    rows = table(a.rows, a.n, a.seed)
    cols = list(rows[0].keys())
    print(" | ".join(f"{c:>22}" for c in cols))
    for r in rows:
        q4 = r["Q4_K"]
        cells = [f"{r['weights']:>22}"] + [f"{r[c]:.4f} ({r[c] / q4:.2f}x)".rjust(22) for c in cols[1:]]
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
