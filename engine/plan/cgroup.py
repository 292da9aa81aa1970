"""Memory and CPU limits a cgroup puts on this process (containers, systemd
slices, CI runners): the machine's DRAM is not what we may use.

cgroup v1 (memory.limit_in_bytes, cpu.cfs_quota_us) and v2 (memory.max,
cpu.max); the effective limit is the smallest one on the way from our cgroup
up to the hierarchy's mount point. Every path is read under `root` so tests
use sample trees.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

_UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2^63 - 1
T = TypeVar("T")


@dataclass(frozen=True)
class CgroupMemory:
    version: int
    limit: int | None  # bytes, None: no limit on the way up
    used: int  # charged to the cgroup, less the inactive page cache it would give back


def _read(p: Path) -> str | None:
    try:
        return p.read_text()
    except OSError:
        return None


def _mounts(root: Path) -> list[tuple[str, str, str, set[str]]]:
    """/proc/self/mountinfo -> [(fs type, mount root, mount point, super options)]."""
    out = []
    for line in (_read(root / "proc/self/mountinfo") or "").splitlines():
        pre, sep, post = line.partition(" - ")
        a, b = pre.split(), post.split()
        if not sep or len(a) < 5 or len(b) < 3:
            continue
        out.append((b[0], a[3], a[4], set(b[2].split(","))))
    return out


def _cgroup_dirs(root: Path, controller: str) -> tuple[int, list[Path]] | None:
    """(version, [our cgroup dir, its parents ... up to the mount point]) for a controller."""
    lines = (_read(root / "proc/self/cgroup") or "").splitlines()
    v1 = v2 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif controller in parts[1].split(","):
            v1 = parts[2]
    mounts = _mounts(root)
    if v1 is not None:
        m = [(mr, mp) for fs, mr, mp, opts in mounts if fs == "cgroup" and controller in opts]
        version, path = 1, v1
    elif v2 is not None:
        m = [(mr, mp) for fs, mr, mp, _ in mounts if fs == "cgroup2"]
        version, path = 2, v2
    else:
        return None
    if not m:
        return None
    mount_root, mount_point = m[0]
    rel = path
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        rel = path[len(mount_root):]
    elif mount_root != "/":
        rel = "/"  # a namespaced view: our cgroup is the mount itself
    top = root / mount_point.lstrip("/")
    dirs = []
    d = top / rel.strip("/") if rel.strip("/") else top
    while True:
        dirs.append(d)
        if d == top or top not in d.parents:
            break
        d = d.parent
    return version, dirs


def _int_or_none(s: str | None) -> int | None:
    if s is None:
        return None
    s = s.strip()
    if s in ("", "max"):
        return None
    try:
        v = int(s)
    except ValueError:
        return None
    return None if v < 0 or v >= _UNLIMITED else v


def _stat(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            try:
                return int(v)
            except ValueError:
                return 0
    return 0


def _under(root: Path | str, controller: str, read: Callable[[int, list[Path]], T]) -> T | None:
    """read(version, dirs) on the cgroup of `controller` (see _cgroup_dirs); None: there is none."""
    found = _cgroup_dirs(Path(root), controller)
    return None if found is None else read(*found)


def cgroup_memory(root: Path | str = "/") -> CgroupMemory | None:
    """The memory cgroup's effective limit and use (None: no memory cgroup found)."""
    return _under(root, "memory", _memory)


def cgroup_cpu_limit(root: Path | str = "/") -> int | None:
    """Whole CPUs a cgroup CPU quota allows (rounded up), None: no quota."""
    return _under(root, "cpu", _cpu_limit)


def _memory(version: int, dirs: list[Path]) -> CgroupMemory:
    limit_file, usage_file = ("memory.max", "memory.current") if version == 2 else \
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    limits = [v for v in (_int_or_none(_read(d / limit_file)) for d in dirs) if v is not None]
    own = dirs[0]
    usage = _int_or_none(_read(own / usage_file)) or 0
    stat = _read(own / "memory.stat")
    inactive = _stat(stat, "inactive_file" if version == 2 else "total_inactive_file") or _stat(stat, "inactive_file")
    return CgroupMemory(version, min(limits) if limits else None, max(0, usage - inactive))


def _cpu_limit(version: int, dirs: list[Path]) -> int | None:
    best = None
    for d in dirs:
        if version == 2:
            f = (_read(d / "cpu.max") or "").split()
            quota, period = (_int_or_none(f[0]), _int_or_none(f[1])) if len(f) == 2 else (None, None)
        else:
            quota, period = _int_or_none(_read(d / "cpu.cfs_quota_us")), _int_or_none(_read(d / "cpu.cfs_period_us"))
        if quota and period:
            n = max(1, math.ceil(quota / period))
            best = n if best is None else min(best, n)
    return best
