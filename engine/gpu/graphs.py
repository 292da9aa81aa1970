"""The GPU step's decode work between two host waits, as CUDA graphs: each
segment (a layer's attention half, a MoE layer's router, its cached W_Q in two
parts, a shared expert, a dense FFN, the output head) is captured once per shape
and replayed on every later token, one launch instead of dozens issued from
Python. What stays on the host between them is the layer's own share: the
critical-set choice, the CPU's residuals and uncached experts, the copies.

A segment is a function of static input tensors and of state that stays put
(weights, the KV cache's rows, the position tensor `pos`): the decode position
reaches it through `pos` (written once per token by `begin`), never as a Python
number, and attention runs over a fixed bucket of cache rows with the rows past
the position masked (`kv_bucket`), so one capture serves every position in the
bucket. Keys therefore name the layer and the bucket, never the position.

On a device that is not a GPU (the stand-in and emulated devices) the same
segments run eagerly through the same static buffers: tests cover the
formulation, the device check covers the capture. RAPIDMOE_GPU_GRAPHS=0 runs
the GPU step eagerly everywhere.
"""
from __future__ import annotations

import os
import time

import torch

KV_BUCKET = 256  # decode attention reads the cache in buckets of this many rows (up to 4 buckets, then by eighths)


def graphs_enabled() -> bool:
    return os.environ.get("RAPIDMOE_GPU_GRAPHS", "1") != "0"


def kv_bucket(S: int, n_ctx: int) -> int:
    """The cache rows a decode token's attention reads when S rows are filled: a
    multiple of KV_BUCKET up to 4 of them, then steps of an eighth of the power of
    two below S (at most 1/8 read in vain past 1024 rows); never past n_ctx."""
    if S <= 4 * KV_BUCKET:
        b = -(-S // KV_BUCKET) * KV_BUCKET
    else:
        step = (1 << (S.bit_length() - 1)) // 8
        b = -(-S // step) * step
    return min(b, n_ctx)


class DecodeGraphs:
    """The decode segments of one KV cache on one device. Keys name a segment
    shape (layer, bucket); `run` captures a key's graph the first time and replays
    it after. `captures` and `capture_s` count what capturing cost."""

    def __init__(self, device: torch.device):
        self.device = device
        self.capture = device.type == "cuda"
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # the decode position, read by the segments
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        # this device's own streams: warm-ups run on one, captures on the other (torch's
        # default capture stream belongs to whichever GPU was current when it was made)
        self._streams = (torch.cuda.Stream(device), torch.cuda.Stream(device)) if self.capture else None
        self._seg: dict[tuple, tuple] = {}  # key -> (graph or None, static inputs, static outputs)
        self._outputs: set[int] = set()  # where the captured segments' outputs live
        self.captures, self.capture_s = 0, 0.0
        self.failed: str | None = None  # why a capture failed: the segments after it run eagerly

    @property
    def n_segments(self) -> int:
        return len(self._seg)

    @staticmethod
    def bucket(S: int, n_ctx: int) -> int:
        return kv_bucket(S, n_ctx)

    def begin(self, pos: int) -> None:
        """This token's position, for every segment replayed until the next call."""
        self.pos.fill_(pos)  # on a GPU: one fill kernel in stream order, no host copy

    def run(self, key: tuple, fn, *xs: torch.Tensor):
        """fn(*static xs) -> a tensor or a tuple of tensors. The outputs are the
        segment's own buffers: valid until the same key runs again (the next token)."""
        seg = self._seg.get(key)
        if seg is None:
            seg = self._seg[key] = self._make(fn, xs)
        graph, statics, out = seg
        for s, x in zip(statics, xs):
            if s.data_ptr() != x.data_ptr():
                s.copy_(x)
        if graph is None:
            return fn(*statics)
        with torch.cuda.device(self.device):
            graph.replay()
        return out

    def _make(self, fn, xs: tuple) -> tuple:
        # an input that is another segment's output buffer (the router's normed x feeding
        # the experts and the shared expert) is its own static input: no copy per token
        statics = tuple(x if x.data_ptr() in self._outputs else x.clone() for x in xs)
        if not self.capture or self.failed:
            return None, statics, None
        try:
            return self._capture(fn, statics)
        except RuntimeError as e:  # the driver refused something in the segment: run it eagerly
            self.failed = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            return None, statics, None

    def _capture(self, fn, statics: tuple) -> tuple:
        t0 = time.perf_counter()
        with torch.cuda.device(self.device):
            main = torch.cuda.current_stream(self.device)
            side, cap = self._streams
            side.wait_stream(main)
            with torch.cuda.stream(side):  # warm-up: kernel modules load, tables and workspaces reach the
                warm = fn(*statics)  # device, outside the capture (it writes what the replay writes again)
            main.wait_stream(side)
            single = isinstance(warm, torch.Tensor)
            # The outputs live outside the graphs' shared pool: segments are captured as they first
            # occur (a new bucket, much later than the rest), so a pool block one segment frees
            # after its capture may be another's scratch; an output there would be overwritten.
            outs = tuple(t.clone() for t in ((warm,) if single else warm))
            # capture_begin/end rather than torch.cuda.graph(), which synchronizes the device and
            # empties the allocator's cache before every capture (hundreds on a first token)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(cap):
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    res = fn(*statics)
                    for o, r in zip(outs, (res,) if single else res):
                        o.copy_(r)
                except BaseException:
                    try:
                        graph.capture_end()  # leave the stream out of capture mode; the first error is the one
                    except RuntimeError:
                        pass
                    raise
                graph.capture_end()
        self._outputs.update(o.data_ptr() for o in outs)
        self.captures += 1
        self.capture_s += time.perf_counter() - t0
        return graph, statics, outs[0] if single else outs
