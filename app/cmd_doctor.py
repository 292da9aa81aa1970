"""`rapidmoe-chat doctor`: what this machine offers the engine — hardware,
the CPU kernel path in use and why, CUDA/NVML status, the kernel cache and
package versions. Every probe reports its failure instead of raising."""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys

PACKAGES = ("rapidmoe-chat", "torch", "numpy", "gguf", "textual", "huggingface-hub", "nvidia-ml-py")


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def _cuda_status(hw) -> dict:
    st: dict = {"gpu_source": hw.gpu_source, "gpus": len(hw.gpus), "note": hw.gpu_note,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "nvidia_smi": shutil.which("nvidia-smi")}
    try:
        import pynvml  # noqa: F401

        st["nvml_bindings"] = True
    except ImportError:
        st["nvml_bindings"] = False
    try:
        import torch  # deferred: loads torch

        st["torch_cuda"] = torch.version.cuda
        st["torch_cuda_available"] = bool(torch.version.cuda) and torch.cuda.is_available()
    except Exception as e:  # a broken torch install is a finding, not a crash
        st["torch_cuda"] = None
        st["torch_error"] = str(e)
    nvcc = shutil.which("nvcc")
    st["nvcc"] = nvcc
    if nvcc:
        try:
            r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20)
            st["nvcc_version"] = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired) as e:
            st["nvcc_version"] = f"failed: {e}"
    return st


def _kernel_cache() -> dict:
    from ..engine.paths import cache_dir  # deferred: loads platformdirs

    d = cache_dir() / "kernels"
    if not d.is_dir():
        return {"path": str(d), "exists": False, "files": 0, "bytes": 0}
    files = [f for f in d.rglob("*") if f.is_file()]
    return {"path": str(d), "exists": True, "files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def collect() -> dict:
    from ..engine.plan.hardware import detect  # deferred: loads psutil

    hw = detect()
    return {
        "hardware": hw.to_dict(),
        "cpu_kernels": {"path": hw.kernel_path, "why": hw.kernel_path_reason,
                        "forced": os.environ.get("RAPIDMOE_ISA") or None, "isa": list(hw.isa),
                        "amx_usable": hw.amx_usable, "amx": hw.amx_reason},
        "cuda": _cuda_status(hw),
        "kernel_cache": _kernel_cache(),
        "packages": _versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def print_report(d: dict, out=None) -> None:
    hw, k, c, kc = d["hardware"], d["cpu_kernels"], d["cuda"], d["kernel_cache"]
    w = (out or sys.stdout).write
    w(f"python       {d['python']} on {d['platform']}\n")
    lim = hw["cgroup_memory_limit_bytes"]
    w(f"DRAM         {_gb(hw['dram_total_bytes'])} total, {_gb(hw['dram_available_bytes'])} available"
      + (f" (cgroup limit {_gb(lim)})" if lim else "") + "\n")
    w(f"CPU          {hw['physical_cores']} physical cores, {hw['usable_cores']} usable; ISA: {', '.join(k['isa']) or 'none'}\n")
    w(f"CPU kernels  {k['path']} ({k['why']})\n")
    w(f"AMX          {'usable' if k['amx_usable'] else 'not used'}: {k['amx']}\n")
    if hw["gpus"]:
        for g in hw["gpus"]:
            cc = ".".join(str(x) for x in g["compute_capability"])
            w(f"GPU {g['index']}        {g['name']}, {_gb(g['total_bytes'])} total, {_gb(g['free_bytes'])} free, "
              f"compute {cc}\n")
        if c["gpu_source"] == "standin":
            w("             a stand-in set by RAPIDMOE_STANDIN_GPU: the GPU path runs with its device work on the "
              "CPU (no real GPU is used)\n")
    else:
        w(f"GPU          none ({c['note'] or 'not found'})\n")
    w(f"CUDA         via {c['gpu_source']}; NVML bindings {'yes' if c['nvml_bindings'] else 'no'}; "
      f"torch CUDA {c.get('torch_cuda') or 'no'}; nvcc {c.get('nvcc_version') or c.get('nvcc') or 'not found'}\n")
    w(f"kernel cache {kc['path']}: " + (f"{kc['files']} files, {kc['bytes'] / 1e6:.1f} MB" if kc["exists"] else "empty")
      + "\n")
    w(f"disk         {_gb(hw['disk_free_bytes'])} free in the cache dir\n")
    w("packages     " + ", ".join(f"{n} {v or 'not installed'}" for n, v in d["packages"].items()) + "\n")


def run(args) -> int:
    d = collect()
    if args.json:
        print(json.dumps(d))
    else:
        print_report(d)
    return 0
