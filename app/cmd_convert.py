"""`rapidmoe-chat convert -m PATH`: build the residual-split pack, or verify
every checksum of the one there (a load checks a sample) and rebuild it when
one fails."""
from __future__ import annotations

import sys

from .args import add_threads_argument, apply_threads
from .cmd_chat import note
from .progress import StepProgress


def add_arguments(p) -> None:
    p.add_argument("-m", "--model", required=True, help="GGUF path, Hugging Face REPO[:QUANT], or 'demo'")
    add_threads_argument(p)


def run(args) -> int:
    from ..engine.loader import resolve_model_path  # deferred: loads torch, the compiled kernels
    from ..engine.pack.convert import convert  # deferred: loads the compiled kernels, gguf

    apply_threads(args.threads)
    with StepProgress(enabled=sys.stderr.isatty()) as prog:
        src = resolve_model_path(args.model, progress=prog)
        out = convert(src, progress=prog, log=note, full_check=True)  # an existing pack: every checksum
    print(out)
    return 0
