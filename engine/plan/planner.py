"""Where a model's bytes live on a machine: a pure function of the model's
sizes (plan_sizes.ModelSizes, from GGUF metadata) and a HardwareRecord.

Modes (DESIGN.md §2):
  gpu-residual  every expert's W_Q in VRAM with the non-expert weights and the
                KV cache; W_R and the D4 down copies in DRAM for the CPU's
                critical-expert path.
  gpu-partial   only the hottest experts' W_Q fit in VRAM; the others' W_Q run
                on the CPU from DRAM.
  cpu           no GPU, or too little VRAM: everything in DRAM (mmapped pack),
                attention too. A critical expert runs from the source file's own
                tensors where their types have an int8 kernel and DRAM holds them
                beside W_Q (critical_from "source": exact to the file, and faster
                than W_R + D4 on CPUs without AVX-512 VBMI); else from the pack's
                W_R + D4 ("pack").

Room left on purpose: CUDA_CONTEXT_BYTES per GPU, the activation buffers
(plan_sizes.gpu_workspace_bytes / cpu_workspace_bytes), and a DRAM reserve for
the OS and other programs (dram_reserve_bytes).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import UserError
from ..kv_types import DEFAULT_KV_TYPE, check_kv_type
from ..units import fmt_bytes
from .components import Component, cpu_components
from .hardware import GiB, HardwareRecord
from .sizes import ModelSizes, gpu_workspace_bytes, host_workspace_bytes

CUDA_CONTEXT_BYTES = GiB // 2
MIN_CTX = 256
MODES = ("gpu-residual", "gpu-partial", "cpu")
CRITICAL_FROM = ("source", "pack")  # where a CPU plan's critical experts come from


def dram_reserve_bytes(total: int) -> int:
    """Left to the OS and other programs: 5% of DRAM, at least 1 GiB, at most 8 GiB."""
    return min(8 * GiB, max(GiB, total // 20))


@dataclass(frozen=True)
class Plan:
    model: str
    ctx: int
    mode: str
    reason: str
    components: tuple[Component, ...]
    vram_budget: dict[str, int]  # per GPU device
    dram_budget: int
    wq_cache_fraction: float
    cached: tuple[tuple[int, int], ...] = ()  # (layer, expert) with W_Q in VRAM, hottest first
    cache_order: str = "layer order"
    gpu_layers: tuple[tuple[str, int, int], ...] = ()  # (device, first layer, last layer)
    fits: bool = True
    suggestion: str | None = None
    suggested: dict | None = None
    reserves: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    kv_type: str = DEFAULT_KV_TYPE
    critical_from: str = "pack"  # CPU plans: "source" (the model file's experts) or "pack" (W_R + D4)

    def bytes_on(self, device: str) -> int:
        return sum(c.bytes for c in self.components if c.device == device)

    @property
    def dram_bytes(self) -> int:
        return self.bytes_on("cpu")

    @property
    def vram_bytes(self) -> int:
        return sum(c.bytes for c in self.components if c.device != "cpu")

    def describe(self, standin: bool = False) -> str:
        """One line of where things run, e.g. 'GPU 0: attention + KV + W_Q 83% (121 GiB) ·
        CPU: residuals + W_Q 17%'."""
        if self.mode == "cpu":
            return "CPU-centric: attention + KV + all experts on the CPU" + (
                " · critical experts from the model file" if self.critical_from == "source" else "")
        gpu = ("stand-in GPU " if standin else "GPU ") + "+".join(d.split(":")[1] for d, _, _ in self.gpu_layers)
        wq = sum(c.bytes for c in self.components if c.device != "cpu" and c.name.startswith("W_Q cache"))
        frac = self.wq_cache_fraction
        cpu = "residuals" + (f" + W_Q {1 - frac:.0%}" if self.mode == "gpu-partial" else "")
        return f"{gpu}: attention + KV + W_Q {frac:.0%} ({fmt_bytes(wq)}) · CPU: {cpu}"

    def over_budget(self) -> list[str]:
        """Devices whose bytes exceed their budget, as 'device: need X of Y'."""
        out = []
        for dev, cap in [("cpu", self.dram_budget)] + list(self.vram_budget.items()):
            need = self.bytes_on(dev)
            if dev == "cpu" or need:
                if need > cap:
                    out.append(f"{'DRAM' if dev == 'cpu' else dev}: needs {fmt_bytes(need)}, budget {fmt_bytes(cap)}")
        return out

    def to_json(self) -> dict:
        per_layer: dict[str, int] = {}
        for il, _ in self.cached:
            per_layer[str(il)] = per_layer.get(str(il), 0) + 1
        return {
            "model": self.model, "ctx": self.ctx, "kv_type": self.kv_type, "mode": self.mode, "reason": self.reason,
            "critical_from": self.critical_from,
            "components": [{"name": c.name, "bytes": c.bytes, "device": c.device} for c in self.components],
            "totals": {"vram_bytes": self.vram_bytes, "dram_bytes": self.dram_bytes,
                       "vram_budget_bytes": self.vram_budget, "dram_budget_bytes": self.dram_budget,
                       "per_device": {d: self.bytes_on(d) for d in ["cpu", *self.vram_budget]}},
            "wq_cache_fraction": round(self.wq_cache_fraction, 6),
            "wq_cache": {"order": self.cache_order, "experts_cached": len(self.cached),
                         "per_layer": per_layer, "hottest": [list(x) for x in self.cached[:16]]},
            "gpu_layers": [{"device": d, "first": a, "last": b} for d, a, b in self.gpu_layers],
            "fits": self.fits, "suggestion": self.suggestion, "suggested": self.suggested,
            "reserves": self.reserves, "notes": list(self.notes),
        }


def _expert_order(s: ModelSizes, freqs: dict[int, list[float]] | None) -> tuple[list[tuple[int, int]], str]:
    slots = [(il, e) for il in s.expert_layers for e in range(s.n_expert)]
    if not freqs:
        return slots, "layer order"
    # hottest first; layers without measurements after every measured one, in layer order
    rank = {sl: (0, -freqs[sl[0]][sl[1]]) if sl[0] in freqs else (1, 0.0) for sl in slots}
    return sorted(slots, key=lambda sl: (rank[sl], sl)), "activation frequency (calibration)"


def _split_layers(need: list[int], head: int, caps: list[int]) -> tuple[list[int], int]:
    """Contiguous layers to GPUs in proportion to their capacity (the head on
    the last GPU) -> (GPU of each layer, largest overflow in bytes, or 0)."""
    total = sum(need) + head
    cap_sum = sum(caps)
    owner, g, used, done = [], 0, [0] * len(caps), 0
    for b in need:
        # move on when this GPU reached its share and the next one exists
        share = total * sum(caps[:g + 1]) / cap_sum
        while g < len(caps) - 1 and (done + b / 2 > share or used[g] + b > caps[g]):
            g += 1
            share = total * sum(caps[:g + 1]) / cap_sum
        owner.append(g)
        used[g] += b
        done += b
    used[-1] += head
    over = max([u - c for u, c in zip(used, caps)] + [0])
    return owner, over


def _gpu_plan(s: ModelSizes, ctx: int, gpus: list[str], budgets: list[int], n_cached: int | None,
              order: list[tuple[int, int]], chunk: int, kv_type: str):
    """-> (components, cached slots, gpu_layers, reason) or None when the
    non-expert weights and KV cache alone do not fit."""
    ws = gpu_workspace_bytes(s, ctx)
    caps = [b - CUDA_CONTEXT_BYTES - ws for b in budgets]
    kv_l = ctx * s.kv_bytes_per_token(kv_type) // max(1, s.n_layer)
    base = [lb + kv_l for lb in s.gpu_layer_bytes]
    head = s.gpu_head_bytes  # a tied head: the whole embedding table
    free = sum(caps) - sum(base) - head
    if min(caps) <= 0 or free < 0:
        return None
    total = len(order)
    n = min(total, free // s.wq_bytes) if n_cached is None else min(total, n_cached)
    layer_of = np.fromiter((il for il, _ in order), dtype=np.int64, count=total)
    for _ in range(64):  # layer boundaries waste a little: drop the coldest until it fits
        per_layer = np.bincount(layer_of[:n], minlength=s.n_layer).tolist()
        need = [b + c * s.wq_bytes for b, c in zip(base, per_layer)]
        owner, over = _split_layers(need, head, caps)
        if over <= 0 or n == 0 or n_cached is not None:
            break
        n = max(0, n - -(-over // s.wq_bytes))
    comps: list[Component] = []
    spans = []
    for g, dev in enumerate(gpus):
        mine = [il for il in range(s.n_layer) if owner[il] == g]
        comps.append(Component("CUDA context", CUDA_CONTEXT_BYTES, dev))
        comps.append(Component("activation buffers", ws, dev))
        if not mine:
            continue
        a, b = mine[0], mine[-1]
        spans.append((dev, a, b))
        comps.append(Component(f"non-expert weights, layers {a}-{b}", sum(s.gpu_layer_bytes[i] for i in mine), dev))
        comps.append(Component(f"KV cache ({kv_type}, {ctx} tokens), layers {a}-{b}", kv_l * len(mine), dev))
        c = sum(per_layer[i] for i in mine)
        if c:
            comps.append(Component(f"W_Q cache: {c} experts of layers {a}-{b}", c * s.wq_bytes, dev))
    comps.append(Component("output head" + (" (tied: the embedding table)" if s.tied_head else ""), head, gpus[-1]))
    types = ", ".join(f"{t} {fmt_bytes(b)}" for t, b in s.nonexpert_types)
    n_all = len(order)
    host = [
        Component("token embedding table (row lookups, mmapped)", s.embd_bytes, "cpu"),
        Component(f"W_R of all {n_all} experts (critical path)", n_all * s.wr_bytes, "cpu"),
        Component(f"D4 down copies of all {n_all} experts (critical path)", n_all * s.d4_bytes, "cpu"),
    ]
    if n < n_all:
        host.append(Component(f"W_Q of {n_all - n} uncached experts (run on the CPU)", (n_all - n) * s.wq_bytes, "cpu"))
    host.append(Component("host working memory (tokenizer, CPU expert buffers)",
                          host_workspace_bytes(s, chunk), "cpu"))
    notes = (f"non-expert weights in VRAM from {types} (Q8_0/Q4_K/Q5_K/Q6_K matrices as they are, other "
             "matrices bf16, vectors and F32 f32)",
             "the pack is memory-mapped: pages uploaded to VRAM stay in the page cache only while DRAM is spare")
    return comps + host, tuple(order[:n]), tuple(spans), notes


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked of the placement (--vram-budget, --dram-budget in bytes,
    --gpus, --mode, --cache-fraction); None: the planner's choice. kv_type: the KV
    cache's type (--kv-type)."""
    vram_budget: int | None = None
    dram_budget: int | None = None
    gpus: tuple[int, ...] | None = None
    mode: str | None = None
    cache_fraction: float | None = None
    kv_type: str = DEFAULT_KV_TYPE
    critical_from: str | None = None  # CPU plans: "source", "pack", None: the planner's choice


def plan_model(s: ModelSizes, hw: HardwareRecord, ctx: int | None, req: PlanRequest,
               freqs: dict[int, list[float]] | None = None) -> Plan:
    """The plan of a request: what `plan` prints and what loading places."""
    return plan(s, hw, ctx, vram_budget=req.vram_budget, dram_budget=req.dram_budget,
                gpus=list(req.gpus) if req.gpus is not None else None, mode=req.mode,
                cache_fraction=req.cache_fraction, freqs=freqs, kv_type=req.kv_type,
                critical_from=req.critical_from)


def _checked_request(s: ModelSizes, hw: HardwareRecord, ctx: int | None, mode: str | None,
                     cache_fraction: float | None, gpus: list[int] | None, kv_type: str,
                     critical_from: str | None) -> tuple[int, list]:
    """The context (default: the trained one, at most 4096) and the GPUs to use, after
    every request is checked against the model and the machine."""
    check_kv_type(kv_type, s.kv_row_dims)
    ctx = ctx or min(s.n_ctx_train, 4096)
    if ctx <= 0:
        raise UserError(f"bad context size {ctx}")
    if ctx > s.n_ctx_train:
        raise UserError(f"context {ctx} exceeds the model's trained context {s.n_ctx_train}")
    if mode is not None and mode not in MODES:
        raise UserError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    if cache_fraction is not None and not 0.0 <= cache_fraction <= 1.0:
        raise UserError("the W_Q cache fraction must be within [0, 1]")
    if critical_from is not None and critical_from not in CRITICAL_FROM:
        raise UserError(f"critical experts come from 'source' or 'pack', not {critical_from!r}")
    if critical_from == "source" and not s.src_expert_bytes:
        raise UserError(f"{s.name}: its routed experts are not all Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K, "
                        "so the critical experts cannot run from the file (use the pack's: --critical-from pack)")
    chosen = list(hw.gpus)
    if gpus is not None:
        have = {g.index: g for g in hw.gpus}
        missing = [i for i in gpus if i not in have]
        if missing:
            names = ", ".join(str(i) for i in have) or "none"
            raise UserError(f"no GPU {missing[0]} here (GPUs: {names})")
        chosen = [have[i] for i in dict.fromkeys(gpus)]
    return ctx, chosen


def plan(s: ModelSizes, hw: HardwareRecord, ctx: int | None = None, *, vram_budget: int | None = None,
         dram_budget: int | None = None, gpus: list[int] | None = None, mode: str | None = None,
         cache_fraction: float | None = None, freqs: dict[int, list[float]] | None = None,
         chunk: int = 256, suggest: bool = True, kv_type: str = DEFAULT_KV_TYPE,
         critical_from: str | None = None) -> Plan:
    """The placement of model `s` on machine `hw` for a context of `ctx` tokens.
    vram_budget: bytes per GPU (default: its free VRAM); dram_budget: bytes
    (default: available DRAM less the OS reserve); mode / cache_fraction force a
    choice (default: the fastest mode that fits, caching as many experts as fit);
    kv_type: the KV cache's type (engine/kv_cache.py); critical_from: where a CPU plan's
    critical experts come from (CRITICAL_FROM; default: the source file's tensors where
    they can serve and DRAM holds them, unless the file asks for the pack's; else the pack's)."""
    ctx, chosen = _checked_request(s, hw, ctx, mode, cache_fraction, gpus, kv_type, critical_from)
    reserve = dram_reserve_bytes(hw.dram_total_bytes)
    dram_cap = dram_budget if dram_budget is not None else max(0, min(hw.dram_total_bytes - reserve,
                                                                     hw.dram_available_bytes))
    devs = [f"cuda:{g.index}" for g in chosen]
    budgets = [min(vram_budget, g.total_bytes) if vram_budget is not None else g.free_bytes for g in chosen]
    order, order_name = _expert_order(s, freqs)
    reserves = {"cuda_context_bytes_per_gpu": CUDA_CONTEXT_BYTES,
                "gpu_activation_bytes_per_gpu": gpu_workspace_bytes(s, ctx) if chosen else 0,
                "dram_os_reserve_bytes": reserve if dram_budget is None else 0}
    common = dict(model=s.name, ctx=ctx, vram_budget=dict(zip(devs, budgets)), dram_budget=dram_cap,
                  cache_order=order_name, reserves=reserves, kv_type=kv_type)

    def cpu(reason: str) -> Plan:
        comps, src, notes = cpu_components(s, ctx, chunk, kv_type, critical_from, dram_cap)
        return Plan(mode="cpu", reason=reason, components=tuple(comps), wq_cache_fraction=0.0, vram_budget={},
                    critical_from=src, notes=notes, **{k: v for k, v in common.items() if k != "vram_budget"})

    def gpu(n_cached: int | None) -> Plan | None:
        r = _gpu_plan(s, ctx, devs, budgets, n_cached, order, chunk, kv_type)
        if r is None:
            return None
        comps, cached, spans, notes = r
        frac = len(cached) / len(order)
        m = "gpu-residual" if len(cached) == len(order) else "gpu-partial"
        why = ("every expert's W_Q in VRAM" if m == "gpu-residual" else
               f"VRAM holds W_Q of {len(cached)} of {len(order)} experts ({frac:.0%}, {order_name}); "
               f"the rest run W_Q on the CPU")
        if n_cached is not None:
            why = f"{mode or f'W_Q cache fraction {cache_fraction:g}'} requested: {why}"
        return Plan(mode=m, reason=why, components=tuple(comps), wq_cache_fraction=frac, cached=cached,
                    gpu_layers=spans, notes=notes, **common)

    total_slots = len(order)
    want = None if cache_fraction is None else round(cache_fraction * total_slots)
    if mode == "cpu":
        p = cpu("CPU mode requested")
    elif not chosen:
        p = cpu("no GPU" + (f" ({hw.gpu_note})" if hw.gpu_note else ""))
        if mode is not None:
            p = replace(p, fits=False, reason=f"{mode} requested, but there is no GPU; CPU mode instead")
    else:
        n_req = total_slots if mode == "gpu-residual" else want
        p = gpu(n_req)
        if p is None:
            need = sum(s.gpu_layer_bytes) + ctx * s.kv_bytes_per_token(kv_type) + s.gpu_head_bytes
            why = (f"too little VRAM: the non-expert weights and KV cache need {fmt_bytes(need)} plus "
                   f"{fmt_bytes(CUDA_CONTEXT_BYTES)} CUDA context and activation buffers per GPU; "
                   f"budget {fmt_bytes(sum(budgets))}")
            p = cpu(why)
            if mode is not None:
                p = replace(p, fits=False, reason=f"{mode} requested, but {why}; CPU mode instead")
        elif mode is None and want is None and p.wq_cache_fraction == 0.0:
            p = cpu("too little VRAM for any expert's W_Q after the non-expert weights and KV cache")
    over = p.over_budget()
    if p.fits and over:
        p = replace(p, fits=False)
    if not p.fits:
        p = replace(p, reason=p.reason + " — does not fit: " + "; ".join(over or ["the requested mode is impossible here"]))
        if suggest:
            p = _with_suggestion(p, s, hw, ctx, vram_budget, dram_budget, gpus, mode, cache_fraction, freqs, chunk,
                                 kv_type, critical_from)
    return p


def _with_suggestion(p: Plan, s, hw, ctx, vram_budget, dram_budget, gpus, mode, cache_fraction, freqs, chunk,
                     kv_type, critical_from) -> Plan:
    """The nearest plan that fits: fewer cached experts, then a smaller context,
    then the best mode at this context, then the best mode at a smaller one."""
    kw = dict(vram_budget=vram_budget, dram_budget=dram_budget, gpus=gpus, freqs=freqs, chunk=chunk, suggest=False,
              kv_type=kv_type, critical_from=critical_from)

    def at(c, m, f):
        try:
            q = plan(s, hw, c, mode=m, cache_fraction=f, **kw)
        except UserError:
            return None
        return q if q.fits else None

    def largest_ctx(m, f):
        lo, hi, best = MIN_CTX, ctx - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            q = at(mid, m, f)
            if q is not None:
                best, lo = q, mid + 1
            else:
                hi = mid - 1
        return best

    def fewer_cached():
        q = at(ctx, None, None)  # as many experts as fit, at this context
        return q if q is not None and q.mode != "cpu" else None

    tries = []
    if mode in ("gpu-residual", "gpu-partial") or cache_fraction is not None:
        tries.append(("fewer cached experts", fewer_cached))
    tries.append(("a smaller context", lambda: largest_ctx(mode, cache_fraction)))
    if mode is not None or cache_fraction is not None:
        tries += [("the best mode here", lambda: at(ctx, None, None)),
                  ("the best mode with a smaller context", lambda: largest_ctx(None, None))]
    for what, fn in tries:
        q = fn()
        if q is not None:
            text = f"{what}: mode {q.mode}, context {q.ctx}, " + (
                f"DRAM {fmt_bytes(q.dram_bytes)}" if q.mode == "cpu" else
                f"W_Q cache {q.wq_cache_fraction:.0%} (VRAM {fmt_bytes(q.vram_bytes)}, DRAM {fmt_bytes(q.dram_bytes)})")
            return replace(p, suggestion=text, suggested={"mode": q.mode, "ctx": q.ctx,
                                                          "wq_cache_fraction": round(q.wq_cache_fraction, 6),
                                                          "vram_bytes": q.vram_bytes, "dram_bytes": q.dram_bytes})
    small = plan(s, hw, min(MIN_CTX, ctx), mode="cpu", **{**kw, "gpus": gpus})
    return replace(p, suggestion=f"nothing fits: even the CPU mode at a context of {small.ctx} needs "
                                 f"{fmt_bytes(small.dram_bytes)} of DRAM (budget {fmt_bytes(small.dram_budget)})")
