"""The CUDA emulation library (csrc/cuda/dev/emu_lib.cpp) built for a test: the real
kernel sources run on the CPU, one thread per CUDA thread."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "csrc" / "cuda"


def build_emulator(out_dir: Path) -> Path:
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    lib = out_dir / "libemu.so"
    r = subprocess.run([cxx, "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", "-o", str(lib),
                        str(SRC / "dev" / "emu_lib.cpp")], capture_output=True, text=True)
    if r.returncode != 0 and "barrier" in r.stderr:
        pytest.skip("C++ compiler without <barrier>")
    assert r.returncode == 0, r.stderr[-2000:]
    return lib
