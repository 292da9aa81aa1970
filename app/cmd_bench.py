"""`rapidmoe-chat bench`: pp and tg tokens/s per setting, each in a fresh process
(like llama-bench), with memory and bandwidth figures. Progress on stderr; with
--json, stdout carries only a JSON list of rows."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ..engine.errors import UserError
from ..engine.units import fmt_bytes
from .args import add_placement_arguments, add_threads_argument, critical_arg, plan_request
from .cmd_chat import note
from .progress import StepProgress


def _settings(v: str) -> list:
    """--critical for bench: a comma list of critical-set sizes, 'auto', 'k' or 'full'."""
    out = []
    for part in v.split(","):
        part = part.strip()
        out.append(None if part == "full" else part if part == "k" else critical_arg(part))
    return out


def add_arguments(p) -> None:
    p.add_argument("-m", "--model", default="bench",
                   help="GGUF path, REPO[:QUANT], 'demo', or 'bench' (the default: a synthetic qwen3moe with "
                        "Qwen3-30B-A3B layer shapes, generated once)")
    p.add_argument("--critical", type=_settings, default=None, metavar="R[,R...]",
                   help="critical-set sizes to measure, e.g. 8,2,0,auto ('k' = all routed, 'auto' = UMIA, 'full' = source weights); default: auto")
    p.add_argument("--precision", choices=("split", "full"), default=None, help="full: the source weights only")
    add_threads_argument(p)
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens for the pp test (default 512)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens for the tg test (default 128)")
    p.add_argument("-d", "--depth", type=int, default=0, metavar="N",
                   help="context already filled before each test, as llama-bench's -d (default 0)")
    add_placement_arguments(p)
    p.add_argument("--json", action="store_true", help="stdout: only a JSON list of row objects")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process: one setting
    p.add_argument("--bandwidth", type=float, default=None, help=argparse.SUPPRESS)  # measured by the parent


def _placement_argv(args) -> list[str]:
    """The placement flags again, for the child process of each setting."""
    out = []
    for flag, v in (("--vram-budget", args.vram_budget), ("--dram-budget", args.dram_budget),
                    ("--mode", args.mode), ("--cache-fraction", args.cache_fraction), ("--kv-type", args.kv_type),
                    ("--critical-from", args.critical_from)):
        if v is not None:
            out += [flag, str(v)]
    if args.gpus is not None:
        out += ["--gpus", ",".join(map(str, args.gpus))]
    return out


def _threads(args) -> int:
    if args.threads is not None:
        return args.threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run(args) -> int:
    if args.n_prompt <= 0 or args.n_gen <= 0:
        raise UserError("-p and -n must be > 0")
    if args.depth < 0:
        raise UserError("-d must be >= 0")
    if args.precision == "full" and args.critical is not None:
        raise UserError("--precision full and --critical exclude each other")
    if args.one:
        return _run_one(args)
    from ..engine.loader import resolve_model_path  # deferred: loads torch, the compiled kernels
    from ..engine.tune.bench import bench_model_path  # deferred: loads torch, the compiled kernels

    threads = _threads(args)
    settings = [None] if args.precision == "full" else (args.critical or ["auto"])
    with StepProgress(enabled=sys.stderr.isatty()) as prog:
        src = bench_model_path(progress=prog) if args.model == "bench" else resolve_model_path(args.model, progress=prog)
        if any(s is not None for s in settings):
            from ..engine.pack.convert import convert  # deferred: loads the compiled kernels, gguf

            convert(src, progress=prog, log=note)
    # the 1 GiB probe runs here, so it never counts in a setting's peak RSS
    from ..engine import kernels

    kernels.set_num_threads(threads)
    bw = kernels.read_bandwidth_gbs()
    rows = []
    for s in settings:
        label = "full precision" if s is None else f"critical {s}"
        at = f" at depth {args.depth}" if args.depth else ""
        print(f"bench: {label}, {threads} threads, pp{args.n_prompt} + tg{args.n_gen}{at} ...", file=sys.stderr,
              flush=True)
        cmd = [sys.executable, "-m", "rapidmoe.app.cli", "bench", "--one", "-m", str(src), "--threads", str(threads),
               "-p", str(args.n_prompt), "-n", str(args.n_gen), "-d", str(args.depth), "--bandwidth", str(bw),
               *_placement_argv(args)]
        cmd += ["--precision", "full"] if s is None else ["--critical", str(s)]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise UserError(f"the bench of {label} failed (exit {r.returncode})")
        rows += json.loads(r.stdout)
    if args.json:
        print(json.dumps(rows))
    else:
        _table(rows)
    return 0


def _run_one(args) -> int:
    from ..engine.tune.bench import rss_now, run_setting  # deferred: loads torch, the compiled kernels

    rss0 = rss_now()
    crit = None if args.precision == "full" else (args.critical[0] if args.critical else "auto")
    rows = run_setting(args.model, crit, _threads(args), args.n_prompt, args.n_gen, rss0, args.bandwidth,
                       plan_request(args), depth=args.depth)
    print(json.dumps(rows))
    return 0


def _table(rows: list[dict]) -> None:
    """MB/token is traffic (decimal, so that t/s x MB/token / 1000 is the GB/s column); peak RSS is memory."""
    tw = max([6] + [len(r["test"]) for r in rows])  # "tg128 @ d8192" with -d
    head = (f"{'model':<34} {'setting':>10} {'thr':>3} {'test':>{tw}} {'t/s':>9} {'mean r':>6} {'MB/token':>9} {'GB/s':>6} "
            f"{'of BW':>6} {'peak RSS':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        setting = ("full" if r["precision"] == "full" else "auto" if r.get("policy") == "umia"
                   else f"r={r['critical']}")
        mr = f"{r['mean_r']:6.2f}" if r.get("mean_r") is not None else f"{'—':>6}"
        mbpt = f"{r['bytes_per_token'] / 1e6:9.1f}" if r["bytes_per_token"] else f"{'—':>9}"
        gbs = f"{r['achieved_gbs']:6.2f}" if r["achieved_gbs"] else f"{'—':>6}"
        frac = (f"{r['achieved_gbs'] / r['read_bandwidth_gbs'] * 100:5.0f}%" if r["achieved_gbs"] and r["read_bandwidth_gbs"]
                else f"{'—':>6}")
        print(f"{r['model'][:34]:<34} {setting:>10} {r['threads']:>3} {r['test']:>{tw}} {r['tokens_per_s']:9.2f} {mr} {mbpt} {gbs} "
              f"{frac} {fmt_bytes(r['peak_rss_bytes']):>9}")
    for where in dict.fromkeys(r.get("placement") for r in rows if r.get("placement")):
        print(f"placement: {where}")
    for kv in dict.fromkeys((r["kv_type"], r["kv_bytes"]) for r in rows if r.get("kv_type")):
        print(f"KV cache: {kv[0]}, {fmt_bytes(kv[1])}")
    for r in rows:
        g = r.get("gpu_step")
        if g:
            busy = f"{g['gpu_busy_frac']:.0%}" if g["gpu_busy_frac"] is not None else "—"
            print(f"GPU step r={r['critical']}: {g['step_ms']:.2f} ms/token, CPU experts {g['cpu_expert_ms_per_layer']:.3f} "
                  f"ms/layer, host waits {g['host_wait_ms']:.2f} ms, orchestration {g['orchestration_ms']:.2f} ms "
                  f"({g['orchestration_frac']:.0%}), GPU busy {busy}; decode graphs: {g['decode_graphs']}")
    if rows:
        print(f"read bandwidth measured: {rows[0]['read_bandwidth_gbs']:.2f} GB/s with {rows[0]['threads']} threads")
