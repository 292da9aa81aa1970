"""The accuracy-latency frontier of one model on this machine: fixed r = 0..k
against UMIA (`--critical auto`, the model's calibrated profile), each with
KL / top-1 flip rate against full precision (the source weights) on held-out
text and decode tokens/s from `rapidmoe-chat bench` (fresh process per setting).

    python scripts/frontier.py -m bench --threads 2 --budgets 1.1,1.25
    python scripts/frontier.py -m demo --threads 2

KL is computed as `eval --kl-base` does (engine/evaluate.py: all_logits, then
divergence against the full-precision logits of the same tokens). The held-out
tokens are taken from assets/calibration.txt after the part calibrate reads.
--budgets runs `calibrate --budget B` for each B first and measures UMIA after
each; the last one stays cached.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

from rapidmoe.engine import kernels
from rapidmoe.engine.calibrate import calibration_text, read_calibration
from rapidmoe.engine.evaluate import all_logits, divergence
from rapidmoe.engine.model import load_model, resolve_model_path
from rapidmoe.engine.moe.resplit import FixedCritical

CLI = [sys.executable, "-m", "rapidmoe.app.cli"]


def held_out_tokens(model, offset: int, n: int) -> list[int]:
    toks = model.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)
    if len(toks) < offset + n:
        raise SystemExit(f"the calibration text has {len(toks)} tokens: lower --offset or --tokens")
    return toks[offset:offset + n]


def kl_rows(path, settings, toks, base) -> dict:
    """setting -> (KL mean, flip rate); fixed r shares one loaded pack."""
    out = {}
    m = load_model(path, n_ctx=len(toks), critical="k")
    for s in settings:
        if s == "auto":
            continue
        for e in m.net._split_experts():
            e.policy = FixedCritical(s)
        d = divergence(base, all_logits(m, toks))
        out[s] = (d.kl_mean, 1.0 - d.top1)
        print(f"  r={s}: KL {d.kl_mean:.5f}", file=sys.stderr, flush=True)
    return out


def kl_auto(path, toks, base) -> tuple[float, float, float, float]:
    """(KL, flip) as eval scores it (every token a prefill token), then with the
    decode phase's profile, as generated tokens see it: the pair that goes with
    decode speed."""
    m = load_model(path, n_ctx=len(toks), critical="auto")
    d = divergence(base, all_logits(m, toks))
    m.net._split_experts()[0].policy.phase = "decode"  # one policy object serves every layer
    dd = divergence(base, all_logits(m, toks))
    print(f"  auto: KL {d.kl_mean:.5f} (prefill phase), {dd.kl_mean:.5f} (decode phase)", file=sys.stderr, flush=True)
    return dd.kl_mean, 1.0 - dd.top1, d.kl_mean, 1.0 - d.top1


def speeds(path, settings, threads, n_gen, repeat) -> dict:
    """setting -> (best tg tok/s over the repeats, mean r of the decode)."""
    out: dict = {}
    crit = ",".join(str(s) for s in settings)
    for _ in range(repeat):
        r = subprocess.run([*CLI, "bench", "--json", "-m", str(path), "--critical", crit, "--threads", str(threads),
                            "-p", "16", "-n", str(n_gen)], stdout=subprocess.PIPE, text=True, check=True)
        for row in json.loads(r.stdout):
            if not row["test"].startswith("tg"):
                continue
            key = "auto" if row.get("policy") == "umia" else row["critical"]
            prev = out.get(key, (0.0, None))
            out[key] = (max(prev[0], row["tokens_per_s"]), row.get("mean_r"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="held-out tokens for KL")
    ap.add_argument("--offset", type=int, default=1024, help="where the held-out tokens start")
    ap.add_argument("--n-gen", type=int, default=32, help="decode tokens per bench run")
    ap.add_argument("--repeat", type=int, default=2, help="bench runs per setting (best kept: a shared machine)")
    ap.add_argument("--budgets", default="", help="calibrate with these budgets first (comma-separated)")
    ap.add_argument("--json", type=str, default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    kernels.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    if args.model == "bench":
        from rapidmoe.engine.bench import bench_model_path

        path = bench_model_path()
    else:
        path = resolve_model_path(args.model)
    full = load_model(path, n_ctx=args.tokens)
    k = full.cfg.n_expert_used
    toks = held_out_tokens(full, args.offset, args.tokens)
    print(f"full-precision logits over {len(toks)} held-out tokens ...", file=sys.stderr, flush=True)
    base = all_logits(full, toks)
    del full
    fixed = list(range(k + 1))
    kl = kl_rows(path, fixed, toks, base)
    sp = speeds(path, fixed, args.threads, args.n_gen, args.repeat)
    umia = []
    for b in [float(x) for x in args.budgets.split(",") if x] or [None]:
        if b is not None:
            print(f"calibrate --budget {b} ...", file=sys.stderr, flush=True)
            subprocess.run([*CLI, "calibrate", "-m", str(path), "--budget", str(b), "--threads", str(args.threads)],
                           check=True, stdout=sys.stderr)
        rec = read_calibration(path)
        s = speeds(path, ["auto"], args.threads, args.n_gen, args.repeat)["auto"]
        umia.append({"budget": rec["budget"] if rec else None, "source": "calibrated" if rec else "default",
                     "kl": kl_auto(path, toks, base), "tok_s": s[0], "mean_r": s[1]})
    rows = [{"setting": f"r={r}", "mean_r": float(r), "kl": kl[r][0], "flip": kl[r][1], "tok_s": sp[r][0]}
            for r in fixed]
    rows += [{"setting": f"auto ({u['source']}" + (f", budget {u['budget']:g})" if u["budget"] else ")"),
              "mean_r": u["mean_r"], "kl": u["kl"][0], "flip": u["kl"][1], "tok_s": u["tok_s"],
              "kl_prefill_phase": u["kl"][2], "flip_prefill_phase": u["kl"][3]} for u in umia]
    table(rows, k, path.name, args.threads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def dominated_by(row, fixed_rows) -> str:
    for f in fixed_rows:
        if (f["tok_s"] >= 1.05 * row["tok_s"] and f["kl"] <= row["kl"]) or \
           (f["kl"] <= row["kl"] / 1.05 and f["tok_s"] >= row["tok_s"]):
            return f["setting"]
    return "-"


def table(rows, k, name, threads) -> None:
    ref = rows[k]
    print(f"{name}, CPU, {threads} threads; KL / flip vs full precision (auto: its decode-phase profile); "
          f"decode speed vs r=k")
    print(f"{'setting':<30} {'mean r':>6} {'KL':>9} {'KL/KL(k)':>8} {'flip':>7} {'tok/s':>7} {'vs r=k':>7} {'dominated by':>12}")
    for r in rows:
        dom = dominated_by(r, rows[:k + 1]) if r["setting"].startswith("auto") else ""
        mr = f"{r['mean_r']:6.2f}" if r["mean_r"] is not None else f"{'-':>6}"
        print(f"{r['setting']:<30} {mr} {r['kl']:9.5f} {r['kl'] / ref['kl']:8.2f} {r['flip'] * 100:6.2f}% "
              f"{r['tok_s']:7.2f} {r['tok_s'] / ref['tok_s']:6.2f}x {dom:>12}")
    for r in rows[k + 1:]:
        print(f"{r['setting']}: as eval scores it (prefill-phase profile): KL {r['kl_prefill_phase']:.5f}, "
              f"flip {r['flip_prefill_phase'] * 100:.2f}%")
        ok = r["kl"] <= 1.2 * ref["kl"] and r["tok_s"] >= 1.15 * ref["tok_s"]
        print(f"{r['setting']}: not dominated: {dominated_by(r, rows[:k + 1]) == '-'}; "
              f"KL <= 1.2 x KL(k) at >= 1.15 x the r=k speed: {ok}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    raise SystemExit(main())
