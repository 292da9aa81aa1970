"""DeepSeek-V3-shaped layers for the device check, written directly in memory
(random valid blocks, no GGUF): hidden 7168, 256 routed experts of FFN 2048,
top-8 (sigmoid router, normalised, x2.5), one shared expert. Attention is
stood in for by its projections at MLA shapes in Q8_0 (q_a, q_b, kv_a, kv_b,
o): the weight traffic of a decode step, without the KV-cache math."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rapidmoe.engine import kernels
from rapidmoe.engine.gpu.placement import GpuQWeight, gpu_linear
from rapidmoe.engine.step import Step

H, E, FF, K, SH_FF = 7168, 256, 2048, 8, 2048
ATTN = {"q_a": (1536, H), "q_b": (24576, 1536), "kv_a": (576, H), "kv_b": (32768, 512), "o": (H, 16384)}
SCALE = 2.5  # expert_weights_scale


def _f16_bytes(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float16).view(torch.uint8).reshape(*v.shape, 2)


def random_wq(shape_er, n, gen, dev, scale=0.02) -> torch.Tensor:
    """[E, R, rb] W_Q bytes: random trits, block scales ~scale (12-bit code = f16 bits 14:3)."""
    nb = -(-n // 32)
    q = torch.randint(0, 256, (*shape_er, nb, 8), dtype=torch.uint8, device=dev, generator=gen)
    s = scale * (0.75 + 0.5 * torch.rand(*shape_er, nb, device=dev, generator=gen))
    code = ((s.to(torch.float16).view(torch.int16).to(torch.int32) + 4) >> 3).clamp(max=0xF7F)
    q[..., 6] = (q[..., 6] & 0xF0) | (code & 0xF).to(torch.uint8)
    q[..., 7] = (code >> 4).to(torch.uint8)
    return q.reshape(*shape_er, nb * 8)


def random_wr(shape_er, n, gen, dev, scale=0.004) -> torch.Tensor:
    rb = kernels.resplit_row_bytes("wr", n)
    q = torch.randint(0, 256, (*shape_er, rb), dtype=torch.uint8, device=dev, generator=gen)
    q[..., 0:2] = _f16_bytes(torch.full(shape_er, scale, device=dev))
    return q


def random_d4(shape_er, n, gen, dev, scale=0.02) -> torch.Tensor:
    rb = kernels.resplit_row_bytes("d4", n)
    q = torch.randint(0, 256, (*shape_er, rb), dtype=torch.uint8, device=dev, generator=gen)
    q[..., 0:2] = _f16_bytes(torch.full(shape_er, scale / (255 * 15), device=dev))
    q[..., 2:4] = _f16_bytes(torch.full(shape_er, scale / (255 * 2), device=dev))
    return q


def random_q8_0(rows, n, gen, dev, scale=0.02) -> torch.Tensor:
    nb = n // 32
    q = torch.randint(0, 256, (rows, nb, 34), dtype=torch.uint8, device=dev, generator=gen)
    q[..., 0:2] = _f16_bytes(torch.full((rows, nb), scale / 127, device=dev))
    return q.reshape(rows, nb * 34)


class Layer:
    """Host parts (numpy, for the CPU kernels) + the GPU-side non-expert weights."""

    def __init__(self, seed: int, dev: torch.device, standin: bool = False, n_expert: int = E):
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.E = n_expert
        parts = {
            "gate_q": random_wq((n_expert, FF), H, gen, dev), "up_q": random_wq((n_expert, FF), H, gen, dev),
            "down_q": random_wq((n_expert, H), FF, gen, dev),
            "gate_r": random_wr((n_expert, FF), H, gen, dev), "up_r": random_wr((n_expert, FF), H, gen, dev),
            "down4": random_d4((n_expert, H), FF, gen, dev),
        }
        self.parts = {k: v.cpu().numpy() for k, v in parts.items()}
        del parts
        self.router = (torch.randn(n_expert, H, device=dev, generator=gen) * 0.02)  # f32 [E, H]
        mats = dict(ATTN, sh_gate=(SH_FF, H), sh_up=(SH_FF, H), sh_down=(H, SH_FF))
        if standin:  # float stand-ins on the CPU
            self.w = {k: torch.randn(r, n, generator=gen) * 0.02 for k, (r, n) in mats.items()}
        else:
            self.w = {k: GpuQWeight.from_device_bytes(random_q8_0(r, n, gen, dev), 8, (r, n)) for k, (r, n) in mats.items()}

    @property
    def wq_bytes_per_expert(self) -> int:
        return sum(int(self.parts[k][0].nbytes) for k in ("gate_q", "up_q", "down_q"))


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


ROUTER_BIAS = -3.0  # keeps the sigmoid scores off saturation, so the top-8 weights differ


def route(h: torch.Tensor, router: torch.Tensor):
    p = torch.sigmoid(h @ router.T + ROUTER_BIAS)  # [T, E]
    w, ids = p.topk(K, dim=-1)
    return ids, w / w.sum(-1, keepdim=True) * SCALE


def attention_stand_in(layer: Layer, h: torch.Tensor) -> torch.Tensor:
    lw = layer.w
    a = gpu_linear(h, lw["q_a"])                   # [T, 1536]
    q = gpu_linear(rms(a), lw["q_b"])              # [T, 24576]
    kv = gpu_linear(h, lw["kv_a"])                 # [T, 576]
    kvb = gpu_linear(rms(kv[:, :512]), lw["kv_b"])  # [T, 32768]
    o_in = rms(q[:, :16384] + kvb[:, :16384])      # stands in for the attention output
    return gpu_linear(o_in, lw["o"])               # [T, H]


def shared_expert(layer: Layer, h: torch.Tensor) -> torch.Tensor:
    lw = layer.w
    return gpu_linear(F.silu(gpu_linear(h, lw["sh_gate"])) * gpu_linear(h, lw["sh_up"]), lw["sh_down"])


def step(layers: list[Layer], scheds: list, dev, x: torch.Tensor, policy, trace: list | None = None) -> torch.Tensor:
    """x [T, H] through every layer: attention stand-in, router, shared expert
    (device) and the routed experts (the schedule under test, with `policy`).
    trace: gets the call's engine.step.Step (critical-set sizes per layer)."""
    st = Step(policy, prefill=x.shape[0] > 1, fused=False)
    for layer, sched in zip(layers, scheds):
        x = rms(x + 0.1 * rms(attention_stand_in(layer, rms(x))))
        h = rms(x)
        ids, w = route(h, layer.router)
        moe = dev.result(sched(h, ids, w, st))
        x = x + moe + shared_expert(layer, h)
    if trace is not None:
        trace.append(st)
    return x
