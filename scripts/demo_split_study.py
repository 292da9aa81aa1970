"""How much of a 16-expert re-expression of SmolLM2-135M survives a critical-set
size r < k, and why (the study behind engine/hub/demo.py). A study, not a product
path: it re-runs the dense model's FFNs (read from the source file) as 16 routed
experts, in float, from the same formats the pack uses (WQ and WR from the joint
quantizer, D4 for a critical expert's down, WQ for the others' down), with the
critical set chosen per token by one of

  router  fixed order (a uniform router: lowest ids first);
  probe   a linear router fitted to each expert's log output size (the demo's);
  output  each expert's W_Q output size, ||silu(x·WgQ)*(x·WuQ)|| x ||WdQ||, which
          the schedule computes anyway;
  oracle  the true gain ||y_critical - y_WQ|| (an upper bound no runtime has);
  full    no split: the source weights (with --tau, the router's weights only);

and the experts of each layer either as contiguous slices of the dense FFN (`none`)
or regrouped by co-activation on calibration text (MoEfication: a permutation of
the hidden units, exact in float; `block32` keeps Q4_1's 32-wide blocks whole,
`neuron` moves single units). --shared S keeps the S units that carry the most
output as a shared expert at full precision; --tau T weighs expert e by
16·softmax(T·probe)_e instead of 1.

    python scripts/demo_split_study.py --group none,block32,neuron --select router,output,oracle --r 4,8,12
    python scripts/demo_split_study.py --group neuron --shared 1024 --select full,probe,oracle --tau 0.01 \
        --r 8,w1.0 --offset 1024 --tokens 256

Prints perplexity and KL against the dense model on held-out tokens of
assets/calibration.txt (prefill logits), per setting. r is a whole number, a
fraction (a share threshold: r_t = how many experts carry more than r/E of the
token's score), `w<c>` (critical while the router weight exceeds c/E) or `umia`
(the built-in default profile).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGUFReader
from gguf.quants import dequantize

from rapidmoe.engine import kernels
from rapidmoe.engine.tune.calibrate import calibration_text
from rapidmoe.engine.hub.demo import N_EXPERT as E, locate_source
from rapidmoe.engine.tune.evaluate import divergence, perplexity
from rapidmoe.engine.loader import load_model

from make_demo_moe import balanced_groups  # scripts/, beside this file


def tensor(reader_tensors, name: str) -> torch.Tensor:
    t = reader_tensors[name]
    shape = [int(s) for s in reversed(t.shape)]
    return torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))


def requant(fmt: str, w: torch.Tensor):
    """w [rows, n] through the pack's quantizer and back."""
    rows, n = w.shape
    a = np.ascontiguousarray(w.numpy())
    if fmt == "wq+wr":
        q, r = kernels.resplit_quantize_wq_wr(a)
        return (torch.from_numpy(kernels.resplit_dequantize("wq", q, n)).view(rows, n),
                torch.from_numpy(kernels.resplit_dequantize("wr", r, n)).view(rows, n))
    return torch.from_numpy(kernels.resplit_dequantize(fmt, kernels.resplit_quantize(fmt, a), n)).view(rows, n)


def permutation(how: str, x, g, u, d, shared: int = 0) -> torch.Tensor:
    """Order of the hidden units: the `shared` largest on calibration text first (a
    shared expert, always at full precision), then the routed experts' units."""
    ff = g.shape[0]
    c = (F.silu(x @ g.T) * (x @ u.T)).abs() * d.norm(dim=0)[None]  # [T, ff]: each unit's output size
    if shared:
        top = torch.argsort(c.pow(2).mean(0), descending=True)
        rest = top[shared:]
        p = permutation(how, x, g[rest], u[rest], d[:, rest])
        return torch.cat([top[:shared], rest[p]])
    if how == "none":
        return torch.arange(ff)
    if how == "block32":
        c = c.view(c.shape[0], -1, 32).pow(2).sum(2).sqrt()  # [T, ff/32]
    feat = c.T / (c.T.norm(dim=1, keepdim=True) + 1e-9)
    order = torch.argsort(balanced_groups(feat, E), stable=True)
    return (order[:, None] * 32 + torch.arange(32)).reshape(-1) if how == "block32" else order


class StudyExperts:
    """Replaces a layer's experts: all E routed with weight 1/E (as the demo routes)."""

    def __init__(self, P: dict, r, select: str, tau: float = 0.0, layer: int = 0):
        self.P, self.r, self.select, self.mean_r = P, r, select, []
        self.tau, self.layer = tau, layer

    def __call__(self, x, ids, w, step=None):
        P, T = self.P, x.shape[0]
        f = P["gq"].shape[0] // E
        ys = (F.silu(x @ P["gs"].T) * (x @ P["us"].T)) @ P["ds"].T if P["gs"].shape[0] else 0.0
        hq = (F.silu(x @ P["gq"].T) * (x @ P["uq"].T)).view(T, E, f)
        hc = (F.silu(x @ P["gc"].T) * (x @ P["uc"].T)).view(T, E, f)
        yq = torch.einsum("tef,hef->teh", hq, P["dq"].view(-1, E, f))
        yc = torch.einsum("tef,hef->teh", hc, P["d4"].view(-1, E, f))
        wts = torch.full((T, E), 1.0)
        if self.tau:  # a router whose softmax weights follow the probe: 16·w_e scales expert e
            wts = E * torch.softmax(self.tau * (torch.cat([x, torch.ones(T, 1)], 1) @ P["probe"]), 1)
        if self.select == "full":
            return ((torch.einsum("tef,hef->teh", (F.silu(x @ P["g"].T) * (x @ P["u"].T)).view(T, E, f),
                                  P["d"].view(-1, E, f)) * wts[:, :, None]).sum(1) + ys) / E
        if self.select == "router":
            score = -torch.arange(E, dtype=torch.float32).expand(T, E)
        elif self.select == "probe":
            score = torch.cat([x, torch.ones(T, 1)], 1) @ P["probe"]
        elif self.select == "output":
            score = hq.norm(dim=2) * P["dq_norm"][None]
        else:
            score = (yc - yq).norm(dim=2)
        if self.r == "umia":  # the default UMIA profile on the router's weights
            from rapidmoe.engine.moe.umia import UmiaProfile, critical_sizes, smooth_alpha
            prof = UmiaProfile(smooth_alpha(30, 1.3, 1.0), 1.25, 1.0, 0.9 / E, 1, E)
            wsort = (wts / E).sort(1, descending=True).values.numpy()
            lead = torch.from_numpy(critical_sizes(prof, wsort, self.layer, False, E)).long()
        elif isinstance(self.r, str):  # "w<c>": critical while the weight exceeds c/E
            lead = torch.cumprod((wts.sort(1, descending=True).values > float(self.r[1:])).int(), 1).sum(1)
        elif isinstance(self.r, float):
            share = score.clamp(min=0) / score.clamp(min=0).sum(1, keepdim=True).clamp(min=1e-12)
            lead = torch.cumprod((share.sort(1, descending=True).values > self.r / E).int(), 1).sum(1)
        else:
            lead = torch.full((T,), self.r)
        self.mean_r.append(lead.float().mean().item())
        rank = torch.argsort(torch.argsort(score, 1, descending=True), 1)
        return ((torch.where((rank < lead[:, None])[:, :, None], yc, yq) * wts[:, :, None]).sum(1) + ys) / E


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", default="none,block32,neuron")
    ap.add_argument("--select", default="router,output,oracle")
    ap.add_argument("--r", default="2,4,8,12,1.0", help="whole r, or a fractional share threshold")
    ap.add_argument("--calib-tokens", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--offset", type=int, default=None, help="held-out tokens start here (default: after the calibration)")
    ap.add_argument("--tau", default="0", help="router temperature on the probe (0: uniform weights)")
    ap.add_argument("--shared", default="0", help="hidden units kept as a shared expert (a multiple of 16)")
    args = ap.parse_args()
    torch.set_num_threads(kernels.num_threads())
    rs = [v if v == "umia" or v.startswith("w") else float(v) if "." in v else int(v) for v in args.r.split(",")]
    taus = [float(v) for v in args.tau.split(",")]
    model = load_model(str(locate_source()), n_ctx=max(args.calib_tokens, args.tokens))  # dense SmolLM2
    blocks = model.net.blocks
    toks = model.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)
    start = args.offset if args.offset is not None else args.calib_tokens
    calib, held = toks[:args.calib_tokens], toks[start:start + args.tokens]

    originals = [b.ffn for b in blocks]
    xs = []
    for b, o in zip(blocks, originals):  # each layer's FFN input on the calibration tokens
        b.ffn = lambda x, o=o: (xs.append(x.float().clone()), o(x))[1]
    model.runner.prefill(calib, 0, model.runner.new_cache(len(calib)))
    for b, o in zip(blocks, originals):
        b.ffn = o

    def held_logits():
        return model.runner.prefill(held, 0, model.runner.new_cache(len(held)))[0].numpy()

    base = held_logits()
    print(f"full precision: ppl {perplexity(held, base):.2f} on {len(held)} tokens")
    tensors = {t.name: t for t in GGUFReader(str(locate_source())).tensors}
    for group, shared in [(gr, int(sh)) for sh in args.shared.split(",") for gr in args.group.split(",")]:
        t0, layers = time.time(), []
        for il, x in enumerate(xs):
            g = tensor(tensors, f"blk.{il}.ffn_gate.weight")
            u = tensor(tensors, f"blk.{il}.ffn_up.weight")
            d = E * tensor(tensors, f"blk.{il}.ffn_down.weight")  # [H, ff], x E: each expert weighs 1/E
            p = permutation(group, x, g, u, d, shared)
            g, u, d = g[p], u[p], d[:, p].contiguous()
            gs, us, ds = g[:shared], u[:shared], d[:, :shared]
            g, u, d = g[shared:], u[shared:], d[:, shared:].contiguous()
            f = g.shape[0] // E
            # a linear router fitted to each expert's log output size on the calibration text
            hx = (F.silu(x @ g.T) * (x @ u.T)).view(x.shape[0], E, f).norm(dim=2) * d.view(-1, E, f).norm(dim=(0, 2))
            xa = torch.cat([x, torch.ones(x.shape[0], 1)], 1)
            probe = torch.linalg.lstsq(xa, hx.clamp(min=1e-6).log()).solution
            (gq, gr), (uq, ur) = requant("wq+wr", g), requant("wq+wr", u)
            dq = torch.cat([requant("wq", d[:, e * f:(e + 1) * f].contiguous()) for e in range(E)], 1)
            d4 = torch.cat([requant("d4", d[:, e * f:(e + 1) * f].contiguous()) for e in range(E)], 1)
            layers.append(dict(g=g, u=u, d=d, gs=gs, us=us, ds=ds, probe=probe, gq=gq, gc=gq + gr, uq=uq, uc=uq + ur, dq=dq, d4=d4,
                               dq_norm=dq.view(-1, E, f).norm(dim=(0, 2))))
        print(f"shared {shared}: experts grouped by {group} in {time.time() - t0:.0f} s", flush=True)
        for select, tau in [(s, t) for t in taus for s in args.select.split(",")]:
            for r in rs if select != "full" else [0]:
                if select == "router" and isinstance(r, float):
                    continue
                study = [StudyExperts(P, r, select, tau, il) for il, P in enumerate(layers)]
                for b, s in zip(blocks, study):
                    b.ffn = lambda x, s=s: s(x, None, None)
                lg = held_logits()
                dv = divergence(base, lg)
                mean_r = float(np.mean([np.mean(s.mean_r) for s in study]))
                print(f"shared={shared} group={group:8s} select={select:7s} tau={tau} r={r!s:5s} mean r {mean_r:5.2f}  "
                      f"ppl {perplexity(held, lg):9.2f}  KL {dv.kl_mean:.4f}  top-1 {dv.top1:.3f}", flush=True)
        for b, o in zip(blocks, originals):
            b.ffn = o


if __name__ == "__main__":
    main()
