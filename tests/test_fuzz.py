"""Fuzzing model files: a seeded corpus of damaged files (tests/fuzz_corpus.py,
every architecture's synthetic model and the demo) through the real CLI entry
point (reader, validation, plan, conversion, loader, generation). Each run must
end in a normal run or in one error line with exit status 2: no traceback, no
signal, no hang, no memory blowup. The bulk runs in one process under an
address-space limit; a handful go through `rapidmoe-chat` as a user runs it.

Reproduce a failure: python -m fuzz_run FILE (from tests/), or write the corpus
with fuzz_corpus.write_corpus(dir, base_docs(), 300, seed=0)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuzz_corpus import HEADER_MUTATIONS, base_docs, file_doc, write_corpus

SEED = 0
N_SYNTH = 300  # mutated synthetic files, in one process (about 35 s on 2 cores)
N_DEMO = 6  # mutated demo files (each 100 MB): full precision and plan only
AS_GIB = 6  # the address-space limit of the batch: a blowup ends as MemoryError, not a dead machine
PER_FILE_S = 30  # a file that takes longer is a hang
HERE = Path(__file__).parent


def _env() -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="2")  # parsing is under test, not placement
    env.pop("RAPIDMOE_STANDIN_GPU", None)
    return env


def run_batch(files: list[tuple[Path, str]], commands: str, timeout: float) -> dict[str, dict]:
    """Run each file through `commands` in one process; -> {file: outcomes}."""
    r = subprocess.run([sys.executable, "-m", "fuzz_run", "--as-gib", str(AS_GIB), "--commands", commands,
                        *[str(p) for p, _ in files]], cwd=HERE, capture_output=True, text=True, env=_env(),
                       timeout=timeout)
    rows = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["file"]] = row
    labels = dict((str(p), lab) for p, lab in files)
    missing = [f for f in labels if f not in rows]
    assert r.returncode == 0 and not missing, (
        f"the batch died (exit {r.returncode}) at {missing[:1]} ({labels.get(missing[0]) if missing else ''}): "
        f"{r.stderr[-2000:]}")
    return rows


def failures(rows: dict[str, dict], labels: dict[str, str], commands: str) -> list[str]:
    bad = []
    for f, row in rows.items():
        for c in commands.split(","):
            out = row[c]
            if not (out == "ok" or out.startswith("error: ")):
                bad.append(f"{Path(f).name} [{labels[f]}] {c}: {out[:400]}")
        if row["seconds"] > PER_FILE_S:
            bad.append(f"{Path(f).name} [{labels[f]}]: {row['seconds']} s")
    return bad


@pytest.fixture(scope="module")
def synth_corpus(tmp_path_factory) -> list[tuple[Path, str]]:
    return write_corpus(tmp_path_factory.mktemp("fuzz"), base_docs(), N_SYNTH, seed=SEED)


def test_corpus_is_reproducible(tmp_path, synth_corpus):
    again = write_corpus(tmp_path, base_docs(), 20, seed=SEED)
    for (a, la), (b, lb) in zip(synth_corpus[:20], again):
        assert la == lb and a.read_bytes() == b.read_bytes()


def test_mutated_synthetic_files_end_cleanly(synth_corpus):
    commands = "chat,full,plan,eval"
    t0 = time.monotonic()
    rows = run_batch(synth_corpus, commands, timeout=600)
    labels = {str(p): lab for p, lab in synth_corpus}
    bad = failures(rows, labels, commands)
    assert not bad, f"{len(bad)} of {len(rows)} files did not end cleanly:\n" + "\n".join(bad[:20])
    outcomes = [row["chat"] for row in rows.values()]
    n_ok = sum(o == "ok" for o in outcomes)
    # the corpus must exercise both sides: files that still run, and errors of many kinds
    assert 0.05 * N_SYNTH < n_ok < 0.6 * N_SYNTH, n_ok
    kinds = {o.split(": ", 2)[-1].split(" ")[0] for o in outcomes if o != "ok"}
    assert len(kinds) > 10, kinds
    print(f"\n{len(rows)} files x {commands}: {n_ok} ran, {len(rows) - n_ok} refused in one line, "
          f"{time.monotonic() - t0:.0f} s")


def test_mutated_demo_files_end_cleanly(tmp_path):
    from rapidmoe.engine.hub.demo import demo_model_path

    demo = file_doc(demo_model_path(), "demo")
    files = write_corpus(tmp_path, [demo], N_DEMO, seed=SEED, mutations=HEADER_MUTATIONS, prefix="demo")
    rows = run_batch(files, "full,plan", timeout=300)
    bad = failures(rows, {str(p): lab for p, lab in files}, "full,plan")
    assert not bad, "\n".join(bad)


def test_a_few_through_the_installed_command(synth_corpus):
    """`rapidmoe-chat -m FILE -p hi`, `plan` and `eval` as a user runs them: exit 0, or
    exit 2 with exactly one line on stderr."""
    (a, la), (b, lb), (c, lc) = synth_corpus[:3]
    runs = [(la, ["-m", str(a), "-p", "hi", "-n", "2", "--no-history", "--ctx", "64"]),
            (lb, ["plan", "-m", str(b)]), (lc, ["eval", "-m", str(c), "--prompt", "hello there"])]
    for label, argv in runs:
        r = subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", *argv], capture_output=True, text=True,
                           env=_env(), timeout=120)
        assert r.returncode in (0, 2), (label, r.returncode, r.stderr[-1500:])
        assert "Traceback" not in r.stderr, (label, r.stderr[-1500:])
        if r.returncode == 2:
            errors = [ln for ln in r.stderr.splitlines() if ln.startswith("rapidmoe-chat: error:")]
            assert len(errors) == 1, (label, r.stderr)


def test_reader_under_hypothesis(tmp_path):
    """Structured mutations chosen by hypothesis for a bounded time: the reader and
    the checks raise ModelFileError or accept, nothing else."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings, strategies as st

    from fuzz_corpus import MUTATIONS, encode, synth_doc
    from rapidmoe.engine.errors import ModelFileError
    from rapidmoe.engine.gguf.reader import GGUFFile
    from rapidmoe.engine.gguf.validate import check_model
    import random

    base = synth_doc("qwen2moe")
    path = tmp_path / "h.gguf"

    @settings(max_examples=100, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.integers(0, len(MUTATIONS) - 1), st.integers(0, 2**32)), min_size=1, max_size=3))
    def check(steps):
        doc = base
        for which, seed in steps:
            d = MUTATIONS[which](random.Random(seed), doc)
            doc = d if d is not None else doc
        path.write_bytes(encode(doc))
        try:
            with GGUFFile(path) as g:
                check_model(g)
        except ModelFileError as e:
            assert "\n" not in str(e)

    check()
