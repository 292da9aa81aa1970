"""The residual-split pack: what it holds, crash safety and resume, verification,
disk checks, and split execution against full precision."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from rapidmoe.engine import kernels
from rapidmoe.engine.errors import ModelFileError, UserError
from rapidmoe.engine.gguf.reader import GGUFFile
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.pack.convert import convert, pack_path, source_identity, verify_pack


def ident(path):
    with GGUFFile(path) as g:
        return source_identity(g)


from rapidmoe.engine.synth.model import write_synthetic


@pytest.fixture()
def src(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path / "cache"))  # packs are keyed by content: one cache per test
    return write_synthetic(tmp_path / "m.gguf", "qwen3moe", seed=11, dtype="f16", n_layer=3)


def test_pack_holds_source_tensors_and_resplit_parts(src):
    out = convert(src)
    g, s = GGUFFile(out), GGUFFile(src)
    assert g.metadata["rapidmoe.pack.version"] == 2
    for name, t in s.tensors.items():
        if "_exps." in name or name == "rapidmoe.pack.crc32":
            assert name not in g.tensors
            continue
        assert np.array_equal(g.raw(name), s.raw(name))  # non-expert tensors keep their source bytes
    # expert parts are exactly the quantizers' output on the dequantized source
    t = s.tensors["blk.1.ffn_gate_exps.weight"]
    E, rows, n = t.shape
    w = kernels.ggml_dequantize(s.raw(t.name).reshape(E, -1)[3], t.ggml_type, rows * n).reshape(rows, n)
    wq, wr = kernels.resplit_quantize_wq_wr(w)
    assert np.array_equal(g.raw("blk.1.ffn_gate_exps.wq").reshape(E, rows, -1)[3], wq)
    assert np.array_equal(g.raw("blk.1.ffn_gate_exps.wr").reshape(E, rows, -1)[3], wr)
    d = s.tensors["blk.2.ffn_down_exps.weight"]
    E, rows, n = d.shape
    w = kernels.ggml_dequantize(s.raw(d.name).reshape(E, -1)[0], d.ggml_type, rows * n).reshape(rows, n)
    assert np.array_equal(g.raw("blk.2.ffn_down_exps.d4").reshape(E, rows, -1)[0], kernels.resplit_quantize("d4", w))
    # a second call reuses the verified pack
    mtime = out.stat().st_mtime_ns
    assert convert(src) == out and out.stat().st_mtime_ns == mtime


def test_split_execution_approaches_full_precision_as_r_grows(src):
    toks = torch.tensor([1, 50, 300, 2000, 7, 8, 9, 4000, 12, 13])
    full = load_model(src, n_ctx=32)
    ref = torch.log_softmax(full.runner.prefill(toks, 0, full.runner.new_cache(32))[0].double(), -1)
    kls = []
    for r in (0, 2, 4):
        m = load_model(src, n_ctx=32, critical=r)
        assert m.critical == r
        logits, trace = m.runner.prefill(toks, 0, m.runner.new_cache(32))
        out = torch.log_softmax(logits.double(), -1)
        kls.append(float((ref.exp() * (ref - out)).sum(-1).mean()))
        assert trace.critical == (r,) * 3 and trace.phase == "prefill" and trace.n_tokens == len(toks)
    assert kls[0] > kls[1] > kls[2] > 0
    notes = []
    m = load_model(src, n_ctx=32, critical=99, log=notes.append)
    assert m.critical == 4 and any("using 4" in n for n in notes)


def test_interrupted_convert_resumes_and_is_never_taken_for_a_pack(src, tmp_path):
    class Stop(Exception):
        pass

    seen = []

    def crash_in_layer_2(step, done, total):
        seen.append(done)
        if done > 2 * total // 3:
            raise Stop

    with pytest.raises(Stop):
        convert(src, progress=crash_in_layer_2)
    out = pack_path(src)
    assert not out.exists() and out.with_name(out.name + ".partial").exists()
    with pytest.raises(ModelFileError):  # the partial is not a valid GGUF pack
        verify_pack(out.with_name(out.name + ".partial"), ident(src))
    notes = []
    assert convert(src, log=notes.append) == out
    assert any("resuming" in n and "2 of 3" in n for n in notes)
    resumed = out.read_bytes()
    out.unlink()
    assert convert(src) == out and out.read_bytes() == resumed  # same bytes as a clean run
    assert not out.with_name(out.name + ".partial").exists()


def test_tampered_or_stale_pack_is_rebuilt(src):
    out = convert(src)
    data = bytearray(out.read_bytes())
    i = data.find(b"rapidmoe.pack.index_sha256")
    data[i + 60] ^= 0x01  # one hex digit of the stored digest
    out.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="checksum"):
        verify_pack(out, ident(src))
    notes = []
    assert convert(src, log=notes.append) == out
    assert any("rebuilding" in n for n in notes)
    verify_pack(out, ident(src))
    os.utime(src, ns=(1, 1))  # touched, same content: same pack
    assert pack_path(src) == out
    data = bytearray(src.read_bytes())  # one tensor's bytes changed where the identity samples them
    t = GGUFFile(src).tensors["blk.0.attn_q.weight"]
    data[t.offset + t.nbytes // 2] ^= 0x40
    src.write_bytes(bytes(data))
    assert pack_path(src) != out


def test_not_enough_disk_is_refused_before_writing(src, tmp_path, monkeypatch):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(mnt))
        with pytest.raises(UserError, match="not enough disk for the pack: it needs"):
            convert(src)
        assert not any(p.name.endswith((".partial", ".rmpack.gguf")) for p in mnt.rglob("*"))
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_cli_critical_flags(src):
    def cli(*a):
        return subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", *a], capture_output=True, text=True, timeout=300)

    r = cli("-m", str(src), "-p", "hi", "--critical", "2", "--precision", "full")
    assert r.returncode == 2 and "exclude" in r.stderr
    r = cli("-m", str(src), "-p", "hi", "--critical", "x")
    assert r.returncode == 2
    r = cli("-m", str(src), "-p", "hi", "--critical", "40", "--max-tokens", "3", "--temp", "0")
    assert r.returncode == 0 and "using 4" in r.stderr
    r = cli("convert", "-m", str(src))
    assert r.returncode == 0 and r.stdout.strip().endswith(".rmpack.gguf")
    out = pack_path(src)  # one flipped bit a load's sample may miss: `convert` checks every checksum
    t = GGUFFile(out).tensors["blk.2.ffn_gate_exps.wq"]
    data = bytearray(out.read_bytes())
    data[t.offset + 3 * t.nbytes // 8 + 1] ^= 0x04
    out.write_bytes(bytes(data))
    r = cli("convert", "-m", str(src))
    assert r.returncode == 0 and "rebuilding the pack" in r.stderr and "checksum mismatch" in r.stderr
    verify_pack(out, ident(src), sample=None).close()


def _leftovers(out):
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name and not p.name.endswith(".lock"))


def test_a_copy_of_the_source_uses_the_same_pack_and_the_source_is_opened_once(src, tmp_path, monkeypatch):
    out = convert(src)
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    copy.write_bytes(src.read_bytes())
    notes = []
    assert convert(copy, log=notes.append) == out and notes == []  # found by content: nothing converted
    other = write_synthetic(tmp_path / "m2.gguf", "qwen3moe", seed=12, dtype="f16", n_layer=3)
    assert pack_path(other) != out  # same shapes, other weights: another pack

    opened = []
    init = GGUFFile.__init__

    def counting(self, path, *a, **k):
        opened.append(os.path.abspath(path))
        init(self, path, *a, **k)

    monkeypatch.setattr(GGUFFile, "__init__", counting)
    load_model(copy, n_ctx=16, critical=2)
    assert opened.count(str(copy)) == 1 and opened.count(str(out)) == 1  # the source once, the pack once


def test_a_pack_damaged_on_disk_is_caught_at_load_and_rebuilt(src):
    from rapidmoe.engine import paths

    before = paths._points
    out = convert(src)
    n_steps = paths._points - before
    clean = out.read_bytes()
    with open(out, "r+b") as f:  # its last 75% zeroed, size and header intact
        f.seek(len(clean) // 4)
        f.write(b"\0" * (len(clean) - len(clean) // 4))
    with pytest.raises(ModelFileError, match="checksum mismatch"):
        verify_pack(out, ident(src)).close()
    # a rebuild killed half-way leaves no pack, only what the next run resumes
    child = "import sys; from rapidmoe.engine.pack.convert import convert; convert(sys.argv[1])"
    r = subprocess.run([sys.executable, "-c", child, str(src)], capture_output=True, timeout=300,
                       env=dict(os.environ, RAPIDMOE_FAULT_KILL_AT=str(1 + 2 * n_steps // 3)))
    assert r.returncode == -9 and not out.exists() and out.with_name(out.name + ".partial").exists()
    notes = []
    m = load_model(src, n_ctx=16, critical=2, log=notes.append)
    assert any("resuming" in n for n in notes)
    assert out.read_bytes() == clean and m.weights.gguf.path == out
    # one flipped bit inside one expert's slice may escape a load's sample: `convert` checks every unit
    t = GGUFFile(out).tensors["blk.1.ffn_up_exps.wr"]
    data = bytearray(clean)
    data[t.offset + 5 * t.nbytes // 8 + 3] ^= 0x10
    out.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="checksum mismatch"):
        verify_pack(out, ident(src), sample=None).close()
    notes = []
    assert convert(src, log=notes.append, full_check=True) == out and out.read_bytes() == clean
    assert any("rebuilding the pack" in n for n in notes) and _leftovers(out) == []


def test_kill_9_anywhere_in_convert_then_the_next_run_works(src, tmp_path, monkeypatch):
    """SIGKILL at seeded random write points of a conversion (and at every step of
    its commit), in a subprocess: no pack is ever there unless whole, and the next
    run gives the same bytes as an uninterrupted one."""
    import random

    from rapidmoe.engine import paths

    before = paths._points
    ref = convert(src)
    clean, n_steps = ref.read_bytes(), paths._points - before
    ref.unlink()
    # 5 seeded random points, and the commit: checksum table, magic, rename, record removal, directory fsync
    points = sorted(set(random.Random(20).sample(range(1, n_steps - 8), 5)) | {n_steps - k for k in (6, 4, 2, 1, 0)})
    child = "import sys; from rapidmoe.engine.pack.convert import convert; convert(sys.argv[1])"
    for i, k in enumerate(points):
        cache = tmp_path / f"kill{k}"
        env = dict(os.environ, RAPIDMOE_CACHE_DIR=str(cache), RAPIDMOE_FAULT_KILL_AT=str(k))
        cmd = ["-m", "rapidmoe.app.cli", "convert", "-m"] if i == 2 else ["-c", child]  # once through the CLI
        r = subprocess.run([sys.executable, *cmd, str(src)], env=env, capture_output=True, timeout=300)
        assert r.returncode == -9, (k, r.stderr[-400:])
        monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(cache))
        out = pack_path(src)
        if out.exists():  # only after the rename: then it is whole
            verify_pack(out, ident(src), sample=None).close()
        if i in (1, 3):  # and again while resuming
            env["RAPIDMOE_FAULT_KILL_AT"] = str(max(1, n_steps // 3))
            r = subprocess.run([sys.executable, "-c", child, str(src)], env=env, capture_output=True, timeout=300)
            assert r.returncode in (0, -9), (k, r.stderr[-400:])
        assert convert(src) == out and out.read_bytes() == clean, k
        assert _leftovers(out) == [], k


def test_list_names_the_model_a_pack_serves_when_its_first_source_is_gone(src, capsys):
    import json

    from rapidmoe.app.cli import main
    from rapidmoe.engine.hub.demo import demo_cache_path

    out = convert(src)
    demo = demo_cache_path()  # the same bytes as the demo of this (per-test) cache dir
    demo.parent.mkdir(parents=True)
    demo.write_bytes(src.read_bytes())
    src.unlink()
    assert main(["list", "--json"]) == 0
    rows = {r["name"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows[out.name]["note"] == "from demo" and not rows[out.name]["stale"]


CONVERT_RSS_CHILD = r"""
import json, sys
from rapidmoe.engine.pack.convert import convert

src, peak = sys.argv[1], [0]
def resident():  # this process's resident pages of the source file's mapping
    kb, cur = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            p = line.split()
            if not p[0].endswith(":"):
                cur = p[5] if len(p) > 5 else None
            elif p[0] == "Rss:" and cur == src:
                kb += int(p[1])
    return kb * 1024
def progress(step, done, total):
    peak[0] = max(peak[0], resident())
convert(src, progress=progress)
print(json.dumps({"peak_source_resident": peak[0]}))
"""


def test_conversion_holds_one_source_tensor_at_a_time(tmp_path, monkeypatch):
    """The converter reads the source through its mapping; each tensor's pages leave
    the process's resident set once it is converted, so converting a model whose
    experts do not fit in DRAM twice over never holds the whole source (before, the
    source's every page stayed resident until the pack was open)."""
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_synthetic(tmp_path / "m.gguf", "qwen3moe", seed=5, dtype="f16", n_layer=6, n_embd=256,
                           n_expert=16, n_ff_exp=256)
    with GGUFFile(path) as g:
        largest = max(t.nbytes for t in g.tensors.values() if "_exps." in t.name)
        experts = sum(t.nbytes for t in g.tensors.values() if "_exps." in t.name)
    r = subprocess.run([sys.executable, "-c", CONVERT_RSS_CHILD, str(path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    peak = json.loads(r.stdout.strip().splitlines()[-1])["peak_source_resident"]
    print(f"source resident at most {peak / 2**20:.1f} MiB; an expert tensor {largest / 2**20:.1f} MiB, "
          f"all experts {experts / 2**20:.1f} MiB, the file {path.stat().st_size / 2**20:.1f} MiB")
    assert peak > 0  # the probe sees the mapping
    # the header (tokenizer arrays) and the tensor being read, never the experts read before it
    assert peak < experts / 4, (peak, experts)
