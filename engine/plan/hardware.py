"""What this machine has: GPUs, DRAM (as the cgroup lets us use it), CPU cores
and ISA, free disk in the cache dir — one frozen record. Everything downstream
(plan, calibrate) is a pure function of it, so machines we do not have are
described by hand-written records.

    hw = detect()
    hw.gpus[0].free_bytes, hw.dram_available_bytes, hw.usable_cores
"""
from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..errors import UserError
from ..paths import cache_dir
from .cgroup import cgroup_cpu_limit, cgroup_memory

GiB = 1 << 30


@dataclass(frozen=True)
class GPUInfo:
    index: int  # CUDA ordinal as this process sees it (after CUDA_VISIBLE_DEVICES)
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int] = (0, 0)
    uuid: str = ""


@dataclass(frozen=True)
class HardwareRecord:
    gpus: tuple[GPUInfo, ...]
    dram_total_bytes: int  # min(physical, cgroup limit)
    dram_available_bytes: int  # what can be allocated now without swapping
    physical_cores: int
    usable_cores: int  # affinity mask, clamped by a cgroup CPU quota
    # CPU features: "avx2", "avx_vnni", "avx512", "avx512_vnni", "avx512_vbmi", "avx512_bf16", "amx"
    isa: tuple[str, ...] = ()
    kernel_path: str = "scalar"  # the CPU kernel path in use
    kernel_path_reason: str = ""
    amx_usable: bool = False
    amx_reason: str = ""
    disk_free_bytes: int = 0  # in the cache dir (packs are written there)
    cgroup_memory_limit_bytes: int | None = None
    gpu_source: str = "none"  # "nvml" | "nvidia-smi" | "torch" | "standin" | "none"
    gpu_note: str = ""  # why no GPU was found, when none was

    @property
    def vram_total_bytes(self) -> int:
        return sum(g.total_bytes for g in self.gpus)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["gpus"] = [dict(dataclasses.asdict(g), compute_capability=list(g.compute_capability)) for g in self.gpus]
        d["isa"] = list(self.isa)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "HardwareRecord":
        """A record from JSON (doctor --json's "hardware", or written by hand)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        bad = set(d) - fields
        if bad:
            raise ValueError(f"unknown hardware fields: {', '.join(sorted(bad))}")
        gpus = []
        for i, g in enumerate(d.get("gpus", [])):
            g = dict(g)
            g.setdefault("index", i)
            g["compute_capability"] = tuple(g.get("compute_capability", (0, 0)))
            gpus.append(GPUInfo(**g))
        rest = {k: v for k, v in d.items() if k != "gpus"}
        rest["isa"] = tuple(rest.get("isa", ()))
        rec = cls(gpus=tuple(gpus), **rest)
        ints = [rec.dram_total_bytes, rec.dram_available_bytes, rec.physical_cores, rec.usable_cores]
        ints += [x for g in rec.gpus for x in (g.total_bytes, g.free_bytes)]
        if any(not isinstance(x, int) or x < 0 for x in ints):
            raise ValueError("sizes and core counts must be non-negative integers")
        return rec


# ---- GPUs ----

def visible_devices(env: str | None, devices: list[tuple[int, str]]) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES -> which of `devices` [(index, uuid)] CUDA shows, in
    CUDA's order (None: unset, all of them). As CUDA does, the list ends at the
    first entry that names no device; UUIDs may be given by a unique prefix."""
    if env is None:
        return None
    out: list[int] = []
    for entry in env.split(","):
        e = entry.strip()
        hit = None
        if e.lstrip("-").isdigit():
            n = int(e)
            hit = n if 0 <= n < len(devices) else None
        elif e.startswith("GPU-") or e.startswith("MIG-"):
            m = [i for i, (_, u) in enumerate(devices) if u.startswith(e)]
            hit = m[0] if len(m) == 1 else None
        if hit is None or hit in out:
            break
        out.append(hit)
    return out


def _nvml_gpus() -> tuple[list[tuple[str, str, int, int, tuple[int, int]]] | None, str]:
    """[(name, uuid, total, free, cc)] in NVML order, or (None, why). NVML reads
    memory without creating a CUDA context."""
    try:
        import pynvml  # nvidia-ml-py: optional
    except ImportError:
        return None, "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # no driver / no library
        return None, f"NVML unavailable ({e})"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                cc = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))
            except Exception:
                cc = (0, 0)
            dec = lambda s: s.decode() if isinstance(s, bytes) else str(s)  # noqa: E731 (old bindings return bytes)
            out.append((dec(name), dec(uuid), int(mem.total), int(mem.free), cc))
        return out, ""
    except Exception as e:
        return None, f"NVML query failed ({e})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def parse_nvidia_smi(text: str) -> list[tuple[str, str, int, int, tuple[int, int]]]:
    """Rows of `nvidia-smi --query-gpu=name,uuid,memory.total,memory.free,compute_cap
    --format=csv,noheader,nounits` (MiB) -> [(name, uuid, total, free, cc)]."""
    out = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) != 5:
            continue
        try:
            total, free = int(float(f[2])) << 20, int(float(f[3])) << 20
        except ValueError:
            continue
        try:
            major, minor = (int(x) for x in f[4].split("."))
        except ValueError:
            major, minor = 0, 0
        out.append((f[0], f[1], total, free, (major, minor)))
    return out


def _smi_gpus() -> tuple[list | None, str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "no nvidia-smi"
    try:
        r = subprocess.run([exe, "--query-gpu=name,uuid,memory.total,memory.free,compute_cap",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi failed ({e})"
    if r.returncode != 0:
        return None, f"nvidia-smi failed: {(r.stderr or r.stdout).strip()[:200]}"
    return parse_nvidia_smi(r.stdout), ""


def _torch_gpus() -> tuple[list[GPUInfo] | None, str]:
    """Last resort. Only when torch is already imported (importing it just to look
    costs seconds) and built with CUDA; free memory would need a context, so
    total stands in for it."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(torch.version, "cuda", None) is None:
        return None, "torch without CUDA" if torch is not None else "torch not loaded"
    try:
        if not torch.cuda.is_available():
            return None, "torch sees no CUDA device"
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(GPUInfo(i, p.name, int(p.total_memory), int(p.total_memory), (p.major, p.minor)))
        return out, "free VRAM unknown (torch): assumed all free"
    except Exception as e:
        return None, f"torch CUDA query failed ({e})"


STANDIN_ENV = "RAPIDMOE_STANDIN_GPU"
STANDIN_NAME = "stand-in GPU (CPU)"


def standin_gpus(value: str) -> tuple[GPUInfo, ...]:
    """RAPIDMOE_STANDIN_GPU=24 or 24,12 (GiB each) -> GPUs that the whole GPU path
    runs on, with the device work done by the CPU: the wiring is tested without one."""
    try:
        sizes = [float(v) for v in value.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(not 0 < g < 1e6 for g in sizes):
        raise UserError(f"{STANDIN_ENV} must be GiB per stand-in GPU, like 24 or 24,12 (got {value!r})")
    return tuple(GPUInfo(i, STANDIN_NAME, int(g * GiB), int(g * GiB), (0, 0), f"standin-{i}")
                 for i, g in enumerate(sizes))


def detect_gpus() -> tuple[tuple[GPUInfo, ...], str, str]:
    """-> (gpus, source, note). CUDA_VISIBLE_DEVICES is honoured (torch applies it itself).
    RAPIDMOE_STANDIN_GPU replaces whatever is there by stand-in GPUs (source "standin")."""
    if os.environ.get(STANDIN_ENV):
        return standin_gpus(os.environ[STANDIN_ENV]), "standin", "stand-in GPU: the device work runs on the CPU"
    notes = []
    for source, probe in (("nvml", _nvml_gpus), ("nvidia-smi", _smi_gpus)):
        rows, why = probe()
        if rows is None:
            notes.append(why)
            continue
        order = visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), [(i, r[1]) for i, r in enumerate(rows)])
        order = list(range(len(rows))) if order is None else order
        gpus = []
        for j, i in enumerate(order):  # j: the CUDA ordinal this process will see
            name, uuid, total, free, cc = rows[i]
            gpus.append(GPUInfo(j, name, total, free, cc, uuid))
        gpus = tuple(gpus)
        note = "" if gpus else "CUDA_VISIBLE_DEVICES hides every GPU"
        return gpus, source, note
    gpus, why = _torch_gpus()
    if gpus is not None:
        return tuple(gpus), "torch", why
    notes.append(why)
    return (), "none", "; ".join(notes)


# ---- CPU ----

# Runs in a child: asks the kernel for the AMX tile state (arch_prctl), then
# executes LDTILECFG / TILEZERO tmm0 / TILERELEASE. A CPU or OS that does not
# allow it kills the child with SIGILL (or the request fails), never us.
_AMX_CHILD = r"""
import ctypes, resource, sys
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
if libc.syscall(158, 0x1023, 18) != 0:  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    sys.exit(3)
code = bytes([0xC4, 0xE2, 0x78, 0x49, 0x07,   # ldtilecfg [rdi]
              0xC4, 0xE2, 0x7B, 0x49, 0xC0,   # tilezero tmm0
              0xC4, 0xE2, 0x78, 0x49, 0xC0,   # tilerelease
              0xC3])                          # ret
addr = libc.mmap(None, 4096, 3, 0x22, -1, 0)  # RW, private anonymous
if addr in (None, ctypes.c_void_p(-1).value):
    sys.exit(5)
ctypes.memmove(addr, code, len(code))
if libc.mprotect(addr, 4096, 5) != 0:  # R+X
    sys.exit(5)
cfg = ctypes.create_string_buffer(64)
cfg[0] = 1        # palette 1
cfg[16] = 64      # tile 0: 64 bytes per row
cfg[48] = 16      # tile 0: 16 rows
ctypes.CFUNCTYPE(None, ctypes.c_void_p)(addr)(ctypes.addressof(cfg))
sys.exit(0)
"""
_AMX_EXIT = {3: "the OS refused the AMX tile state (arch_prctl)", 5: "could not map the probe's code"}


def run_probe(code: str, timeout: float = 20.0) -> tuple[bool, str]:
    """Run `code` in a fresh interpreter: (True, "") when it exits 0; a child
    killed by a signal or failing means the feature is unusable."""
    try:
        r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "probe timed out"
    except OSError as e:
        return False, f"probe could not start ({e})"
    if r.returncode == 0:
        return True, ""
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f"signal {-r.returncode}"
        return False, f"a tile instruction killed the probe ({name})"
    return False, _AMX_EXIT.get(r.returncode, f"probe failed (exit {r.returncode})")


def amx_advertised() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False


def probe_amx(force: bool = False) -> tuple[bool, str]:
    """Whether AMX tile instructions run here, tested in a child process (never
    in-process: cpuinfo can advertise AMX while the instructions fault)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False, "not x86-64 Linux"
    if not force and not amx_advertised():
        return False, "not advertised by the CPU"
    ok, why = run_probe(_AMX_CHILD)
    return ok, "a tile instruction ran in a probe process" if ok else why


def cpu_kernel_path() -> tuple[str, str, tuple[str, ...]]:
    """-> (path in use, why, ISA flags) from the compiled kernels' own detection."""
    from .. import kernels  # deferred: loads the compiled kernels, numpy

    info = kernels.isa_info()
    flags = tuple(k for k in ("avx2", "avx_vnni", "avx512", "avx512_vnni", "avx512_vbmi", "avx512_bf16") if info.get(k))
    if info.get("amx_tile_cpuid"):
        flags += ("amx",)
    best = "avx512" if info.get("avx512") else "avx2" if info.get("avx2") else "scalar"
    active = info.get("active", "scalar")
    forced = os.environ.get("RAPIDMOE_ISA")
    if forced:
        why = f"forced by RAPIDMOE_ISA={forced}" + (f" (best available: {best})" if active != best else "")
        if active != forced.split("-")[0]:  # avx2-novnni, avx512-novnni / -novbmi: features hidden
            why += f"; {forced} is not available here, so {active}"
    else:
        why = "best available on this CPU and OS"
    return active, why, flags


def _usable_cores() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    return max(1, min(n, quota)) if quota else n


def disk_free(d: Path) -> int:
    d = Path(d)
    while not d.exists() and d != d.parent:  # nothing is created just to look
        d = d.parent
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return 0


def detect(amx: bool = True) -> HardwareRecord:
    """This machine's record. amx=False skips the AMX child process."""
    gpus, source, note = detect_gpus()
    vm = psutil.virtual_memory()
    total, avail = int(vm.total), int(vm.available)
    cg = cgroup_memory()
    if cg is not None and cg.limit is not None:
        total = min(total, cg.limit)
        avail = min(avail, max(0, cg.limit - cg.used))
    path, why, flags = cpu_kernel_path()
    amx_ok, amx_why = probe_amx() if amx else (False, "not probed")
    return HardwareRecord(
        gpus=gpus, dram_total_bytes=total, dram_available_bytes=avail,
        physical_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1, usable_cores=_usable_cores(),
        isa=flags, kernel_path=path, kernel_path_reason=why, amx_usable=amx_ok, amx_reason=amx_why,
        disk_free_bytes=disk_free(cache_dir()), cgroup_memory_limit_bytes=cg.limit if cg else None,
        gpu_source=source, gpu_note=note)
