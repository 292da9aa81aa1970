"""Pieces every architecture shares: RMSNorm, RoPE, attention with a KV cache,
the dense SwiGLU FFN. Math and order of operations follow llama.cpp."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..hparams import ModelConfig
from ..kv_cache import KVRows
from ..kv_types import DEFAULT_KV_TYPE

ATTN_SCORES_BYTES = 16 << 20  # a prefill attention chunk's scores [n_head, c, S] stay about this size


def attention_chunk(n_head: int, S: int) -> int:
    """Queries per prefill attention chunk (engine/models/common.attend) over S keys."""
    return max(16, min(128, ATTN_SCORES_BYTES // (4 * n_head * max(1, S))))


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    # [.., D] -> [.., D]: x * rsqrt(mean(x^2) + eps) * w, rounded as ggml (and the fused
    # decode kernels) do
    if w is None or x.dtype != torch.float32 or x.device.type != "cpu":
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    from .. import kernels  # deferred: loads the compiled kernels

    return torch.from_numpy(kernels.rms_norm(x.detach().numpy(), w.detach().numpy(), eps))


@dataclass(frozen=True)
class Yarn:
    """YaRN RoPE scaling as ggml's rope applies it: per rotary pair, a ramp between
    the interpolated (pos * freq_scale) and extrapolated (pos) angles, and a
    magnitude attn_factor * (1 + 0.1 ln(1/freq_scale)) on cos and sin."""
    attn_factor: float  # the context's yarn_attn_factor (llama.cpp cparams)
    n_ctx_orig: int  # rope.scaling.original_context_length
    ext_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def corr_dims(self, n_dims: int, base: float) -> tuple[float, float]:
        """First and last rotary pair of the ramp (ggml_rope_yarn_corr_dims)."""
        def dim(n_rot: float) -> float:
            return n_dims * math.log(self.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

        return max(0.0, math.floor(dim(self.beta_fast))), min(n_dims - 1.0, math.ceil(dim(self.beta_slow)))


class Rope:
    """Rotary embedding tables for one model (norm = adjacent pairs, neox = halves),
    optionally with YaRN scaling."""

    def __init__(self, cfg: ModelConfig, n_ctx: int, yarn: Yarn | None = None):
        d = cfg.rope_dim
        self.dim, self.style = d, cfg.rope_style
        i = torch.arange(0, d, 2, dtype=torch.float64)
        inv = cfg.rope_base ** (-i / d)  # [d/2]
        fs = cfg.rope_freq_scale
        pos = torch.arange(n_ctx, dtype=torch.float64)[:, None]
        extrap = pos * inv[None, :]  # [n_ctx, d/2]
        theta = extrap * fs
        mscale = 1.0
        if yarn is not None:
            mscale = yarn.attn_factor
            if yarn.ext_factor != 0.0:
                low, high = yarn.corr_dims(d, cfg.rope_base)
                ramp = 1 - ((i / 2 - low) / max(0.001, high - low)).clamp(0, 1)  # [d/2]: 1 = extrapolate
                mix = ramp * yarn.ext_factor
                theta = theta * (1 - mix) + extrap * mix
                mscale *= 1.0 + 0.1 * math.log(1.0 / fs)
        self.cos = (torch.cos(theta) * mscale).float()
        self.sin = (torch.sin(theta) * mscale).float()
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # the tables on each GPU

    def tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device.type == "cpu":
            return self.cos, self.sin
        if device not in self._on:  # copied once, not per call (a copy per layer would sync)
            self._on[device] = (self.cos.to(device), self.sin.to(device))
        return self._on[device]

    def __call__(self, x: torch.Tensor, pos0: int | torch.Tensor) -> torch.Tensor:
        # x [T, H, hd] -> same; rotates the first `dim` dims of each head. pos0: the first
        # position, or (a decode token in a graph segment) a device tensor [1] holding it
        T = x.shape[0]
        cos_t, sin_t = self.tables(x.device)
        if isinstance(pos0, torch.Tensor):
            cos, sin = cos_t.index_select(0, pos0)[:, None, :], sin_t.index_select(0, pos0)[:, None, :]
        else:
            cos = cos_t[pos0:pos0 + T, None, :]  # [T, 1, d/2]
            sin = sin_t[pos0:pos0 + T, None, :]
        d = self.dim
        rot, rest = x[..., :d], x[..., d:]
        if self.style == "neox":
            a, b = rot[..., : d // 2], rot[..., d // 2:]
            out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
        return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


class KVCache:
    """Per-layer K and V for one sequence: k[il] and v[il], n_kv heads of hd and hd_v values
    (engine/kv_cache.KVRows) in kv_type. devices: each layer's device (None: all in host memory)."""

    def __init__(self, cfg: ModelConfig, n_ctx: int, devices=None, kv_type: str = DEFAULT_KV_TYPE):
        self.n_ctx, self.kv_type = n_ctx, kv_type
        devs = devices or [None] * cfg.n_layer
        self.k = [KVRows(n_ctx, cfg.n_head_kv, cfg.head_dim, kv_type, d) for d in devs]
        self.v = [KVRows(n_ctx, cfg.n_head_kv, cfg.head_dim_v, kv_type, d) for d in devs]

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.k + self.v)


def attend(q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, pos0: int | torch.Tensor,
           scale: float) -> torch.Tensor:
    """Causal attention of T new queries at positions pos0.. over the cache.
    q [T, H, hd], k_all [S, Hkv, hd], v_all [S, Hkv, hdv] with S = pos0 + T -> [T, H*hdv].
    A decode token in a graph segment: pos0 a device tensor [1], S a bucket of rows
    (engine/gpu/graphs.kv_bucket), the rows past pos0 masked."""
    T, H, hd = q.shape
    S, Hkv, _ = k_all.shape
    rep = H // Hkv
    kh, vh = k_all.transpose(0, 1), v_all.transpose(0, 1)  # [Hkv, S, hd]: views of the cache
    if T == 1:
        # decode: the rep query heads of a group read their K/V head in place (no copy of the cache)
        qg = q.view(Hkv, rep, hd)  # [Hkv, rep, hd]
        s = torch.matmul(qg, kh.transpose(1, 2)) * scale  # [Hkv, rep, S]
        if isinstance(pos0, torch.Tensor):
            s = s.masked_fill(unwritten(S, pos0), float("-inf"))
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, vh).reshape(1, -1)  # [1, H*hdv]
    # prefill: chunks of queries against the keys they can see (later keys are never
    # computed), the rep query heads of a group batched over their shared K/V head
    # (no copy per head). A chunk's scores [H, c, S] stay within ~16 MB (the plan counts them).
    hdv = v_all.shape[-1]
    qg = q.permute(1, 0, 2).reshape(Hkv, rep, T, hd)
    out = torch.empty(T, Hkv, rep, hdv, device=q.device)
    step = attention_chunk(H, S)
    for c0 in range(0, T, step):
        c1 = min(T, c0 + step)
        s1 = pos0 + c1  # keys visible to the chunk's last query
        s = torch.matmul(qg[:, :, c0:c1], kh[:, None, :s1].transpose(2, 3))  # [Hkv, rep, c, s1]
        hidden = (torch.arange(s1, device=q.device)[None, :]
                  > torch.arange(pos0 + c0, pos0 + c1, device=q.device)[:, None])
        p = torch.softmax(s.mul_(scale).masked_fill_(hidden, float("-inf")), dim=-1)
        out[c0:c1] = torch.matmul(p, vh[:, None, :s1]).permute(2, 0, 1, 3)
    return out.view(T, -1)


def unwritten(S: int, pos: torch.Tensor) -> torch.Tensor:
    """[S] bool: the cache rows past the decode position in the device tensor pos [1]."""
    return torch.arange(S, device=pos.device) > pos


def embed(table, tokens: torch.Tensor) -> torch.Tensor:
    """Rows of the embedding table [V, H] (f32 tensor or QWeight) -> [T, H] f32."""
    if isinstance(table, torch.Tensor):
        return table[tokens]
    from .. import kernels  # deferred: loads the compiled kernels

    rows = table.raw[tokens.numpy()]  # [T, row_bytes]: only the rows used are read
    return torch.from_numpy(kernels.ggml_dequantize(rows, table.qtype, rows.shape[0] * table.shape[-1])
                            ).view(rows.shape[0], -1)


def default_kq_scale(cfg: ModelConfig) -> float:
    return cfg.attn_scale or 1.0 / math.sqrt(cfg.head_dim)
