"""DeepSeek's latent attention (MLA) in one kernel call for a decode token
(kernels.decode_mla_block) against the torch step of engine/models/mla.py: the
block's output, the cache row it writes, and whole decode tokens."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rapidmoe.engine import kernels
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.models.common import rms_norm
from rapidmoe.engine.models.mla import MLAttention
from rapidmoe.engine.plan.planner import PlanRequest
from rapidmoe.engine.synth.model import write_synthetic
from test_decode_blocks import block_by_block

PROMPT = torch.tensor([5, 17, 99, 3, 250, 41, 7])


@pytest.fixture(scope="module")
def ds2(tmp_path_factory):
    d = tmp_path_factory.mktemp("mla")
    models = {}

    def get(preset, dtype, kv_type, critical="k"):
        key = (preset, dtype, kv_type, critical)
        if key not in models:
            # a q8_0 cache needs rows (latent + RoPE) and a latent of whole 32-blocks; q8_0
            # matrices need rows of whole blocks
            shape = {"qk_rope": 32} if kv_type == "q8_0" else {}
            if dtype == "q8_0":
                shape.update(q_lora_rank=64, qk_nope=32, v_head=32)
            p = write_synthetic(d / f"{preset}-{dtype}-{kv_type}.gguf", preset, seed=4, dtype=dtype, **shape)
            models[key] = load_model(p, n_ctx=64, critical=critical, placement=PlanRequest(mode="cpu", kv_type=kv_type))
        return models[key]
    return get


def two_caches(m):
    """Two caches holding the same prompt, as the torch step wrote it."""
    caches = [m.runner.new_cache(m.n_ctx) for _ in range(2)]
    for c in caches:
        m.runner.prefill(PROMPT, 0, c, last_only=True)
    return caches


# ds2_v3: q LoRA; ds2_lite: one wq; ds2_v3_legacy: k_b/v_b sliced from one attn_kv_b (f32 tensors)
@pytest.mark.parametrize("preset,dtype,kv_type", [("ds2_v3", "f32", "f32"), ("ds2_lite", "f32", "f16"),
                                                  ("ds2_v3_legacy", "f32", "q8_0"), ("ds2_v3", "q8_0", "f16"),
                                                  ("ds2_lite", "f16", "f32")])
def test_decode_mla_block_matches_the_torch_step(ds2, preset, dtype, kv_type):
    m = ds2(preset, dtype, kv_type)
    pos = len(PROMPT)
    ref_cache, fused_cache = two_caches(m)
    rng = np.random.default_rng(1)
    attn_layers = [b for b in m.net.blocks if isinstance(b.attn, MLAttention)]
    assert attn_layers and all(b.attn.fusable() for b in attn_layers)
    for blk in attn_layers:
        x = torch.from_numpy(rng.standard_normal((1, m.cfg.n_embd)).astype(np.float32))
        want = x + blk.attn(rms_norm(x, blk.attn_norm, blk.eps), pos, ref_cache)
        got = blk.attn.decode_block(x, blk.attn_norm, blk.eps, pos, fused_cache)
        err = (got - want).abs().max().item()
        assert err <= 1e-5 * want.abs().max().item(), err
        il = blk.attn.il
        a, b = ref_cache.kv[il].array(), fused_cache.kv[il].array()
        assert np.array_equal(a[:, :pos], b[:, :pos])  # nothing else written
        row_a, row_b = a[:, pos].view(a.dtype), b[:, pos].view(b.dtype)
        if kv_type == "q8_0":  # blocks: the same bytes unless a rounding tie fell the other way
            assert np.mean(row_a == row_b) > 0.95
        else:
            np.testing.assert_allclose(row_b.astype(np.float32), row_a.astype(np.float32), rtol=2e-3, atol=1e-5)


@pytest.mark.parametrize("preset", ["ds2_v3", "ds2_lite"])
def test_decode_tokens_fused_and_unfused_agree(ds2, preset, monkeypatch):
    """A few greedy decode tokens with the MLA half fused and with the torch step: the
    same tokens, logits within f32 summation noise."""
    m = ds2(preset, "f32", "f16")

    def run():
        cache = m.runner.new_cache(m.n_ctx)
        logits = m.runner.prefill(PROMPT, 0, cache, last_only=True)[0][-1]
        out = []
        for i in range(6):
            tok = int(torch.argmax(logits))
            logits = m.runner.decode(tok, len(PROMPT) + i, cache)[0]
            out.append((tok, logits.clone()))
        return out

    fused = run()
    monkeypatch.setattr(MLAttention, "fusable", lambda self: False)
    unfused = run()
    for (ta, la), (tb, lb) in zip(fused, unfused):
        assert ta == tb
        assert (la - lb).abs().max().item() <= 1e-4 * lb.abs().max().item()


# ds2_v3: a dense lead block, then two MoE blocks with a shared expert, the selection bias
# and expert groups; ds2_lite: one wq, softmax routing
@pytest.mark.parametrize("preset", ["ds2_v3", "ds2_lite"])
@pytest.mark.parametrize("critical,kv_type", [(2, "f16"), ("auto", "f16"), ("k", "q8_0")])
def test_a_decode_token_through_the_mla_chain_is_the_blocks_one_by_one(ds2, preset, critical, kv_type):
    m = ds2(preset, "f32", kv_type, critical)
    R = m.runner
    toks = [3, 17, 5, 9, 40, 2, 11]
    chain, blocks = R.new_cache(32), R.new_cache(32)
    R.prefill(torch.tensor(toks[:3]), 0, chain)
    R.prefill(torch.tensor(toks[:3]), 0, blocks)
    for pos in range(3, len(toks)):
        logits, trace = R.decode(toks[pos], pos, chain)
        want, st = block_by_block(R.net, toks[pos], pos, blocks, R.policy)
        assert torch.equal(logits, want)  # the same kernels in the same order
        assert sorted(trace.r) == sorted(st.r)
        for il in st.r:
            assert np.array_equal(trace.r[il], st.r[il]) and np.array_equal(trace.ids[il], st.ids[il])
    # every MoE block ran in the chain (the dense lead block does not fuse), same cache
    n_moe = sum(1 for b in R.net.blocks if hasattr(b.ffn, "chain_args"))
    assert n_moe >= 2 and sum(len(c.blocks) for c in R.net._chains.get(chain, {}).values()) == n_moe
    for il in range(m.cfg.n_layer):
        assert torch.equal(chain.kv[il].data, blocks.kv[il].data)


def test_decode_mla_block_rejects_bad_input(ds2):
    m = ds2("ds2_v3", "f32", "f16")
    blk = next(b for b in m.net.blocks if isinstance(b.attn, MLAttention))
    cache = m.runner.new_cache(m.n_ctx)
    ops = list(blk.attn._operands())
    x, nw, cfg = np.zeros(m.cfg.n_embd, np.float32), blk.attn_norm.numpy(), m.cfg
    rows = cache.kv[blk.attn.il].array()
    rope = blk.attn.rope
    args = dict(cache=rows, pos=3, n_head=cfg.n_head, cos=rope.cos[3].numpy(), sin=rope.sin[3].numpy(),
                rope_dim=rope.dim, neox=rope.style == "neox", scale=blk.attn.scale, nope=blk.attn.nope,
                hv=cfg.mla.head_dim_v)
    kernels.decode_mla_block(x, nw, 1e-6, *ops, **args)  # as given, it runs
    cases = [
        (dict(args, pos=m.n_ctx), "position"),
        (dict(args, n_head=cfg.n_head + 1), "heads"),
        (dict(args, nope=blk.attn.nope + 1), "k_b"),
    ]
    for kw, _ in cases:
        with pytest.raises(ValueError) as e:
            kernels.decode_mla_block(x, nw, 1e-6, *ops, **kw)
        assert "\n" not in str(e.value)
    bad = list(ops)
    bad[0] = ops[1]  # both wq and wq_a
    with pytest.raises(ValueError, match="give wq, or wq_a"):
        kernels.decode_mla_block(x, nw, 1e-6, *bad, **args)
    with pytest.raises(ValueError, match="norm weight size"):
        kernels.decode_mla_block(x, nw[:-1], 1e-6, *ops, **args)
