"""The few device operations the residual-split schedule needs, behind one
small interface, so the schedule's logic runs unchanged with CPU tensors
standing in for the GPU (tests) and on a real GPU:

    put(array)                         weights onto the device (once)
    to_device(host tensor)             activations onto the device (async)
    to_host(*dev tensors) -> Pending   async copy to pinned host memory; .wait() -> host tensor
                                       (a tuple of them for several: one copy event, one wait)
    new_layer()                        the previous layer's copies are complete (its staging
                                       buffers may be reused)
    gate_up(wg, wu, eid, x, xrow, swiglu)   W_Q gate/up of selected slots
    gate_up_split(wg, wu, eid, x, xrow, n_crit)
                                       the same for critical slots [0, n_crit) (raw gate and up,
                                       copied to the host first) and the rest (silu(gate)·up)
    down(wd, eid, h, scale)            W_Q down of selected slots, scaled per slot
    index_add(out, tok, y)             out[tok[i]] += y[i]
    zeros(T, H)
    segment(graphs, key, fn, *dev tensors)
                                       fn of device tensors as a decode graph segment
                                       (engine/gpu/graphs.py), where `segments` is true

Device ops are ordered like a stream: they run in the order they are issued,
asynchronously to the host. `segment(name)` brackets device work so the busy
time per layer can be measured (CUDA events on the GPU; the worker's clock for
the stand-in).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from .. import kernels as cpu_kernels
from . import cuda_kernels as gk
from .placement import place
from .prefill import grouped_down, grouped_gate_up, grouped_gate_up_split, use_grouped


class Pending:
    def __init__(self, wait):
        self._wait = wait

    def wait(self) -> torch.Tensor:
        return self._wait()


class StandInDevice:
    """CPU tensors standing in for the GPU: one worker thread is the stream; W_Q
    products use the CPU kernels on the same bytes the GPU kernels decode."""

    name = "cpu-standin"
    torch_device = torch.device("cpu")
    segments = False  # its W_Q products are the CPU's kernels, not the GPU's: no device segments

    def place_weight(self, w):
        """A layer's non-expert weight as this device computes with it: the host's own."""
        return w

    def __init__(self):
        self._q = ThreadPoolExecutor(max_workers=1, thread_name_prefix="standin-stream")
        self.busy_s = 0.0
        self._mark: float | None = None

    # values on this "device" are Futures, resolved inside the worker (in order)
    def _run(self, fn, *args) -> Future:
        def job():
            t0 = time.perf_counter()
            vals = [a.result() if isinstance(a, Future) else a for a in args]
            out = fn(*vals)
            self.busy_s += time.perf_counter() - t0
            return out
        return self._q.submit(job)

    def put(self, a):
        return np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a

    def to_device(self, t: torch.Tensor):
        return self._run(lambda v: v.clone(), t)

    def to_host(self, *ts) -> Pending:
        f = self._run(lambda *v: tuple(x.clone() for x in v), *ts)
        return Pending(lambda: f.result() if len(ts) > 1 else f.result()[0])

    def new_layer(self) -> None:
        pass

    def zeros(self, T: int, H: int):
        return self._run(lambda: torch.zeros(T, H))

    def index_add(self, out, tok: torch.Tensor, y):
        return self._run(lambda o, v: o.index_add_(0, tok, v), out, y)

    def add(self, a, b):
        return self._run(lambda u, v: u + v, a, b)

    def gate_up(self, wg, wu, eid: torch.Tensor, x, xrow: torch.Tensor, swiglu: bool):
        def fn(xv):
            xs = xv[xrow.long()].numpy()
            ids = eid.numpy()
            # the CPU split path's per-row arithmetic (its decode kernels): non-critical
            # slots (swiglu) on the z activations the CPU gives them
            g = torch.from_numpy(cpu_kernels.resplit_expert_matmul("wq", wg, xs.shape[1], ids, xs, z=swiglu))
            u = torch.from_numpy(cpu_kernels.resplit_expert_matmul("wq", wu, xs.shape[1], ids, xs, z=swiglu))
            return F.silu(g) * u if swiglu else (g, u)
        if swiglu:
            return self._run(fn, x)
        pair = self._run(fn, x)
        return self._run(lambda p: p[0], pair), self._run(lambda p: p[1], pair)

    def gate_up_split(self, wg, wu, eid: torch.Tensor, x, xrow: torch.Tensor, n_crit: int):
        return split_gate_up(self, wg, wu, eid, x, xrow, n_crit)

    def down(self, wd, eid: torch.Tensor, h, scale: torch.Tensor):
        def fn(hv):
            y = cpu_kernels.resplit_expert_matmul("wq", wd, hv.shape[1], eid.numpy(), hv.contiguous().numpy(), z=True)
            return torch.from_numpy(y) * scale[:, None]
        return self._run(fn, h)

    def segment_begin(self, name: str) -> None:
        pass

    def segment_end(self, name: str) -> None:
        pass

    def layer_begin(self) -> None:
        self.busy_s = 0.0
        self._mark = time.perf_counter()

    def layer_busy(self) -> tuple[float, float]:
        """(device busy seconds, layer wall seconds) since layer_begin; waits for the stream."""
        self._q.submit(lambda: None).result()
        return self.busy_s, time.perf_counter() - (self._mark or time.perf_counter())

    def synchronize(self) -> None:
        self._q.submit(lambda: None).result()

    def result(self, t) -> torch.Tensor:
        return t.result() if isinstance(t, Future) else t


class PinnedArena:
    """Pinned host staging for one device's copies, reused layer after layer (no
    pin_memory per call): take() hands out slices of one page-locked block, which
    grows (and is replaced) only when a layer needs more; reset() once the copies
    that used the slices are complete."""

    ALIGN = 256

    def __init__(self, nbytes: int = 1 << 22):
        self._buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self._used = 0
        self._want = 0

    def take(self, shape, dtype: torch.dtype) -> torch.Tensor:
        n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        start = -(-self._used // self.ALIGN) * self.ALIGN
        if start + n > self._buf.numel():  # this layer needs more: a fresh buffer for now, a bigger arena next
            self._want = max(self._want, start + n)
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        self._used = start + n
        return self._buf[start:start + n].view(dtype).view(shape)

    def reset(self) -> None:
        if self._want > self._buf.numel():
            self._buf = torch.empty(2 * self._want, dtype=torch.uint8, pin_memory=True)
        self._used, self._want = 0, 0


class CudaDevice:
    """The GPU: torch's current stream for compute, a second stream for the copies
    to the host (each waits for the compute that made its tensor), pinned staging
    from a PinnedArena."""

    name = "cuda"
    segments = True

    def __init__(self, device: str | torch.device = "cuda", measure: bool = False):
        d = torch.device(device)
        self.dev = torch.device("cuda", torch.cuda.current_device()) if d.index is None else d
        self.torch_device = self.dev
        self.measure = measure
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._open: torch.cuda.Event | None = None
        self._layer0: torch.cuda.Event | None = None
        self._arena = PinnedArena()
        self._copy = torch.cuda.Stream(self.dev)

    def put(self, a):
        t = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
        return t.to(self.dev)

    def place_weight(self, w):
        """A layer's non-expert weight in VRAM: GGUF types the kernels read stay as they
        are, other float matrices in bf16; vectors (norms, biases, router gates) in f32."""
        return place_weight(w, self.dev)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.dev:
            return t
        if t.is_cuda:  # from another GPU (layers split across GPUs)
            return t.to(self.dev, non_blocking=True)
        src = t
        if not t.is_pinned():
            src = self._arena.take(t.shape, t.dtype)
            src.copy_(t)
        return src.to(self.dev, non_blocking=True)

    def new_layer(self) -> None:
        self._arena.reset()

    def to_host(self, *ts: torch.Tensor) -> Pending:
        compute = torch.cuda.current_stream(self.dev)
        bufs = [self._arena.take(t.shape, t.dtype) for t in ts]
        self._copy.wait_stream(compute)
        with torch.cuda.stream(self._copy):
            for b, t in zip(bufs, ts):
                b.copy_(t, non_blocking=True)
                t.record_stream(self._copy)  # the allocator keeps t until the copy is done
            ev = torch.cuda.Event()
            ev.record(self._copy)

        def wait():
            ev.synchronize()
            return bufs[0] if len(bufs) == 1 else tuple(bufs)
        return Pending(wait)

    def zeros(self, T: int, H: int) -> torch.Tensor:
        return torch.zeros(T, H, device=self.dev)

    def segment(self, graphs, key: tuple, fn, *ts: torch.Tensor) -> torch.Tensor:
        return graphs.run(key, fn, *ts)

    def index_add(self, out, tok: torch.Tensor, y):
        return out.index_add_(0, tok.to(self.dev, non_blocking=True), y)

    def add(self, a, b):
        return a + b

    def _ids(self, a: torch.Tensor) -> torch.Tensor:
        return self.to_device(a.to(torch.int32))

    def gate_up(self, wg, wu, eid: torch.Tensor, x, xrow: torch.Tensor, swiglu: bool):
        return slots_gate_up(wg, wu, eid, x, xrow, swiglu, self._ids)

    def gate_up_split(self, wg, wu, eid: torch.Tensor, x, xrow: torch.Tensor, n_crit: int):
        if not use_grouped(eid):
            return split_gate_up(self, wg, wu, eid, x, xrow, n_crit)
        self.segment_begin("W_Q gate/up")
        out = grouped_gate_up_split(wg, wu, eid, x, xrow, n_crit, lambda g, u: self.to_host(g, u))
        self.segment_end("W_Q gate/up")
        return out

    def down(self, wd, eid: torch.Tensor, h, scale: torch.Tensor):
        scale_d = self.to_device(scale.to(torch.float32))
        return slots_down(wd, eid, h, scale_d, self._ids)

    def segment_begin(self, name: str) -> None:
        if self.measure:
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record(torch.cuda.current_stream(self.dev))

    def segment_end(self, name: str) -> None:
        if self.measure and self._open is not None:
            e = torch.cuda.Event(enable_timing=True)
            e.record(torch.cuda.current_stream(self.dev))
            self._events.append((self._open, e))
            self._open = None

    def layer_begin(self) -> None:
        self._events = []
        if self.measure:
            self._layer0 = torch.cuda.Event(enable_timing=True)
            self._layer0.record(torch.cuda.current_stream(self.dev))

    def layer_busy(self) -> tuple[float, float]:
        if not self.measure or self._layer0 is None:
            return 0.0, 0.0
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.dev))
        end.synchronize()
        busy = sum(a.elapsed_time(b) for a, b in self._events) / 1e3
        return busy, self._layer0.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.dev)

    def result(self, t) -> torch.Tensor:
        return t


def split_gate_up(dev, wg, wu, eid: torch.Tensor, x, xrow: torch.Tensor, n_crit: int):
    """gate_up_split from two gate_up calls: the critical slots' first, their copy
    to the host issued before the rest. -> (Pending (g, u) or None, h or None)."""
    gu = h = None
    if n_crit:
        dev.segment_begin("critical gate/up")
        g, u = dev.gate_up(wg, wu, eid[:n_crit], x, xrow[:n_crit], swiglu=False)
        dev.segment_end("critical gate/up")
        gu = dev.to_host(g, u)  # one copy, one wait
    if eid.numel() > n_crit:
        dev.segment_begin("W_Q gate/up")
        h = dev.gate_up(wg, wu, eid[n_crit:], x, xrow[n_crit:], swiglu=True)
        dev.segment_end("W_Q gate/up")
    return gu, h


def slots_gate_up(wg, wu, eid: torch.Tensor, x, xrow: torch.Tensor, swiglu: bool, to_dev):
    """W_Q gate/up of the slots on the GPU kernels: GEMV for decode-sized batches,
    dequantize + GEMM when experts see several tokens. eid, xrow: host int tensors."""
    if use_grouped(eid):
        return grouped_gate_up(wg, wu, eid, x, xrow, swiglu)
    return gk.wq_gate_up(wg, wu, to_dev(eid), to_dev(xrow), gk.wq_prep(x.contiguous()), swiglu)


def slots_down(wd, eid: torch.Tensor, h, scale_dev: torch.Tensor, to_dev):
    if use_grouped(eid):
        return grouped_down(wd, eid, h, scale_dev)
    rows = torch.arange(eid.numel(), dtype=torch.int32)
    return gk.wq_gemv(wd, to_dev(eid), to_dev(rows), gk.wq_prep(h.contiguous()), scale_dev)


def place_weight(w, device: torch.device):
    """A host weight (QWeight or float tensor) -> what the GPU kernels and torch read."""
    if w is None:
        return w

    if isinstance(w, torch.Tensor) and w.dim() == 1:
        return w.to(device)
    return place(w, device, torch.float32 if isinstance(w, torch.Tensor) else torch.bfloat16)


class EmulatedGpuDevice(StandInDevice):
    """The GPU code path (engine/gpu/cuda_kernels.py, prefill.py, the GPU placement of
    non-expert weights) on CPU tensors, its kernels run by the CPU emulation library
    (kernels.use_emulator): lets tests cover everything but the hardware."""

    name = "emulated-gpu"
    segments = True

    def segment(self, graphs, key: tuple, fn, *ts):
        """The segment through its static buffers, run eagerly in stream order."""
        return self._run(lambda *vs: graphs.run(key, fn, *vs), *ts)

    def place_weight(self, w):
        return place_weight(w, torch.device("cpu"))

    def put(self, a):
        if not isinstance(a, np.ndarray):
            return a
        a = np.ascontiguousarray(a)
        return torch.from_numpy(a if a.flags.writeable else a.copy())  # "device memory" is a copy

    def gate_up(self, wg, wu, eid: torch.Tensor, x, xrow: torch.Tensor, swiglu: bool):
        ids = lambda a: a.to(torch.int32).contiguous()  # noqa: E731
        if swiglu:
            return self._run(lambda xv: slots_gate_up(wg, wu, eid, xv, xrow, True, ids), x)
        pair = self._run(lambda xv: slots_gate_up(wg, wu, eid, xv, xrow, False, ids), x)
        return self._run(lambda p: p[0], pair), self._run(lambda p: p[1], pair)

    def gate_up_split(self, wg, wu, eid: torch.Tensor, x, xrow: torch.Tensor, n_crit: int):
        if not use_grouped(eid):
            return split_gate_up(self, wg, wu, eid, x, xrow, n_crit)
        copy = lambda g, u: (g.clone(), u.clone())  # noqa: E731  the host copy, taken when issued
        res = self._run(lambda xv: grouped_gate_up_split(wg, wu, eid, xv, xrow, n_crit, copy), x)
        gu = Pending(lambda: res.result()[0]) if n_crit else None
        return gu, (self._run(lambda p: p[1], res) if eid.numel() > n_crit else None)

    def down(self, wd, eid: torch.Tensor, h, scale: torch.Tensor):
        ids = lambda a: a.to(torch.int32).contiguous()  # noqa: E731
        return self._run(lambda hv: slots_down(wd, eid, hv, scale.to(torch.float32), ids), h)
