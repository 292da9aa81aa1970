"""KV cache types (engine/kv_types.py, engine/kv_cache.py) and the decode attention over
them (csrc/cpu/attn/attn.cpp: attn_cached, kv_store) against torch references on odd shapes,
and whole models run with each type against the exact f32 cache."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from isa_paths import run_on_path

from rapidmoe.engine import kernels
from rapidmoe.engine.errors import UserError
from rapidmoe.engine.kv_cache import KVRows
from rapidmoe.engine.kv_types import KV_TYPES, check_kv_type, kv_bytes
from rapidmoe.engine.models.common import attend


def _rows(kv_type, n_ctx, heads, dim, seed, scale=1.0):
    r = KVRows(n_ctx, heads, dim, kv_type)
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((n_ctx, heads, dim)).astype(np.float32)) * scale
    r.write(0, x)
    return r, x


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_rows_round_trip_within_the_type(kv_type):
    r, x = _rows(kv_type, 7, 3, 64, 0, scale=3.0)
    back = r.read(7)
    err = (back - x).abs().max().item()
    bound = {"f32": 0.0, "f16": 3.0 * 2 ** -11 * 4, "q8_0": x.abs().max().item() / 127 / 2 * 1.01}[kv_type]
    assert err <= bound
    assert r.nbytes == kv_bytes(7 * 3 * 64, kv_type)
    if kv_type == "q8_0":  # a leading part of each row, as MLA's values are
        assert torch.equal(r.read(5, dim=32), back[:5, :, :32])
        z = KVRows(2, 1, 32, "q8_0")
        z.write(0, torch.zeros(2, 1, 32))  # an all-zero block: scale 0, no division by it
        assert torch.equal(z.read(2), torch.zeros(2, 1, 32))


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_kernel_store_writes_the_same_bytes_as_the_torch_path(kv_type):
    # the decode kernels extend a cache that prefill filled: one format, byte for byte
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 2, 96)) * np.array([1e-3, 1.0, 300.0, 6e4, 1e-8])[:, None, None]).astype(np.float32)
    x[0, 0, :32] = 0.0
    x[1, 1, 5] = 0.5 * 2 ** -24  # halfway below the smallest f16 subnormal: ties to even (0)
    a, b = KVRows(5, 2, 96, kv_type), KVRows(5, 2, 96, kv_type)
    a.write(0, torch.from_numpy(x))
    for pos in range(5):
        kernels.kv_store(b.array(), pos, x[pos].reshape(-1))
    assert torch.equal(a.data, b.data)


CASES = [  # n_head, n_kv, hd, hdv, S, T: T queries ending at position S - 1
    (4, 2, 32, 32, 1, 1),
    (6, 3, 64, 96, 37, 1),
    (8, 1, 32, 64, 300, 1),
    (5, 5, 128, 128, 700, 1),
    (32, 4, 128, 128, 2900, 1),  # long enough for key blocks over threads
    (6, 3, 64, 96, 37, 37),  # a prefill from position 0
    (8, 2, 32, 64, 300, 45),  # a chunk after earlier ones; query blocks cut mid-tile
    (32, 4, 128, 128, 1100, 3),  # few queries over a long context: key blocks and query blocks
]


ISA_CASES = [  # row counts per group of 1 to 15 (the kernels' blocks of 8, 4, 2 and 1 rows) and odd dims
    (7, 7, 40, 24, 67, 1),
    (9, 3, 24, 40, 45, 1),
    (15, 1, 136, 8, 100, 1),
    (14, 2, 56, 72, 33, 2),
    (10, 2, 200, 200, 70, 1),
    (7, 7, 96, 64, 67, 1),
    (14, 2, 160, 32, 33, 2),
]


def _attn_case(kv_type, n_head, n_kv, hd, hdv, S, T):
    kc, _ = _rows(kv_type, S + 3, n_kv, hd, S)
    vc, _ = _rows(kv_type, S + 3, n_kv, hdv, S + 1)
    q = np.random.default_rng(S + 2).standard_normal((T, n_head, hd)).astype(np.float32)
    want = attend(torch.from_numpy(q), kc.read(S), vc.read(S), S - T, 0.2).numpy().reshape(-1)
    got = kernels.attn_cached(q, kc.array(), vc.array(), S - T, n_head, 0.2)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("case", CASES)
def test_attn_cached_matches_attention_over_the_rows_it_holds(kv_type, case):
    _attn_case(kv_type, *case)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("S,T", [(1, 1), (33, 1), (3000, 1), (70, 70), (200, 9)])
def test_mla_values_are_the_leading_part_of_the_key_rows(kv_type, S, T):
    nh, kv, rope = 16, 64, 32
    rows, _ = _rows(kv_type, S, 1, kv + rope, S)
    q = np.random.default_rng(S).standard_normal((T, nh, kv + rope)).astype(np.float32)
    keys = rows.read(S)[:, 0]
    s = torch.from_numpy(q) @ keys.T * 0.1  # [T, nh, S]
    hidden = torch.arange(S)[None, :] > torch.arange(S - T, S)[:, None]
    p = torch.softmax(s.masked_fill(hidden[:, None, :], float("-inf")), dim=-1)
    want = (p @ keys[:, :kv]).numpy().reshape(-1)
    got = kernels.attn_cached(q, rows.array(), None, S - T, nh, 0.1, v_dim=kv)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_attn_cached_on_each_isa_path(isa):
    # each path's tile kernels (portable loops, attn_avx2.cpp, attn_avx512.cpp) against the
    # same references, in a process forced to that path: every row count (rep 1..8 and more),
    # head sizes that are not multiples of the vector width, and MLA's shared rows
    if isa != "scalar" and not kernels.isa_info()[isa]:
        pytest.skip(f"this CPU has no {isa}")
    run_on_path("test_kv_cache", "[t._attn_case(k, *c) for k in t.KV_TYPES for c in t.CASES + t.ISA_CASES "
                "if k != 'q8_0' or c[2] % 32 == c[3] % 32 == 0]; "
                "t.test_mla_values_are_the_leading_part_of_the_key_rows('q8_0', 3000, 1); "
                "t.test_mla_values_are_the_leading_part_of_the_key_rows('f16', 200, 9); "
                "[t.test_kernel_store_writes_the_same_bytes_as_the_torch_path(k) for k in t.KV_TYPES]", isa=isa)


def test_attn_cached_refuses_bad_input():
    kc = np.zeros((2, 4, 32), np.float16)  # 2 heads, 4 positions
    q = np.zeros(4 * 32, np.float32)
    with pytest.raises(ValueError, match="shapes"):
        kernels.attn_cached(q, kc, kc, 4, 4, 1.0)  # past the cache
    with pytest.raises(ValueError, match="shapes"):
        kernels.attn_cached(np.zeros(4 * 32 + 5, np.float32), kc, kc, 0, 4, 1.0)  # not whole queries
    with pytest.raises(ValueError, match="shapes"):
        kernels.attn_cached(q, kc, kc, 2, 3, 1.0)  # heads not a multiple of the groups
    with pytest.raises(ValueError, match="k cache"):
        kernels.attn_cached(q, np.zeros((2, 4, 33), np.uint8), kc, 2, 4, 1.0)  # not q8_0 blocks
    with pytest.raises(ValueError, match="v_dim"):
        kernels.attn_cached(q, kc, None, 2, 4, 1.0, v_dim=40)
    with pytest.raises(ValueError, match="k cache"):
        kernels.attn_cached(q, kc[:, :, ::2], kc, 2, 4, 1.0)  # a view, not the rows in place


def test_kv_type_checks():
    assert check_kv_type("q8_0", (64, 128)) == "q8_0"
    with pytest.raises(UserError, match="multiples of 32"):
        check_kv_type("q8_0", (64, 20))
    with pytest.raises(UserError, match="unknown KV cache type"):
        check_kv_type("q4_0")


# ---- whole models: each cache type against the exact f32 cache ----

def _kl(p_logits, q_logits):
    lp, lq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def _decode_logits(model, tokens):
    run = model.runner
    cache = run.new_cache(model.n_ctx)
    first, _ = run.prefill(torch.tensor(tokens[:8]), 0, cache, last_only=True)
    out = [first[0]]
    for i, t in enumerate(tokens[8:]):
        logits, _ = run.decode(int(t), 8 + i, cache)
        out.append(logits)
    return torch.stack(out)


@pytest.mark.parametrize("arch,shape", [
    ("qwen3moe", {}),
    ("olmoe", {"head_dim": 32, "n_head": 2, "n_head_kv": 2}),  # q8_0 rows are whole blocks of 32
    ("ds2_lite", {"kv_lora_rank": 64, "qk_rope": 32}),
])
def test_models_run_each_cache_type_close_to_f32(tmp_path, arch, shape):
    """Prefill, then decode through the fused CPU blocks (qwen3moe's per-head q/k norms,
    olmoe's over the whole projections) and MLA (deepseek2)."""
    from rapidmoe.engine.loader import load_model
    from rapidmoe.engine.plan.planner import PlanRequest
    from rapidmoe.engine.synth.model import write_synthetic

    path = write_synthetic(tmp_path / f"{arch}.gguf", arch, seed=7, dtype="f32", **shape)
    models = {t: load_model(path, n_ctx=64, critical="k", placement=PlanRequest(kv_type=t)) for t in KV_TYPES}
    tokens = models["f32"].tokenizer.encode("The quick brown fox jumps over the lazy dog, then naps in the sun "
                                            "until evening comes.", add_special=True, parse_special=False)[:24]
    base = _decode_logits(models["f32"], tokens)
    for t, bound in (("f16", 1e-4), ("q8_0", 2e-3)):
        kl = _kl(base, _decode_logits(models[t], tokens))
        assert kl.mean().item() < bound, (t, kl.mean().item())
        assert kl.mean().item() > 0  # the type is really used


# ---- the flag: plan, -p, eval, bench ----

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", *args], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))


def test_plan_counts_the_chosen_type_and_refuses_what_the_model_cannot_hold(tmp_path):
    import json

    from rapidmoe.engine.synth.model import write_synthetic

    ok = write_synthetic(tmp_path / "ok.gguf", "qwen3moe", seed=3, dtype="f32")  # head_dim 32
    kv = {}
    for t in KV_TYPES:
        r = _cli("plan", "-m", str(ok), "--ctx", "200", "--kv-type", t, "--json")
        assert r.returncode == 0, r.stderr
        p = json.loads(r.stdout)
        assert p["kv_type"] == t
        kv[t] = next(c["bytes"] for c in p["components"] if c["name"].startswith(f"KV cache ({t}, 200 tokens)"))
    assert kv["f32"] == 2 * kv["f16"] and kv["q8_0"] == kv["f16"] * 17 // 32
    odd = write_synthetic(tmp_path / "odd.gguf", "olmoe", seed=3, dtype="f32")  # head_dim 16
    for cmd in (("plan",), ("-p", "hi", "--max-tokens", "2")):
        r = _cli(*cmd, "-m", str(odd), "--kv-type", "q8_0")
        assert r.returncode == 2 and "multiples of 32" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_bench_reports_the_cache_at_depth():
    import json

    r = _cli("bench", "-m", "demo", "--critical", "2", "-p", "8", "-n", "4", "-d", "40", "--kv-type", "q8_0", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["test"] for x in rows] == ["pp8 @ d40", "tg4 @ d40"]
    assert all(x["kv_type"] == "q8_0" and x["depth"] == 40 for x in rows)
    from rapidmoe.engine.hub.demo import demo_model_path
    from rapidmoe.engine.gguf.reader import GGUFFile
    from rapidmoe.engine.kv_types import kv_values_per_token
    from rapidmoe.engine.gguf.validate import check_model

    g = GGUFFile(demo_model_path())
    per_token = kv_bytes(kv_values_per_token(check_model(g)), "q8_0")
    g.close()
    assert rows[0]["kv_bytes"] == (40 + 8 + 4 + 1) * per_token
