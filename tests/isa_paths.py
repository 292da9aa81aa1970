"""Run test code in a process whose CPU kernel path is forced (RAPIDMOE_ISA): the path
is fixed at first use, so a path other than this CPU's best needs its own process."""
from __future__ import annotations

import os
import subprocess
import sys


def run_on_path(module: str, statements: str, isa: str = "scalar", timeout: int = 300) -> None:
    """Import tests/<module>.py as t in a process forced to `isa`, check the path is the one
    running, execute `statements` (Python using t); fail with the child's stderr."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import {module} as t; "
            f"from rapidmoe.engine import kernels; assert kernels.isa_info()['active'] == {isa!r}; "
            f"{statements}; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, RAPIDMOE_ISA=isa),
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
