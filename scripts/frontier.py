"""The accuracy-latency frontier of one model on this machine: fixed r = 0..k
against UMIA (`--critical auto`, the model's calibrated profile), each with
KL / top-1 flip rate against full precision (the source weights) on held-out
text and decode tokens/s.

    python scripts/frontier.py -m bench --threads 2 --budgets 1.15,1.25
    python scripts/frontier.py -m demo --threads 2 --budgets default,1.25

KL is the divergence against the full-precision logits of the same tokens (as
`eval --kl-base` computes it), on tokens of assets/calibration.txt after the part
calibrate reads. Every setting's logits come from decode steps, one token at a
time, so they carry the decode kernels' numerics (prefill runs other kernels);
UMIA is scored with its decode-phase profile, as a generated token sees it. The
prefill-phase figure, what `eval --critical auto` reports (one batched forward),
is printed too.
Decode speed: whole decode steps of every setting interleaved round by round in
one process, so that load from other processes on a shared machine falls on all
settings alike; a low percentile of the step times is kept.
--budgets runs `calibrate --budget B` for each B ("default": the uncalibrated
profile); the last one stays cached.
--kl-base M also scores every setting against model M's full-precision logits
(same tokenizer): for a pack made from a quantized file, the weights that file
was quantized from (`-m <bench Q4_K_M> --kl-base bench`). The verdict is the one
against the file run (-m): what UMIA is measured against is what the user loads;
the base figures are printed for context.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from rapidmoe.engine import kernels  # noqa: E402
from rapidmoe.engine.plan.calibration import calibration_path, load_profile, read_calibration  # noqa: E402
from rapidmoe.engine.tune.calibrate import calibration_text  # noqa: E402
from rapidmoe.engine.tune.evaluate import all_logits, divergence  # noqa: E402
from rapidmoe.engine.loader import load_model, resolve_model_path  # noqa: E402
from rapidmoe.engine.moe.resplit import FixedCritical  # noqa: E402
from rapidmoe.engine.moe.umia import UmiaPolicy, default_profile  # noqa: E402

CLI = [sys.executable, "-m", "rapidmoe.app.cli"]


def held_out_tokens(model, offset: int, n: int) -> list[int]:
    toks = model.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)
    if len(toks) < offset + n:
        raise SystemExit(f"the calibration text has {len(toks)} tokens: lower --offset or --tokens")
    return toks[offset:offset + n]


def decode_logits(model, toks, policy) -> np.ndarray:
    """Logits after each token, the tokens fed one decode step at a time."""
    cache = model.runner.new_cache(len(toks))
    return np.stack([model.runner.decode(t, i, cache, policy)[0].numpy() for i, t in enumerate(toks)])


def kl(model, policy, toks, bases: dict, decode: bool = True) -> dict:
    """KL and top-1 flip rate of one setting against each base: {"kl", "flip", "kl_<base>", ...}."""
    lg = decode_logits(model, toks, policy) if decode else all_logits(model, toks, policy=policy)
    out = {}
    for suffix, base in bases.items():
        d = divergence(base, lg)
        out[f"kl{suffix}"], out[f"flip{suffix}"] = d.kl_mean, 1.0 - d.top1
    return out


def model_path(name: str):
    if name == "bench":
        from rapidmoe.engine.tune.bench import bench_model_path

        return bench_model_path()
    return resolve_model_path(name)


def decode_speeds(model, policies: dict, toks, rounds: int, pct: float) -> dict:
    """name -> (tokens/s, mean r): decode steps of all settings interleaved."""
    rng = np.random.default_rng(0)
    caches = {n: model.runner.new_cache(rounds + 1) for n in policies}
    times = {n: [] for n in policies}
    rs = {n: [] for n in policies}
    for pos in range(rounds + 1):
        for n in rng.permutation(list(policies)):
            t0 = time.perf_counter()
            trace = model.runner.decode(toks[pos], pos, caches[n], policies[n])[1]
            if pos:  # position 0 warms up
                times[n].append(time.perf_counter() - t0)
                rs[n].append(trace.mean_r)
    return {n: (1.0 / float(np.percentile(times[n], pct)), float(np.mean(rs[n]))) for n in policies}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="held-out tokens for KL")
    ap.add_argument("--offset", type=int, default=1024, help="where the held-out tokens start")
    ap.add_argument("--rounds", type=int, default=128, help="decode steps per setting for the speed")
    ap.add_argument("--pct", type=float, default=20, help="percentile of step times kept (a shared machine)")
    ap.add_argument("--budgets", default="", help="'default' and/or calibrate budgets, comma-separated")
    ap.add_argument("--kl-base", default=None, help="also score against this model's full-precision logits")
    ap.add_argument("--json", type=str, default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    kernels.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    path = model_path(args.model)
    full = load_model(path, n_ctx=args.tokens)
    toks = held_out_tokens(full, args.offset, args.tokens)
    log(f"full-precision logits over {len(toks)} held-out tokens ...")
    bases = {"": all_logits(full, toks)}
    del full
    if args.kl_base:
        other = load_model(model_path(args.kl_base), n_ctx=args.tokens)
        if held_out_tokens(other, args.offset, args.tokens) != toks:
            raise SystemExit("--kl-base must share the model's tokenizer")
        log(f"full-precision logits of {other.path.name} ...")
        bases["_base"] = all_logits(other, toks)
        del other
    # profiles first: calibrate runs in its own process and must not share the CPU with timing
    umia = {}
    for b in [x.strip() for x in args.budgets.split(",") if x.strip()] or ["cached"]:
        m0 = load_model(path, n_ctx=32)
        if b == "default":
            umia["auto (default profile)"] = default_profile(m0.cfg, m0.metadata)
            continue
        if b != "cached":
            log(f"calibrate --budget {b} ...")
            subprocess.run([*CLI, "calibrate", "-m", str(path), "--budget", b, "--threads", str(args.threads)],
                           check=True, stdout=sys.stderr)
        prof = load_profile(path, m0.cfg) if read_calibration(path) else default_profile(m0.cfg, m0.metadata)
        rec = read_calibration(path)
        umia[f"auto (budget {rec['budget']:g})" if rec else "auto (default profile)"] = prof
    model = load_model(path, n_ctx=max(args.tokens, args.rounds + 1), critical="k")
    k = model.cfg.n_expert_used
    rows = {}
    for r in range(k + 1):
        rows[f"r={r}"] = kl(model, FixedCritical(r), toks, bases)
        log(f"  r={r}: KL {rows[f'r={r}']['kl']:.5f}")
    for name, prof in umia.items():
        d = kl(model, UmiaPolicy(prof, k, phase="decode"), toks, bases)
        p = kl(model, UmiaPolicy(prof, k), toks, bases, decode=False)
        rows[name] = {**d, "kl_prefill_phase": p["kl"], "flip_prefill_phase": p["flip"], "profile": prof.to_json()}
        log(f"  {name}: KL {d['kl']:.5f} (decode phase), {p['kl']:.5f} (prefill phase)")
    log(f"decode speed: {args.rounds} steps per setting, interleaved ...")
    pols = {**{f"r={r}": FixedCritical(r) for r in range(k + 1)}, **{n: UmiaPolicy(p, k) for n, p in umia.items()}}
    for n, (tps, mr) in decode_speeds(model, pols, toks, args.rounds, args.pct).items():
        rows[n].update(tok_s=tps, mean_r=mr)
    out = [{"setting": n, **v} for n, v in rows.items()]
    table(out, k, path.name, args.threads, calibration_path(path), model_path(args.kl_base).name if args.kl_base else None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def dominated_by(row, fixed_rows, key="kl") -> str:
    for f in fixed_rows:
        if (f["tok_s"] >= 1.05 * row["tok_s"] and f[key] <= row[key]) or \
           (f[key] <= row[key] / 1.05 and f["tok_s"] >= row["tok_s"]):
            return f["setting"]
    return "-"


def table(rows, k, name, threads, cal_path, base_name=None) -> None:
    ref = rows[k]
    keys = [("", "source")] + ([("_base", "base")] if base_name else [])
    print(f"{name}, CPU, {threads} threads; KL / flip vs full precision on held-out text (auto: decode-phase "
          f"profile); decode speed vs r=k")
    print(f"full precision: source = {name}" + (f", base = {base_name}" if base_name else ""))
    head = "".join(f" {'KL ' + label:>10} {'/KL(k)':>7} {'flip':>7}" for _, label in keys)
    print(f"{'setting':<24} {'mean r':>6}{head} {'tok/s':>7} {'vs r=k':>7} {'dominated by':>12}")
    for r in rows:
        dom = dominated_by(r, rows[:k + 1]) if r["setting"].startswith("auto") else ""
        cols = "".join(f" {r['kl' + sx]:10.5f} {r['kl' + sx] / ref['kl' + sx]:7.2f} {r['flip' + sx] * 100:6.2f}%"
                       for sx, _ in keys)
        print(f"{r['setting']:<24} {r['mean_r']:6.2f}{cols} {r['tok_s']:7.2f} {r['tok_s'] / ref['tok_s']:6.2f}x {dom:>12}")
    for r in rows[k + 1:]:
        print(f"{r['setting']}: eval-style (prefill-phase profile) KL {r['kl_prefill_phase']:.5f}, flip "
              f"{r['flip_prefill_phase'] * 100:.2f}%")
        for sx, label in keys:
            ok = r["kl" + sx] <= 1.2 * ref["kl" + sx] and r["tok_s"] >= 1.15 * ref["tok_s"]
            # the file the user runs is the one that counts; the weights it was quantized
            # from are context (how far the pack is from them, not from what it replaces)
            what = "VERDICT, against the file run" if not sx else "for context, against the base weights"
            print(f"  {what} ({label}): not dominated: {dominated_by(r, rows[:k + 1], 'kl' + sx) == '-'}; "
                  f"KL <= 1.2 x KL(k) at >= 1.15 x the r=k speed: {ok}")
    print(f"calibration: {cal_path}")


if __name__ == "__main__":
    raise SystemExit(main())
