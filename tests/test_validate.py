"""Model-file validation (engine/gguf/validate.py) on real files: shapes llama.cpp
accepts load and compute the same logits; every malformed tensor, key or
tokenizer array is one ModelFileError naming the file and what it has and
expected, on the full-precision path and on the split path (before any
conversion); what sizes memory is checked before anything is sized from it."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from fuzz_corpus import ARR, I32, STR, U32, U64, KV, encode, synth_doc
from fuzz_run import run_cli
from rapidmoe.app.args import error_line
from rapidmoe.engine.errors import ModelFileError, UserError
from rapidmoe.engine.gguf.reader import GGUFFile
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.plan.planner import PlanRequest


@pytest.fixture(scope="module")
def docs():
    return {name: synth_doc(name) for name in ("qwen2moe", "qwen3moe", "ds2_v3", "ds2_lite")}


def write(tmp_path, doc, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(encode(doc))
    return p


def edit_tensors(doc, fn):
    """doc with fn(tensor) -> tensor applied to every tensor."""
    d = doc.copy("edited")
    d.tensors = [fn(t) for t in d.tensors]
    return d


def set_kv(doc, key, vtype, value, sub=None):
    d = doc.copy("edited")
    kv = KV(key, vtype, value, sub)
    idx = [i for i, x in enumerate(d.kvs) if x.key == key]
    if idx:
        d.kvs[idx[0]] = kv
    else:
        d.kvs.append(kv)
    return d


def logits(path, critical=None):
    m = load_model(path, n_ctx=32, critical=critical)
    ids = m.tokenizer.encode("hello world, this is a test")
    out, _ = m.runner.prefill(ids, 0, m.runner.new_cache(32))
    return out


def refused(path, *fragments, critical=None):
    with pytest.raises(ModelFileError) as e:
        load_model(path, n_ctx=32, critical=critical)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    for f in fragments:
        assert f in msg, msg
    return msg


# ---- shapes llama.cpp accepts ----

def test_shared_expert_gate_stored_as_a_column_loads_with_the_same_logits(tmp_path, docs):
    """qwen2moe converters write ffn_gate_inp_shexp as {n_embd, 1}; llama.cpp loads it."""
    doc = docs["qwen2moe"]
    column = edit_tensors(doc, lambda t: dataclasses.replace(t, ne=(t.ne[0], 1))
                          if t.name.endswith("ffn_gate_inp_shexp.weight") else t)
    a, b = write(tmp_path, doc, "vector.gguf"), write(tmp_path, column, "column.gguf")
    assert GGUFFile(b).tensors["blk.0.ffn_gate_inp_shexp.weight"].ne == (64, 1)
    torch.testing.assert_close(logits(b), logits(a), rtol=0, atol=0)
    torch.testing.assert_close(logits(b, critical=1), logits(a, critical=1), rtol=0, atol=0)


def test_trailing_dimensions_of_one_load_everywhere(tmp_path, docs):
    """Any tensor with extra trailing 1s (ggml keeps every tensor 4-D): experts
    (through the pack converter too), matrices, norms."""
    doc = docs["qwen3moe"]
    padded = edit_tensors(doc, lambda t: dataclasses.replace(t, ne=t.ne + (1,) * (4 - len(t.ne))))
    a, b = write(tmp_path, doc, "plain.gguf"), write(tmp_path, padded, "padded.gguf")
    assert GGUFFile(b).tensors["blk.0.ffn_up_exps.weight"].ne == (64, 32, 8, 1)
    torch.testing.assert_close(logits(b), logits(a), rtol=0, atol=0)
    torch.testing.assert_close(logits(b, critical=2), logits(a, critical=2), rtol=0, atol=0)
    assert run_cli(["plan", "-m", str(b)]) == "ok"  # its conversion-time estimate reads the expert stacks too


def test_deepseek2_gating_func_0_is_softmax_as_in_llama_cpp(tmp_path, docs):
    """Old DeepSeek-V2 files carry expert_gating_func = 0 (none); llama.cpp runs them with softmax."""
    doc = docs["ds2_lite"]
    zero = set_kv(doc, "deepseek2.expert_gating_func", U32, 0)
    torch.testing.assert_close(logits(write(tmp_path, zero, "zero.gguf")), logits(write(tmp_path, doc, "none.gguf")),
                               rtol=0, atol=0)


# ---- tensors ----

def _drop(name):
    return lambda doc: dataclasses.replace(doc.copy("x"), tensors=[t for t in doc.tensors if t.name != name])


def _reshape(name, ne):
    return lambda doc: edit_tensors(doc, lambda t: dataclasses.replace(t, ne=ne) if t.name == name else t)


def _rename(old, new):
    return lambda doc: edit_tensors(doc, lambda t: dataclasses.replace(t, name=new) if t.name == old else t)


TENSOR_CASES = {
    "missing expert": (_drop("blk.0.ffn_up_exps.weight"), ["missing tensor blk.0.ffn_up_exps.weight",
                                                            "expected shape [64, 32, 8]"]),
    # the same bytes, transposed: ran with a different answer on the split path before
    "transposed expert": (_reshape("blk.1.ffn_gate_exps.weight", (32, 64, 8)),
                          ["tensor blk.1.ffn_gate_exps.weight has shape [32, 64, 8], expected [64, 32, 8]"]),
    "fewer dimensions": (_reshape("blk.0.ffn_down_exps.weight", (32, 512)),
                         ["blk.0.ffn_down_exps.weight has shape [32, 512], expected [32, 64, 8]"]),
    "fused gate_up": (_rename("blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate_up_exps.weight"),
                      ["missing tensor blk.0.ffn_gate_exps.weight", "fused blk.0.ffn_gate_up_exps.weight"]),
    "router of another width": (_reshape("blk.1.ffn_gate_inp.weight", (32, 16)),
                                ["blk.1.ffn_gate_inp.weight has shape [32, 16], expected [64, 8]"]),
    "norm missing": (_drop("blk.1.attn_k_norm.weight"), ["missing tensor blk.1.attn_k_norm.weight"]),
    "unsupported type": (lambda d: edit_tensors(d, lambda t: dataclasses.replace(t, ggml_type=24, data=t.data[:len(
        t.data) // 4]) if t.name == "blk.0.attn_q.weight" else t), ["blk.0.attn_q.weight has unsupported type I8"]),
}


@pytest.mark.parametrize("critical", [None, 1], ids=["full", "split"])
@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_bad_tensors_are_one_line_on_both_paths(tmp_path, docs, case, critical):
    make, fragments = TENSOR_CASES[case]
    refused(write(tmp_path, make(docs["qwen3moe"])), *fragments, critical=critical)


def test_deepseek2_mla_tensors_are_checked(tmp_path, docs):
    doc = _reshape("blk.0.attn_k_b.weight", (32, 16, 4))(docs["ds2_v3"])
    refused(write(tmp_path, doc), "blk.0.attn_k_b.weight has shape [32, 16, 4], expected [16, 32, 4]")


# ---- the header: as strict as llama.cpp's ----

def test_duplicate_key_is_refused(tmp_path, docs):
    doc = docs["qwen3moe"].copy("dup")
    doc.kvs.append(KV("qwen3moe.block_count", U32, 1))
    with pytest.raises(ModelFileError, match="duplicate metadata key qwen3moe.block_count"):
        GGUFFile(write(tmp_path, doc))


@pytest.mark.parametrize("offset", [0, 1, 1 << 20])
def test_tensor_offset_off_the_running_sum_is_refused(tmp_path, docs, offset):
    doc = docs["qwen3moe"].copy("off")
    doc.tensors[3] = dataclasses.replace(doc.tensors[3], offset=offset)
    with pytest.raises(ModelFileError, match=f"tensor {doc.tensors[3].name} has data offset {offset}, expected"):
        GGUFFile(write(tmp_path, doc))


# ---- keys ----

KEY_CASES = {
    "int key as text": ("qwen3moe.expert_count", STR, "synthetic-7", None, "qwen3moe.expert_count is 'synthetic-7'"),
    "int key as float": ("qwen3moe.expert_used_count", 6, 2.5, None, "expert_used_count is 2.5, expected an integer"),
    "eps not finite": ("qwen3moe.attention.layer_norm_rms_epsilon", 6, float("nan"), None, "is nan, expected a number"),
    "2^30 experts": ("qwen3moe.expert_count", U32, 1 << 30, None, "expert_count is 1073741824, expected 0..4096"),
    "huge head dim": ("qwen3moe.attention.key_length", U32, 1 << 20, None, "key_length is 1048576"),
    "huge context": ("qwen3moe.context_length", U64, 1 << 40, None, "context_length is 1099511627776"),
    "per-layer widths differ": ("qwen3moe.expert_feed_forward_length", ARR, [32, 64], U32, "per-layer values"),
    "tokens as integers": ("tokenizer.ggml.tokens", ARR, list(range(640)), I32,
                           "tokenizer.ggml.tokens: is an array of int32, expected an array of strings"),
    "tokens as one string": ("tokenizer.ggml.tokens", STR, "abc", None, "tokenizer.ggml.tokens: is a string"),
    "fewer tokens than rows": ("tokenizer.ggml.tokens", ARR, [f"t{i}" for i in range(600)], STR,
                               "token_embd.weight has shape [64, 640], expected [64, 600] (600 tokens in the vocabulary)"),
    "duplicate tokens": ("tokenizer.ggml.tokens", ARR, ["a", "a"] + [f"t{i}" for i in range(638)], STR,
                         "holds 'a' more than once"),
    "token types as text": ("tokenizer.ggml.token_type", ARR, ["1"] * 640, STR, "token_type: is an array of strings"),
    "scores too short": ("tokenizer.ggml.scores", ARR, [0.0] * 10, 6, "scores: has 10 entries, expected 640"),
    "merges as one int": ("tokenizer.ggml.merges", I32, 5, None, "merges: is an integer, expected an array"),
    "bos id as text": ("tokenizer.ggml.bos_token_id", STR, "1", None, "bos_token_id: is a string"),
    "add_bos as text": ("tokenizer.ggml.add_bos_token", STR, "yes", None, "add_bos_token: is a string, expected a bool"),
    "unknown model": ("tokenizer.ggml.model", STR, "bogus", None, "tokenizer.ggml.model: is 'bogus'"),
    "unknown pre-tokenizer": ("tokenizer.ggml.pre", STR, "weird", None, "unsupported pre-tokenizer type 'weird'"),
    "template not text": ("tokenizer.chat_template", I32, 7, None, "tokenizer.chat_template: is an integer"),
}


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_bad_keys_are_one_line(tmp_path, docs, case):
    key, vtype, value, sub, fragment = KEY_CASES[case]
    refused(write(tmp_path, set_kv(docs["qwen3moe"], key, vtype, value, sub)), fragment)


def test_llama_cpp_token_types_it_does_not_know_still_load(tmp_path, docs):
    """llama.cpp gives an unknown token type no attributes; it does not refuse the file."""
    path = write(tmp_path, set_kv(docs["qwen3moe"], "tokenizer.ggml.token_type", ARR, [1] * 639 + [99], I32))
    assert load_model(path, n_ctx=32).tokenizer.n_vocab == 640


def test_byte_tokens_whose_text_is_not_hex_render_as_llama_cpp_reads_them(tmp_path, docs):
    """Every token typed BYTE (6): llama.cpp reads "<0xNN>" with strtol and never fails;
    this was `ValueError: invalid literal for int() with base 16` on the first reply."""
    from rapidmoe.engine.text.tokenizer import _byte_value

    assert [_byte_value(t) for t in ("<0x0A>", "<0xfF>", "<0x1>", "<0xZZ>", "ab", "")] == [10, 255, 1, 0, 0, 0]
    path = write(tmp_path, set_kv(docs["qwen3moe"], "tokenizer.ggml.token_type", ARR, [6] * 640, I32))
    for argv in (["-m", str(path), "-p", "hi", "-n", "4", "--temp", "0", "--no-history"],
                 ["eval", "-m", str(path), "--prompt", "hello there"]):
        assert run_cli(argv) == "ok"


# ---- memory: nothing sized from metadata before its check ----

def test_plan_of_2_30_experts_is_one_line_and_small(tmp_path, docs):
    """It used to build n_layer x n_expert tuples until past 6 GB."""
    path = write(tmp_path, set_kv(docs["qwen3moe"], "qwen3moe.expert_count", U32, 1 << 30))
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", "import resource,sys; resource.setrlimit(resource.RLIMIT_AS,"
                        "(3<<30,3<<30)); from rapidmoe.app.cli import main; sys.exit(main(sys.argv[1:]))",
                        "plan", "-m", str(path)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "expert_count is 1073741824" in lines[0], r.stderr


def test_full_precision_goes_through_the_memory_check(tmp_path, docs):
    """--precision full used to allocate the KV cache of any context until killed."""
    path = write(tmp_path, set_kv(docs["qwen3moe"], "qwen3moe.context_length", U32, 1 << 24))
    with pytest.raises(UserError, match="full precision at a context of 16777216 tokens needs") as e:
        load_model(path, n_ctx=1 << 24, critical=None, placement=PlanRequest(dram_budget=1 << 30))
    # the engine says it in its own terms; the command line names the flag
    assert "use a smaller context" in str(e.value) and "--" not in str(e.value)
    assert error_line(e.value).endswith("use a smaller context (--ctx)")
    # within the budget the same file loads
    assert load_model(path, n_ctx=32, critical=None, placement=PlanRequest(dram_budget=1 << 30)).n_ctx == 32
