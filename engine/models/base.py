"""The decoder loop shared by all architectures. An architecture file supplies
`build_block(cfg, W, il)`; this file owns embedding, the layer loop, the final
norm and the output head."""
from __future__ import annotations

import weakref

import numpy as np
import torch

from .. import kernels
from ..hparams import ModelConfig
from ..kv_types import DEFAULT_KV_TYPE
from ..moe.block import MoEFFN
from ..moe.router import RouterSpec
from ..ops import linear
from ..weights import Weights
from .common import KVCache, Rope, attend, default_kq_scale, embed, rms_norm
from .experts_loader import load_experts


class Attention:
    """Standard multi-head attention with GQA. qk_norm: None, "head" (per head,
    qwen3moe) or "full" (over the whole projection, olmoe)."""

    def __init__(self, cfg: ModelConfig, W: Weights, il: int, rope: Rope, kq_scale: float,
                 bias: bool = False, qk_norm: str | None = None):
        H, nh, nkv, hd, hdv = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
        p = f"blk.{il}."
        self.cfg, self.rope, self.scale, self.il = cfg, rope, kq_scale, il
        self.wq = W.mat(p + "attn_q.weight", H, nh * hd)
        self.wk = W.mat(p + "attn_k.weight", H, nkv * hd)
        self.wv = W.mat(p + "attn_v.weight", H, nkv * hdv)
        self.wo = W.mat(p + "attn_output.weight", nh * hdv, H)
        opt = W.get if bias else W.opt
        self.bq = opt(p + "attn_q.bias", nh * hd)
        self.bk = opt(p + "attn_k.bias", nkv * hd)
        self.bv = opt(p + "attn_v.bias", nkv * hdv)
        self.qk_norm = qk_norm
        self._ops = None  # the projections as decode_block passes them (built on first use)
        self.q_norm_np = self.k_norm_np = None  # the norms for decode_block
        if qk_norm == "head":
            self.q_norm = W.get(p + "attn_q_norm.weight", hd)
            self.k_norm = W.get(p + "attn_k_norm.weight", hd)
        elif qk_norm == "full":
            self.q_norm = W.get(p + "attn_q_norm.weight", nh * hd)
            self.k_norm = W.get(p + "attn_k_norm.weight", nkv * hd)
        if qk_norm:
            self.q_norm_np, self.k_norm_np = self.q_norm.numpy(), self.k_norm.numpy()

    def __call__(self, x: torch.Tensor, pos0: int | torch.Tensor, cache: KVCache, span: int | None = None
                 ) -> torch.Tensor:
        """pos0: the first position; for a decode token in a graph segment (engine/gpu/graphs.py),
        the device position tensor, with span the cache rows read (the rest masked)."""
        cfg, T = self.cfg, x.shape[0]
        q = linear(x, self.wq, self.bq)  # [T, nh*hd]
        k = linear(x, self.wk, self.bk)  # [T, nkv*hd]
        v = linear(x, self.wv, self.bv)  # [T, nkv*hdv]
        if self.qk_norm == "full":
            q = rms_norm(q, self.q_norm, cfg.rms_eps)
            k = rms_norm(k, self.k_norm, cfg.rms_eps)
        q = q.view(T, cfg.n_head, cfg.head_dim)
        k = k.view(T, cfg.n_head_kv, cfg.head_dim)
        if self.qk_norm == "head":
            q = rms_norm(q, self.q_norm, cfg.rms_eps)
            k = rms_norm(k, self.k_norm, cfg.rms_eps)
        q, k = self.rope(q, pos0), self.rope(k, pos0)
        kc, vc = cache.k[self.il], cache.v[self.il]
        kc.write(pos0, k)
        vc.write(pos0, v.view(T, cfg.n_head_kv, cfg.head_dim_v))
        if span is not None:
            o = attend(q, kc.read(span), vc.read(span), pos0, self.scale)
        elif kc.device.type == "cpu":  # the cache read in place, in its type, flash-style over threads
            o = torch.from_numpy(kernels.attn_cached(q.numpy(), kc.array(), vc.array(), pos0, cfg.n_head,
                                                     self.scale)).view(T, -1)
        else:
            o = attend(q, kc.read(pos0 + T), vc.read(pos0 + T), pos0, self.scale)  # [T, nh*hdv]
        return linear(o, self.wo)

    def fusable(self) -> bool:
        """decode_block covers this layer."""
        return self.rope.dim <= self.cfg.head_dim

    def _operands(self) -> tuple:
        """wq, wk, wv, wo as ggml operands and the biases (or None) as the fused kernels take them."""
        if self._ops is None:
            self._ops = (*(kernels.ggml_operand(w) for w in (self.wq, self.wk, self.wv, self.wo)),
                         *(None if b is None else b.numpy() for b in (self.bq, self.bk, self.bv)))
        return self._ops

    CHAIN_ADD = "add"  # the DecodeChain method that takes chain_args

    def chain_args(self, cache: KVCache) -> dict:
        """The attention half's operands as DecodeChain.add takes them (this cache's rows,
        the whole RoPE tables)."""
        cfg = self.cfg
        return dict(zip(("wq", "wk", "wv", "wo", "bq", "bk", "bv"), self._operands()),
                    kc=cache.k[self.il].array(), vc=cache.v[self.il].array(), n_head=cfg.n_head,
                    cos=self.rope.cos.numpy(), sin=self.rope.sin.numpy(), rope_dim=self.rope.dim,
                    neox=self.rope.style == "neox", q_norm=self.q_norm_np, k_norm=self.k_norm_np,
                    qk_eps=cfg.rms_eps, scale=self.scale, qk_full=self.qk_norm == "full")

    def decode_block(self, x: torch.Tensor, norm_w: torch.Tensor, eps: float, pos: int, cache: KVCache) -> torch.Tensor:
        """x [1, H] -> x + self(rms_norm(x)) in one kernel call (the K/V cache written at pos)."""
        cfg = self.cfg
        out = kernels.decode_attn_block(
            x.numpy().reshape(-1), norm_w.numpy(), eps, *self._operands(),
            cache.k[self.il].array(), cache.v[self.il].array(), pos, cfg.n_head, self.rope.cos[pos].numpy(),
            self.rope.sin[pos].numpy(), self.rope.dim, self.rope.style == "neox", self.q_norm_np, self.k_norm_np,
            cfg.rms_eps, self.scale, self.qk_norm == "full")
        return torch.from_numpy(out).view(1, -1)


class Block:
    """Pre-norm residual block: x + attn(norm(x)); h + ffn(norm(h))."""

    def __init__(self, cfg: ModelConfig, W: Weights, il: int, attn, ffn):
        H = cfg.n_embd
        self.eps = cfg.rms_eps
        self.attn_norm = W.get(f"blk.{il}.attn_norm.weight", H)
        self.ffn_norm = W.get(f"blk.{il}.ffn_norm.weight", H)
        self.attn, self.ffn = attn, ffn
        self.device = torch.device("cpu")  # where this block's weights and cache live

    def chainable(self, step) -> bool:
        """Both halves fuse for a decode token of this step (a DecodeChain can run the block)."""
        return (step.fused and getattr(self.attn, "fusable", lambda: False)() and isinstance(self.ffn, MoEFFN)
                and self.ffn.fusable(step))

    def __call__(self, x: torch.Tensor, pos0: int, cache: KVCache, step) -> torch.Tensor:
        if x.shape[0] == 1 and step.graphs is not None:
            return self.segments(x, pos0, cache, step, step.graphs[str(self.device)])
        decode = x.shape[0] == 1 and step.fused  # the CPU step: each half in one kernel call
        if decode and getattr(self.attn, "fusable", lambda: False)():
            h = self.attn.decode_block(x, self.attn_norm, self.eps, pos0, cache)
        else:
            h = x + self.attn(rms_norm(x, self.attn_norm, self.eps), pos0, cache)
        if decode and isinstance(self.ffn, MoEFFN) and self.ffn.fusable(step):
            return self.ffn.decode_block(h, self.ffn_norm, self.eps, step)
        return h + (self.ffn(rms_norm(h, self.ffn_norm, self.eps), step) if isinstance(self.ffn, MoEFFN)
                    else self.ffn(rms_norm(h, self.ffn_norm, self.eps)))

    def segments(self, x: torch.Tensor, pos: int, cache: KVCache, step, g) -> torch.Tensor:
        """A decode token of the GPU step through graph segments (g: the DecodeGraphs of this
        block's device, engine/gpu/graphs.py): the attention half over a bucket of cache
        rows, then the dense FFN, or the router (norm included), the experts' schedule
        (its device work in segments of its own) and the shared expert."""
        il, span = self.attn.il, g.bucket(pos + 1, cache.n_ctx)
        h = g.run(("attn", il, span),
                  lambda xs: xs + self.attn(rms_norm(xs, self.attn_norm, self.eps), g.pos, cache, span), x)
        ffn = self.ffn
        if not isinstance(ffn, MoEFFN):
            return g.run(("ffn", il), lambda hs: hs + ffn(rms_norm(hs, self.ffn_norm, self.eps)), h)

        def router(hs):
            xn = rms_norm(hs, self.ffn_norm, self.eps)
            return (xn, *ffn.route(xn))
        xn, ids, w = g.run(("route", il), router, h)
        return h + ffn.expert_sum(xn, ids, w, step, g)


class BlockChain:
    """Consecutive blocks that a decode token runs through in one kernel call
    (DecodeChain): their operands and one cache's rows are handed over once."""

    def __init__(self, blocks: list[Block], cache: KVCache):
        self.blocks = blocks
        self.op = kernels.decode_chain()
        for b in blocks:
            getattr(self.op, b.attn.CHAIN_ADD)(attn_norm=b.attn_norm.numpy(), ffn_norm=b.ffn_norm.numpy(), eps=b.eps,
                                               **b.attn.chain_args(cache), **b.ffn.chain_args())

    def __call__(self, x: torch.Tensor, pos: int, step) -> torch.Tensor:
        """x [1, H] at pos through the blocks; each MoE layer's r and ids recorded in step."""
        crit = [b.ffn.crit_args(step) for b in self.blocks]
        fixed, _, theta, r_min, r_max = crit[0]
        out, ids, _, r = self.op.run(x.numpy().reshape(-1), pos, fixed, np.array([c[1] for c in crit]), theta,
                                     r_min, r_max)
        k0 = 0
        for b, ri in zip(self.blocks, r):
            k = b.ffn.spec.k
            b.ffn.record(step, int(ri), ids[k0:k0 + k])
            k0 += k
        return torch.from_numpy(out).view(1, -1)


class Transformer:
    def __init__(self, cfg: ModelConfig, W: Weights, build_block, progress=None):
        H, V = cfg.n_embd, cfg.n_vocab
        self.cfg = cfg
        self.tok_embd = W.mat("token_embd.weight", H, V)  # [V, H]
        self.output = W.mat("output.weight", H, V) if W.has("output.weight") else self.tok_embd  # tied
        self.output_norm = W.get("output_norm.weight", H)
        self.head_device = torch.device("cpu")  # where the output head runs (a GPU plan moves it)
        self._chains = weakref.WeakKeyDictionary()  # cache -> {(first, end) block: BlockChain}
        self.blocks = []
        for il in range(cfg.n_layer):
            self.blocks.append(build_block(cfg, W, il))
            if progress:
                progress(il + 1, cfg.n_layer)

    def new_cache(self, n_ctx: int, devices=None, kv_type: str = DEFAULT_KV_TYPE) -> KVCache:
        """devices: the device of each layer's cache (None: host memory)."""
        return KVCache(self.cfg, n_ctx, devices, kv_type)

    def _chain(self, cache: KVCache, i: int, j: int) -> BlockChain:
        """Blocks i..j-1 as one DecodeChain over this cache (built on its first decode token)."""
        chains = self._chains.setdefault(cache, {})
        if (i, j) not in chains:
            chains[(i, j)] = BlockChain(self.blocks[i:j], cache)
        return chains[(i, j)]

    def moe_layers(self) -> list[MoEFFN]:
        return [b.ffn for b in self.blocks if isinstance(b.ffn, MoEFFN)]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, pos0: int, cache: KVCache, step, last_only: bool = False) -> torch.Tensor:
        """tokens [T] at positions pos0.. -> logits [T, V] (or [1, V] with last_only), on the
        output head's device.
        step (engine.step.Step): this call's policy and records; callers go through
        engine.runner.Runner."""
        # Decode's heavy math is in the kernels' own thread pool; torch's OpenMP
        # workers spinning beside it on the same cores only slow both down.
        torch.set_num_threads(1 if tokens.numel() == 1 else kernels.num_threads())
        x = embed(self.tok_embd, tokens)  # [T, H] on the host
        i, n = 0, len(self.blocks)
        while i < n:
            j = i
            if tokens.numel() == 1:  # the CPU step's runs of fully fused blocks: one call each
                while j < n and self.blocks[j].chainable(step):
                    j += 1
            if j - i > 1:
                x = self._chain(cache, i, j)(x, pos0, step)
                i = j
            else:
                blk = self.blocks[i]
                x = blk(x.to(blk.device), pos0, cache, step)
                i += 1
        if last_only:
            x = x[-1:]
        x = x.to(self.head_device)
        head = lambda xs: linear(rms_norm(xs, self.output_norm, self.cfg.rms_eps), self.output)  # noqa: E731
        return head(x) if step.graphs is None else step.graphs[str(self.head_device)].run(("head",), head, x)


def routed_ffn(cfg: ModelConfig, W: Weights, il: int, shared=None) -> MoEFFN:
    """Layer il's routed experts behind its router, plus an optional shared expert."""
    return MoEFFN(il, W.mat(f"blk.{il}.ffn_gate_inp.weight", cfg.n_embd, cfg.n_expert),
                  load_experts(cfg, W, il), RouterSpec.from_config(cfg), shared=shared)


def build_standard(cfg: ModelConfig, W: Weights, n_ctx: int, progress=None, qk_norm: str | None = None,
                   bias: bool = False, ffn=routed_ffn) -> Transformer:
    """Pre-norm blocks of GQA attention (RoPE; optional q/k/v biases and q/k norms)
    and ffn(cfg, W, il)."""
    rope = Rope(cfg, n_ctx)

    def block(cfg, W, il):
        attn = Attention(cfg, W, il, rope, default_kq_scale(cfg), bias=bias, qk_norm=qk_norm)
        return Block(cfg, W, il, attn, ffn(cfg, W, il))

    return Transformer(cfg, W, block, progress)
