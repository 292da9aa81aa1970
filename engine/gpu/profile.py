"""How busy the GPU was over some host work: the union of its kernel and copy
intervals (CUPTI, through torch.profiler) over the wall time."""
from __future__ import annotations

import time


def busy_fraction(fn) -> tuple[float, float]:
    """Run fn() once under the profiler -> (GPU busy seconds, wall seconds)."""
    import torch  # deferred: loads torch
    from torch.autograd import DeviceType  # deferred: loads torch
    from torch.profiler import ProfilerActivity, profile  # deferred: loads torch

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    iv = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                if getattr(e, "device_type", None) == DeviceType.CUDA)
    busy, cur_s, cur_e = 0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / 1e6, wall
