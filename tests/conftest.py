"""Every test runs with its own user cache, config and data dirs, and an HF cache
that is empty unless a test fills it."""
from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("userdirs")
    env = {
        "RAPIDMOE_CACHE_DIR": str(root / "cache"),
        "RAPIDMOE_CONFIG_DIR": str(root / "config"),
        "RAPIDMOE_DATA_DIR": str(root / "data"),
        "HF_HOME": str(root / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield root
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# Disk: a test's own tmp_path goes when it passes (pyproject's retention policy); the
# files a module's fixtures made (models, corpora, caches) go when the module is done
# and none of its tests failed. The whole suite then never holds more than one module's
# files, where keeping everything took several GB.
_failed_modules: set[str] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        _failed_modules.add(item.module.__name__)
    return report


@pytest.fixture(autouse=True, scope="module")
def _module_tmp_cleanup(request, tmp_path_factory, _isolated_dirs):
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if request.module.__name__ in _failed_modules:
        return
    for p in set(base.iterdir()) - before:
        shutil.rmtree(p, ignore_errors=True)


# Which CPU kernel paths the ISA-parametrized tests ran: a path this CPU lacks is
# skipped, and the summary says so instead of leaving it to the skip count.
ISA_PATHS = ("avx512-novbmi", "avx512-novnni", "avx2-novnni", "avx512", "avx2", "scalar")  # longest first
_isa_runs: dict[str, dict[str, int]] = {}


def _isa_of(nodeid: str) -> str | None:
    if "[" not in nodeid:
        return None
    params = nodeid[nodeid.index("[") + 1:-1].split("-")
    for name in ISA_PATHS:
        parts = name.split("-")
        if any(params[i:i + len(parts)] == parts for i in range(len(params))):
            return name
    return None


def pytest_runtest_logreport(report):
    isa = _isa_of(report.nodeid)
    if isa is None or not (report.when == "call" or report.skipped):
        return
    outcome = "skipped" if report.skipped else "ran"
    _isa_runs.setdefault(isa, {"ran": 0, "skipped": 0})[outcome] += 1


def pytest_terminal_summary(terminalreporter):
    if not _isa_runs:
        return
    ran = [f"{k} ({v['ran']})" for k, v in sorted(_isa_runs.items()) if v["ran"]]
    skipped = [f"{k} ({v['skipped']})" for k, v in sorted(_isa_runs.items()) if v["skipped"] and not v["ran"]]
    terminalreporter.write_line("CPU kernel paths tested: " + (", ".join(ran) or "none")
                                + ("; not on this CPU, skipped: " + ", ".join(skipped) if skipped else ""))


@pytest.fixture(scope="module")
def emulated_gpu(tmp_path_factory):
    """engine/gpu/cuda_kernels.py with its launches going to the emulation library
    (tests/emulator.py), for one test module."""
    from emulator import build_emulator

    from rapidmoe.engine.gpu import cuda_kernels as gk

    gk.use_emulator(str(build_emulator(tmp_path_factory.mktemp("emulib"))))
    yield gk
    gk.use_emulator(None)
