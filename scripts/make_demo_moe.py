"""Derive how the demo re-expresses SmolLM2-135M's dense FFNs as a Mixture of
Experts (engine/hub/demo.py), from the dense model's own activations on the first
512 tokens of assets/calibration.txt (the tokens after them stay held out), and
write it to engine/hub/demo_moe.npz:

  perm    [n_layer, ff] uint16  hidden units in their new order: the SHARED units
          that carry the most output over the text first (the shared expert), then
          the rest grouped into N_EXPERT equal experts by co-activation (balanced
          k-means on each unit's output size per token, as MoEfication does)
  router  [n_layer, N_EXPERT, n_embd] float16  a linear router: each expert's logit
          predicts the log of its output size on that token (least squares, centred
          per token, as a softmax sees it), times ROUTER_TEMP

Deterministic given its inputs, but the activations come from this machine's
kernels: the data is made once, committed, and the demo build reads it, so every
machine builds the same file.

    python scripts/make_demo_moe.py
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from rapidmoe.engine.gguf.reader import GGUFFile
from rapidmoe.engine.hub import demo
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.tune.calibrate import calibration_text

CALIB_TOKENS = 512


def balanced_groups(feat: torch.Tensor, k: int, iters: int = 12) -> torch.Tensor:
    """k-means on the rows of feat, then k equal groups (largest cluster first takes
    its nearest free rows) -> group per row."""
    n, m = feat.shape[0], feat.shape[0] // k
    g = torch.Generator().manual_seed(0)
    c = feat[torch.randperm(n, generator=g)[:k]].clone()
    for _ in range(iters):
        a = torch.cdist(feat, c).argmin(1)
        c = torch.stack([feat[a == j].mean(0) if (a == j).any() else c[j] for j in range(k)])
    dist = torch.cdist(feat, c)
    out = torch.full((n,), -1, dtype=torch.long)
    for j in torch.argsort(torch.bincount(a, minlength=k), descending=True).tolist():
        d = dist[:, j].clone()
        d[out >= 0] = float("inf")
        out[torch.topk(d, m, largest=False).indices] = j
    return out


def matrix(g: GGUFFile, name: str) -> torch.Tensor:
    t = g.tensors[name]
    w = dequantize(g.raw(name), GGMLQuantizationType(t.ggml_type)).astype(np.float32)
    return torch.from_numpy(w.reshape(t.shape))


def layer_data(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
    """x [T, H] the FFN's input; gate/up [ff, H], down [H, ff] -> (perm [ff], router [E, H])."""
    E, S = demo.N_EXPERT, demo.SHARED_FF
    c = (F.silu(x @ gate.T) * (x @ up.T)).abs() * down.norm(dim=0)[None]  # [T, ff]: each unit's output size
    top = torch.argsort(c.pow(2).mean(0), descending=True, stable=True)
    shared, rest = top[:S], top[S:]
    cr = c[:, rest]
    feat = cr.T / (cr.T.norm(dim=1, keepdim=True) + 1e-9)
    routed = rest[torch.argsort(balanced_groups(feat, E), stable=True)]
    perm = torch.cat([shared, routed])
    f = routed.numel() // E
    size = c[:, routed].view(x.shape[0], E, f).norm(dim=2)  # [T, E] (down's column norms folded in)
    target = size.clamp(min=1e-6).log()
    target = target - target.mean(1, keepdim=True)
    probe = torch.linalg.lstsq(x.double(), target.double()).solution.float()  # [H, E]
    return perm, (demo.ROUTER_TEMP * probe.T).contiguous()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(demo.__file__).with_name("demo_moe.npz"))
    args = ap.parse_args()
    src = demo.locate_source()
    demo.verify_source(src)
    model = load_model(str(src), n_ctx=CALIB_TOKENS)
    toks = model.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)[:CALIB_TOKENS]
    xs: list[torch.Tensor] = []
    for b in model.net.blocks:
        b.ffn = lambda x, o=b.ffn: (xs.append(x.float().clone()), o(x))[1]
    model.runner.prefill(toks, 0, model.runner.new_cache(len(toks)))
    perms, routers = [], []
    with GGUFFile(src) as g:
        for il, x in enumerate(xs):
            m = lambda kind: matrix(g, f"blk.{il}.ffn_{kind}.weight")  # noqa: E731
            perm, router = layer_data(x, m("gate"), m("up"), m("down"))
            perms.append(perm.numpy().astype(np.uint16))
            routers.append(router.numpy().astype(np.float16))
            print(f"layer {il}: done", flush=True)
    np.savez_compressed(args.out, perm=np.stack(perms), router=np.stack(routers))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
