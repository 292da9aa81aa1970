"""The fused decode block halves (csrc/cpu/decode.cpp) against the Python steps they
replace: routing (engine/moe/router.py semantics), the UMIA / fixed critical-set
policy, the residual-split MoE layer, and the attention half with its projections."""
import numpy as np
import pytest
import torch

from rapidmoe.engine import kernels
from rapidmoe.engine.models.common import Rope, attend, rms_norm
from rapidmoe.engine.moe.umia import UmiaProfile, critical_sizes
from test_resplit_kernels import make_layer

F32 = 0  # GGML type


def torch_route(logits, k, sigmoid, norm_topk, scale):
    p = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, -1)
    # by probability descending, ties to the lower id (a stable sort of -p)
    ids = torch.sort(-p, dim=-1, stable=True).indices[:, :k]
    w = p.gather(1, ids)
    if norm_topk:
        w = w / w.sum(-1, keepdim=True).clamp(min=6.103515625e-5)
    if scale not in (0.0, 1.0):
        w = w * scale
    return ids, w


@pytest.mark.parametrize("sigmoid,norm_topk,scale", [(False, True, 1.0), (False, False, 0.0), (True, True, 2.5)])
def test_route_matches_torch(sigmoid, norm_topk, scale):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((9, 12)).astype(np.float32)
    logits[3] = 0.5  # all tied: the lowest ids win, in order
    logits[4, [2, 7, 9]] = 4.0  # a tie at the top
    ids, w = kernels.route(logits, 5, sigmoid, norm_topk, scale)
    tids, tw = torch_route(torch.from_numpy(logits), 5, sigmoid, norm_topk, scale)
    np.testing.assert_array_equal(ids, tids.numpy())
    np.testing.assert_allclose(w, tw.numpy(), rtol=1e-6, atol=1e-7)
    assert ids[3].tolist() == [0, 1, 2, 3, 4] and ids[4, :3].tolist() == [2, 7, 9]
    with pytest.raises(ValueError, match="k <= E"):
        kernels.route(logits, 13, sigmoid, norm_topk, scale)


@pytest.mark.parametrize("policy", ["fixed0", "fixed2", "fixed9", "umia"])
def test_decode_moe_block_matches_steps(policy):
    rng = np.random.default_rng(2)
    E, H, F, k = 7, 96, 40, 4
    L = make_layer(rng, E, H, F)
    router = (rng.standard_normal((E, H)) * 0.3).astype(np.float32)
    norm_w = (rng.random(H) + 0.5).astype(np.float32)
    prof = UmiaProfile(alpha=(1.3, 1.1, 1.0), beta_prefill=1.25, beta_decode=1.0, theta=0.22, r_min=1, r_max=3)
    rs = set()
    for i in range(12):
        h = (rng.standard_normal(H) * (0.2 + i)).astype(np.float32)
        layer = i % 3
        if policy == "umia":
            fixed, ab = -1, prof.alpha[layer] * prof.beta_decode
        else:
            fixed, ab = int(policy[5:]), 0.0
        out, ids, w, r = kernels.decode_moe_block(h, norm_w, 1e-6, kernels.ggml_operand(torch.from_numpy(router)), k,
                                                   False, True, 1.0, fixed, ab, prof.theta, prof.r_min, prof.r_max,
                                                   **L)
        # the same steps in Python
        xn = kernels.rms_norm(h[None], norm_w, 1e-6)
        tids, tw = torch_route(torch.from_numpy(xn @ router.T), k, False, True, 1.0)
        np.testing.assert_array_equal(ids, tids[0].numpy())
        np.testing.assert_allclose(w, tw[0].numpy(), rtol=1e-5, atol=1e-7)
        want_r = critical_sizes(prof, tw.numpy(), layer, False, k)[0] if fixed < 0 else min(fixed, k)
        assert r == want_r
        rs.add(r)
        ref = h + kernels.resplit_moe_forward(xn, ids[None], w[None], np.array([r], np.int32), **L)[0]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    if policy == "umia":
        assert len(rs) > 1  # the inputs reach more than one critical-set size


@pytest.mark.parametrize("gated", [True, False])
def test_decode_moe_block_with_a_shared_expert_matches_steps(gated):
    # qwen2moe gates its shared expert by sigmoid(gate_inp . x); deepseek2 adds it as it is
    from rapidmoe.engine.moe.block import SharedExpert

    rng = np.random.default_rng(4)
    E, H, F, Fs, k = 6, 96, 40, 72, 3
    L = make_layer(rng, E, H, F)
    router = (rng.standard_normal((E, H)) * 0.3).astype(np.float32)
    norm_w = (rng.random(H) + 0.5).astype(np.float32)
    t = lambda *shape: torch.from_numpy((rng.standard_normal(shape) * 0.1).astype(np.float32))  # noqa: E731
    sh = SharedExpert(t(Fs, H), t(Fs, H), t(H, Fs), t(H) if gated else None)
    for i in range(4):
        h = (rng.standard_normal(H) * (0.5 + i)).astype(np.float32)
        out, ids, w, r = kernels.decode_moe_block(h, norm_w, 1e-6, kernels.ggml_operand(torch.from_numpy(router)), k,
                                                   False, True, 1.0, 2, 0.0, 0.0, 0, 0, **L, **sh.chain_args())
        xn = kernels.rms_norm(h[None], norm_w, 1e-6)
        moe = kernels.resplit_moe_forward(xn, ids[None], w[None], np.array([r], np.int32), **L)[0]
        ref = h + (moe + sh(torch.from_numpy(xn))[0].numpy())
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        without = kernels.decode_moe_block(h, norm_w, 1e-6, kernels.ggml_operand(torch.from_numpy(router)), k,
                                           False, True, 1.0, 2, 0.0, 0.0, 0, 0, **L)[0]
        assert np.abs(out - without).max() > 1e-3 * np.abs(ref).max()  # the shared expert is really added
    bad = {**sh.chain_args(), "shared_down": kernels.ggml_operand(t(H, Fs + 1))}
    with pytest.raises(ValueError, match="shared down"):
        kernels.decode_moe_block(h, norm_w, 1e-6, kernels.ggml_operand(torch.from_numpy(router)), k, False, True,
                                 1.0, 2, 0.0, 0.0, 0, 0, **L, **bad)
    with pytest.raises(ValueError, match="needs gate, up and down"):
        kernels.decode_moe_block(h, norm_w, 1e-6, kernels.ggml_operand(torch.from_numpy(router)), k, False, True,
                                 1.0, 2, 0.0, 0.0, 0, 0, **L, **{**sh.chain_args(), "shared_up": None})


def torch_route_grouped(logits, k, norm_topk, scale, bias, n_groups, n_group_used):
    # DeepSeek-V3's selection as the torch steps of llama.cpp's graph: sigmoid scores plus the
    # bias select within the groups whose top-2 scores sum highest; weights unbiased
    p = torch.sigmoid(logits)
    sel = (p + bias).view(p.shape[0], n_groups, -1)
    keep = sel.topk(2, dim=-1).values.sum(-1).topk(n_group_used, dim=-1).indices
    mask = torch.ones(p.shape[0], n_groups, dtype=torch.bool).scatter_(1, keep, False)
    ids = sel.masked_fill(mask[:, :, None], float("-inf")).view(p.shape[0], -1).topk(k, dim=-1).indices
    w = p.gather(1, ids)
    if norm_topk:
        w = w / w.sum(-1, keepdim=True).clamp(min=6.103515625e-5)
    return ids, w * scale


@pytest.mark.parametrize("n_groups,n_group_used", [(0, 0), (4, 2), (8, 3)])
def test_route_with_bias_and_groups_matches_torch(n_groups, n_group_used):
    rng = np.random.default_rng(6)
    T, E, k = 40, 32, 6
    logits = rng.standard_normal((T, E)).astype(np.float32)
    bias = (rng.standard_normal(E) * 0.3).astype(np.float32)
    ids, w = kernels.route(logits, k, True, True, 2.5, bias, n_groups, n_group_used)
    tids, tw = torch_route_grouped(torch.from_numpy(logits), k, True, 2.5, torch.from_numpy(bias),
                                   max(n_groups, 1), max(n_group_used, 1))
    np.testing.assert_array_equal(ids, tids.numpy())
    np.testing.assert_allclose(w, tw.numpy(), rtol=1e-6, atol=1e-7)
    if n_groups > 1:  # every token's experts lie in n_group_used groups
        assert max(len(set((ids // (E // n_groups))[t].tolist())) for t in range(T)) == n_group_used
    plain = kernels.route(logits, k, True, True, 2.5)[0]
    assert (plain != ids).any()  # the bias (and the groups) change the selection
    with pytest.raises(ValueError, match="groups"):
        kernels.route(logits, k, True, True, 2.5, bias, 5, 2)  # 32 experts do not split in 5
    with pytest.raises(ValueError, match="bias must have E"):
        kernels.route(logits, k, True, True, 2.5, bias[:-1])


def test_decode_moe_block_with_a_selection_bias_makes_the_largest_weights_critical():
    # DeepSeek-V3: the bias orders the selection, but the critical experts are those of the
    # largest (unbiased) weights, as ResplitExperts chooses them
    rng = np.random.default_rng(7)
    E, H, F, k = 8, 64, 32, 3
    L = make_layer(rng, E, H, F)
    router = (rng.standard_normal((E, H)) * 0.5).astype(np.float32)
    norm_w = np.ones(H, np.float32)
    bias = (rng.standard_normal(E) * 0.3).astype(np.float32)
    reordered = 0
    for i in range(24):
        h = rng.standard_normal(H).astype(np.float32)
        out, ids, w, r = kernels.decode_moe_block(h, norm_w, 1e-6, kernels.ggml_operand(torch.from_numpy(router)), k,
                                                   True, True, 2.5, 1, 0.0, 0.0, 0, 0, **L, bias=bias, n_groups=4,
                                                   n_group_used=2)
        xn = kernels.rms_norm(h[None], norm_w, 1e-6)
        want_ids, want_w = kernels.route(xn @ router.T, k, True, True, 2.5, bias, 4, 2)
        np.testing.assert_array_equal(ids, want_ids[0])  # returned in selection order
        order = np.argsort(-w, kind="stable")
        reordered += int((order != np.arange(k)).any())
        ref = h + kernels.resplit_moe_forward(xn, ids[order][None], w[order][None], np.array([r], np.int32), **L)[0]
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
    assert reordered > 0  # some tokens' largest weight is not their first selected expert


def test_decode_moe_block_rejects_bad_input():
    rng = np.random.default_rng(3)
    L = make_layer(rng, 3, 64, 32)
    h, nw = np.zeros(64, np.float32), np.ones(64, np.float32)
    router = kernels.ggml_operand(torch.zeros(3, 64))
    args = dict(k=2, sigmoid=False, norm_topk=True, scale=1.0, fixed=1, ab=0.0, theta=0.0, r_min=0, r_max=0)
    with pytest.raises(ValueError, match="critical"):
        kernels.decode_moe_block(h, nw, 1e-6, router, **args, **dict(L, gate_r=None))
    with pytest.raises(ValueError, match="router"):
        kernels.decode_moe_block(h, nw, 1e-6, kernels.ggml_operand(torch.zeros(4, 64)), **args, **L)
    with pytest.raises(ValueError, match="k <= E"):
        kernels.decode_moe_block(h, nw, 1e-6, router, **dict(args, k=4), **L)


class Cfg:
    rope_dim, rope_style, rope_base, rope_freq_scale = 16, "neox", 10000.0, 1.0


@pytest.mark.parametrize("bias,norm", [(False, "head"), (True, None), (True, "full")])
def test_decode_attn_block_matches_steps(bias, norm):
    # q/k norms per head (qwen3moe), none, or over the whole projections (olmoe)
    rng = np.random.default_rng(4)
    H, nh, nkv, hd, pos = 48, 6, 2, 16, 9
    mats = [torch.from_numpy((rng.standard_normal(s) * 0.2).astype(np.float32))
            for s in ((nh * hd, H), (nkv * hd, H), (nkv * hd, H), (H, nh * hd))]
    bs = [torch.from_numpy(rng.standard_normal(n).astype(np.float32)) if bias else None
          for n in (nh * hd, nkv * hd, nkv * hd)]
    qn, kn = [torch.from_numpy((rng.random(n if norm == "full" else hd) + 0.5).astype(np.float32)) if norm else None
              for n in (nh * hd, nkv * hd)]
    norm_w = torch.from_numpy((rng.random(H) + 0.5).astype(np.float32))
    rope = Rope(Cfg, 32)
    kc = torch.from_numpy(rng.standard_normal((32, nkv, hd)).astype(np.float32))
    vc = torch.from_numpy(rng.standard_normal((32, nkv, hd)).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((1, H)).astype(np.float32))
    # the Python steps (engine/models/base.py Attention for one token)
    kr, vr = kc.clone(), vc.clone()
    xn = rms_norm(x, norm_w, 1e-5)
    lin = lambda m, b: xn @ m.T + (b if b is not None else 0)  # noqa: E731
    q, k, v = lin(mats[0], bs[0]), lin(mats[1], bs[1]), lin(mats[2], bs[2])
    if norm == "full":
        q, k = rms_norm(q, qn, 1e-6), rms_norm(k, kn, 1e-6)
    q, k = q.view(1, nh, hd), k.view(1, nkv, hd)
    if norm == "head":
        q, k = rms_norm(q, qn, 1e-6), rms_norm(k, kn, 1e-6)
    q, k = rope(q, pos), rope(k, pos)
    kr[pos], vr[pos] = k[0], v.view(nkv, hd)
    want = x + attend(q, kr[:pos + 1], vr[:pos + 1], pos, 0.25) @ mats[3].T
    ops = [kernels.ggml_operand(m) for m in mats]
    kc, vc = kc.transpose(0, 1).contiguous(), vc.transpose(0, 1).contiguous()  # the kernels' [n_kv, n_ctx, hd]
    got = kernels.decode_attn_block(x.numpy()[0], norm_w.numpy(), 1e-5, *ops, *bs, kc.numpy(), vc.numpy(), pos, nh,
                                    rope.cos[pos].numpy(), rope.sin[pos].numpy(), 16, True, qn, kn, 1e-6, 0.25,
                                    qk_full=norm == "full")
    np.testing.assert_allclose(got, want.numpy()[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kc.numpy()[:, pos], kr.numpy()[pos], rtol=1e-5, atol=1e-6)  # written in place
    with pytest.raises(ValueError, match="projection shapes"):
        kernels.decode_attn_block(x.numpy()[0], norm_w.numpy(), 1e-5, ops[1], ops[1], ops[2], ops[3], *bs, kc.numpy(),
                                  vc.numpy(), pos, nh, rope.cos[pos].numpy(), rope.sin[pos].numpy(), 16, True, qn, kn,
                                  1e-6, 0.25, qk_full=norm == "full")
    if norm:  # norms of the other kind's size
        with pytest.raises(ValueError, match="q_norm has the wrong size"):
            kernels.decode_attn_block(x.numpy()[0], norm_w.numpy(), 1e-5, *ops, *bs, kc.numpy(), vc.numpy(), pos, nh,
                                      rope.cos[pos].numpy(), rope.sin[pos].numpy(), 16, True, qn, kn, 1e-6, 0.25,
                                      qk_full=norm != "full")


def test_decode_attn_block_quantized_projections():
    # q/k/v in one pass on int8 activations (Q8_0 and Q4_0 share the layout), o in Q8_0:
    # the same numbers as one ggml_matmul per projection
    from gguf import GGMLQuantizationType as G
    from gguf import quants

    rng = np.random.default_rng(5)
    H, nh, nkv, hd, pos = 64, 4, 2, 16, 3
    dense = [(rng.standard_normal(s) * 0.2).astype(np.float32)
             for s in ((nh * hd, H), (nkv * hd, H), (nkv * hd, H), (H, nh * hd))]
    types = (G.Q8_0, G.Q4_0, G.Q8_0, G.Q8_0)
    ops = [(quants.quantize(d, t), int(t)) for d, t in zip(dense, types)]
    norm_w = (rng.random(H) + 0.5).astype(np.float32)
    rope = Rope(Cfg, 8)
    kc = rng.standard_normal((8, nkv, hd)).astype(np.float32)
    vc = rng.standard_normal((8, nkv, hd)).astype(np.float32)
    x = rng.standard_normal(H).astype(np.float32)
    kr, vr = torch.from_numpy(kc.copy()), torch.from_numpy(vc.copy())
    xn = kernels.rms_norm(x[None], norm_w, 1e-5)
    q, k, v = (torch.from_numpy(kernels.ggml_matmul(w, t, xn)) for w, t in ops[:3])
    q, k = rope(q.view(1, nh, hd), pos), rope(k.view(1, nkv, hd), pos)
    kr[pos], vr[pos] = k[0], v.view(nkv, hd)
    o = attend(q, kr[:pos + 1], vr[:pos + 1], pos, 0.25).numpy()
    want = x + kernels.ggml_matmul(*ops[3], o)[0]
    kc, vc = np.ascontiguousarray(kc.transpose(1, 0, 2)), np.ascontiguousarray(vc.transpose(1, 0, 2))
    got = kernels.decode_attn_block(x, norm_w, 1e-5, *ops, None, None, None, kc, vc, pos, nh, rope.cos[pos].numpy(),
                                    rope.sin[pos].numpy(), 16, True, None, None, 1e-6, 0.25)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---- a decode token through consecutive fused blocks in one call (DecodeChain) ----

@pytest.fixture(scope="module")
def synth_models(tmp_path_factory):
    from rapidmoe.engine.loader import load_model
    from rapidmoe.engine.plan.planner import PlanRequest
    from rapidmoe.engine.synth.model import write_synthetic

    d = tmp_path_factory.mktemp("chain")
    cache = {}

    def get(arch, critical, kv_type="f16", source=False):
        """source: the experts in Q4_0, the critical ones run from the file's tensors."""
        key = (arch, critical, kv_type, source)
        if key not in cache:
            p = write_synthetic(d / f"{arch}-{source}.gguf", arch, seed=5, dtype="f32",
                                expert_dtype="q4_0" if source else None, n_layer=3, n_embd=128, head_dim=32)
            cache[key] = load_model(p, n_ctx=32, critical=critical, placement=PlanRequest(
                mode="cpu", kv_type=kv_type, critical_from="source" if source else "pack"))
            assert cache[key].plan.critical_from == ("source" if source else "pack")
        return cache[key]
    return get


def block_by_block(net, tok, pos, cache, policy):
    """One decode token through each block's own call (its fused halves where they fuse)."""
    from rapidmoe.engine.models.common import embed
    from rapidmoe.engine.ops import linear
    from rapidmoe.engine.step import Step

    st = Step(policy=policy, prefill=False)
    x = embed(net.tok_embd, torch.tensor([tok]))
    for blk in net.blocks:
        x = blk(x, pos, cache, st)
    return linear(rms_norm(x, net.output_norm, net.cfg.rms_eps), net.output)[0], st


# (preset, blocks a decode token runs through chains): qwen3moe has per-head q/k norms,
# llama_moe none, olmoe q/k norms over the whole projections, qwen2moe a gated shared expert
@pytest.mark.parametrize("arch,chained", [("qwen3moe", 3), ("llama_moe", 3), ("olmoe", 3), ("qwen2moe", 3)])
@pytest.mark.parametrize("critical,kv_type", [(2, "f16"), ("auto", "f16"), ("k", "q8_0")])
def test_a_decode_token_through_the_chain_is_the_blocks_one_by_one(synth_models, arch, chained, critical, kv_type):
    chain_matches_blocks(synth_models(arch, critical, kv_type), chained, critical)


# critical experts from the source file's own tensors (qwen2moe: beside a gated shared expert)
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
@pytest.mark.parametrize("critical", [2, "k"])
def test_the_chain_with_critical_experts_from_the_source_is_the_blocks_one_by_one(synth_models, arch, critical):
    m = synth_models(arch, critical, source=True)
    assert all(e.source is not None and e.gate_r is None for e in m.runner.split_layers())
    chain_matches_blocks(m, 3, critical)


def chain_matches_blocks(m, chained, critical):
    R = m.runner
    toks = [3, 17, 5, 9, 40, 2, 11]
    chain, blocks = R.new_cache(32), R.new_cache(32)
    R.prefill(toks[:3], 0, chain)
    R.prefill(toks[:3], 0, blocks)
    rs = set()
    for pos in range(3, len(toks)):
        logits, trace = R.decode(toks[pos], pos, chain)
        want, st = block_by_block(R.net, toks[pos], pos, blocks, R.policy)
        assert torch.equal(logits, want)  # the same kernels in the same order
        assert sorted(trace.r) == sorted(st.r) and sorted(trace.ids) == sorted(st.ids)
        for il in st.r:
            assert np.array_equal(trace.r[il], st.r[il]) and np.array_equal(trace.ids[il], st.ids[il])
            rs.add(int(trace.r[il][0]))
    # the chain ran the blocks it can (one call for the whole run), and wrote the same cache
    assert sum(len(c.blocks) for c in R.net._chains.get(chain, {}).values()) == chained
    for il in range(m.cfg.n_layer):
        assert torch.equal(chain.k[il].data, blocks.k[il].data) and torch.equal(chain.v[il].data, blocks.v[il].data)
    if critical == 2:
        assert rs == {2}
    elif critical == "k":
        assert rs == {m.cfg.n_expert_used}


def test_the_chain_refuses_what_it_cannot_run(synth_models):
    m = synth_models("qwen3moe", 2)
    R = m.runner
    cache = R.new_cache(32)
    blocks = R.net.blocks
    op = kernels.decode_chain()
    with pytest.raises(ValueError, match="no blocks"):
        op.run(np.zeros(m.cfg.n_embd, np.float32), 0, 2, np.zeros(0), 0.0, 0, 0)
    for b in blocks:
        args = {**b.attn.chain_args(cache), **b.ffn.chain_args(), "gate_r": None, "up_r": None, "down4": None}
        op.add(attn_norm=b.attn_norm.numpy(), ffn_norm=b.ffn_norm.numpy(), eps=b.eps, **args)
    x = np.ones(m.cfg.n_embd, np.float32)
    out, ids, w, r = op.run(x, 0, 0, np.zeros(len(blocks)), 0.0, 0, 0)  # r = 0 needs no residual
    assert out.shape == x.shape and np.isfinite(out).all() and list(r) == [0] * len(blocks)
    with pytest.raises(ValueError, match="residuals"):
        op.run(x, 1, 2, np.zeros(len(blocks)), 0.0, 0, 0)
    with pytest.raises(ValueError, match="position past the cache"):
        op.run(x, 32, 0, np.zeros(len(blocks)), 0.0, 0, 0)
    with pytest.raises(ValueError, match="width"):
        op.run(x[:-1], 1, 0, np.zeros(len(blocks)), 0.0, 0, 0)
    with pytest.raises(ValueError, match="ab per block"):
        op.run(x, 1, -1, np.zeros(1), 0.0, 0, 2)
    b = blocks[0]
    with pytest.raises(ValueError, match="RoPE tables"):
        op.add(attn_norm=b.attn_norm.numpy(), ffn_norm=b.ffn_norm.numpy(), eps=b.eps,
               **{**b.attn.chain_args(cache), "cos": b.attn.rope.cos[0].numpy()}, **b.ffn.chain_args())
