"""What a model's first use costs before it starts: converting its routed
experts into a pack takes time (expert weights / this machine's converter rate)
and disk (about the model's size again).

The rate is measured on the model's own first experts when its file is at hand
(the converter's own per-expert step, in their type and shape, for about a
quarter of a second); without it, the last conversion's on this machine
(recorded when it ran long enough to measure), else the same quick measurement
on an F16 expert of a mid-size model's shape, kept until the machine, its
thread count or the expert format changes.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..paths import cache_dir
from ..units import fmt_bytes

MIN_MEASURED_S = 2.0  # a conversion shorter than this says more about overheads than the rate
CALIB_SHAPE = (256, 2048)  # rows, row length of each timed slice (a Qwen3-30B-A3B expert has 768 x 2048)
CALIB_MIN_S = 0.25


def _rate_file() -> Path:
    return cache_dir() / "convert-rate.json"


def _machine() -> dict:
    from .. import kernels  # deferred: loads the compiled kernels, numpy

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
    import numpy as np  # deferred: loads numpy
    from gguf.constants import GGMLQuantizationType  # deferred: loads gguf

    from .layout import convert_expert  # deferred: loads the compiled kernels, gguf

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


def model_rate(g) -> float:
    """Time the converter on the first routed experts of an open source GGUF, in
    their own type and shape, until CALIB_MIN_S has passed -> weights per second."""
    from ..gguf.validate import padded  # deferred: loads gguf, numpy
    from .layout import EXPERT_KINDS, convert_expert  # deferred: loads the compiled kernels, gguf

    il = next(il for il in range(10**6) if f"blk.{il}.ffn_gate_exps.weight" in g.tensors)
    ts = [g.tensors[f"blk.{il}.ffn_{k}_exps.weight"] for k in EXPERT_KINDS]
    shapes = [tuple(reversed(padded(t.ne)[:3])) for t in ts]  # (E, rows, n): {n, rows, E, 1} is one too
    raws = [g.raw(t.name).reshape(s[0], -1) for t, s in zip(ts, shapes)]
    done, t0 = 0, time.perf_counter()
    for e in range(shapes[0][0]):
        for kind, t, raw, (_, rows, n) in zip(EXPERT_KINDS, ts, raws, shapes):
            convert_expert(raw[e], t.ggml_type, kind, rows, n)
            done += rows * n
        dt = time.perf_counter() - t0
        if dt >= CALIB_MIN_S:
            break
    return done / max(dt, 1e-9)


def last_rate() -> float | None:
    """The rate recorded by the last conversion or measurement; None (and nothing
    measured) when there is none."""
    d = _read()
    return float(d["weights_per_s"]) if d is not None else None


def converter_rate(src=None) -> tuple[float, str]:
    """(weights per second, how it was measured) on this machine: on the source's
    own experts when an open GGUF is given, else the last conversion's rate or a
    quick measurement."""
    if src is not None:
        return model_rate(src), "a test conversion of its first experts"
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


def conversion_cost(weights: int, pack_bytes: int, src=None) -> dict:
    """The cost of converting `weights` expert weights (of the open GGUF src, when
    given) into a pack of `pack_bytes`."""
    rate, how = converter_rate(src)
    return {"seconds": weights / rate, "weights": weights, "pack_bytes": pack_bytes,
            "weights_per_s": rate, "rate_from": how}


def sizes_cost(sizes) -> dict:
    """The conversion cost of a model known by its plan sizes alone
    (engine/plan_sizes.ModelSizes, e.g. a recommended model not downloaded yet)."""
    weights = sizes.n_moe_layers * sizes.n_expert * 3 * sizes.n_ff_exp * sizes.n_embd
    return conversion_cost(weights, sizes.nonexpert_bytes + sizes.n_moe_layers * sizes.n_expert * sizes.expert_bytes)


def source_cost(g, ident: dict, measure: bool = True) -> dict:
    """The conversion cost of an open source GGUF: the pack's exact size (its
    layout is planned, nothing written) and the rate timed on its own experts
    (measure) or this machine's recorded one."""
    from .layout import plan_pack  # deferred: loads the compiled kernels, gguf

    plan = plan_pack(g, ident)
    return conversion_cost(plan.weights, plan.size, g if measure else None)


def describe_cost(c: dict) -> str:
    """'about 25 min (20.1 M weights/s, the last conversion here) and 17.6 GiB of disk'."""
    return (f"about {fmt_duration(c['seconds'])} ({c['weights_per_s'] / 1e6:.1f} M weights/s, "
            f"from {c['rate_from']} on this machine) and {fmt_bytes(c['pack_bytes'])} of disk")


def first_use_note(weights: int, pack_bytes: int, where: Path, src=None) -> str:
    return (f"first use of this model: converting {weights / 1e6:.1f} M expert weights once, "
            f"{describe_cost(conversion_cost(weights, pack_bytes, src))} in {where}")


def first_use_label(path) -> str:
    """'' when the model's pack is there (or it has no routed experts), else a short
    'first use: about 25 min to convert, 17.6 GiB of disk' for lists of models."""
    from ..gguf.reader import GGUFFile  # deferred: loads gguf, numpy
    from ..hparams import config_from_metadata  # deferred: loads numpy
    from .identity import source_identity  # deferred: loads gguf, numpy
    from .layout import expert_layers, pack_path  # deferred: loads the compiled kernels, gguf

    with GGUFFile(path) as g:
        if not expert_layers(config_from_metadata(g.metadata, str(path)), g) or pack_path(g).exists():
            return ""
        c = source_cost(g, source_identity(g), measure=False)
    return f"first use: about {fmt_duration(c['seconds'])} to convert, {fmt_bytes(c['pack_bytes'])} of disk"
