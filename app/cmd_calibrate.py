"""`rapidmoe-chat calibrate -m PATH`: fit UMIA's profile (which experts get the
residual, per token, layer and phase) to this model on this machine; `--critical
auto` then uses it. Progress on stderr; --json prints the cached record."""
from __future__ import annotations

import argparse
import contextlib
import io
import json

from ..engine.errors import UserError
from .args import add_placement_arguments, add_threads_argument, apply_offline, apply_threads, plan_request
from .cmd_chat import note
from .progress import StepProgress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="GGUF path, REPO[:QUANT], 'demo' (the default) or 'bench' (the synthetic bench model)")
    p.add_argument("--budget", type=float, default=None, metavar="X",
                   help="latency budget: decode time <= X times the r = 1 time (default 1.25); prefill may "
                        "spend 1.25x what that profile would cost there")
    p.add_argument("--tokens", type=int, default=256, help="calibration tokens (default 256; more: slower, steadier)")
    p.add_argument("--segment", type=int, default=128,
                   help="tokens per segment: first half prefill, second half decode (default 128)")
    add_threads_argument(p)
    add_placement_arguments(p)  # the latency model is timed on the step this plan runs
    p.add_argument("--offline", action="store_true", help="never reach the Hub: use the local cache only")
    p.add_argument("--show", action="store_true", help="print the cached calibration of this model and machine")
    p.add_argument("--json", action="store_true", help="stdout: the calibration record as JSON")


def run(args) -> int:
    from ..engine.loader import resolve_model_path  # deferred: loads torch, the compiled kernels
    from ..engine.plan.calibration import (  # deferred: loads torch, the compiled kernels
        calibration_path,
        read_calibration,
    )
    from ..engine.tune.calibrate import DEFAULT_BUDGET, calibrate  # deferred: loads torch, the compiled kernels

    if args.tokens < args.segment:
        raise UserError("--tokens must be at least one --segment")
    apply_threads(args.threads)
    apply_offline(args)
    # a bar on a terminal, plain lines in a log or pipe; --json keeps stderr for errors
    with StepProgress(enabled=not args.json) as prog:
        if args.model == "bench":
            from ..engine.tune.bench import bench_model_path  # deferred: loads torch, the compiled kernels

            path = bench_model_path(progress=prog)
        else:
            path = resolve_model_path(args.model, progress=prog)
        if args.show:
            rec = read_calibration(path)
            if rec is None:
                raise UserError(f"no calibration of {path.name} on this machine (run `rapidmoe-chat calibrate -m ...`)")
        else:
            rec = calibrate(path, n_tokens=args.tokens, seg_len=args.segment,
                            budget=DEFAULT_BUDGET if args.budget is None else args.budget, progress=prog, log=note,
                            placement=plan_request(args))
    if args.json:
        print(json.dumps(rec))
    else:
        text = io.StringIO()  # all or nothing: a damaged record prints no half table
        try:
            with contextlib.redirect_stdout(text):
                _summary(rec, calibration_path(path))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise UserError(f"{calibration_path(path)}: a damaged calibration record ({type(e).__name__}: {e}); "
                            f"run `rapidmoe-chat calibrate -m {args.model}` again") from None
        print(text.getvalue(), end="")
    return 0


def _summary(rec: dict, path) -> None:
    lat, k = rec["latency"], rec["k"]
    t1 = rec["fixed"][1]["decode_s"]
    print(f"{rec['model']}: {rec['n_tokens']} tokens, budget {rec['budget']:g} x the r=1 decode time "
          f"({rec['budget'] * t1 * 1e3:.1f} ms/token), {lat['threads']} threads, {rec['seconds']:.0f} s")
    print(f"timed on: {rec.get('placement', 'the CPU step')}")
    sens = rec.get("sensitivity") or {}
    if sens:
        print("layer sensitivity (KL per unit of dropped weight², r = k/2 in that layer alone): "
              + " ".join(f"{il}:{s:.3g}" for il, s in sens.items()))
    print(f"{'candidate':<30} {'KL vs r=k':>10} {'flip':>7} {'r decode':>8} {'r prefill':>9} {'ms/token':>9}")
    for c in rec["candidates"]:
        mark = "*" if c["name"] == rec["chosen"] else " "
        print(f"{mark}{c['name']:<29} {c['kl_mean']:10.5f} {c['flip_rate'] * 100:6.2f}% {c['mean_r_decode']:8.2f} "
              f"{c['mean_r_prefill']:9.2f} {c['decode_s'] * 1e3:9.2f}")
    print(" r fixed: " + "  ".join(f"r={f['r']} {f['decode_s'] * 1e3:.1f} ms" for f in rec["fixed"]))
    prof = rec["profile"]
    print(f"profile: theta {prof['theta']:.4g}, beta prefill {prof['beta']['prefill']:.3g} / decode "
          f"{prof['beta']['decode']:.3g}, r in [{prof['r_min']}, {prof['r_max']}] (k = {k}), alpha "
          f"{prof['alpha'][0]:.3g} .. {prof['alpha'][-1]:.3g}")
    print(f"saved: {path}")
