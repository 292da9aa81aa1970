"""The one owner of the forward pass. Every tool (generation, eval, bench,
calibrate, the latency model) calls `prefill` and `decode` and gets logits plus
a StepTrace (engine/step.py); the critical-set policy is an argument of the call
(default: the one the model was loaded with).

Which step implementation runs is fixed by the loaded plan: the CPU step (fused
decode blocks where a layer allows them) for `cpu` plans, the GPU step
(engine/gpu/executor.py: attention, norms, router and KV cache on the device,
the residual-split schedule per MoE layer) for `gpu-residual` / `gpu-partial`.
A GPU step's decode token runs its device work between host waits as graph
segments (engine/gpu/graphs.py), kept per KV cache.
"""
from __future__ import annotations

import time
import weakref

import torch

from .gpu.graphs import DecodeGraphs, graphs_enabled
from .kv_types import DEFAULT_KV_TYPE
from .step import Step, StepTrace


class Runner:
    def __init__(self, net, policy=None, where: str = "cpu", devices: tuple = (), layer_devices=None,
                 kv_type: str = DEFAULT_KV_TYPE):
        self.net = net
        self.policy = policy  # the loaded default: FixedCritical, UmiaPolicy, or None (no split)
        self.where = where  # "cpu", or the plan's devices ("cuda:0", "cuda:0+cuda:1")
        self.devices = devices  # the GPU step's device objects (engine/gpu/device.py)
        self.layer_devices = layer_devices  # per layer: where its KV cache lives (None: the host)
        self.kv_type = kv_type  # the KV cache's type (engine/kv_cache.py)
        self._graphs = weakref.WeakKeyDictionary()  # cache -> {device name: DecodeGraphs} (GPU step, decode)

    @property
    def gpu_step(self) -> bool:
        return bool(self.devices)

    def new_cache(self, n_ctx: int):
        return self.net.new_cache(n_ctx, self.layer_devices, self.kv_type)

    def split_layers(self) -> list:
        """The MoE layers' residual-split experts as loaded (the CPU step's), in layer order."""
        from .moe.resplit import ResplitExperts  # deferred: loads the compiled kernels

        return [f.experts for f in self.net.moe_layers() if isinstance(f.experts, ResplitExperts)]

    def _run(self, tokens: torch.Tensor, pos0: int, cache, policy, last_only: bool):
        pol = self.policy if policy is None else policy
        step = Step(policy=pol, prefill=tokens.numel() > 1, fused=not self.gpu_step)
        if self.gpu_step and tokens.numel() == 1 and graphs_enabled():
            step.graphs = self._decode_graphs(cache, pos0)
        for d in self.devices:
            d.layer_begin()
        t0 = time.perf_counter()
        logits = self.net.forward(tokens, pos0, cache, step, last_only=last_only)  # on the head's device
        t1 = time.perf_counter()
        logits = logits.float().cpu()
        seconds = time.perf_counter() - t0
        step.host_wait_s += seconds - (t1 - t0)
        busy = sum(d.layer_busy()[0] for d in self.devices)
        trace = StepTrace(phase="prefill" if step.prefill else "decode", n_tokens=int(tokens.numel()), r=step.r,
                          ids=step.ids, seconds=seconds, where=self.where, groups=step.groups,
                          cpu_expert_s=step.cpu_expert_s, host_wait_s=step.host_wait_s, device_busy_s=busy)
        return logits, trace

    def _decode_graphs(self, cache, pos: int) -> dict:
        """The GPU step's decode graph segments for this cache (device name -> DecodeGraphs),
        their position set to pos. They live as long as the cache."""
        graphs = self._graphs.setdefault(cache, {})
        for d in self.devices:
            name = str(d.torch_device)
            if name not in graphs:
                graphs[name] = DecodeGraphs(d.torch_device)
            graphs[name].begin(pos)
        return graphs

    def graph_summary(self) -> str | None:
        """The decode graph segments in one line (None: the CPU step)."""
        if not self.gpu_step:
            return None
        if not graphs_enabled():
            return "off (RAPIDMOE_GPU_GRAPHS=0)"
        gs = [g for per in list(self._graphs.values()) for g in per.values()]
        n, captured = sum(g.n_segments for g in gs), sum(g.captures for g in gs)
        failed = next((g.failed for g in gs if g.failed), None)
        if failed:
            return f"{n} segments, {captured} captured, the rest eager: a capture failed ({failed})"
        if not captured:
            return f"{n} segments, run eagerly (no CUDA device)"
        return f"{n} segments, captured in {sum(g.capture_s for g in gs):.2f} s"

    def prefill(self, tokens, pos0: int, cache, policy=None, last_only: bool = False):
        """tokens [T] at positions pos0.. -> (logits [T, V] (or [1, V] with last_only), StepTrace)."""
        t = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(list(tokens))
        return self._run(t, pos0, cache, policy, last_only)

    def decode(self, token: int, pos: int, cache, policy=None):
        """One token at position pos -> (logits [V], StepTrace)."""
        logits, trace = self._run(torch.tensor([int(token)]), pos, cache, policy, False)
        return logits[0], trace
