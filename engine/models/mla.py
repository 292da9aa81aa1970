"""Multi-head latent attention (MLA, DeepSeek-V2/V3) in the absorbed form, as
llama.cpp's MLA path computes it.

Per token and layer the cache keeps only the normalised latent c (kv_lora_rank)
and the roped shared key k_pe (rope dims). A head's query is split into q_nope
and q_pe; q_nope is absorbed through attn_k_b into the latent space, so every
head attends over the same cached rows [c, k_pe] (one-group MQA):

    score_h(t, s) = (k_b_h q_nope_h(t)) . c(s) + q_pe_h(t) . k_pe(s)
    out_h(t)      = v_b_h (sum_s softmax(score_h)(t, s) c(s))
"""
from __future__ import annotations

import math

import torch

from .. import kernels
from ..hparams import ModelConfig
from ..kv_cache import KVRows
from ..kv_types import DEFAULT_KV_TYPE, check_kv_type
from ..weights import QWeight, Weights
from ..ops import linear
from .common import Rope, rms_norm, unwritten


_SCORES_MAX = 1 << 25  # attention scores held at once (128 MiB in f32)


class MLACache:
    """Per layer: one head of rows (engine/kv_cache.KVRows) [latent c | roped k_pe] of
    kv_lora_rank + rope values in kv_type."""

    def __init__(self, cfg: ModelConfig, n_ctx: int, devices=None, kv_type: str = DEFAULT_KV_TYPE):
        self.n_ctx, self.kv_type = n_ctx, kv_type
        devs = devices or [None] * cfg.n_layer
        check_kv_type(kv_type, (cfg.mla.kv_lora_rank,))  # the values are the rows' latent part
        self.kv = [KVRows(n_ctx, 1, cfg.mla.kv_lora_rank + cfg.rope_dim, kv_type, d) for d in devs]

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.kv)


def kq_scale(cfg: ModelConfig, attn_factor: float) -> float:
    """llama.cpp pre-scales the attention by YaRN's mscale squared, with the
    log multiplier (mscale_all_dim) applied: mscale^2 / sqrt(key length)."""
    ln = math.log(1.0 / cfg.rope_freq_scale)
    mscale = attn_factor * (1.0 + 0.1 * ln) * (1.0 + 0.1 * cfg.mla.yarn_log_mul * ln)
    return mscale * mscale / math.sqrt(cfg.mla.head_dim_k)


def per_head(w, x: torch.Tensor) -> torch.Tensor:
    """Each head's own matrix: w (nh, out, in) as a float tensor, a QWeight or a
    GPU-placed stack (its own per_head), x [T, nh, in] -> [T, nh, out]."""
    if isinstance(w, torch.Tensor):
        return torch.einsum("thi,hoi->tho", x.to(w.dtype), w).float()
    if not isinstance(w, QWeight):
        return w.per_head(x)
    T, nh, _ = x.shape
    ids = torch.arange(nh, dtype=torch.int32).repeat(T)  # row t*nh + h uses head h
    return w.expert_matmul(ids, x.reshape(T * nh, -1).contiguous()).view(T, nh, -1)


class MLAttention:
    def __init__(self, cfg: ModelConfig, W: Weights, il: int, rope: Rope, scale: float):
        H, nh = cfg.n_embd, cfg.n_head
        kv, rd, hk, hv = cfg.mla.kv_lora_rank, cfg.rope_dim, cfg.mla.head_dim_k, cfg.mla.head_dim_v
        self.nope = hk - rd
        p = f"blk.{il}."
        self.cfg, self.rope, self.scale, self.il = cfg, rope, scale, il
        q_lora = cfg.mla.q_lora_rank
        if q_lora:
            self.wq_a = W.mat(p + "attn_q_a.weight", H, q_lora)
            self.q_a_norm = W.get(p + "attn_q_a_norm.weight", q_lora)
            self.wq_b = W.mat(p + "attn_q_b.weight", q_lora, nh * hk)
            self.wq = None
        else:
            self.wq = W.mat(p + "attn_q.weight", H, nh * hk)
        self.wkv_a = W.mat(p + "attn_kv_a_mqa.weight", H, kv + rd)
        self.kv_a_norm = W.get(p + "attn_kv_a_norm.weight", kv)
        if cfg.mla.absorbed:  # per-head stacks, kept in their GGUF type like expert stacks
            self.k_b = W.mat(p + "attn_k_b.weight", self.nope, kv, nh)  # [nh, kv, nope]
            self.v_b = W.mat(p + "attn_v_b.weight", kv, hv, nh)  # [nh, hv, kv]
        else:  # legacy files: one attn_kv_b holding, per head, the k_nope rows then the v rows
            kvb = W.get(p + "attn_kv_b.weight", kv, nh * (self.nope + hv)).view(nh, self.nope + hv, kv)
            self.k_b = kvb[:, :self.nope].transpose(1, 2).contiguous()  # [nh, kv, nope]
            self.v_b = kvb[:, self.nope:].contiguous()  # [nh, hv, kv]
        self.wo = W.mat(p + "attn_output.weight", nh * hv, H)
        self.kv = kv
        self._ops = None

    def fusable(self) -> bool:
        """decode_block covers this layer (not llama.cpp's per-position query temperature)."""
        return not self.cfg.mla.attn_temp_scale

    def _operands(self) -> tuple:
        """The projections as decode_mla_block takes them: 2-D ggml operands (the per-head
        stacks as one run of rows), None where the layer has no such matrix."""
        if self._ops is None:
            def op(w):
                if w is None:
                    return None
                raw, qtype = kernels.ggml_operand(w.contiguous() if isinstance(w, torch.Tensor) else w)
                return raw.reshape(-1, raw.shape[-1]), qtype

            q_lora = self.wq is None
            self._ops = (op(self.wq), op(self.wq_a if q_lora else None),
                         self.q_a_norm.numpy() if q_lora else None, op(self.wq_b if q_lora else None),
                         op(self.wkv_a), self.kv_a_norm.numpy(), op(self.k_b), op(self.v_b), op(self.wo))
        return self._ops

    CHAIN_ADD = "add_mla"  # the DecodeChain method that takes chain_args

    def chain_args(self, cache: MLACache) -> dict:
        """The attention half's operands as DecodeChain.add_mla takes them (this cache's rows,
        the whole RoPE tables)."""
        cfg = self.cfg
        return dict(zip(("wq", "wq_a", "q_a_norm", "wq_b", "wkv_a", "kv_a_norm", "k_b", "v_b", "wo"), self._operands()),
                    cache=cache.kv[self.il].array(), n_head=cfg.n_head, cos=self.rope.cos.numpy(),
                    sin=self.rope.sin.numpy(), rope_dim=self.rope.dim, neox=self.rope.style == "neox", scale=self.scale,
                    nope=self.nope, hv=cfg.mla.head_dim_v)

    def decode_block(self, x: torch.Tensor, norm_w: torch.Tensor, eps: float, pos: int, cache: MLACache) -> torch.Tensor:
        """x [1, H] -> x + self(rms_norm(x)) in one kernel call (the cache row written at pos)."""
        cfg = self.cfg
        out = kernels.decode_mla_block(
            x.numpy().reshape(-1), norm_w.numpy(), eps, *self._operands(), cache.kv[self.il].array(), pos, cfg.n_head,
            self.rope.cos[pos].numpy(), self.rope.sin[pos].numpy(), self.rope.dim, self.rope.style == "neox",
            self.scale, self.nope, cfg.mla.head_dim_v)
        return torch.from_numpy(out).view(1, -1)

    def __call__(self, x: torch.Tensor, pos0: int | torch.Tensor, cache: MLACache, span: int | None = None
                 ) -> torch.Tensor:
        """pos0, span: as Attention's (a decode token in a graph segment: the device position
        tensor and the cache rows read)."""
        cfg, T = self.cfg, x.shape[0]
        nh, kv = cfg.n_head, self.kv
        if self.wq is not None:
            q = linear(x, self.wq)
        else:
            q = linear(rms_norm(linear(x, self.wq_a), self.q_a_norm, cfg.rms_eps), self.wq_b)
        q = q.view(T, nh, -1)  # [T, nh, nope + rope]
        q_pe = self.rope(q[..., self.nope:], pos0)  # [T, nh, rope]
        q_lat = per_head(self.k_b, q[..., :self.nope])  # [T, nh, kv]

        ckv = linear(x, self.wkv_a)  # [T, kv + rope]
        k_pe = self.rope(ckv[:, None, kv:], pos0)[:, 0]  # [T, rope]
        rows = cache.kv[self.il]
        rows.write(pos0, torch.cat([rms_norm(ckv[:, :kv], self.kv_a_norm, cfg.rms_eps), k_pe], dim=-1)[:, None])
        S = pos0 + T if span is None else span

        qcat = torch.cat([q_lat, q_pe], dim=-1)  # [T, nh, kv + rope]
        if cfg.mla.attn_temp_scale:  # llama.cpp's per-position query temperature
            pos = pos0.double() if span is not None else torch.arange(pos0, S, dtype=torch.float64, device=x.device)
            temp = torch.log(torch.floor(pos / cfg.mla.attn_temp_length) + 1) * cfg.mla.attn_temp_scale + 1
            qcat = qcat * temp.float()[:, None, None]
        if span is None and rows.device.type == "cpu":  # every head over the cached rows in place, flash-style
            o_lat = torch.from_numpy(kernels.attn_cached(qcat.contiguous().numpy(), rows.array(), None, pos0, nh,
                                                         self.scale, v_dim=kv)).view(T, nh, kv)
            return linear(per_head(self.v_b, o_lat).reshape(T, -1), self.wo)
        keys = rows.read(S)[:, 0]  # [S, kv + rope]
        o_lat = torch.empty(T, nh, kv, device=x.device)
        step = max(1, _SCORES_MAX // (nh * S))  # queries per block: bounds the [t, nh, S] scores
        for t0 in range(0, T, step):
            t1 = min(T, t0 + step)
            scores = (qcat[t0:t1] @ keys.T) * self.scale  # [t, nh, S]
            if span is not None:
                scores = scores.masked_fill(unwritten(S, pos0), float("-inf"))
            elif T > 1:
                causal = (torch.arange(S, device=x.device)[None, :]
                          <= torch.arange(pos0 + t0, pos0 + t1, device=x.device)[:, None])  # [t, S]
                scores = scores.masked_fill(~causal[:, None, :], float("-inf"))
            o_lat[t0:t1] = torch.softmax(scores, dim=-1) @ keys[:, :kv]  # [t, nh, kv]
        o = per_head(self.v_b, o_lat)  # [T, nh, hv]
        return linear(o.reshape(T, -1), self.wo)
