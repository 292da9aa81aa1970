"""UMIA: the policy against a per-token oracle, the profile format, the default
profile on realistic and uniform routers, and `auto` through the engine."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rapidmoe.app.args import critical_arg, critical_setting
from rapidmoe.engine.errors import UserError
from rapidmoe.engine.plan.calibration import calibration_path
from rapidmoe.engine.hparams import config_from_metadata
from rapidmoe.engine.gguf.reader import GGUFFile
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.moe.umia import UmiaPolicy, UmiaProfile, critical_sizes, default_profile
from rapidmoe.engine.synth.model import write_synthetic


def oracle(profile: UmiaProfile, w: np.ndarray, layer: int, prefill: bool, k: int) -> np.ndarray:
    """The definition, one token and one expert at a time."""
    a = profile.alpha[layer]
    b = profile.beta_prefill if prefill else profile.beta_decode
    out = []
    for row in w:
        r = 0
        while r < len(row) and a * b * float(row[r]) > profile.theta:
            r += 1
        out.append(min(max(r, profile.r_min), profile.r_max, k))
    return np.array(out, dtype=np.int32)


def sorted_softmax_topk(rng, T: int, E: int, k: int, temp: float) -> np.ndarray:
    p = torch.softmax(torch.from_numpy(rng.standard_normal((T, E)) * temp), -1)
    w = p.topk(k, -1).values
    return (w / w.sum(-1, keepdim=True)).float().numpy()  # [T, k] descending, renormalised


@pytest.mark.parametrize("theta,r_min,r_max", [(0.1, 0, 8), (0.2, 1, 8), (0.05, 2, 5), (10.0, 0, 8), (0.0, 0, 3)])
def test_policy_matches_oracle(theta, r_min, r_max):
    rng = np.random.default_rng(1)
    prof = UmiaProfile((1.3, 1.0, 0.7), 1.2, 0.9, theta, r_min, r_max)
    w = sorted_softmax_topk(rng, 300, 32, 8, 1.5)
    pol = UmiaPolicy(prof, k=8)
    for layer in range(3):
        for prefill in (False, True):
            got = pol(torch.from_numpy(w), layer, prefill)
            assert got.dtype == np.int32 and got.shape == (300,)
            np.testing.assert_array_equal(got, oracle(prof, w, layer, prefill, 8))
            np.testing.assert_array_equal(got, pol(torch.from_numpy(w.copy()), layer, prefill))  # deterministic


def test_scores_scale_with_layer_and_phase():
    w = np.full((1, 16), 1 / 16, np.float32)  # a uniform router: only α and β can act
    prof = UmiaProfile((2.0, 1.0), 1.5, 1.0, 0.1, 0, 16)
    assert critical_sizes(prof, w, 0, False, 16)[0] == 16  # 2.0 / 16 > 0.1
    assert critical_sizes(prof, w, 1, False, 16)[0] == 0  # 1.0 / 16 < 0.1
    assert critical_sizes(prof, w, 1, True, 16)[0] == 0  # 1.5 / 16 < 0.1
    assert critical_sizes(prof, w, 1, True, 16)[0] == critical_sizes(prof, w, 1, True, 16)[0]
    prof2 = UmiaProfile((2.0, 1.0), 2.0, 1.0, 0.1, 0, 16)
    assert critical_sizes(prof2, w, 1, True, 16)[0] == 16  # 2.0 / 16 > 0.1
    # the forced phase of calibration overrides the batch shape
    pol = UmiaPolicy(prof2, 16, phase="decode")
    assert pol(torch.from_numpy(np.repeat(w, 4, 0)), 1, True).tolist() == [0] * 4


def test_profile_json_round_trip_and_validation():
    prof = UmiaProfile((1.0, 0.5), 1.25, 1.0, 0.19, 1, 8, "calibrated")
    assert UmiaProfile.from_json(json.loads(json.dumps(prof.to_json())), 2, 8) == prof
    assert UmiaProfile.from_json(prof.to_json(), 2, 4).r_max == 4  # clamped to this model's k
    good = prof.to_json()
    bad = [None, [], {**good, "alpha": [1.0]}, {**good, "alpha": [1.0, "x"]}, {**good, "theta": float("nan")},
           {**good, "theta": -1}, {**good, "beta": {"prefill": 1}}, {**good, "r_min": 3, "r_max": 2},
           {**good, "r_min": 1.5}, {**good, "alpha": [True, 1.0]}]
    for d in bad:
        with pytest.raises(ValueError):
            UmiaProfile.from_json(d, 2, 8)


def _cfg(path):
    return config_from_metadata(GGUFFile(path).metadata, str(path))


def test_default_profile_on_realistic_and_uniform_routers(tmp_path):
    rng = np.random.default_rng(2)
    src = write_synthetic(tmp_path / "m.gguf", "qwen3moe", seed=3, n_layer=4, n_expert=32, n_expert_used=8)
    prof = default_profile(_cfg(src))
    assert prof.source == "default" and len(prof.alpha) == 4 and prof.alpha[0] > prof.alpha[-1]
    # top-8 of 32 with a peaked softmax (w_1 ~ 0.2-0.5): a few experts per token, more in shallow layers
    w = sorted_softmax_topk(rng, 2000, 32, 8, 2.0)
    assert 0.2 < np.median(w[:, 0]) < 0.5
    deep = critical_sizes(prof, w, 3, False, 8).mean()
    shallow = critical_sizes(prof, w, 0, False, 8).mean()
    prefill = critical_sizes(prof, w, 3, True, 8).mean()
    assert 1.0 <= deep < shallow < 4.0 and deep < prefill < 4.0
    # a uniform router (16 of 16 experts at 1/16) carries no ranking: all stay critical
    demo_like = write_synthetic(tmp_path / "u.gguf", "qwen3moe", seed=3, n_layer=3, n_expert=16, n_expert_used=16)
    p16 = default_profile(_cfg(demo_like))
    uni = np.full((5, 16), 1 / 16, np.float32)
    for layer in range(3):
        for prefill in (False, True):
            assert critical_sizes(p16, uni, layer, prefill, 16).tolist() == [16] * 5


def test_a_model_file_carries_its_own_default_profile(tmp_path):
    """rapidmoe.umia.theta/alpha/beta (the demo's: critical while above 1/16) replace the
    built-in default when there is no calibration; anything but finite numbers >= 0 is
    ignored (the file is untrusted)."""
    src = write_synthetic(tmp_path / "u.gguf", "qwen3moe", seed=3, n_layer=3, n_expert=16, n_expert_used=16)
    cfg = _cfg(src)
    own = default_profile(cfg, {"rapidmoe.umia.theta": 1 / 16, "rapidmoe.umia.alpha": 1.0,
                                "rapidmoe.umia.beta": np.float32(1.0)})
    assert own.alpha == (1.0, 1.0, 1.0) and own.beta_prefill == own.beta_decode == 1.0
    assert own.theta == 1 / 16 and (own.r_min, own.r_max) == (1, 16)
    w = np.sort(np.array([[0.07] * 5 + [0.06] * 11, [0.1] + [0.06] * 15, [0.0625] * 16]), axis=1)[:, ::-1]
    for prefill in (False, True):
        assert critical_sizes(own, w, 2, prefill, 16).tolist() == [5, 1, 1]  # r_min = 1
    for bad in ({"rapidmoe.umia.theta": float("nan"), "rapidmoe.umia.alpha": 1.0, "rapidmoe.umia.beta": 1.0},
                {"rapidmoe.umia.theta": -1.0, "rapidmoe.umia.alpha": 1.0, "rapidmoe.umia.beta": 1.0},
                {"rapidmoe.umia.theta": "0.1", "rapidmoe.umia.alpha": 1.0, "rapidmoe.umia.beta": 1.0},
                {"rapidmoe.umia.theta": True, "rapidmoe.umia.alpha": 1.0, "rapidmoe.umia.beta": 1.0},
                {"rapidmoe.umia.theta": 0.1, "rapidmoe.umia.alpha": 1.0}):
        assert default_profile(cfg, bad) == default_profile(cfg)


def test_cli_accepts_auto_and_p_defaults_to_it():
    assert critical_arg("auto") == "auto" and critical_arg("3") == 3

    class A:
        precision = None
        critical = None

    assert critical_setting(A(), default_split=True) == "auto"
    assert critical_setting(A(), default_split=False) is None

    class Gpu(A):  # a GPU mode places the residual split: full precision is refused by its flags' names
        mode = "gpu-partial"

    assert critical_setting(Gpu(), default_split=True) == "auto"
    for precision, default_split in (("full", True), (None, False)):
        Gpu.precision = precision
        with pytest.raises(UserError, match=r"^--mode gpu-partial places the residual split: it needs --critical"):
            critical_setting(Gpu(), default_split=default_split)


def test_auto_through_the_engine_follows_the_cached_profile(tmp_path):
    """A profile that makes every expert critical gives r = k's logits exactly;
    one that makes none critical gives r = 0's; the default lies in between."""
    from rapidmoe.engine.plan.calibration import load_profile
    from rapidmoe.engine.moe.resplit import FixedCritical

    src = write_synthetic(tmp_path / "m.gguf", "qwen3moe", seed=4, dtype="f16", n_layer=2)
    toks = torch.arange(20, 36)
    m = load_model(src, n_ctx=32, critical="auto")
    assert m.critical == "auto"
    pol = m.policy
    assert isinstance(pol, UmiaPolicy) and pol.profile.source == "default"
    traces = []

    def logits(policy):
        out, trace = m.runner.prefill(toks, 0, m.runner.new_cache(32), policy)
        traces.append(trace)
        return out.numpy()

    l_default = logits(pol)
    assert all(1 <= r <= 4 for r in traces[-1].critical)
    l_k, l_0 = logits(FixedCritical(4)), logits(FixedCritical(0))
    assert not np.array_equal(l_k, l_0)
    path = calibration_path(src)
    path.parent.mkdir(parents=True, exist_ok=True)
    for theta, want in ((0.0, l_k), (1e9, l_0)):
        path.write_text(json.dumps({"version": 1, "profile": UmiaProfile((1.0,) * 2, 1.0, 1.0, theta, 0, 4).to_json()}))
        prof = load_profile(src, m.cfg)
        assert prof.source == "calibrated" and prof.theta == theta
        np.testing.assert_array_equal(logits(UmiaPolicy(prof, 4)), want)
    m2 = load_model(src, n_ctx=32, critical="auto")  # the engine reads the cached profile itself
    np.testing.assert_array_equal(m2.runner.prefill(toks, 0, m2.runner.new_cache(32))[0].numpy(), l_0)
    path.write_text("{not json")  # damaged: the default profile again
    assert load_profile(src, m.cfg).source == "default"
    np.testing.assert_array_equal(logits(UmiaPolicy(load_profile(src, m.cfg), 4)), l_default)


def test_bench_rows_carry_the_policy_and_mean_r(tmp_path, capsys):
    from rapidmoe.app.cli import main
    from rapidmoe.app.cmd_bench import _table

    src = write_synthetic(tmp_path / "b.gguf", "qwen3moe", seed=8, dtype="f16", n_layer=2)
    rows = []
    for setting in ("auto", "2"):
        assert main(["bench", "--one", "-m", str(src), "--critical", setting, "-p", "8", "-n", "4",
                     "--threads", "1", "--bandwidth", "10.0"]) == 0
        rows += json.loads(capsys.readouterr().out)
    auto, fixed = [r for r in rows if r["policy"] == "umia"], [r for r in rows if r["policy"] == "fixed"]
    assert len(auto) == len(fixed) == 2 and all(r["critical"] == "auto" for r in auto)
    assert all(r["mean_r"] == 2.0 for r in fixed)
    assert all(0.0 <= r["mean_r"] <= 4.0 for r in auto)
    _table(rows)
    lines = capsys.readouterr().out.splitlines()
    assert sum(" auto " in ln for ln in lines) == 2 and sum(" r=2 " in ln for ln in lines) == 2


def test_eval_takes_critical_auto(tmp_path, capsys):
    from rapidmoe.app.cli import main

    src = write_synthetic(tmp_path / "e.gguf", "qwen3moe", seed=9, dtype="f16", n_layer=2)
    outs = {}
    for crit in ("auto", "0", "4"):
        assert main(["eval", "-m", str(src), "--prompt", "The quick brown fox jumps over the lazy dog.",
                     "--critical", crit, "--json"]) == 0
        outs[crit] = json.loads(capsys.readouterr().out)["ppl"]
    assert outs["auto"] != outs["0"] and all(np.isfinite(v) for v in outs.values())
    assert main(["eval", "-m", str(src), "--prompt", "x y", "--critical", "most"]) == 2  # one line: the reason
    err = capsys.readouterr().err
    assert "'auto'" in err and err.count("\n") == 1
