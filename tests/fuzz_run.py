"""Run corpus files through the real CLI entry point in this process, and report
one outcome per file: "ok", "error: <one line>" (exit 2 with one line), or
"FAIL: ..." (anything else: a traceback, another exit status, a multi-line
error). Run as a module it takes corpus files and prints one JSON line per
run, under address-space and time limits, so a memory blowup or a hang shows
up as a failure instead of taking the machine down:

    python -m tests.fuzz_run [--as-gib 6] FILE...
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback
from pathlib import Path

# each file runs these; {f} is the file. The text has a newline and characters
# outside ASCII, so byte tokens and multi-byte pieces are tokenized and rendered.
TEXT = "hi there,\ncafé – 12€"
COMMANDS = {
    "chat": ["-m", "{f}", "-p", TEXT, "-n", "4", "--temp", "0", "--no-history"],
    "full": ["-m", "{f}", "-p", TEXT, "-n", "4", "--temp", "0.8", "--seed", "1", "--no-history",
             "--precision", "full"],
    "plan": ["plan", "-m", "{f}", "--ctx", "64"],
    "eval": ["eval", "-m", "{f}", "--prompt", TEXT],
}


def run_cli(argv: list[str]) -> str:
    from rapidmoe.app.cli import main

    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(argv)
    except BaseException as e:  # noqa: BLE001 - every escape is what we look for
        tb = traceback.format_exception(e)
        return f"FAIL: {type(e).__name__}: {str(e)[:300]} | {''.join(tb[-3:])[-600:]}"
    lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("rapidmoe-chat: error:")]
    if rc == 0:
        return "ok"
    if rc == 2 and len(lines) == 1 and "Traceback" not in err.getvalue():
        return "error: " + lines[0].removeprefix("rapidmoe-chat: error: ")
    return f"FAIL: exit {rc}: {err.getvalue()[-600:]!r}"


def check(path: Path, commands=("chat", "plan")) -> dict[str, str]:
    return {c: run_cli([a.format(f=path) for a in COMMANDS[c]]) for c in commands}


def main(argv: list[str]) -> int:
    import resource

    gib = 6
    cmds = ["chat", "plan"]
    if argv[:1] == ["--as-gib"]:
        gib, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--commands"]:
        cmds, argv = argv[1].split(","), argv[2:]
    resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))
    for f in argv:
        t0 = time.monotonic()
        res = check(Path(f), cmds)
        print(json.dumps({"file": f, "seconds": round(time.monotonic() - t0, 3), **res}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
