"""The decode attention kernel (csrc/cpu/attn/attn.cpp) against the torch path it replaces
(engine/models/common.py: rms_norm, Rope, attend) on odd shapes."""
import numpy as np
import pytest
import torch

from isa_paths import run_on_path

from rapidmoe.engine import kernels
from rapidmoe.engine.models.common import Rope, attend, rms_norm


class Cfg:
    def __init__(self, rope_dim, style):
        self.rope_dim, self.rope_style, self.rope_base, self.rope_freq_scale = rope_dim, style, 10000.0, 1.0


@pytest.mark.parametrize("n_head,n_kv,hd,hdv,rope_dim,style,norm,pos", [
    (4, 2, 16, 16, 16, "neox", True, 0),
    (6, 3, 24, 40, 24, "norm", False, 5),
    (8, 1, 20, 20, 12, "neox", False, 37),   # partial rotary dims
    (5, 5, 8, 8, 8, "norm", True, 300),      # no GQA, contexts long enough to split heads over threads
    (32, 4, 128, 128, 128, "neox", True, 700),
])
def test_attn_decode_matches_torch_path(n_head, n_kv, hd, hdv, rope_dim, style, norm, pos):
    rng = np.random.default_rng(pos)
    n_ctx = pos + 3
    rope = Rope(Cfg(rope_dim, style), n_ctx)
    q = rng.standard_normal(n_head * hd).astype(np.float32)
    k = rng.standard_normal(n_kv * hd).astype(np.float32)
    v = rng.standard_normal(n_kv * hdv).astype(np.float32)
    qn = (rng.random(hd) + 0.5).astype(np.float32) if norm else None
    kn = (rng.random(hd) + 0.5).astype(np.float32) if norm else None
    kc = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float32)
    vc = rng.standard_normal((n_ctx, n_kv, hdv)).astype(np.float32)
    kc[pos:] = vc[pos:] = 7.0  # stale rows: pos must be overwritten, later ones never read
    scale, eps = 0.3, 1e-6

    # reference: the torch path of engine/models/base.py Attention for one token
    tq, tk = torch.from_numpy(q).view(1, n_head, hd), torch.from_numpy(k).view(1, n_kv, hd)
    if norm:
        tq, tk = rms_norm(tq, torch.from_numpy(qn), eps), rms_norm(tk, torch.from_numpy(kn), eps)
    tq, tk = rope(tq, pos), rope(tk, pos)
    kref, vref = torch.from_numpy(kc.copy()), torch.from_numpy(vc.copy())
    kref[pos], vref[pos] = tk[0], torch.from_numpy(v).view(n_kv, hdv)
    want = attend(tq, kref[:pos + 1], vref[:pos + 1], pos, scale).numpy().reshape(-1)

    # the kernels keep each head's rows together: [n_kv, n_ctx, hd]
    kc, vc = np.ascontiguousarray(kc.transpose(1, 0, 2)), np.ascontiguousarray(vc.transpose(1, 0, 2))
    out = kernels.attn_decode(q.copy(), k.copy(), v, kc, vc, pos, n_head, rope.cos[pos].numpy(), rope.sin[pos].numpy(),
                              rope_dim, style == "neox", qn, kn, eps, scale)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kc[:, pos], kref[pos].numpy(), rtol=1e-6, atol=1e-6)  # the cache row, in place
    np.testing.assert_array_equal(vc[:, pos], v.reshape(n_kv, hdv))
    assert (kc[:, pos + 1:] == 7.0).all() and (vc[:, pos + 1:] == 7.0).all()


def test_attn_decode_rejects_bad_input():
    kc = np.zeros((2, 4, 8), np.float32)  # 2 KV heads, 4 positions
    vc = np.zeros((2, 4, 8), np.float32)
    cs = np.ones(4, np.float32)
    args = dict(q=np.zeros(32, np.float32), k=np.zeros(16, np.float32), v=np.zeros(16, np.float32), kc=kc, vc=vc,
                pos=1, n_head=4, cos=cs, sin=cs, rope_dim=8, neox=True, q_norm=None, k_norm=None, eps=1e-6, scale=1.0)
    with pytest.raises(ValueError, match="shapes"):
        kernels.attn_decode(**dict(args, pos=4))  # past the cache
    with pytest.raises(ValueError, match="shapes"):
        kernels.attn_decode(**dict(args, n_head=3))
    with pytest.raises(ValueError, match="k cache"):
        kernels.attn_decode(**dict(args, kc=kc[:, :, ::2].copy().astype(np.float64)))
    with pytest.raises(ValueError, match="v cache"):
        kernels.attn_decode(**dict(args, vc=np.zeros((2, 8, 4), np.float32).transpose(0, 2, 1)))  # a view, not in place


def test_attn_decode_scalar_path():
    # the portable loops (no AVX2) against the same reference, in a process forced to scalar
    run_on_path("test_attn_decode", "t.test_attn_decode_matches_torch_path(6, 3, 24, 40, 24, 'norm', True, 300); "
                "t.test_attn_decode_matches_torch_path(8, 1, 20, 20, 12, 'neox', False, 37)", timeout=120)
