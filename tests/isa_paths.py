"""Run test code in a process whose CPU kernel path is forced (RAPIDMOE_ISA): the path
is fixed at first use, so a path other than this CPU's best needs its own process."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

ORDER = ["scalar", "avx2", "avx512"]


@functools.lru_cache(maxsize=1)
def cpu_isa() -> dict:
    """kernels.isa_info() of a process without RAPIDMOE_ISA: what this CPU can run. The
    test process may itself run on a forced path, which hides the best path and VNNI."""
    env = {k: v for k, v in os.environ.items() if k != "RAPIDMOE_ISA"}
    code = "import json; from rapidmoe.engine import kernels; print(json.dumps(kernels.isa_info()))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def runnable_paths() -> list[str]:
    """The kernel paths this CPU can run, scalar first."""
    best = cpu_isa()["active"]
    return ORDER[: ORDER.index(best) + 1] if best in ORDER else ["scalar"]


def run_on_path(module: str, statements: str, isa: str = "scalar", timeout: int = 300) -> None:
    """Import tests/<module>.py as t in a process forced to `isa`, check the path is the one
    running, execute `statements` (Python using t); fail with the child's stderr."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import {module} as t; "
            f"from rapidmoe.engine import kernels; assert kernels.isa_info()['active'] == {isa!r}; "
            f"{statements}; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, RAPIDMOE_ISA=isa),
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
