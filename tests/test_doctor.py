"""`rapidmoe-chat doctor`: runs on this machine, its --json parses and agrees
with what it reports on (package versions, kernel cache). The forced ISA path
is tested in test_hardware.py (a child process)."""
from __future__ import annotations

import importlib.metadata as md
import io
import json
from contextlib import redirect_stdout

import numpy

from rapidmoe.app.cli import main
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

