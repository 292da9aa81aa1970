"""The options the commands and the TUI share: the model and its placement
(`--threads`, `--ctx`, `--offline`, `--critical`, the plan's budgets), sampling,
and what a parsed set of them means to the engine. A bad value is argparse's
one-line error (exit 2) before anything is loaded."""
from __future__ import annotations

import argparse
import os

from ..engine.errors import ContextError, SettingError, SettingNote, UserError
from ..engine.kv_types import DEFAULT_KV_TYPE, KV_TYPES

MAX_THREADS = 1024  # more is a typo: each thread costs the OpenMP runtime and the kernels' pool memory


def threads(v: str) -> int:
    """--threads: a whole number of CPU threads in 1..MAX_THREADS."""
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of threads, got {v!r}") from None
    if not 1 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_THREADS}, got {n}")
    return n


def context(v: str) -> int:
    """--ctx: a whole number of tokens > 0."""
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, got {v!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return n


def add_threads_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=threads, default=None, help="CPU threads (default: usable cores)")


def add_ctx_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ctx", type=context, default=None, help="context size in tokens (default: min(trained, 4096))")


def apply_threads(n: int | None) -> None:
    """--threads for the kernels' pool and torch alike (None: usable cores)."""
    if n is None:
        return
    import torch  # deferred: loads torch

    from ..engine import kernels  # deferred: loads the compiled kernels, numpy

    kernels.set_num_threads(n)
    torch.set_num_threads(n)


def apply_offline(args) -> None:
    """--offline: the Hub is never reached (the local cache only), here and in huggingface_hub."""
    if getattr(args, "offline", False):
        os.environ["HF_HUB_OFFLINE"] = "1"


def _gib(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GiB, got {v!r}") from None
    if not (x > 0 and x < 1e9):  # also refuses nan and inf
        raise argparse.ArgumentTypeError("must be a size in GiB > 0")
    return x


def _gpu_list(v: str) -> list[int]:
    try:
        out = [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1, got {v!r}") from None
    if any(i < 0 for i in out):
        raise argparse.ArgumentTypeError("GPU indices are >= 0")
    return out


def add_placement_arguments(p) -> None:
    """The flags that shape a plan: `plan`, chat, -p, eval and bench take the same."""
    p.add_argument("--vram-budget", type=_gib, default=None, metavar="GiB",
                   help="VRAM to use on each GPU (default: its free VRAM)")
    p.add_argument("--dram-budget", type=_gib, default=None, metavar="GiB",
                   help="DRAM to use (default: available DRAM less a reserve for the OS)")
    p.add_argument("--gpus", type=_gpu_list, default=None, metavar="0,1", help="GPUs to use (default: all visible)")
    p.add_argument("--mode", choices=("gpu-residual", "gpu-partial", "cpu"), default=None,
                   help="force a mode (default: the fastest that fits)")
    p.add_argument("--cache-fraction", type=float, default=None, metavar="F",
                   help="fraction of experts whose W_Q is cached in VRAM (default: as many as fit)")
    p.add_argument("--kv-type", choices=KV_TYPES, default=DEFAULT_KV_TYPE,
                   help=f"KV cache type (default {DEFAULT_KV_TYPE}; q8_0 halves it again, f32 is exact)")
    p.add_argument("--critical-from", choices=("auto", "source", "pack"), default="auto",
                   help="CPU plans: run the critical experts from the model file's own tensors (exact to it; "
                        "the file must stay) or from the pack's residuals (default: the file where DRAM holds it)")


def plan_request(args):
    """Parsed placement flags -> engine.plan.planner.PlanRequest."""
    from ..engine.plan.hardware import GiB  # deferred: loads psutil
    from ..engine.plan.planner import PlanRequest  # deferred: loads gguf, numpy

    if args.cache_fraction is not None and not 0.0 <= args.cache_fraction <= 1.0:
        raise UserError("--cache-fraction must be within [0, 1]")
    return PlanRequest(vram_budget=int(args.vram_budget * GiB) if args.vram_budget else None,
                       dram_budget=int(args.dram_budget * GiB) if args.dram_budget else None,
                       gpus=tuple(args.gpus) if args.gpus is not None else None, mode=args.mode,
                       cache_fraction=args.cache_fraction, kv_type=args.kv_type,
                       critical_from=None if args.critical_from == "auto" else args.critical_from)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None, help="GGUF path, Hugging Face REPO[:QUANT] (pulled when needed), or 'demo' (the default)")
    add_ctx_argument(p)
    add_threads_argument(p)
    p.add_argument("--offline", action="store_true", help="never reach the Hub: use the local cache only")
    p.add_argument("--critical", type=critical_arg, default=None, metavar="R|auto",
                   help="residual split with R critical experts per token (R > k means k), or 'auto': "
                        "UMIA picks them per token and layer (the default of -p and the TUI)")
    p.add_argument("--precision", choices=("split", "full"), default=None,
                   help="full: the source weights as they are (no residual split)")
    add_placement_arguments(p)


def critical_arg(v: str) -> int | str:
    if v == "auto":
        return v
    try:
        r = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of experts or 'auto', got {v!r}") from None
    if r < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return r


def critical_setting(args, default_split: bool):
    """-> r (int), "auto" (UMIA), or None for full precision. default_split: what no flag means."""
    if args.precision == "full" and args.critical is not None:
        raise UserError("--precision full and --critical exclude each other")
    if args.precision == "full":
        r = None
    elif args.critical is not None:
        r = args.critical
    else:  # UMIA: the calibrated profile of this model and machine, else the default
        r = "auto" if args.precision == "split" or default_split else None
    mode = getattr(args, "mode", None)
    if r is None and mode in ("gpu-residual", "gpu-partial"):
        raise UserError(f"--mode {mode} places the residual split: it needs --critical, not full precision")
    return r


# parsed flag -> SamplingParams field (either spelling: callers may build the arguments themselves)
SAMPLING_FLAGS = {"temp": "temperature", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                  "min_p": "min_p", "repeat_penalty": "repeat_penalty", "seed": "seed", "max_tokens": "max_tokens",
                  "n_predict": "max_tokens", "stop": "stop"}

# a SamplingParams field or load_model argument -> its flag
FLAG_OF = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
           "repeat_penalty": "--repeat-penalty", "seed": "--seed", "max_tokens": "--max-tokens", "stop": "--stop",
           "critical": "--critical", "n_ctx": "--ctx"}


def sampling_overrides(args) -> dict:
    """The sampling flags that were given, as SamplingParams fields (lists become tuples)."""
    out = {}
    for attr, field in SAMPLING_FLAGS.items():
        v = getattr(args, attr, None)
        if v is not None:
            out[field] = tuple(v) if isinstance(v, list) else v
    return out


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=float, default=None, help="temperature (0 = greedy; default 0.7)")
    p.add_argument("--top-k", type=int, default=None, help="top-k (0 = off; default 40)")
    p.add_argument("--top-p", type=float, default=None, help="top-p (default 0.9)")
    p.add_argument("--min-p", type=float, default=None, help="min-p (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=None, help="repeat penalty (default 1.0 = off)")
    p.add_argument("--seed", type=int, default=None, help="random seed (same seed, same output)")
    p.add_argument("--max-tokens", "-n", type=int, default=None, help="maximum tokens to generate (default 512)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def remote_endpoint(args):
    """--endpoint URL, or -m naming a provider of config.toml -> its Endpoint; None: a local model.
    What only a local model has is refused in one line."""
    from .remote.providers import resolve  # the providers' config and keyring: only when asked

    ep = resolve(args.model, getattr(args, "endpoint", None))
    if ep is None:
        return None
    for flag, given in (("--raw", getattr(args, "raw", False)), ("--critical", args.critical is not None),
                        ("--precision", args.precision is not None)):
        if given:
            raise UserError(f"{flag} applies to local models only, not to {ep.name or ep.base_url}")
    return ep


def error_line(e: UserError) -> str:
    """An engine error as the command line says it: the setting that would fix it named by its flag."""
    flag = FLAG_OF.get(e.setting) if e.setting else None
    if flag and isinstance(e, ContextError):
        return f"{e} (raise {flag} or shorten {e.what})"
    return f"{e} ({flag})" if flag else str(e)


def flag_note(msg: str) -> str:
    """An engine note as the command line says it: a setting the engine changed is named by its flag."""
    if isinstance(msg, SettingNote) and msg.field in FLAG_OF:
        return f"{FLAG_OF[msg.field]} {msg.value} {msg.rest}"
    return msg


def check_sampling(params) -> None:
    """SamplingParams from the flags, checked: a value out of range is one line naming its flag."""
    try:
        params.validate()
    except SettingError as e:
        raise UserError(f"{FLAG_OF.get(e.field, e.field)} {e.rule}") from None
