"""Hardware detection: cgroup limits from sample trees, CUDA_VISIBLE_DEVICES,
nvidia-smi parsing, the AMX probe in a child process, the forced ISA path, and
detect() on this machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rapidmoe.engine.plan import hardware
from rapidmoe.engine.plan.hardware import GPUInfo, HardwareRecord, parse_nvidia_smi, visible_devices
from rapidmoe.engine.plan.cgroup import cgroup_cpu_limit, cgroup_memory


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = ("35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n")


def test_cgroup_v2_limit_is_the_smallest_on_the_way_up(tmp_path):
    root = _tree(tmp_path, {
        "proc/self/cgroup": "0::/user.slice/app.scope\n",
        "proc/self/mountinfo": V2_MOUNT,
        "sys/fs/cgroup/user.slice/app.scope/memory.max": "8589934592\n",
        "sys/fs/cgroup/user.slice/app.scope/memory.current": str(3 << 30) + "\n",
        "sys/fs/cgroup/user.slice/app.scope/memory.stat": "anon 1000\nfile 2000\ninactive_file 1073741824\n",
        "sys/fs/cgroup/user.slice/memory.max": "4294967296\n",  # the parent is tighter
        "sys/fs/cgroup/user.slice/app.scope/cpu.max": "150000 100000\n",
        "sys/fs/cgroup/user.slice/cpu.max": "max 100000\n",
    })
    m = cgroup_memory(root)
    assert (m.version, m.limit, m.used) == (2, 4 << 30, 2 << 30)
    assert cgroup_cpu_limit(root) == 2  # 1.5 CPUs -> 2 whole cores


def test_cgroup_v2_without_limits(tmp_path):
    root = _tree(tmp_path, {
        "proc/self/cgroup": "0::/\n", "proc/self/mountinfo": V2_MOUNT,
        "sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/cpu.max": "max 100000\n",
    })
    assert cgroup_memory(root).limit is None
    assert cgroup_cpu_limit(root) is None


def test_cgroup_v1_memory_and_cpu_quota(tmp_path):
    root = _tree(tmp_path, {
        "proc/self/cgroup": "11:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        "proc/self/mountinfo": V1_MOUNTS + V2_MOUNT.replace("/sys/fs/cgroup ", "/sys/fs/cgroup/unified "),
        "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "2147483648\n",
        "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": "1610612736\n",
        "sys/fs/cgroup/memory/docker/abc/memory.stat": "cache 5\ntotal_inactive_file 536870912\n",
        "sys/fs/cgroup/memory/docker/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "unlimited"
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "400000\n",
        "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    })
    m = cgroup_memory(root)
    assert (m.version, m.limit, m.used) == (1, 2 << 30, 1 << 30)
    assert cgroup_cpu_limit(root) == 4


def test_cgroup_v1_unlimited_and_namespaced_mount(tmp_path):
    # inside a container the hierarchy is mounted at our own cgroup (mount root /docker/abc)
    root = _tree(tmp_path, {
        "proc/self/cgroup": "4:memory:/docker/abc\n",
        "proc/self/mountinfo": "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": "1000\n",
    })
    m = cgroup_memory(root)
    assert (m.version, m.limit, m.used) == (1, None, 1000)
    assert cgroup_cpu_limit(root) is None  # no cpu controller line


def test_no_cgroup_files(tmp_path):
    assert cgroup_memory(tmp_path) is None
    assert cgroup_cpu_limit(tmp_path) is None


def test_cuda_visible_devices():
    devs = [(0, "GPU-aaaa-1111"), (1, "GPU-bbbb-2222"), (2, "GPU-cccc-3333")]
    assert visible_devices(None, devs) is None
    assert visible_devices("", devs) == []
    assert visible_devices("2,0", devs) == [2, 0]
    assert visible_devices("0,7,1", devs) == [0]  # CUDA stops at the first invalid entry
    assert visible_devices("-1", devs) == []
    assert visible_devices("GPU-bbbb,0", devs) == [1, 0]  # unique UUID prefix
    assert visible_devices("GPU-,1", devs) == []  # ambiguous prefix ends the list
    assert visible_devices("1,1", devs) == [1]


def test_parse_nvidia_smi():
    text = ("NVIDIA GeForce RTX 4090, GPU-1a2b, 24564, 23950, 8.9\n"
            "NVIDIA H100 80GB HBM3, GPU-3c4d, 81559, 81000, 9.0\n"
            "garbage line\n")
    rows = parse_nvidia_smi(text)
    assert rows == [("NVIDIA GeForce RTX 4090", "GPU-1a2b", 24564 << 20, 23950 << 20, (8, 9)),
                    ("NVIDIA H100 80GB HBM3", "GPU-3c4d", 81559 << 20, 81000 << 20, (9, 0))]


def test_record_round_trips_through_json():
    rec = HardwareRecord(gpus=(GPUInfo(0, "x", 24 << 30, 23 << 30, (8, 9), "GPU-1"),), dram_total_bytes=128 << 30,
                         dram_available_bytes=120 << 30, physical_cores=16, usable_cores=32, isa=("avx2",))
    assert HardwareRecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
    with pytest.raises(ValueError, match="unknown hardware fields"):
        HardwareRecord.from_dict({**rec.to_dict(), "vram": 1})
    with pytest.raises(ValueError, match="non-negative"):
        HardwareRecord.from_dict({**rec.to_dict(), "dram_total_bytes": -1})


def test_amx_probe_returns_a_bool_and_survives_a_faulting_child():
    ok, why = hardware.probe_amx(force=True)  # runs the tile instructions even when not advertised
    assert isinstance(ok, bool) and why
    if not hardware.amx_advertised():
        assert ok is False
    # a child killed by SIGILL (what a faulting tile instruction does) is a clean "no"
    ok, why = hardware.run_probe("import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    assert ok is False and "SIGILL" in why
    assert hardware.run_probe("pass") == (True, "")


def test_forced_isa_is_reported_with_the_reason():
    code = ("import json; from rapidmoe.engine.plan.hardware import cpu_kernel_path; "
            "print(json.dumps(cpu_kernel_path()))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "RAPIDMOE_ISA": "scalar"},
                         capture_output=True, text=True, check=True).stdout
    path, why, flags = json.loads(out)
    assert path == "scalar" and why.startswith("forced by RAPIDMOE_ISA=scalar")
    best, why_best, _ = hardware.cpu_kernel_path() if not os.environ.get("RAPIDMOE_ISA") else (None, "", None)
    if best is not None:
        assert why_best == "best available on this CPU and OS"
        assert best == ("avx512" if "avx512" in flags else "avx2" if "avx2" in flags else "scalar")


def test_detect_on_this_machine():
    hw = hardware.detect()
    assert 0 < hw.dram_available_bytes <= hw.dram_total_bytes
    assert 1 <= hw.usable_cores <= (os.cpu_count() or 1)
    assert hw.physical_cores >= 1
    assert hw.kernel_path in ("scalar", "avx2", "avx512")
    assert hw.disk_free_bytes > 0
    cg = cgroup_memory()
    if cg is not None and cg.limit is not None:
        assert hw.dram_total_bytes <= cg.limit
    if hw.gpu_source == "none":  # no NVML bindings, no nvidia-smi, no CUDA torch: zero GPUs, with the reason
        assert hw.gpus == () and hw.gpu_note
    assert HardwareRecord.from_dict(json.loads(json.dumps(hw.to_dict()))) == hw


def test_gpus_from_nvidia_smi_honour_cuda_visible_devices(tmp_path, monkeypatch):
    """No GPU here: a stand-in nvidia-smi on PATH prints what the real one does
    for two GPUs; CUDA_VISIBLE_DEVICES=1 leaves the second as CUDA device 0."""
    try:
        import pynvml  # noqa: F401
        pytest.skip("NVML bindings installed: they take precedence over nvidia-smi")
    except ImportError:
        pass
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA GeForce RTX 4090, GPU-aa11, 24564, 20000, 8.9\\n"
                   "NVIDIA A100-SXM4-80GB, GPU-bb22, 81920, 81000, 8.0\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpus, source, _ = hardware.detect_gpus()
    assert source == "nvidia-smi"
    assert gpus == (GPUInfo(0, "NVIDIA A100-SXM4-80GB", 81920 << 20, 81000 << 20, (8, 0), "GPU-bb22"),)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    gpus, _, _ = hardware.detect_gpus()
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpus, _, note = hardware.detect_gpus()
    assert gpus == () and "hides every GPU" in note
