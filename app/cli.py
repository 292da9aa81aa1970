"""rapidmoe-chat command line: the TUI by default, `-p` for one prompt, and
subcommands (each in its own module app/cmd_<name>.py exposing
`add_arguments(parser)` and `run(args) -> int`)."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# torch's OpenMP workers must not spin between ops: the kernels' own threads
# need those cores (set before torch is imported).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from importlib.metadata import PackageNotFoundError, version

from ..engine.errors import UserError
from . import cmd_chat
from .args import error_line

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("cmd_bench", "pp/tg tokens/s, bytes per token and memory per setting (--critical 8,2,0)"),
    "calibrate": ("cmd_calibrate", "fit UMIA's critical-expert profile to this model and machine (--critical auto)"),
    "convert": ("cmd_convert", "build the residual-split pack of a model (done on first use otherwise)"),
    "eval": ("cmd_eval", "perplexity / KL of a model over a text (full precision by default)"),
    "pull": ("cmd_pull", "download a GGUF model from the Hugging Face Hub: REPO[:QUANT]"),
    "paths": ("cmd_paths", "where config, chat history, cache, packs and models live"),
    "list": ("cmd_list", "models (demo, Hugging Face cache) and packs, with sizes"),
    "rm": ("cmd_rm", "remove a model or pack, and packs whose source is gone"),
    "plan": ("cmd_plan", "where a model's bytes would live on this machine (VRAM/DRAM), from its metadata alone"),
    "serve": ("cmd_serve", "an OpenAI-compatible HTTP server over one model (chat completions, streaming, tools)"),
    "doctor": ("cmd_doctor", "hardware, CPU kernel path, CUDA status, kernel cache and package versions"),
}


class Parser(argparse.ArgumentParser):
    """A bad flag is bad input like any other: one line, exit 2 (not argparse's usage block)."""

    def error(self, message: str):
        cmd = self.prog.removeprefix("rapidmoe-chat").strip()
        where = f"{cmd}: " if cmd else ""
        raise UserError(f"{where}{message} (see `{self.prog} --help`)")


def _subcommand_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    mod_name, help_ = SUBCOMMANDS[name]
    mod = importlib.import_module(f".{mod_name}", __package__)
    p = Parser(prog=f"rapidmoe-chat {name}", description=help_)
    mod.add_arguments(p)
    return p, mod


def _version() -> str:
    try:
        return version("rapidmoe-chat")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from ..engine.plan.sizes import use_planned_allocator  # deferred: loads gguf, numpy

    use_planned_allocator()  # freed large buffers go back to the OS: peak memory is what `plan` counts
    try:
        if os.environ.get("RAPIDMOE_ISA"):
            from ..engine import kernels  # deferred: loads the compiled kernels, numpy

            kernels.check_isa_override()  # a bad value: one line now, not a silent fallback later
        if argv and argv[0] in SUBCOMMANDS:
            p, mod = _subcommand_parser(argv[0])
            args = p.parse_args(argv[1:])
            return int(mod.run(args) or 0)

        p = Parser(
            prog="rapidmoe-chat",
            description="Chat with large Mixture-of-Experts models. Without -p: the TUI.",
            epilog="subcommands: " + ", ".join(f"{k} ({v[1]})" for k, v in SUBCOMMANDS.items()),
        )
        cmd_chat.add_arguments(p)
        p.add_argument("--version", action="version", version=f"rapidmoe-chat {_version()}")
        args = p.parse_args(argv)
        return int(cmd_chat.run(args) or 0)
    except UserError as e:
        print(f"rapidmoe-chat: error: {error_line(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 141


if __name__ == "__main__":
    sys.exit(main())
