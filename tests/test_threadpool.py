"""The kernels' thread pool: growing it after work has run, and results that do
not depend on the thread count."""
from __future__ import annotations

import subprocess
import sys

CODE = """
import numpy as np
from rapidmoe.engine import kernels as k
w = np.random.default_rng(0).standard_normal((512, 768)).astype(np.float32)
x = np.random.default_rng(1).standard_normal((3, 768)).astype(np.float32)
outs = []
for n in (1, 2, 1, 3, 2):  # grow and shrink with jobs in between
    k.set_num_threads(n)
    assert k.num_threads() == n
    outs.append(k.ggml_matmul(w, 0, x))
assert all(np.array_equal(outs[0], o) for o in outs)
assert np.allclose(outs[0], x @ w.T, rtol=1e-4, atol=1e-3)
print("ok")
"""


def test_pool_resizes_after_jobs_and_results_do_not_depend_on_threads():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
