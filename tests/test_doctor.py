"""`rapidmoe-chat doctor`: runs on this machine, its --json parses and agrees
with what it reports on (package versions, kernel cache). The forced ISA path
is tested in test_hardware.py (a child process); a value that names no path is
refused here."""
from __future__ import annotations

import importlib.metadata as md
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy

from rapidmoe.app.cli import main
from rapidmoe.engine.kernels import ISA_PATHS
from rapidmoe.engine.paths import cache_dir


def _doctor(*args) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["doctor", *args])
    return rc, out.getvalue()


def test_doctor_json(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path))  # other tests build kernels in the shared cache
    kdir = cache_dir() / "kernels"
    kdir.mkdir(parents=True, exist_ok=True)
    (kdir / "resplit_sm90_abc.so").write_bytes(b"\0" * 1000)
    rc, out = _doctor("--json")
    assert rc == 0
    d = json.loads(out)
    assert set(d) >= {"hardware", "cpu_kernels", "cuda", "kernel_cache", "packages"}
    assert d["packages"]["numpy"] == numpy.__version__
    assert d["packages"]["rapidmoe-chat"] == md.version("rapidmoe-chat")
    assert d["kernel_cache"] == {"path": str(kdir), "exists": True, "files": 1, "bytes": 1000}
    assert d["cpu_kernels"]["path"] in ("scalar", "avx2", "avx512") and d["cpu_kernels"]["why"]
    hw = d["hardware"]
    assert hw["dram_total_bytes"] >= hw["dram_available_bytes"] > 0
    assert isinstance(d["cpu_kernels"]["amx_usable"], bool)
    assert d["cuda"]["gpus"] == len(hw["gpus"])


def test_doctor_text():
    rc, out = _doctor()
    assert rc == 0
    for label in ("DRAM", "CPU kernels", "AMX", "GPU", "CUDA", "kernel cache", "packages"):
        assert label in out


def test_unknown_forced_isa_is_one_line_naming_the_paths():
    for bogus in ("bogus", "avx2-bogus", "AVX2"):  # the compiled module took the last two as avx2 / nothing
        r = subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", "doctor"], capture_output=True, text=True,
                           env={**os.environ, "RAPIDMOE_ISA": bogus}, timeout=120)
        assert r.returncode == 2 and r.stdout == "", r.stdout
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"rapidmoe-chat: error: RAPIDMOE_ISA={bogus!r}"), r.stderr
        assert all(p in lines[0] for p in ISA_PATHS)


def test_isa_paths_are_the_compiled_modules():
    """The names the check accepts are the ones csrc/cpu/common/isa.cpp compares RAPIDMOE_ISA with."""
    src = (Path(__file__).parents[1] / "csrc" / "cpu" / "common" / "isa.cpp").read_text()
    assert all(f'"{p}"' in src for p in ISA_PATHS)
    assert set(ISA_PATHS) == {"scalar", "avx2", "avx2-novnni", "avx512", "avx512-novbmi", "avx512-novnni"}
