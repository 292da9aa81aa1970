"""deepseek2 specifics beyond the llama.cpp parity cases (tests/test_parity.py):
KV cache size, the legacy attn_kv_b layout, MTP blocks, YaRN scaling against
DeepSeek's published formula, the absorbed decode against an explicit
multi-head computation, and the CLI doors on a deepseek2 file."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from parity_cases import PROMPT
from rapidmoe.engine.hparams import config_from_metadata
from rapidmoe.engine.errors import ModelFileError
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.models.common import rms_norm
from rapidmoe.engine.kv_types import kv_bytes, kv_values_per_token
from rapidmoe.engine.synth.model import write_synthetic

REFS = Path(__file__).parent / "refs"
SEED = 1234  # the parity cases' seed: the llama.cpp references apply


def v3_metadata(**over):
    """DeepSeek-V3/R1-671B hyperparameters as its GGUFs carry them (the MTP block included)."""
    a = "deepseek2"
    m = {"general.architecture": a, "tokenizer.ggml.tokens": ["a"] * 129280,
         f"{a}.block_count": 62, f"{a}.nextn_predict_layers": 1, f"{a}.context_length": 163840,
         f"{a}.embedding_length": 7168, f"{a}.feed_forward_length": 18432,
         f"{a}.attention.head_count": 128, f"{a}.attention.head_count_kv": 1,
         f"{a}.attention.key_length": 576, f"{a}.attention.value_length": 512,
         f"{a}.attention.key_length_mla": 192, f"{a}.attention.value_length_mla": 128,
         f"{a}.attention.q_lora_rank": 1536, f"{a}.attention.kv_lora_rank": 512,
         f"{a}.rope.dimension_count": 64, f"{a}.rope.freq_base": 10000.0,
         f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": 40.0,
         f"{a}.rope.scaling.original_context_length": 4096, f"{a}.rope.scaling.yarn_log_multiplier": 0.1,
         f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.leading_dense_block_count": 3,
         f"{a}.expert_count": 256, f"{a}.expert_used_count": 8, f"{a}.expert_shared_count": 1,
         f"{a}.expert_feed_forward_length": 2048, f"{a}.expert_weights_scale": 2.5,
         f"{a}.expert_weights_norm": True, f"{a}.expert_gating_func": 2,
         f"{a}.expert_group_count": 8, f"{a}.expert_group_used_count": 4}
    m.update({f"{a}.{k}": v for k, v in over.items()})
    return m


def test_v3_kv_cache_is_latent_only():
    cfg = config_from_metadata(v3_metadata())
    assert cfg.n_layer == 61 and cfg.mla.n_layer_nextn == 1  # the MTP block is not part of the trunk
    per_token = kv_bytes(kv_values_per_token(cfg), "f16")
    assert per_token == 61 * (512 + 64) * 2 == 70272
    gb = per_token * 32768 / 1e9
    print(f"DeepSeek-V3 KV cache: {per_token} bytes/token (f16), {gb:.2f} GB for a 32K context")
    assert 2.25 < gb < 2.35
    # as opposed to 128 heads of K (192) and V (128) per token and layer
    assert per_token * 70 < 61 * 128 * (192 + 128) * 2


def test_v3_config_values():
    cfg = config_from_metadata(v3_metadata())
    assert (cfg.mla.q_lora_rank, cfg.mla.kv_lora_rank, cfg.mla.head_dim_k, cfg.mla.head_dim_v) \
        == (1536, 512, 192, 128)
    assert cfg.mla.absorbed and cfg.mla.rope_scaling == "yarn" and cfg.mla.yarn_orig_ctx == 4096
    assert cfg.mla.yarn_log_mul == 1.0 and cfg.rope_freq_scale == 1 / 40
    assert cfg.n_ff_shexp == 2048 and cfg.n_layer_dense_lead == 3 and cfg.n_expert_groups == 8
    # V2-Lite files have no q LoRA key
    meta = v3_metadata()
    del meta["deepseek2.attention.q_lora_rank"]
    assert config_from_metadata(meta).mla.q_lora_rank == 0


def test_gating_default_as_llama_cpp():
    """Files without expert_gating_func: softmax (DeepSeek-V2), except the
    GLM-4.7-Flash shape, where llama.cpp assumes sigmoid."""
    from rapidmoe.engine.hparams import GATING_SIGMOID, GATING_SOFTMAX

    meta = v3_metadata(block_count=47, nextn_predict_layers=0)
    del meta["deepseek2.expert_gating_func"]
    assert config_from_metadata(meta).gating == GATING_SOFTMAX
    meta["tokenizer.ggml.tokens"] = ["a"] * 154880
    assert config_from_metadata(meta).gating == GATING_SIGMOID


@pytest.mark.parametrize("over, why", [
    ({"attention.kv_lora_rank": 0}, "MLA sizes"),
    ({"rope.dimension_count": 192}, "MLA sizes"),
    ({"nextn_predict_layers": 62}, "block_count"),
    ({"rope.scaling.type": "longrope"}, "rope.scaling.type"),
    ({"attention.temperature_scale": 0.1}, "temperature_length"),
])
def test_bad_deepseek2_metadata(over, why):
    with pytest.raises(ModelFileError, match=why):
        config_from_metadata(v3_metadata(**over))


def test_yarn_scales_follow_deepseek():
    """DeepSeek's reference: softmax scale = mscale^2 / sqrt(qk_head_dim) with
    mscale = 0.1 * mscale_all_dim * ln(factor) + 1, and the rope keeps unit
    magnitude when mscale == mscale_all_dim."""
    from rapidmoe.engine.models.common import Rope, Yarn
    from rapidmoe.engine.models.deepseek2 import yarn_attn_factor
    from rapidmoe.engine.models.mla import kq_scale

    for log_mul_key, mscale_all_dim in ((0.1, 1.0), (0.0707, 0.707)):
        cfg = config_from_metadata(v3_metadata(**{"rope.scaling.yarn_log_multiplier": log_mul_key}))
        af = yarn_attn_factor(cfg)
        want = (0.1 * mscale_all_dim * math.log(40) + 1) ** 2 / math.sqrt(192)
        assert kq_scale(cfg, af) == pytest.approx(want, rel=1e-6)
        rope = Rope(cfg, 64, Yarn(af, 4096))
        assert torch.allclose(rope.cos ** 2 + rope.sin ** 2, torch.ones(()), atol=1e-6)
        # the ramp: the fastest pairs keep their angles, the slowest are divided by the factor
        theta1 = torch.atan2(rope.sin[1], rope.cos[1]).double()  # position 1
        inv = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
        assert theta1[0] == pytest.approx(inv[0].item(), rel=1e-6)
        assert theta1[-1] == pytest.approx(inv[-1].item() / 40, rel=1e-5)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ds2")
    return {p: write_synthetic(d / f"{p}.gguf", p, seed=SEED)
            for p in ("ds2_v3", "ds2_v3_legacy", "ds2_v3_mtp", "ds2_lite")}


def _run(model, tokens, n_greedy=8):
    run = model.runner
    cache = run.new_cache(model.n_ctx)
    logits = [run.prefill(tokens, 0, cache)[0]]
    pos = len(tokens)
    for _ in range(n_greedy):
        logits.append(run.decode(int(logits[-1][-1].argmax()), pos, cache)[0][None])
        pos += 1
    return torch.cat(logits), cache


def test_legacy_kv_b_gives_identical_logits(files):
    """The same weights written as split attn_k_b/attn_v_b and as one attn_kv_b."""
    split, legacy = load_model(files["ds2_v3"], n_ctx=128), load_model(files["ds2_v3_legacy"], n_ctx=128)
    assert not legacy.cfg.mla.absorbed and legacy.cfg.n_head_kv == 4
    toks = split.tokenizer.encode(PROMPT, add_special=True, parse_special=False)
    a, _ = _run(split, toks)
    b, cache = _run(legacy, toks)
    assert torch.equal(a, b)
    # the legacy file runs absorbed too: its cache holds latents, not per-head K/V
    assert cache.kv[0].data.shape == (1, 128, 32 + 16)


def test_mtp_block_is_skipped(files):
    trunk, mtp = load_model(files["ds2_v3"], n_ctx=64), load_model(files["ds2_v3_mtp"], n_ctx=64)
    assert mtp.metadata["deepseek2.block_count"] == 4 and mtp.cfg.n_layer == 3 == len(mtp.net.blocks)
    toks = trunk.tokenizer.encode("Hello world, hello MTP", add_special=True, parse_special=False)
    assert torch.equal(_run(trunk, toks, 2)[0], _run(mtp, toks, 2)[0])


def _mha_reference(attn, x):
    """Attention without absorption: K and V decompressed per head (DeepSeek's
    published form), from the layer's own weights. x [T, H] -> [T, H]."""
    cfg = attn.cfg
    T, nh, kv, nope = x.shape[0], cfg.n_head, attn.k_b.shape[1], attn.nope
    if attn.wq is not None:
        q = x @ attn.wq.T
    else:
        q = rms_norm(x @ attn.wq_a.T, attn.q_a_norm, cfg.rms_eps) @ attn.wq_b.T
    q = q.view(T, nh, -1)
    q = torch.cat([q[..., :nope], attn.rope(q[..., nope:], 0)], -1)
    ckv = x @ attn.wkv_a.T
    c = rms_norm(ckv[:, :kv], attn.kv_a_norm, cfg.rms_eps)  # [T, kv]
    k_pe = attn.rope(ckv[:, None, kv:], 0).expand(T, nh, -1)
    k = torch.cat([torch.einsum("tc,hcj->thj", c, attn.k_b), k_pe], -1)  # [T, nh, nope + rope]
    v = torch.einsum("tc,hjc->thj", c, attn.v_b)  # [T, nh, hv]
    s = torch.einsum("thd,shd->hts", q, k) * attn.scale
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("hts,shj->thj", torch.softmax(s, -1), v)
    return o.reshape(T, -1) @ attn.wo.T


@pytest.mark.parametrize("preset", ["ds2_v3", "ds2_lite"])
def test_absorbed_decode_matches_multi_head_attention(files, preset):
    model = load_model(files[preset], n_ctx=64)
    attn = model.net.blocks[1].attn
    x = torch.randn(12, model.cfg.n_embd, generator=torch.Generator().manual_seed(0))
    want = _mha_reference(attn, x)
    prefill = attn(x, 0, model.net.new_cache(64, kv_type="f32"))
    cache = model.net.new_cache(64, kv_type="f32")
    steps = torch.cat([attn(x[t:t + 1], t, cache) for t in range(12)])  # one token at a time
    assert torch.allclose(prefill, want, atol=2e-5, rtol=0)
    assert torch.allclose(steps, want, atol=2e-5, rtol=0)
    assert cache.nbytes == 64 * kv_bytes(kv_values_per_token(model.cfg), "f32")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


def test_cli_prompt_and_eval_on_deepseek2(files, tmp_path):
    """-p runs (in whatever precision the CLI picks by default); eval, in full
    precision, reproduces llama.cpp's log-probabilities."""
    ref = json.loads((REFS / "parity_ds2_v3.json").read_text())
    path = str(files["ds2_v3"])
    r = cli("-m", path, "-p", PROMPT, "--raw", "--temp", "0", "--max-tokens", "16", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_tokens"] == len(ref["tokens"]) and out["text"].strip()
    assert out["completion_tokens"] == 16 or out["finish_reason"] == "stop"

    text = tmp_path / "p.txt"
    text.write_text(PROMPT, encoding="utf-8")
    r = cli("eval", "-m", path, "--kv-type", "f32", "--text", str(text), "--save-logits", str(tmp_path / "l.npz"),
            "--json")  # llama.cpp's references ran with an f32 KV cache
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "l.npz") as z:
        toks, logits = z["tokens"].tolist(), z["logits"].astype(np.float64)
    assert toks == ref["tokens"]
    for pos, top in zip(ref["positions"], ref["top"]):
        ls = logits[pos] - logits[pos].max()
        ls -= np.log(np.exp(ls).sum())
        assert np.abs(ls[[i for i, _ in top]] - [v for _, v in top]).max() < 1e-3


def test_long_prefill_blocks_of_queries_give_the_same_logits(files, monkeypatch):
    from rapidmoe.engine.models import mla

    model = load_model(files["ds2_v3"], n_ctx=64)
    toks = torch.arange(100, 140)
    whole = model.runner.prefill(toks, 0, model.runner.new_cache(64))[0]
    monkeypatch.setattr(mla, "_SCORES_MAX", 3 * 4 * 40)  # three queries per block
    assert torch.equal(model.runner.prefill(toks, 0, model.runner.new_cache(64))[0], whole)
