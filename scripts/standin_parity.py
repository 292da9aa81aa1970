"""The GPU path on a stand-in GPU against the CPU split path, over a text: KL and
top-1 agreement of the logits, whole-text prefill (as `eval` runs it) and one decode
step at a time, at r = k, r = 2 and UMIA, on the demo and synthetic qwen3moe and
deepseek2 files. Also the CPU split path's own prefill-vs-decode KL on the same
tokens: two valid summation schemes of the same model.

    python scripts/standin_parity.py [--tokens 200] [--models demo,qwen3moe,deepseek2]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from rapidmoe.engine.tune.calibrate import calibration_text
from rapidmoe.engine.tune.evaluate import divergence
from rapidmoe.engine.loader import load_model
from rapidmoe.engine.moe.umia import UmiaPolicy
from rapidmoe.engine.synth.model import write_synthetic


def logits(model, toks, decode: bool, policy=None) -> np.ndarray:
    run = model.runner
    cache = run.new_cache(model.n_ctx)
    if not decode:
        return run.prefill(toks, 0, cache, policy)[0].numpy()
    return np.stack([run.decode(t, i, cache, policy)[0].numpy() for i, t in enumerate(toks)])


def load(spec, critical, standin: bool, n_ctx: int):
    if standin:
        os.environ["RAPIDMOE_STANDIN_GPU"] = "24"
    else:
        os.environ.pop("RAPIDMOE_STANDIN_GPU", None)
    return load_model(spec, n_ctx=n_ctx, critical=critical)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200, help="text tokens (the synthetic files' context is 256)")
    ap.add_argument("--models", default="demo,qwen3moe,deepseek2")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = {"demo": "demo",
                  "qwen3moe": str(write_synthetic(Path(tmp) / "q3.gguf", "qwen3moe", seed=3, dtype="f16")),
                  "deepseek2": str(write_synthetic(Path(tmp) / "ds2.gguf", "ds2_v3", seed=3))}
        print(f"{'model':<10} {'r':<5} {'KL prefill':>11} {'top1':>6} {'KL decode':>10} {'top1':>6} "
              f"{'CPU prefill vs decode':>22}", flush=True)
        for name, spec in models.items():
            if name not in a.models.split(","):
                continue
            for crit in ("k", 2, "auto"):
                cpu = load(spec, crit, False, a.tokens)
                toks = cpu.tokenizer.encode(calibration_text(), add_special=True, parse_special=False)[:a.tokens]
                # UMIA held to its decode phase for the decode-vs-prefill floor (both sides the same r rule)
                pol = cpu.policy if crit != "auto" else UmiaPolicy(cpu.policy.profile, cpu.policy.k, phase="decode")
                c_pre, c_dec = logits(cpu, toks, False), logits(cpu, toks, True)
                floor = divergence(logits(cpu, toks, False, pol), logits(cpu, toks, True, pol))
                gpu = load(spec, crit, True, a.tokens)
                assert gpu.runner.gpu_step
                d_pre, d_dec = divergence(c_pre, logits(gpu, toks, False)), divergence(c_dec, logits(gpu, toks, True))
                print(f"{name:<10} {str(crit):<5} {d_pre.kl_mean:11.2e} {d_pre.top1:6.3f} {d_dec.kl_mean:10.2e} "
                      f"{d_dec.top1:6.3f} {floor.kl_mean:22.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
