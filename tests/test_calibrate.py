"""calibrate: the budget search on a hand-written latency model, the cached
record end to end on a tiny model (the file `auto` and the planner read), the CLI."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rapidmoe.engine.plan.calibration import CALIB_VERSION, calibration_path, load_profile
from rapidmoe.engine.tune.calibrate import (
    Calibrator,
    _fit_threshold,
    _predicted,
    calibrate,
    calibration_text,
    candidate_profiles,
    fixed_choose,
    fixed_fit,
    layer_sensitivity,
    sensitivity_alphas,
)
from rapidmoe.engine.tune.latency import LatencyModel, decode_points, line, split_decode
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.moe.umia import UmiaProfile
from rapidmoe.engine.synth.model import write_synthetic

K = 8
# decode: 1 ms per layer at r = 0, +0.25 ms per critical expert; 4 ms of attention etc.
LAT = LatencyModel(tuple(1e-3 + 0.25e-3 * r for r in range(K + 1)), tuple(2e-4 + 1e-4 * r for r in range(K + 1)),
                   4e-3, 4, 2)


def _weights(seed=0, n=500):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 32)) * 2.0
    p = np.exp(z - z.max(1, keepdims=True))
    w = -np.sort(-p, axis=1)[:, :K]
    return {il: (w / w.sum(1, keepdims=True)).astype(np.float32) for il in range(4)}


def test_latency_model_arithmetic():
    assert LAT.fixed_time(0, False) == pytest.approx(4e-3 + 4e-3)
    assert LAT.fixed_time(K, False) == pytest.approx(4e-3 + 4 * 3e-3)
    r = [np.array([0, 8]), np.array([2, 2]), np.array([1, 1]), np.array([0, 0])]
    assert LAT.token_time(r, False) == pytest.approx(4e-3 + 2e-3 + 1.5e-3 + 1.25e-3 + 1e-3)
    assert LatencyModel.from_json(json.loads(json.dumps(LAT.to_json()))) == LAT


def test_decode_line_from_whole_steps():
    """Decode's cost per critical expert is the slope of whole steps; the kernel's own
    per-layer time only splits the intercept, so fixed_time reproduces the steps."""
    assert decode_points(8) == [0, 2, 4, 6, 8] and decode_points(2) == [0, 1, 2] and decode_points(1) == [0, 1]
    pts = decode_points(K)
    steps = [8e-3 + 1e-3 * r + (2e-5 if r == 4 else 0.0) for r in pts]  # a little noise at r = 4
    a, b = line(pts, steps)
    assert a == pytest.approx(8e-3 + 4e-6) and b == pytest.approx(1e-3)
    R, other = split_decode(a, b, 1e-3, 4, K)
    lat = LatencyModel(tuple(R), tuple(R), other, 4, 2)
    assert other == pytest.approx(a - 4e-3)
    for r in range(K + 1):
        assert lat.fixed_time(r, False) == pytest.approx(a + b * r)
    R, other = split_decode(a, b, 5e-3, 4, K)  # a kernel slower alone than in the step: nothing left outside
    assert other == 0.0 and 4 * R[0] == pytest.approx(a)
    assert line([0, 1, 2], [3.0, 2.0, 1.0]) == (2.0, 0.0)  # never a negative cost per expert


def test_threshold_fit_spends_the_budget_and_no_more():
    w = _weights()
    base = UmiaProfile((1.2, 1.1, 0.9, 0.8), 1.0, 1.0, 1.0, 0, K)
    budget = 1.25 * LAT.fixed_time(1, False)
    th = _fit_threshold(LAT, base, w, K, False, budget)
    at = lambda t: _predicted(LAT, UmiaProfile(base.alpha, 1.0, 1.0, t, 0, K), w, K, False)  # noqa: E731
    assert at(th) <= budget < at(th * 0.97)  # tight: a little lower θ breaks the budget
    # a budget that r = k meets: θ just under the smallest score, not an arbitrary tiny number
    th_all = _fit_threshold(LAT, base, w, K, False, 1.0)
    smallest = min(float(w[il].min()) * base.alpha[il] for il in w)
    assert 0.98 * smallest < th_all < smallest and at(th_all) == pytest.approx(LAT.fixed_time(K, False))
    assert fixed_fit(LAT, K, 1.25) == max(r for r in range(K + 1) if LAT.fixed_time(r, False) <= budget) == 3
    for name, prof in candidate_profiles(LAT, w, 4, K, 1.25):
        assert _predicted(LAT, prof, w, K, False) <= budget + 1e-12, name
        as_decode = UmiaProfile(prof.alpha, 1.0, 1.0, prof.theta, prof.r_min, K)
        t_pre = _predicted(LAT, prof, w, K, True)
        assert prof.beta_prefill >= 1.0 and t_pre <= 1.25 * _predicted(LAT, as_decode, w, K, True) + 1e-12, name
        assert prof.alpha[0] >= prof.alpha[-1] and prof.r_max == K


def test_sensitivity_alphas_are_the_square_root_rule():
    """α ∝ √s (power 1) or its square root (power 0.5), largest 1; layers without
    routed experts take the next MoE layer's value."""
    got = dict(sensitivity_alphas({1: 4.0, 3: 1.0}, 4, powers=(1.0, 0.5)))
    assert got["sensitivity^1"] == pytest.approx([1.0, 1.0, 0.5, 0.5])
    assert got["sensitivity^0.5"] == pytest.approx([1.0, 1.0, 0.5 ** 0.5, 0.5 ** 0.5])
    # measured α's become candidates like the smooth ones: within budget, θ fitted
    w = _weights()
    alphas = sensitivity_alphas({0: 9.0, 1: 4.0, 2: 1.0, 3: 1.0}, 4)
    cands = dict(candidate_profiles(LAT, w, 4, K, 1.25, slopes=(), alphas=alphas))
    assert sorted(cands) == ["umia sensitivity^0.5 r_min=0", "umia sensitivity^0.5 r_min=1",
                             "umia sensitivity^1 r_min=0", "umia sensitivity^1 r_min=1"]
    prof = cands["umia sensitivity^1 r_min=0"]
    assert prof.alpha == pytest.approx((1.0, 2 / 3, 1 / 3, 1 / 3))
    assert _predicted(LAT, prof, w, K, False) <= 1.25 * LAT.fixed_time(1, False) + 1e-12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("cal") / "m.gguf", "qwen3moe", seed=6, dtype="f16", n_layer=2)


def test_calibrate_writes_the_record_auto_and_the_planner_read(tiny):
    rec = calibrate(tiny, n_tokens=64, seg_len=32, budget=1.25, slopes=(0.0, 2.8))
    path = calibration_path(tiny)
    assert path.parent.name == "calibration" and json.loads(path.read_text()) == json.loads(json.dumps(rec))
    assert rec["version"] == CALIB_VERSION and rec["n_tokens"] == 64 and rec["k"] == 4
    # expert activations: every token routes to k experts in every MoE layer
    freq = np.asarray(rec["expert_frequency"])
    assert freq.shape == (2, 8) and (freq.sum(1) == 64 * 4).all()
    m = load_model(tiny, n_ctx=32, critical="k")
    toks = m.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)[:64]
    want = np.zeros((2, 8), np.int64)
    for s in range(0, 64, 16):  # the same chunks calibrate runs: 16 prefill + 16 decode per segment
        if s % 32 == 0:
            cache = m.runner.new_cache(32)
        trace = m.runner.prefill(toks[s:s + 16], s % 32, cache)[1]
        for il, ids in trace.ids.items():
            want[il] += np.bincount(ids.reshape(-1), minlength=8)
    np.testing.assert_array_equal(freq, want)
    # the pick: lowest KL among the candidates within the decode budget (3% grace)
    ok = [c for c in rec["candidates"] if c["decode_s"] <= 1.03 * rec["budget"] * rec["fixed"][1]["decode_s"]]
    chosen = next(c for c in rec["candidates"] if c["name"] == rec["chosen"])
    assert ok and chosen["kl_mean"] == min(c["kl_mean"] for c in ok)
    for c in rec["candidates"]:
        assert c["kl_mean"] >= 0 and 0 <= c["flip_rate"] <= 1 and 0 <= c["mean_r_decode"] <= 4
        if c["name"] == "fixed r=4":
            assert c["kl_mean"] == 0 and c["flip_rate"] == 0  # r = k again: the reference, bit for bit
    assert sorted(rec["sensitivity"]) == ["0", "1"]
    named = {c["name"]: c["profile"]["alpha"] for c in rec["candidates"]}
    for name, alpha in sensitivity_alphas({int(il): s for il, s in rec["sensitivity"].items()}, 2):
        assert named[f"umia {name} r_min=0"] == pytest.approx(alpha)
    lat = rec["latency"]
    assert len(lat["decode_layer_s"]) == 5 and all(t > 0 for t in lat["decode_layer_s"])
    prof = load_profile(tiny, m.cfg)
    assert prof.source == "calibrated" and prof.to_json() == rec["profile"]
    assert load_model(tiny, n_ctx=32, critical="auto").policy.profile == prof


def test_calibrate_times_the_step_the_plan_runs(tiny, tmp_path, monkeypatch, capsys):
    """On a GPU plan (the stand-in GPU) the latency model comes from whole GPU steps
    and the record names the plan; `auto` on that plan takes the profile silently,
    on another plan with a note. `calibrate --mode cpu` times the CPU step."""
    from rapidmoe.app.cli import main
    from rapidmoe.engine.plan.planner import PlanRequest

    monkeypatch.setenv("RAPIDMOE_STANDIN_GPU", "24")
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path / "cache"))  # tiny's own record stays as it is
    src = tmp_path / "g.gguf"
    src.write_bytes(tiny.read_bytes())
    rec = calibrate(src, n_tokens=32, seg_len=32, slopes=(1.0,))
    assert rec["mode"] == "gpu-residual" and rec["placement"].startswith("stand-in GPU 0: ")
    dec, pre = rec["latency"]["decode_layer_s"], rec["latency"]["prefill_layer_s"]
    for v in (dec, pre):  # a line in r through whole steps, shared by the layers
        assert len(v) == 5 and min(v) > 0 and np.diff(v).min() >= 0
        np.testing.assert_allclose(np.diff(v), v[-1] - v[-2], rtol=1e-6, atol=2e-9)  # R(0) >= 1e-9
    assert rec["latency"]["n_moe_layers"] == 2
    notes: list[str] = []
    m = load_model(src, n_ctx=32, critical="auto", log=notes.append)
    assert m.plan.mode == "gpu-residual" and m.policy.profile.to_json() == rec["profile"]
    assert not any("calibrated on" in n for n in notes), notes
    m = load_model(src, n_ctx=32, critical="auto", log=notes.append, placement=PlanRequest(mode="cpu"))
    assert m.policy.profile.to_json() == rec["profile"]
    assert any("calibrated on a gpu-residual plan, this one is cpu" in n for n in notes), notes

    args = ["calibrate", "-m", str(src), "--tokens", "32", "--segment", "32"]
    assert main([*args, "--mode", "cpu", "--json"]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert cpu["mode"] == "cpu" and cpu["placement"] == load_model(src, n_ctx=32, critical="k",
                                                                   placement=PlanRequest(mode="cpu")).placement
    assert main(["calibrate", "-m", str(src), "--show"]) == 0
    assert f"timed on: {cpu['placement']}" in capsys.readouterr().out


def test_layer_sensitivity_per_layer_and_grouped(tiny):
    m = load_model(tiny, n_ctx=32, critical="k")
    toks = m.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)[:64]
    cal = Calibrator(m, toks, 32)
    _, (w, _), _ = cal.run(fixed_choose(4), record=True)
    per = layer_sensitivity(cal, w, 4)
    assert sorted(per) == [0, 1] and all(np.isfinite(v) and v > 0 for v in per.values())
    # one group: both layers at r = k/2 in one pass, which is fixed r = 2 everywhere
    one = layer_sensitivity(cal, w, 4, groups=1)
    both, _, _ = cal.run(fixed_choose(2))
    dropped = sum(float((w[il][:, 2:].astype(np.float64) ** 2).sum(1).mean()) for il in (0, 1))
    assert one[0] == one[1] == pytest.approx(both.kl_mean / dropped)
    # a layer alone costs less than both together
    assert max(per[il] * float((w[il][:, 2:].astype(np.float64) ** 2).sum(1).mean()) for il in (0, 1)) < both.kl_mean


def test_calibration_is_keyed_by_the_content(tiny, tmp_path, monkeypatch):
    """As packs are: a copy of a model under another name or directory finds its
    original's record, a touched file keeps it, other content has its own."""
    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    copy.write_bytes(tiny.read_bytes())
    rec = calibration_path(tiny)
    assert rec.name.startswith("m.") and calibration_path(copy).name.startswith("renamed.")  # none yet: own names
    assert rec.name.split(".")[1] == calibration_path(copy).name.split(".")[1]  # one key
    rec.parent.mkdir(parents=True)
    rec.write_text("{}")
    assert calibration_path(copy) == rec
    os.utime(copy, ns=(1, 1))
    assert calibration_path(copy) == rec
    other = write_synthetic(tmp_path / "m.gguf", "qwen3moe", seed=7, dtype="f16", n_layer=2)
    assert calibration_path(other) != rec and not calibration_path(other).exists()


def test_cli(tiny, tmp_path, capsys):
    """In process (the subcommand's own code; test_cli covers the process door)."""
    from rapidmoe.app.cli import main

    calibrate(tiny, n_tokens=32, seg_len=32, slopes=(1.0,))
    assert main(["calibrate", "-m", str(tiny), "--show", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["n_tokens"] == 32 and set(rec["profile"]) == {"alpha", "beta", "theta", "r_min", "r_max"}
    assert main(["calibrate", "-m", str(tiny), "--show"]) == 0
    out = capsys.readouterr().out
    assert "profile: theta" in out and f"saved: {calibration_path(tiny)}" in out and f"*{rec['chosen']}" in out
    for bad, msg in ((["--budget", "0.5"], "budget"), (["--tokens", "16"], "--tokens"),
                     (["--segment", "7", "--tokens", "64"], "segment")):
        assert main(["calibrate", "-m", str(tiny), *bad]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
    copy = tmp_path / "n.gguf"  # the same model under another name: the same record
    copy.write_bytes(tiny.read_bytes())
    assert main(["calibrate", "-m", str(copy), "--show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == rec
    fresh = write_synthetic(tmp_path / "f.gguf", "qwen3moe", seed=8, dtype="f16", n_layer=2)
    assert main(["calibrate", "-m", str(fresh), "--show"]) == 2
    assert "no calibration" in capsys.readouterr().err


def test_cli_progress_is_plain_lines_off_a_terminal(tiny, tmp_path, capsys, monkeypatch):
    """stderr to a file or pipe (capsys here): one line per step, no bar redrawn with \\r."""
    from rapidmoe.app.cli import main

    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path / "cache"))  # packs are keyed by content: none here yet
    src = tmp_path / "p.gguf"
    src.write_bytes(tiny.read_bytes())
    assert main(["calibrate", "-m", str(src), "--tokens", "32", "--segment", "32"]) == 0
    cap = capsys.readouterr()
    assert "\r" not in cap.err and f"saved: {calibration_path(src)}" in cap.out
    lines = cap.err.splitlines()
    for step in ("convert", "load", "reference", "latency", "search 1/"):
        assert any(ln.startswith(step) and ln.endswith(" ...") for ln in lines), (step, cap.err)
    assert main(["calibrate", "-m", str(src), "--show", "--json"]) == 0
    assert capsys.readouterr().err == ""  # --json: stderr only for errors


def test_kill_9_in_calibrate_leaves_the_old_record_or_the_new_one(tiny, tmp_path, monkeypatch, capsys):
    """SIGKILL at every step of the record's commit while an older record is in
    place, and at seeded random points of the conversion a first calibrate makes,
    through `rapidmoe-chat calibrate` (the conversion's kill points,
    RAPIDMOE_FAULT_KILL_AT): the record is the old one or the new one, whole, never
    a part; the next run reads it, the one after replaces it and leaves no temp file."""
    import random
    import subprocess
    import sys

    from rapidmoe.app.cli import main
    from rapidmoe.engine import paths

    monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "k.gguf"
    src.write_bytes(tiny.read_bytes())
    path = calibration_path(src)

    def run():  # what the command below runs
        rec = calibrate(src, n_tokens=32, seg_len=32)
        assert json.loads(path.read_text()) == json.loads(json.dumps(rec))
        assert not list(path.parent.glob(".*.tmp"))

    before = paths._points
    run()  # the first: converts, then writes the record
    n_first = paths._points - before
    before = paths._points
    run()  # the pack is there now: the record's steps alone
    n_commit = paths._points - before
    # create, write, fsync, rename, directory fsync
    assert n_commit == 5 and n_first > n_commit + 10
    cli = [sys.executable, "-m", "rapidmoe.app.cli", "calibrate", "-m", str(src), "--tokens", "32", "--segment", "32"]

    def killed_at(k: int, env_cache=None):
        env = dict(os.environ, RAPIDMOE_FAULT_KILL_AT=str(k))
        if env_cache:
            env["RAPIDMOE_CACHE_DIR"] = str(env_cache)
        r = subprocess.run(cli, env=env, capture_output=True, timeout=300)
        assert r.returncode == -9, (k, r.stderr[-400:])

    stale = 0  # a killed run's temp file: the next run removes it first, one step more
    for k in range(1, n_commit + 1):
        old = path.read_bytes()
        killed_at(k + stale)
        now = path.read_bytes()
        if k < n_commit:  # up to the rename: the old record, and a temp file once it is created
            assert now == old, k
            stale = len(list(path.parent.glob(".*.tmp")))
            assert stale == (k > 1), k
        else:  # after it: the new record, whole
            assert json.loads(now)["version"] == CALIB_VERSION and not list(path.parent.glob(".*.tmp"))
        assert main(["calibrate", "-m", str(src), "--show", "--json"]) == 0  # the next run reads it
        assert json.loads(capsys.readouterr().out) == json.loads(now)
    killed_at(n_commit - 1)  # before the rename, a temp file left over ...
    run()  # ... which the next writing run removes

    # a first calibrate killed inside its conversion: the next run resumes and writes the record
    for i, k in enumerate(random.Random(5).sample(range(1, n_first - n_commit), 2)):
        cache = tmp_path / f"fresh{i}"
        killed_at(k, cache)
        monkeypatch.setenv("RAPIDMOE_CACHE_DIR", str(cache))
        assert not calibration_path(src).exists()
        path = calibration_path(src)
        run()
        assert not list(cache.rglob("*.partial")), k
