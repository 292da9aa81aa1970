"""`rapidmoe-chat plan -m PATH`: where the model's bytes would live on this
machine (or on one described by --hardware), from GGUF metadata alone: nothing
is converted or loaded. A plan that does not fit exits with status 2 and names
the nearest plan that does."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..engine.errors import ModelFileError, UserError
from ..engine.hub.resolve import looks_local
from ..engine.units import fmt_bytes
from .args import add_ctx_argument, add_placement_arguments, plan_request


def add_arguments(p) -> None:
    p.add_argument("-m", "--model", default="demo", help="GGUF path, Hugging Face REPO[:QUANT], or 'demo' (the default)")
    add_ctx_argument(p)
    add_placement_arguments(p)
    p.add_argument("--hardware", default=None, metavar="FILE.json",
                   help="plan for the machine this JSON describes (doctor --json's \"hardware\" object)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def load_hardware(path: str):
    from ..engine.plan.hardware import HardwareRecord  # deferred: loads psutil

    try:
        with open(path) as f:
            d = json.load(f)
        return HardwareRecord.from_dict(d.get("hardware", d))
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    except (ValueError, TypeError, AttributeError) as e:
        raise UserError(f"{path}: not a hardware description ({e})") from None


def resolve(spec: str):
    """Model spec -> local GGUF path, without importing the model code (torch):
    plan stays quick."""
    if spec in (None, "demo"):
        from ..engine.hub.demo import demo_model_path  # deferred: loads gguf, numpy

        return demo_model_path()
    if looks_local(str(spec)):
        p = Path(spec).expanduser()
        if not p.exists():
            raise ModelFileError(p, "no such file")
        return p
    from ..engine.loader import resolve_model_path  # deferred: loads torch, the compiled kernels

    return resolve_model_path(spec)


def make_plan(args):
    """-> (Plan, ModelSizes) for the parsed arguments."""
    from ..engine.gguf.reader import GGUFFile  # deferred: loads gguf, numpy
    from ..engine.plan.hardware import detect  # deferred: loads psutil
    from ..engine.plan.planner import plan_model  # deferred: loads gguf, numpy
    from ..engine.plan.sizes import calibrated_frequencies, sizes_from_gguf  # deferred: loads gguf, numpy

    path = resolve(args.model)
    hw = load_hardware(args.hardware) if args.hardware else detect()
    with GGUFFile(path) as g:
        sizes = sizes_from_gguf(g)
        p = plan_model(sizes, hw, args.ctx, plan_request(args), calibrated_frequencies(path, sizes, g))
    return p, sizes


def _bytes(n: int) -> str:
    return fmt_bytes(n)


def print_plan(p, sizes, disk_note: str = "", out=None) -> None:
    w = (out or sys.stdout).write
    w(f"model    {p.model} ({sizes.arch}, {sizes.n_layer} layers, {sizes.n_expert} experts, "
      f"top-{sizes.n_expert_used}; source {_bytes(sizes.source_bytes)})\n")
    w(f"context  {p.ctx} tokens\n")
    w(f"mode     {p.mode}: {p.reason}\n\n")
    width = max([len(c.name) for c in p.components] + [9])
    w(f"{'component':<{width}}  {'bytes':>10}  device\n")
    for c in p.components:
        dev = "DRAM" if c.device == "cpu" else c.device
        w(f"{c.name:<{width}}  {_bytes(c.bytes):>10}  {dev}\n")
    w("\n")
    for dev, cap in p.vram_budget.items():
        w(f"{dev:<8} {_bytes(p.bytes_on(dev))} of {_bytes(cap)} budget\n")
    r = p.reserves
    w(f"{'DRAM':<8} {_bytes(p.dram_bytes)} of {_bytes(p.dram_budget)} budget"
      + (f" (after {_bytes(r['dram_os_reserve_bytes'])} left to the OS)" if r.get("dram_os_reserve_bytes") else "")
      + "\n")
    if p.vram_budget:
        w(f"W_Q cache {p.wq_cache_fraction:.1%} of experts in VRAM ({p.cache_order}); "
          f"{_bytes(r['cuda_context_bytes_per_gpu'])} CUDA context per GPU left free\n")
        for dev, a, b in p.gpu_layers:
            w(f"  {dev}: layers {a}-{b}\n")
    for n in p.notes:
        w(f"note: {n}\n")
    if disk_note:
        w(f"note: {disk_note}\n")


def pack_disk_note(sizes, hw_disk_free: int, pack_exists: bool) -> str:
    """The pack is written on first use: say so when the cache dir is short of room."""
    need = sizes.nonexpert_bytes + sizes.n_moe_layers * sizes.n_expert * sizes.expert_bytes
    if pack_exists:
        return ""
    if hw_disk_free and hw_disk_free < need:
        return (f"the residual-split pack ({_bytes(need)}) is written to the cache dir on first use, "
                f"which has {_bytes(hw_disk_free)} free: not enough")
    return f"the residual-split pack ({_bytes(need)}) is written to the cache dir on first use"


def conversion_note(cost: dict, disk_free: int) -> str:
    """What the first use's conversion costs, before it starts (engine/pack/cost.py)."""
    from ..engine.pack.cost import describe_cost  # deferred: loads platformdirs

    short = (f"; the cache dir has {_bytes(disk_free)} free: not enough"
             if disk_free and disk_free < cost["pack_bytes"] else "")
    return (f"first use converts {cost['weights'] / 1e6:.1f} M expert weights into the residual-split pack "
            f"in the cache dir: {describe_cost(cost)}{short}")


def run(args) -> int:
    p, sizes = make_plan(args)
    disk, cost = "", None
    if not args.hardware:
        from ..engine.gguf.reader import GGUFFile  # deferred: loads gguf, numpy
        from ..engine.pack.convert import pack_path, source_identity  # deferred: loads the compiled kernels, gguf
        from ..engine.pack.cost import source_cost  # deferred: loads platformdirs
        from ..engine.paths import cache_dir  # deferred: loads platformdirs
        from ..engine.plan.hardware import disk_free  # deferred: loads psutil

        free = disk_free(cache_dir())
        with GGUFFile(resolve(args.model)) as g:
            exists = pack_path(g).exists()
            if not exists and sizes.n_moe_layers:  # timed on its own experts, on this machine
                cost = source_cost(g, source_identity(g))
        disk = conversion_note(cost, free) if cost else pack_disk_note(sizes, free, exists)
    if args.json:
        print(json.dumps({**p.to_json(), **({"disk_note": disk} if disk else {}),
                          **({"conversion": cost} if cost else {})}))
    else:
        print_plan(p, sizes, disk)
    if not p.fits:
        print(f"rapidmoe-chat: error: the plan does not fit: {p.reason}", file=sys.stderr)
        if p.suggestion:
            print(f"rapidmoe-chat: nearest plan that fits: {p.suggestion}", file=sys.stderr)
        return 2
    return 0
