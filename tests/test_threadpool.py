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


STRESS = """
import threading
import numpy as np
from rapidmoe.engine import kernels as k
k.set_num_threads(3)
rng = np.random.default_rng(0)
# k = 4096: jobs of 70 rows and more are split over the threads (min_blocks in ggml_gemv.cpp)
ws = [rng.standard_normal((r, 4096)).astype(np.float32) for r in (1, 70, 130, 400, 1000)]
x = rng.standard_normal((1, 4096)).astype(np.float32)
ref = [k.ggml_matmul(w, 0, x) for w in ws]
bad = []
def hammer(seed):
    order = np.random.default_rng(seed).integers(0, len(ws), 600)
    for i in order:  # many tiny jobs back to back: workers spin, sleep and wake between them
        if not np.array_equal(k.ggml_matmul(ws[i], 0, x), ref[i]):
            bad.append(int(i))
ts = [threading.Thread(target=hammer, args=(s,)) for s in (1, 2)]
[t.start() for t in ts]; [t.join() for t in ts]
assert not bad, bad[:5]
print("ok")
"""


def test_many_small_jobs_from_two_python_threads():
    for spin in ("0", "300"):  # sleeping workers and polling workers
        r = subprocess.run([sys.executable, "-c", STRESS], capture_output=True, text=True, timeout=300,
                           env={**__import__("os").environ, "RAPIDMOE_SPIN_US": spin})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "ok"
