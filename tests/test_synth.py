"""Synthetic MoE GGUFs: a numpy-independent random stream, byte-identical files
from a seed, and tensor names/shapes/keys exactly as llama.cpp's loader wants
them (the expected tables below are transcribed from llama.cpp's load_tensors
and load_hparams for each architecture, not from the writer)."""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from rapidmoe.engine.gguf.reader import GGUFFile
from rapidmoe.engine.synth.rng import Stream
from rapidmoe.engine.synth.model import FIXTURES, plan_synthetic, write_synthetic
from rapidmoe.engine.synth.tokenizer import tokenizer_kvs


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- random stream

def test_raw_stream_is_splitmix64():
    # The published SplitMix64 sequence for seed 0.
    assert [int(x) for x in Stream(0).raw(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4,
                                                  0x06C45D188009454F]


def test_normals_are_box_muller_of_the_uniforms():
    s = Stream(7, "x")
    u = s.uniform(2000)
    want = [math.sqrt(-2 * math.log(1 - a)) * math.cos(2 * math.pi * b) for a, b in zip(u[0::2], u[1::2])]
    np.testing.assert_allclose(s.normal(1000), want, rtol=0, atol=1e-13)


def test_slices_of_a_stream_are_independent_of_chunking():
    s = Stream(3, "w")
    full = s.normal(100_000)
    assert np.array_equal(full[33_333:77_777], s.normal(44_444, start=33_333))
    assert not np.array_equal(full[:100], Stream(3, "v").normal(100))


def test_distributions():
    z = Stream(1, "moments").normal(1_000_000)
    assert abs(z.mean()) < 0.005 and abs(z.std() - 1) < 0.005
    assert abs((z ** 4).mean() - 3) < 0.05
    t = Stream(2, "t").student_t(1_000_000, 5)
    assert abs(t.std() - 1) < 0.03
    assert (t ** 4).mean() > 5  # heavy tails: a Gaussian has 3


def test_stream_bits_are_pinned():
    # The committed llama.cpp reference files depend on these exact values.
    x = Stream(12345, "pin").normal(4096)
    assert hashlib.sha256(x.tobytes()).hexdigest() == \
        "4785e4ec4b9af3acf7efbf5b3d4c467bcd98aebe4e193081dd0e1fe43a44e6ba"


# ---------------------------------------------------------------- determinism

QWEN3MOE_SEED0_SHA256 = "378e9ebedd54d10e262b661660296dc563c72a0a067cbb648d43e9c85892ca15"


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("fixtures")
    return {p: write_synthetic(d / f"{p}.gguf", p, seed=0) for p in FIXTURES}


@pytest.fixture(scope="module")
def written(paths):
    return {p: GGUFFile(path) for p, path in paths.items()}


def values(f: GGUFFile, name: str) -> np.ndarray:
    """A tensor dequantized to float64, numpy shape."""
    t = f.tensors[name]
    q = GGMLQuantizationType(t.ggml_type)
    return dequantize(f.raw(name), q).astype(np.float64).reshape(t.shape)


@pytest.mark.parametrize("preset", sorted(FIXTURES))
def test_same_seed_same_bytes(tmp_path, paths, preset):
    again = write_synthetic(tmp_path / "again.gguf", preset, seed=0)
    assert sha256(again) == sha256(paths[preset])
    assert not list(tmp_path.glob(".*tmp"))


def test_other_seed_other_bytes(tmp_path, paths):
    assert sha256(write_synthetic(tmp_path / "s1.gguf", "qwen3moe", seed=1)) != sha256(paths["qwen3moe"])


def test_chunked_generation_gives_the_same_bytes(tmp_path, paths, monkeypatch):
    # Big tensors (the bench preset's experts) are generated a chunk at a time.
    import rapidmoe.engine.synth.model as synth

    monkeypatch.setattr(synth, "_CHUNK", 1000)
    assert sha256(write_synthetic(tmp_path / "c.gguf", "qwen2moe", seed=0)) == sha256(paths["qwen2moe"])


def test_fixture_bytes_are_pinned(paths):
    # Guards the committed llama.cpp references made from this fixture.
    assert sha256(paths["qwen3moe"]) == QWEN3MOE_SEED0_SHA256


# ---------------------------------------------------------------- layout

def expected_layout(arch, *, E, L, Hq, Hkv, Dh, F, X, K, V, Fsh=0):
    """(tensor ne by name, hparams) per llama.cpp's loader."""
    q, kv = Hq * Dh, Hkv * Dh
    t = {"token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V)}
    for i in range(L):
        p = f"blk.{i}."
        t.update({p + "attn_norm.weight": (E,), p + "attn_q.weight": (E, q), p + "attn_k.weight": (E, kv),
                  p + "attn_v.weight": (E, kv), p + "attn_output.weight": (q, E), p + "ffn_norm.weight": (E,),
                  p + "ffn_gate_inp.weight": (E, X), p + "ffn_gate_exps.weight": (E, F, X),
                  p + "ffn_up_exps.weight": (E, F, X), p + "ffn_down_exps.weight": (F, E, X)})
        if arch == "qwen3moe":
            t.update({p + "attn_q_norm.weight": (Dh,), p + "attn_k_norm.weight": (Dh,)})
        if arch == "olmoe":
            t.update({p + "attn_q_norm.weight": (E,), p + "attn_k_norm.weight": (E,)})
        if arch == "qwen2moe":
            t.update({p + "attn_q.bias": (E,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,),
                      p + "ffn_gate_inp_shexp.weight": (E,), p + "ffn_gate_shexp.weight": (E, Fsh),
                      p + "ffn_up_shexp.weight": (E, Fsh), p + "ffn_down_shexp.weight": (Fsh, E)})
    h = {"embedding_length": E, "block_count": L, "attention.head_count": Hq,
         "attention.head_count_kv": Hkv, "expert_count": X, "expert_used_count": K,
         "context_length": 256}
    if arch in ("llama", "olmoe"):
        h["feed_forward_length"] = F  # experts sized by it
    else:
        h["expert_feed_forward_length"] = F
    if arch == "qwen2moe":
        h["expert_shared_feed_forward_length"] = Fsh
    if Dh * Hq != E:
        h["attention.key_length"] = Dh
        h["attention.value_length"] = Dh
    return t, {f"{arch}.{k}": v for k, v in h.items()}


EXPECTED = {
    "qwen3moe": expected_layout("qwen3moe", E=64, L=2, Hq=4, Hkv=2, Dh=32, F=32, X=8, K=4, V=49152),
    "qwen2moe": expected_layout("qwen2moe", E=64, L=2, Hq=4, Hkv=2, Dh=16, F=32, X=4, K=2, V=49152, Fsh=64),
    "llama_moe": expected_layout("llama", E=64, L=2, Hq=4, Hkv=2, Dh=16, F=64, X=8, K=2, V=49152),
    "olmoe": expected_layout("olmoe", E=64, L=2, Hq=4, Hkv=4, Dh=16, F=32, X=8, K=2, V=49152),
}


@pytest.mark.parametrize("preset", sorted(FIXTURES))
def test_layout_matches_llama_cpp(written, preset):
    f = written[preset]
    tensors, hparams = EXPECTED[preset]
    assert {name: t.ne for name, t in f.tensors.items()} == tensors
    assert f.metadata["general.architecture"] == ("llama" if preset == "llama_moe" else preset)
    for key, val in hparams.items():
        assert f.metadata[key] == val, key
    assert {t.type_name for t in f.tensors.values()} == {"F32"}  # the fixtures' default


def test_gguf_py_reads_the_same(paths, written):
    # An independent reader (gguf-py's) sees the same tensors and keys.
    r = GGUFReader(str(paths["qwen2moe"]))
    f = written["qwen2moe"]
    assert [(t.name, tuple(int(x) for x in t.shape)) for t in r.tensors] == \
        [(name, t.ne) for name, t in f.tensors.items()]
    assert [k for k in r.fields if not k.startswith("GGUF.")] == list(f.metadata)
    for t in r.tensors:
        assert np.array_equal(np.asarray(t.data).reshape(-1), values(f, t.name).reshape(-1)), t.name


@pytest.mark.parametrize("preset", sorted(FIXTURES))
def test_real_tokenizer_metadata(written, preset):
    meta = written[preset].metadata
    for key, val, _, _ in tokenizer_kvs("smollm2"):
        assert list(meta[key]) == list(val) if isinstance(val, list) else meta[key] == val, key
    assert meta["tokenizer.ggml.pre"] == "smollm"
    assert len(meta["tokenizer.ggml.tokens"]) == 49152


@pytest.mark.parametrize("preset", sorted(FIXTURES))
def test_weights_are_well_scaled_and_routing_varies(written, preset):
    f = written[preset]
    w = {name: values(f, name) for name in f.tensors}
    norm = w["blk.0.ffn_norm.weight"]
    assert abs(norm.mean() - 1) < 0.05 and 0.05 < norm.std() < 0.15
    q = w["blk.0.attn_q.weight"]  # numpy shape (out, in): std 1/sqrt(in)
    assert abs(q.std() * np.sqrt(q.shape[1]) - 1) < 0.1
    # Route 200 real token embeddings through layer 0's router: choices must vary.
    k = f.metadata[f"{f.metadata['general.architecture']}.expert_used_count"]
    x = w["token_embd.weight"][:200]
    x = x / np.sqrt((x * x).mean(axis=1, keepdims=True)) * norm
    logits = x @ w["blk.0.ffn_gate_inp.weight"].T
    top = {tuple(sorted(row)) for row in np.argsort(-logits, axis=1)[:, :k]}
    n_expert = w["blk.0.ffn_gate_inp.weight"].shape[0]
    assert len(top) >= min(10, math.comb(n_expert, k))
    assert np.median(logits.std(axis=1)) > 1.0  # a decisive, non-uniform router


def test_quantized_types_hold_the_f32_values(tmp_path, written):
    # Same seed, other types: the values are the f32 fixture's, rounded.
    q = GGUFFile(write_synthetic(tmp_path / "q.gguf", "olmoe", seed=0, dtype="bf16", expert_dtype="q8_0"))
    ref = written["olmoe"]
    for name, t in q.tensors.items():
        want = "Q8_0" if "_exps" in name else "F32" if len(t.ne) == 1 or "gate_inp" in name else "BF16"
        assert t.type_name == want, name
        a, got = values(ref, name), values(q, name)
        bound = np.abs(a).max() / 127 if want == "Q8_0" else np.abs(a) / 256 if want == "BF16" else 0
        assert np.all(np.abs(got - a) <= bound), name
    q.close()


@pytest.mark.parametrize("dtype", ["f16", "q4_0", "q4_1"])
def test_dense_dtypes(dtype):
    types = {s.name: q.name for s, q in plan_synthetic("llama_moe", dtype=dtype).tensors}
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_down_exps.weight"] == dtype.upper()
    assert types["token_embd.weight"] == types["output.weight"] == dtype.upper()
    assert types["blk.0.ffn_gate_inp.weight"] == types["blk.0.attn_norm.weight"] == "F32"


def test_qwen_tokenizer_variant():
    plan = plan_synthetic("qwen3moe", tokenizer="qwen")
    meta = plan.metadata()
    assert meta["tokenizer.ggml.pre"] == "deepseek-r1-qwen"
    assert len(meta["tokenizer.ggml.tokens"]) == 152064
    assert dict((s.name, s.ne) for s, _ in plan.tensors)["output.weight"] == (64, 152064)


def test_tied_embeddings_omit_output():
    names = [s.name for s, _ in plan_synthetic("qwen3moe", tie_embeddings=True).tensors]
    assert "output.weight" not in names and "token_embd.weight" in names


@pytest.mark.parametrize("preset, overrides, message", [
    ("olmoe", dict(n_head_kv=2), "n_head_kv == n_head"),
    ("qwen2moe", dict(head_dim=32), "n_head\\*head_dim == n_embd"),
    ("qwen3moe", dict(n_expert_used=9), "n_expert_used"),
    ("olmoe", dict(tie_embeddings=True), "output.weight"),
    ("llama_moe", dict(dtype="q4_0", n_ff_exp=48), "Q4_0 blocks"),
    ("llama_moe", dict(dtype="q9"), "unsupported dtype"),
])
def test_impossible_shapes_are_refused(preset, overrides, message):
    with pytest.raises(ValueError, match=message):
        plan_synthetic(preset, **overrides)


def test_bench_plan_has_qwen3_30b_a3b_layer_shapes():
    plan = plan_synthetic("bench")
    ne = {s.name: (s.ne, q.name) for s, q in plan.tensors}
    assert ne["blk.7.attn_q.weight"] == ((2048, 4096), "F16")
    assert ne["blk.7.attn_k.weight"] == ((2048, 512), "F16")
    assert ne["blk.7.attn_output.weight"] == ((4096, 2048), "F16")
    assert ne["blk.7.attn_q_norm.weight"] == ((128,), "F32")
    assert ne["blk.7.ffn_gate_inp.weight"] == ((2048, 32), "F32")
    assert ne["blk.7.ffn_gate_exps.weight"] == ((2048, 768, 32), "F16")
    assert ne["blk.7.ffn_down_exps.weight"] == ((768, 2048, 32), "F16")
    assert "blk.8.attn_norm.weight" not in ne
    m = plan.metadata()
    assert (m["qwen3moe.expert_count"], m["qwen3moe.expert_used_count"]) == (32, 8)
    assert m["qwen3moe.expert_feed_forward_length"] == 768
    assert (m["qwen3moe.attention.head_count"], m["qwen3moe.attention.head_count_kv"]) == (32, 4)
    assert m["qwen3moe.attention.key_length"] == 128
    assert 3.0e9 < plan.nbytes() < 3.3e9
