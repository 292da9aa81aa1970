"""Just-in-time build of the CUDA kernels (csrc/cuda), on first GPU use only.

Each .cu file is one device module (no host code), compiled for the GPU's own
architecture and cached under the user cache dir, keyed by the sources' hash,
the architecture and the compiler's version (DESIGN.md §4):

    <cache>/kernels/cuda-<hash16>-sm<XY>-<toolchain>/<module>.cubin

Compilers, first found wins: nvcc (a CUDA toolkit), else NVRTC from the CUDA
libraries that pip's CUDA torch wheels bring (no toolkit needed). A machine
without a GPU never gets here, so it never needs either.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

from ..errors import UserError
from ..paths import cache_dir

MODULES = ("resplit_wq", "ggml_gemv")


def source_dir() -> Path:
    """The CUDA sources: RAPIDMOE_CUDA_SRC, else installed beside the package
    (rapidmoe/engine/cuda_src), else the checkout's csrc/cuda."""
    env = os.environ.get("RAPIDMOE_CUDA_SRC")
    engine = Path(__file__).resolve().parents[1]
    for d in ([Path(env)] if env else []) + [engine / "cuda_src", engine.parent / "csrc" / "cuda"]:
        if (d / f"{MODULES[0]}.cu").is_file():
            return d
    raise UserError("the CUDA kernel sources are missing from this installation (set RAPIDMOE_CUDA_SRC)")


def sources(d: Path) -> dict[str, bytes]:
    """Every .cu/.cuh file a module may include (name -> bytes), dev harnesses excluded."""
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.cu")) + sorted(d.glob("*.cuh"))}


def source_hash(d: Path) -> str:
    h = hashlib.sha256()
    for name, data in sorted(sources(d).items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- nvcc
def find_nvcc() -> str | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        p = os.environ.get(env)
        if p and os.access(Path(p) / "bin" / "nvcc", os.X_OK):
            return str(Path(p) / "bin" / "nvcc")
    p = shutil.which("nvcc")
    if p:
        return p
    return "/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def nvcc_compile(nvcc: str, src: Path, arch: int, out: Path) -> None:
    """One .cu -> cubin for sm_<arch> (device code only: no host compiler step)."""
    cmd = [nvcc, "-cubin", f"-arch=sm_{arch}", "-O3", "-std=c++17", "-o", str(out), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src.name} for sm_{arch}:\n{r.stderr[-4000:]}")


# ---------------------------------------------------------------- NVRTC
def _nvrtc_candidates() -> list[str]:
    found = []
    for base in sys.path:
        found += sorted(glob.glob(os.path.join(base, "nvidia", "**", "libnvrtc.so*"), recursive=True))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            found += sorted(glob.glob(os.path.join(os.environ[env], "lib*", "libnvrtc.so*")))
    found += sorted(glob.glob("/usr/local/cuda/lib*/libnvrtc.so*"))
    # the library itself (not its builtins companion, nor the .alt build)
    return [f for f in found if "builtins" not in os.path.basename(f) and ".alt." not in os.path.basename(f)] + [
        "libnvrtc.so"]


def load_nvrtc():
    for cand in _nvrtc_candidates():
        # NVRTC dlopens libnvrtc-builtins by name at compile time: load the one
        # beside it first, globally, so a wheel's copy is found without LD_LIBRARY_PATH
        for b in sorted(glob.glob(os.path.join(os.path.dirname(cand), "libnvrtc-builtins.so*"))):
            if ".alt." not in b:
                try:
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass
        try:
            return ctypes.CDLL(cand)
        except OSError:
            continue
    return None


def nvrtc_version(lib) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def nvrtc_compile(lib, name: str, srcs: dict[str, bytes], arch: int) -> bytes:
    """One module's source -> cubin for sm_<arch>; headers passed in memory."""
    prog = ctypes.c_void_p()
    hdr_names = [n for n in srcs if n.endswith(".cuh")]
    n_h = len(hdr_names)
    headers = (ctypes.c_char_p * n_h)(*[srcs[n] for n in hdr_names])
    inames = (ctypes.c_char_p * n_h)(*[n.encode() for n in hdr_names])
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), srcs[name + ".cu"], (name + ".cu").encode(), n_h, headers, inames)
    if rc != 0:
        raise RuntimeError(f"nvrtcCreateProgram failed ({rc})")
    try:
        opts = [f"--gpu-architecture=sm_{arch}".encode(), b"--std=c++17", b"-default-device"]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC failed on {name}.cu for sm_{arch}:\n{log.value.decode(errors='replace')[-4000:]}")
        size = ctypes.c_size_t()
        if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) != 0:
            raise RuntimeError("nvrtcGetCUBINSize failed")
        buf = ctypes.create_string_buffer(size.value)
        if lib.nvrtcGetCUBIN(prog, buf) != 0:
            raise RuntimeError("nvrtcGetCUBIN failed")
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


# ---------------------------------------------------------------- build + cache
def build(arch: int, prefer: str | None = None, log=None) -> dict[str, Path]:
    """Cubins of every module for sm_<arch> (built once, then from the cache).
    prefer: "nvcc" or "nvrtc" forces a toolchain (RAPIDMOE_CUDA_COMPILER too)."""
    prefer = prefer or os.environ.get("RAPIDMOE_CUDA_COMPILER") or None
    d = source_dir()
    srcs = sources(d)
    nvcc = find_nvcc() if prefer in (None, "nvcc") else None
    nvrtc = load_nvrtc() if nvcc is None and prefer in (None, "nvrtc") else None
    if nvcc:
        tool = f"nvcc{nvcc_version(nvcc)}"
    elif nvrtc is not None:
        tool = f"nvrtc{nvrtc_version(nvrtc)}"
    else:
        raise UserError("no CUDA compiler for the GPU kernels: install the NVRTC library that matches your "
                        "torch (pip install nvidia-cuda-nvrtc) or a CUDA toolkit (nvcc), or run on the CPU")
    out_dir = cache_dir() / "kernels" / f"cuda-{source_hash(d)}-sm{arch}-{tool}"  # where doctor looks
    paths = {m: out_dir / f"{m}.cubin" for m in MODULES}
    if all(p.is_file() for p in paths.values()):
        return paths
    out_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):
        for m, p in paths.items():
            if p.is_file():
                continue
            if log:
                log(f"compiling GPU kernels ({m}, sm_{arch}, {tool}) — once")
            tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
            if nvcc:
                nvcc_compile(nvcc, d / f"{m}.cu", arch, tmp)
            else:
                tmp.write_bytes(nvrtc_compile(nvrtc, m, srcs, arch))
            os.replace(tmp, p)
    return paths
