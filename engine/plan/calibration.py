"""Calibration records: one JSON file per (model content, pack format, machine)
in cache_dir()/calibration, written by `calibrate` (engine/tune/calibrate.py) and
read by the planner (routing frequencies, engine/plan/sizes.py) and at load
(UMIA's profile, engine/loader.py)."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import torch

from .. import kernels
from ..gguf.reader import GGUFFile
from ..moe.umia import UmiaProfile, default_profile
from ..pack.identity import source_identity
from ..pack.layout import PACK_VERSION
from ..paths import cache_dir, fault_point, fsync_dir

CALIB_VERSION = 1


def machine_fingerprint() -> dict:
    """What the latency model depends on: CPU model, usable cores, kernel path, GPUs."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    gpus = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"cpu": cpu, "cores": cores, "isa": str(kernels.isa_info().get("active", "")), "gpus": gpus}


def calibration_path(model_path: str | os.PathLike, gguf=None) -> Path:
    """cache_dir()/calibration/<stem>.<key>.json, key = (the source's content identity
    (engine/pack/identity.py, as packs are keyed), pack format, machine fingerprint):
    the file `auto` and the planner read. A copy of a model, under any name, finds
    the record its original has. gguf: the source, when the caller has it open."""
    p = Path(model_path)
    if gguf is None:
        with GGUFFile(p) as g:
            ident = source_identity(g)
    else:
        ident = source_identity(gguf)
    key = hashlib.sha256(json.dumps([ident["digest"], PACK_VERSION, CALIB_VERSION, machine_fingerprint()],
                                    sort_keys=True).encode()).hexdigest()[:16]
    d = cache_dir() / "calibration"
    found = sorted(d.glob(f"*.{key}.json")) if d.is_dir() else []
    stem = p.name[:-5] if p.name.endswith(".gguf") else p.name
    return found[0] if found else d / f"{stem}.{key}.json"


def read_calibration(model_path, gguf=None) -> dict | None:
    """The cached calibration of this model on this machine, or None (absent or unreadable)."""
    path = calibration_path(model_path, gguf)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("version") == CALIB_VERSION else None


def _critical_from(record: dict) -> str:
    """Where the record's critical experts ran ("pack" before this was kept, or if garbled)."""
    got = record.get("critical_from")
    return "source" if got == "source" else "pack"


def load_profile(model_path, cfg, mode: str | None = None, log=None, gguf=None,
                 critical_from: str = "pack") -> UmiaProfile:
    """The calibrated profile, else the default. mode, critical_from: the loaded plan's; a
    profile fitted on another plan's step still serves, with a note (records from before
    the mode was kept were all timed on the CPU step, with critical experts from the pack).
    gguf: the source, open."""
    d = read_calibration(model_path, gguf)
    if d is not None:
        try:
            prof = UmiaProfile.from_json(d.get("profile"), cfg.n_layer, cfg.n_expert_used, "calibrated")
        except ValueError:
            pass  # a damaged file: the default serves until the next calibrate
        else:
            timed = d.get("mode", "cpu")
            if log and mode is not None and timed != mode:
                log(f"UMIA: calibrated on a {timed} plan, this one is {mode} "
                    f"(`rapidmoe-chat calibrate --mode {mode}` fits one to it)")
            elif log and mode is not None and _critical_from(d) != critical_from:
                where = {"source": "model file", "pack": "pack"}
                log(f"UMIA: calibrated with the critical experts from the {where[_critical_from(d)]}, "
                    f"this plan runs them from the {where[critical_from]} (`rapidmoe-chat calibrate` fits one to it)")
            return prof
    return default_profile(cfg, gguf.metadata if gguf is not None else None)


def write_record(path: Path, obj: dict) -> None:
    """Replace `path` whole or not at all: a temp file beside it, written and
    fsynced, renamed over it, the directory fsynced. A kill -9 at any point leaves
    the previous record or the new one; the temp file of a run killed before its
    rename is removed by the next. The kill points of the crash tests are the
    conversion's (engine/paths.py `fault_point`), counted on from there."""
    data = json.dumps(obj, indent=1).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        if not _pid_alive(stale.name[len(path.name) + 2:-len(".tmp")]):
            fault_point()
            stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fault_point()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            fault_point()
            view = view[os.write(fd, view[:1 << 16]):]
        fault_point()
        os.fsync(fd)
    finally:
        os.close(fd)
    fault_point()
    os.replace(tmp, path)
    fault_point()
    fsync_dir(path.parent)


def _pid_alive(pid: str) -> bool:
    """Whether the process that named a temp file may still be writing it."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: alive
        return True
    return True
