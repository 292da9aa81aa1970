"""What a model's first use costs before it starts: converting its routed
experts into a pack takes time (expert weights / this machine's converter rate)
and disk (about the model's size again).

The rate is the last conversion's on this machine (recorded when it ran long
enough to measure), else a quick measurement of the converter's own per-expert
step on one expert of a mid-size model's shape (about a quarter of a second),
kept until the machine, its thread count or the expert format changes.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .paths import cache_dir
from .units import fmt_bytes

MIN_MEASURED_S = 2.0  # a conversion shorter than this says more about overheads than the rate
CALIB_SHAPE = (256, 2048)  # rows, row length of each timed slice (a Qwen3-30B-A3B expert has 768 x 2048)
CALIB_MIN_S = 0.25


def _rate_file() -> Path:
    return cache_dir() / "convert-rate.json"


def _machine() -> dict:
    from . import kernels

    return {"isa": str(kernels.isa_info().get("active", "")), "threads": kernels.num_threads(),
            "format": kernels.resplit_format_version(), "cpus": os.cpu_count()}


def _read() -> dict | None:
    try:
        d = json.loads(_rate_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("machine") != _machine():
        return None
    r = d.get("weights_per_s")
    return d if isinstance(r, (int, float)) and 0 < r < 1e12 else None


def _save(rate: float, how: str) -> None:
    f = _rate_file()
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"weights_per_s": rate, "how": how, "machine": _machine()}), encoding="utf-8")
        os.replace(tmp, f)
    except OSError:
        pass  # an estimate is not worth failing a conversion for


def record_rate(weights: int, seconds: float) -> None:
    """A finished conversion's rate, when it ran long enough to measure it."""
    if seconds >= MIN_MEASURED_S and weights > 0:
        _save(weights / seconds, "the last conversion")


def calibrate() -> float:
    """Time the converter's per-expert step (gate, up, down of one F16 expert
    slice) until CALIB_MIN_S has passed -> weights per second."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType

    from .pack import convert_expert

    rows, n = CALIB_SHAPE
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((rows, n), dtype=np.float32) * 0.02).astype(np.float16)
    wd = np.ascontiguousarray(w.reshape(n, rows))
    f16 = int(GGMLQuantizationType.F16)
    done, t0 = 0, time.perf_counter()
    while True:
        convert_expert(w.view(np.uint8), f16, "gate", rows, n)
        convert_expert(w.view(np.uint8), f16, "up", rows, n)
        convert_expert(wd.view(np.uint8), f16, "down", n, rows)
        done += 3 * rows * n
        dt = time.perf_counter() - t0
        if dt >= CALIB_MIN_S:
            return done / dt


def converter_rate() -> tuple[float, str]:
    """(weights per second, how it was measured) on this machine."""
    d = _read()
    if d is not None:
        return float(d["weights_per_s"]), str(d.get("how", "measured"))
    rate = calibrate()
    _save(rate, "a quick measurement")
    return rate, "a quick measurement"


def fmt_duration(s: float) -> str:
    if s < 90:
        return f"{max(1, round(s))} s"
    if s < 90 * 60:
        return f"{round(s / 60)} min"
    return f"{s / 3600:.1f} h"


def conversion_cost(weights: int, pack_bytes: int) -> dict:
    """The cost of converting `weights` expert weights into a pack of `pack_bytes`."""
    rate, how = converter_rate()
    return {"seconds": weights / rate, "weights": weights, "pack_bytes": pack_bytes,
            "weights_per_s": rate, "rate_from": how}


def describe_cost(c: dict) -> str:
    """'about 25 min (20.1 M weights/s, the last conversion here) and 17.6 GiB of disk'."""
    return (f"about {fmt_duration(c['seconds'])} ({c['weights_per_s'] / 1e6:.1f} M weights/s, "
            f"from {c['rate_from']} on this machine) and {fmt_bytes(c['pack_bytes'])} of disk")


def first_use_note(weights: int, pack_bytes: int, where: Path) -> str:
    return (f"first use of this model: converting {weights / 1e6:.1f} M expert weights once, "
            f"{describe_cost(conversion_cost(weights, pack_bytes))} in {where}")
