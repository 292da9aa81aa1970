"""The product end to end on the GPU (issue #16 §5), from the command line the
user types: a DeepSeek-V3-shaped GGUF with a few layers is written here, converted,
answered with `rapidmoe-chat -m FILE -p ... --verbose --json`, and benched side by
side in one run:

  (a) our KTransformers-style split: attention and dense layers on the GPU, every
      routed expert on the CPU at Q4_K-class bytes (r = k, no W_Q cached), same VRAM
  (b) the residual split at r = k, r = 2 and UMIA, each with W_Q cache 100% and at
      the fraction that one GPU of this size allows for the full 61-layer model
      (what `plan` says for the real V3 layout: gpu-partial on one H200)
  (c) the CPU only

plus (b) at r = 2 with the decode graph segments off (RAPIDMOE_GPU_GRAPHS=0), and the
greedy text with and without them.

`--standin` runs the same flow at a tiny size on a stand-in GPU (CI)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shapes.py

from shapes import write_v3_shape  # noqa: E402

from rapidmoe.engine.synth.model import write_synthetic  # noqa: E402

CLI = [sys.executable, "-m", "rapidmoe.app.cli"]
# DeepSeek-V3's shapes with fewer layers and experts (top-8 of n_expert, groups of 8)
V3_FEW = dict(n_embd=7168, n_head=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head=128,
              n_ff=18432, n_ff_exp=2048, n_expert_used=8, n_expert_shared=1, n_layer_dense_lead=1, n_group=8,
              n_group_used=4, n_ctx=163840)


def cli(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"rapidmoe-chat {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def full_model_fraction(d: Path, vram_gib: float | None, env) -> tuple[str, float]:
    """The mode and W_Q cache fraction `plan` gives the real 61-layer V3 layout on
    this GPU (DRAM assumed large enough: a V3 machine has it; this one may not)."""
    shape = write_v3_shape(d / "DeepSeek-V3-shape.gguf")
    args = ["plan", "-m", str(shape), "--json", "--dram-budget", "1024"] + (
        ["--vram-budget", str(vram_gib)] if vram_gib else [])
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    p = json.loads(r.stdout)
    return p["mode"], p["wq_cache_fraction"]


def bench(model: str, settings: str, flags: list[str], n_prompt: int, n_gen: int, env) -> list[dict]:
    r = cli("bench", "-m", model, "--critical", settings, "-p", str(n_prompt), "-n", str(n_gen), "--json", *flags,
            env=env, timeout=900)
    return json.loads(r.stdout)


def table(rows, head) -> str:
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([line(head), line(["-" * x for x in w])] + [line(r) for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--standin", action="store_true", help="tiny shapes on a stand-in GPU (tests this script)")
    ap.add_argument("--layers", type=int, default=3, help="layers of the V3-shaped file (the first one dense)")
    ap.add_argument("--experts", type=int, default=32, help="routed experts per MoE layer (a multiple of 8)")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens of the pp test")
    ap.add_argument("--gen", type=int, default=32, help="tokens of the tg test")
    ap.add_argument("--dir", default=None, help="where the model is written (default: a temporary dir)")
    a = ap.parse_args()
    env = {"RAPIDMOE_STANDIN_GPU": "141"} if a.standin else {}  # an H200's memory, for the stand-in
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        d = Path(tmp)
        t0 = time.perf_counter()
        if a.standin:
            src = write_synthetic(d / "v3-few.gguf", "ds2_v3", seed=0, dtype="f16")
        else:
            src = write_synthetic(d / "v3-few.gguf", "ds2_v3", seed=0, dtype="q8_0", expert_dtype="q4_0", random_blocks=True,
                                  n_layer=a.layers, n_expert=a.experts, **V3_FEW)
        print(f"wrote {src.name} ({src.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s", flush=True)
        # the real V3 layout on this GPU: the plan must cache only the hottest part of W_Q
        vram = None
        if not a.standin:
            import torch

            vram = torch.cuda.get_device_properties(0).total_memory / 2**30
        mode, frac = full_model_fraction(d, vram, env)
        print(f"plan for the full 61-layer DeepSeek-V3 on this GPU: {mode}, W_Q cache {frac:.1%}", flush=True)
        if mode != "gpu-partial":
            raise SystemExit("!! expected gpu-partial for V3 on one GPU of this size")
        t0 = time.perf_counter()
        cli("convert", "-m", str(src), env=env)
        print(f"converted in {time.perf_counter() - t0:.0f} s", flush=True)
        ask = ("-m", str(src), "-p", "Name three colours.", "--temp", "0", "--max-tokens", "16", "--verbose",
               "--json", "--critical", "auto")
        r = cli(*ask, env=env)
        print("\n== -p --verbose --json\n" + r.stdout.strip() + "\n" + r.stderr.strip(), flush=True)
        # the decode graph segments (engine/gpu/graphs.py) against the same step run eagerly
        eager = json.loads(cli(*ask, env={**env, "RAPIDMOE_GPU_GRAPHS": "0"}).stdout)["text"]
        same = eager == json.loads(r.stdout)["text"]
        print(f"graph segments: greedy text {'equal to' if same else '!! differs from'} the eager GPU step"
              + ("" if same else f" (eager: {eager!r})"), flush=True)
        ctx = ["--cache-fraction"]
        no_graphs = {"RAPIDMOE_GPU_GRAPHS": "0"}
        runs = [("(a) KTransformers-style: routed experts on the CPU", "k", ctx + ["0"], "0%", {}),
                ("(b) residual split", "k,2,auto", ["--mode", "gpu-residual"], "100%", {}),
                ("(b) residual split, no graph segments", "2", ["--mode", "gpu-residual"], "100%", no_graphs),
                ("(b) residual split", "k,2,auto", ctx + [f"{frac:.6f}"], f"{frac:.0%}", {}),
                ("(c) CPU only", "k,auto", ["--mode", "cpu"], "—", {})]
        rows, kt = [], None
        for name, settings, flags, cache, extra in runs:
            t0 = time.perf_counter()
            got = bench(str(src), settings, flags, a.prompt, a.gen, {**env, **extra})
            print(f"bench {name} {settings} {' '.join(flags)}: {time.perf_counter() - t0:.0f} s", flush=True)
            by = {}
            for row in got:
                by.setdefault(row["critical"], {})[row["test"][:2]] = row
            for crit, t in by.items():
                tg, pp = t["tg"], t["pp"]
                kt = kt or tg["tokens_per_s"]
                g = tg.get("gpu_step") or {}
                busy = f"{g['gpu_busy_frac']:.0%}" if g.get("gpu_busy_frac") is not None else "—"
                orch = (f"{g['orchestration_ms']:.2f} ({g['orchestration_frac']:.0%})" if g else "—")
                rows.append([name, f"r={crit}", cache, f"{tg['mean_r']:.2f}" if tg["mean_r"] is not None else "—",
                             f"{tg['tokens_per_s']:.1f}", f"{pp['tokens_per_s']:.0f}", f"{tg['tokens_per_s'] / kt:.2f}x",
                             busy, f"{g['cpu_expert_ms_per_layer']:.3f}" if g else "—", orch])
        print(f"\n== {src.name}: {a.layers if not a.standin else 'tiny'} layers; decode tg{a.gen}, prefill pp{a.prompt}\n"
              + table(rows, ["setting", "r", "W_Q cache", "mean r", "decode tok/s", "prefill tok/s", "vs (a)",
                             "GPU busy", "CPU expert ms/layer", "orchestration ms/token"]))
        placement = json.loads(r.stdout)["placement"]
        print(f"\nplacement of the -p run: {placement}\nproduct check done in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
