"""`rapidmoe-chat eval`: perplexity, and KL / top-1 agreement against saved logits."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ..engine.errors import UserError
from ..engine.tune.evaluate import all_logits, divergence, load_logits, perplexity, save_logits
from .args import add_model_arguments
from .cmd_chat import load_for_cli
from .progress import StepProgress


def add_arguments(p) -> None:
    add_model_arguments(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", type=Path, help="a UTF-8 text file (its exact bytes are tokenized)")
    src.add_argument("--prompt", help="the text itself")
    p.add_argument("--save-logits", type=Path, metavar="OUT.npz", help="write tokens and logits [T, V]")
    p.add_argument("--kl-base", type=Path, metavar="BASE.npz", help="compare against logits saved by --save-logits")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    if args.text is not None:
        try:
            text = args.text.read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise UserError(f"{args.text}: no such file") from None
        except UnicodeDecodeError:
            raise UserError(f"{args.text}: not UTF-8 text") from None
    else:
        text = args.prompt
    base = load_logits(args.kl_base) if args.kl_base else None
    if args.save_logits is not None and not args.save_logits.parent.is_dir():
        raise UserError(f"{args.save_logits.parent}: no such directory")
    model = load_for_cli(args, quiet=args.json or not sys.stderr.isatty())
    tokens = model.tokenizer.encode(text, add_special=True, parse_special=False)
    if base is not None:
        btok, blog = base
        if not np.array_equal(btok, np.asarray(tokens, dtype=btok.dtype)) or blog.shape[1] != model.cfg.n_vocab:
            raise UserError(f"{args.kl_base}: made from other tokens or another vocabulary than this text and model")
    with StepProgress(enabled=not args.json and sys.stderr.isatty()) as prog:
        logits = all_logits(model, tokens, progress=prog)
    result = {"ppl": perplexity(tokens, logits), "n": len(tokens)}
    if base is not None:
        d = divergence(base[1], logits)
        result.update(kl_mean=d.kl_mean, kl_p99=d.kl_p99, top1=d.top1)
    if args.save_logits is not None:
        save_logits(args.save_logits, tokens, logits)
    if args.json:
        print(json.dumps(result))
    else:
        line = f"tokens {result['n']}  perplexity {result['ppl']:.4f}"
        if base is not None:
            line += f"  KL mean {result['kl_mean']:.6f}  KL p99 {result['kl_p99']:.6f}  top-1 {result['top1'] * 100:.2f}%"
        print(line)
    return 0
