"""Side by side with llama.cpp, in one run, same thread count (not part of CI).

Quantizes the bench model (synthetic qwen3moe, Qwen3-30B-A3B layer shapes) to
Q4_K_M with llama.cpp, converts our pack from that same Q4_K_M file, then
measures pp512 and tg128 for llama.cpp and for `rapidmoe-chat bench` at each
critical-set size, alternating engines, and prints tokens/s and ratios. Both
engines keep the KV cache in the same type (--kv-type, default f16 as both
default to); --depth N measures both tests at a context already N tokens deep
(filled untimed first, as llama-bench's -d). Needs llama-cpp-python 0.3.36 (see
README for the build flags).

    python scripts/bench_vs_llamacpp.py [--threads 2] [--critical 8,2,0] [--reps 2] [--depth 8192]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def quantize_q4_k_m(src: Path, dst: Path) -> None:
    import llama_cpp

    if dst.exists():
        return
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = os.cpu_count() or 1
    tmp = dst.with_name(dst.name + ".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")
    tmp.replace(dst)


GGML_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}


def llama_cpp_bench(path: Path, threads: int, n_prompt: int, n_gen: int, depth: int = 0, kv_type: str = "f16") -> dict:
    """One fresh process per measurement, as our bench does: the context filled to depth
    (untimed), tg at positions depth.., then pp over the same filled context."""
    t = GGML_TYPES[kv_type]
    fa = kv_type == "q8_0"  # llama.cpp quantizes the V cache only with flash attention
    code = f"""
import json, time, numpy as np, llama_cpp
llm = llama_cpp.Llama(model_path={str(path)!r}, n_ctx={depth + n_prompt + n_gen + 8}, n_batch={n_prompt},
                      n_ubatch={n_prompt}, n_threads={threads}, n_threads_batch={threads}, type_k={t}, type_v={t},
                      flash_attn={fa}, verbose=False)
rng = np.random.default_rng(0)
V = llm.n_vocab()
prompt = [int(t) for t in rng.integers(10, V - 10, {n_prompt})]
llm.eval(prompt[:16]); llm.reset()
llm.eval([int(t) for t in rng.integers(10, V - 10, {depth})])
toks = [int(t) for t in rng.integers(10, V - 10, {n_gen})]
llm.eval([toks[0]])
t0 = time.perf_counter()
for t in toks:
    llm.eval([t])
tg = {n_gen} / (time.perf_counter() - t0)
llm.n_tokens = {depth}  # eval drops the cache past it
t0 = time.perf_counter(); llm.eval(prompt); pp = {n_prompt} / (time.perf_counter() - t0)
print(json.dumps({{"pp": pp, "tg": tg}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def ours(path: Path, setting: str, threads: int, n_prompt: int, n_gen: int, depth: int = 0,
         kv_type: str = "f16") -> list[dict]:
    cmd = [sys.executable, "-m", "rapidmoe.app.cli", "bench", "-m", str(path), "--threads", str(threads),
           "-p", str(n_prompt), "-n", str(n_gen), "-d", str(depth), "--kv-type", kv_type, "--json"]
    r, _, source = setting.partition(":")  # "8:pack", "8:source": where the critical experts come from
    cmd += ["--precision", "full"] if r == "full" else ["--critical", r, "--critical-from", source or "auto"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--critical", default="8,2,0",
                    help="settings, comma-separated: r, r:source or r:pack (where critical experts come from), full")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0, help="context filled before each test (llama-bench -d)")
    ap.add_argument("--kv-type", choices=tuple(GGML_TYPES), default="f16")
    a = ap.parse_args()
    from rapidmoe.engine.tune.bench import bench_model_path
    from rapidmoe.engine.pack.convert import convert

    f16 = bench_model_path()
    q4 = f16.with_name(f16.name.replace(".f16.gguf", ".Q4_K_M.gguf"))
    print(f"quantizing {f16.name} -> Q4_K_M with llama.cpp ...", file=sys.stderr)
    quantize_q4_k_m(f16, q4)
    print("converting our pack from the same Q4_K_M file ...", file=sys.stderr)
    t0 = time.perf_counter()
    convert(q4, log=lambda m: print(m, file=sys.stderr))
    print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    settings = a.critical.split(",")
    res: dict[str, dict[str, list[float]]] = {}
    extra: dict[str, dict] = {}
    for rep in range(a.reps):
        print(f"rep {rep + 1}/{a.reps}: llama.cpp", file=sys.stderr)
        lc = llama_cpp_bench(q4, a.threads, a.p, a.n, a.depth, a.kv_type)
        res.setdefault("llama.cpp", {}).setdefault("pp", []).append(lc["pp"])
        res["llama.cpp"].setdefault("tg", []).append(lc["tg"])
        for s in settings:
            print(f"rep {rep + 1}/{a.reps}: ours, critical {s}", file=sys.stderr)
            rows = ours(q4, s, a.threads, a.p, a.n, a.depth, a.kv_type)
            for row in rows:
                key = "pp" if row["test"].startswith("pp") else "tg"
                res.setdefault(f"r={s}", {}).setdefault(key, []).append(row["tokens_per_s"])
                if key == "tg":
                    extra[f"r={s}"] = row
    print("\nper repetition (pp / tg tokens/s):", file=sys.stderr)
    for name, v in res.items():
        print(f"  {name:<12} pp {' '.join(f'{x:.1f}' for x in v['pp'])} | tg {' '.join(f'{x:.1f}' for x in v['tg'])}",
              file=sys.stderr)
    base = {k: float(np.median(v)) for k, v in res["llama.cpp"].items()}
    at = f", depth {a.depth}" if a.depth else ""
    print(f"\n{a.threads} threads, {q4.name} (both engines), KV {a.kv_type}{at}, median of {a.reps}")
    print(f"{'engine':<12} {'pp' + str(a.p):>9} {'ratio':>6} {'tg' + str(a.n):>9} {'ratio':>6} {'MB/tok':>7} {'GB/s':>6} {'of BW':>6}")
    for name, v in res.items():
        pp, tg = float(np.median(v["pp"])), float(np.median(v["tg"]))
        row = extra.get(name)
        mb = f"{row['bytes_per_token'] / 1e6:7.1f}" if row else f"{'—':>7}"
        gbs = f"{row['achieved_gbs']:6.2f}" if row else f"{'—':>6}"
        frac = f"{row['achieved_gbs'] / row['read_bandwidth_gbs'] * 100:5.0f}%" if row else f"{'—':>6}"
        print(f"{name:<12} {pp:9.2f} {pp / base['pp']:6.2f} {tg:9.2f} {tg / base['tg']:6.2f} {mb} {gbs} {frac}")


if __name__ == "__main__":
    main()
