"""The CLI doors: -p (plain, --json, stdin; the settings it reads), eval (perplexity,
saved logits, KL), bad input as one line, and the units sizes are printed in."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from rapidmoe.engine.synth.model import write_synthetic


def cli(*args, input=None, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", *args], capture_output=True, text=True,
                          input=input, cwd=cwd, timeout=300, env={**os.environ, **(env or {})})


def one_line_error(r) -> str:
    """r exited 2 with a single `rapidmoe-chat: error: ...` line on stderr -> that line."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rapidmoe-chat: error: "), r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def fixture_model(tmp_path_factory):
    return str(write_synthetic(tmp_path_factory.mktemp("cli") / "m.gguf", "olmoe", seed=5, dtype="f32"))


def test_prompt_json_on_demo(tmp_path):
    r = cli("-m", "demo", "-p", "What is the capital of France? Answer in one sentence.", "--temp", "0",
            "--max-tokens", "16", "--json",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert set(obj) >= {"text", "prompt_tokens", "completion_tokens", "ttft_s", "prompt_tok_s", "decode_tok_s",
                        "finish_reason"}
    assert "Paris" in obj["text"] and obj["finish_reason"] == "stop" and obj["prompt_tokens"] > 10


def test_stdin_prompt_raw_and_verbose(fixture_model):
    r = cli("-m", fixture_model, "--raw", "--temp", "0", "--max-tokens", "5", "--verbose", input="Hello there")
    assert r.returncode == 0, r.stderr
    assert "decode:" in r.stderr and "tok/s" in r.stderr and "TTFT" in r.stderr
    # greedy raw output is deterministic
    r2 = cli("-m", fixture_model, "-p", "Hello there", "--raw", "--temp", "0", "--max-tokens", "5")
    assert r2.stdout == r.stdout


def test_eval_saves_logits_and_compares(tmp_path, fixture_model):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 6, encoding="utf-8")
    base = tmp_path / "base.npz"
    r = cli("eval", "-m", fixture_model, "--text", str(text), "--save-logits", str(base), "--json")
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    with np.load(base) as z:
        toks, logits = z["tokens"], z["logits"]
    assert toks.dtype == np.int32 and logits.dtype == np.float32 and logits.shape == (len(toks), 49152)
    assert a["n"] == len(toks) and a["ppl"] > 1
    # perplexity from the saved logits agrees with the printed one
    lp = logits[:-1].astype(np.float64)
    lp = lp - lp.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    ppl = float(np.exp(-lp[np.arange(len(toks) - 1), toks[1:]].mean()))
    assert abs(ppl - a["ppl"]) / ppl < 1e-6
    # against itself: KL 0, full agreement
    r = cli("eval", "-m", fixture_model, "--text", str(text), "--kl-base", str(base), "--json")
    b = json.loads(r.stdout)
    assert b["kl_mean"] < 1e-9 and b["top1"] == 1.0
    # against another model's logits (other weights, same tokenizer): KL > 0
    other = write_synthetic(tmp_path / "o.gguf", "olmoe", seed=6, dtype="f32")
    r = cli("eval", "-m", str(other), "--text", str(text), "--kl-base", str(base), "--json")
    c = json.loads(r.stdout)
    assert c["kl_mean"] > 1e-3 and c["kl_p99"] >= c["kl_mean"] and c["top1"] < 1.0


def test_eval_errors(tmp_path, fixture_model):
    long = tmp_path / "long.txt"
    long.write_text("word " * 5000)
    r = cli("eval", "-m", fixture_model, "--text", str(long), "--ctx", "128")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().endswith("but the context holds 128 (raise --ctx or shorten the text)"), r.stderr
    # the chat's prompt: the same engine error, the same way of naming the flag
    r = cli("-m", fixture_model, "-p", "word " * 400, "--ctx", "128", "--precision", "full", "--no-history")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.strip().endswith("but the context holds 128 (raise --ctx or shorten the prompt)"), r.stderr
    r = cli("eval", "-m", fixture_model, "--text", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "no such file" in r.stderr
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"nope")
    r = cli("eval", "-m", fixture_model, "--prompt", "hello world", "--kl-base", str(bad))
    assert r.returncode == 2 and "bad.npz" in r.stderr


def test_history_continue_and_chat_id(tmp_path, fixture_model, monkeypatch):
    import sqlite3

    env_dir = tmp_path / "data"
    monkeypatch.setenv("RAPIDMOE_DATA_DIR", str(env_dir))
    a = cli("-m", fixture_model, "-p", "first question", "--precision", "full", "--temp", "0", "--max-tokens", "4", "--json")
    assert a.returncode == 0, a.stderr
    b = cli("-m", fixture_model, "-p", "second", "--continue", "--precision", "full", "--temp", "0", "--max-tokens", "4",
            "--json")
    assert b.returncode == 0, b.stderr
    fresh = cli("-m", fixture_model, "-p", "second", "--precision", "full", "--temp", "0", "--max-tokens", "4", "--json",
                "--no-history")
    # the continued prompt carries the first exchange
    assert json.loads(b.stdout)["prompt_tokens"] > json.loads(fresh.stdout)["prompt_tokens"]
    db = sqlite3.connect(next(env_dir.rglob("*.db")))
    rows = db.execute("SELECT chat_id, role, content FROM messages ORDER BY id").fetchall()
    assert [(r[1], r[2]) for r in rows][:3] == [("user", "first question"), ("assistant", json.loads(a.stdout)["text"]),
                                                ("user", "second")]
    assert len({r[0] for r in rows}) == 1  # one chat, continued
    r = cli("-m", fixture_model, "-p", "x", "--chat", "12345")
    assert r.returncode == 2 and "no chat with id 12345" in r.stderr


def test_reader_leaving_a_pipe_is_a_quiet_exit(tmp_path, capsys):
    """`rapidmoe-chat paths | head -1`: the writer's BrokenPipeError ends the
    command with 141 and no traceback, whichever subcommand was printing."""
    from rapidmoe.app.cli import main

    r, w = os.pipe()
    os.close(r)  # the reader is gone: a write to w raises BrokenPipeError

    class Gone:
        def write(self, s):
            os.write(w, s.encode())

        def flush(self):
            pass

        def fileno(self):
            return w

    saved, sys.stdout = sys.stdout, Gone()
    try:
        assert main(["paths"]) == 141
    finally:
        sys.stdout = saved
        os.close(w)
    assert "Traceback" not in capsys.readouterr().err


def test_version_is_the_installed_distributions():
    import tomllib
    from pathlib import Path

    with open(Path(__file__).parents[1] / "pyproject.toml", "rb") as f:
        expected = tomllib.load(f)["project"]["version"]
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"rapidmoe-chat {expected}\n"


def test_prompt_reads_config_toml_and_env_like_the_tui(tmp_path, fixture_model):
    """-p: flags > config.toml / RAPIDMOE_* > the model's own defaults, as the TUI."""
    conf = tmp_path / "conf"
    conf.mkdir()
    env = {"RAPIDMOE_CONFIG_DIR": str(conf)}
    run = ("-p", "Hello there", "--precision", "full", "--temp", "0", "--json", "--no-history")
    (conf / "config.toml").write_text("[sampling]\nmax_tokens = 3\n")
    r = cli("-m", fixture_model, *run, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["completion_tokens"] == 3
    r = cli("-m", fixture_model, *run, "--max-tokens", "2", env=env)  # the flag wins
    assert json.loads(r.stdout)["completion_tokens"] == 2
    # [chat] system reaches the prompt; the model comes from RAPIDMOE_MODEL when -m is not given
    (conf / "config.toml").write_text('[sampling]\nmax_tokens = 1\n[chat]\nsystem = "You answer in rhymes."\n')
    with_system = cli(*run, env={**env, "RAPIDMOE_MODEL": fixture_model})
    assert with_system.returncode == 0, with_system.stderr
    flag = cli("-m", fixture_model, *run, "--max-tokens", "1", "--system", "You answer in rhymes.")
    plain = cli("-m", fixture_model, *run, "--max-tokens", "1")  # the template's own default system prompt
    tokens = [json.loads(r.stdout)["prompt_tokens"] for r in (with_system, flag, plain)]
    assert tokens[0] == tokens[1] != tokens[2]
    # the environment is read (and checked) on the way
    assert "no such file" in one_line_error(cli(*run, env={**env, "RAPIDMOE_MODEL": str(tmp_path / "nope.gguf")}))
    assert "RAPIDMOE_CTX" in one_line_error(cli("-m", fixture_model, *run, env={**env, "RAPIDMOE_CTX": "big"}))


@pytest.mark.parametrize("content,says", [
    (b"[sampling\nmax_tokens = 3\n", "not valid TOML"),
    (b'[chat]\nsystem = "caf\xe9"\n', "not UTF-8"),
    (b"[sampling]\ntop_p = 5\n", "sampling.top_p must be in (0, 1]"),
])
def test_bad_config_stops_prompt_with_one_line(tmp_path, content, says):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.toml").write_bytes(content)
    line = one_line_error(cli("-p", "hi", "--json", env={"RAPIDMOE_CONFIG_DIR": str(conf)}))
    assert says in line and str(conf / "config.toml") in line


def test_argparse_errors_are_one_line_for_every_command(capsys):
    """Bad flags, bad values, missing arguments: one line and exit 2, as any bad input."""
    from rapidmoe.app.cli import SUBCOMMANDS, main

    cases = [["--no-such-flag"], ["--temp", "hot", "-p", "x"], ["--precision", "half", "-p", "x"],
             ["--critical", "many", "-p", "x"], ["--ctx"]]
    cases += [[name, "--no-such-flag"] for name in SUBCOMMANDS]
    cases += [["pull"], ["eval", "--ctx", "x"], ["plan", "--mode", "gpu"]]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("rapidmoe-chat: error: "), (argv, err)
        name = argv[0] if argv[0] in SUBCOMMANDS else ""
        assert err[0].startswith(f"rapidmoe-chat: error: {name}: " if name else "rapidmoe-chat: error: ")
        assert f"`rapidmoe-chat{' ' + name if name else ''} --help`" in err[0], err
    assert main(["--ctx"]) == 2 and "usage:" not in capsys.readouterr().err


def test_critical_above_k_is_clamped_and_said(fixture_model):
    r = cli("-m", fixture_model, "-p", "Hello there", "--critical", "99", "--temp", "0", "--max-tokens", "2",
            "--no-history")
    assert r.returncode == 0, r.stderr
    assert "--critical 99 is more than the 2 routed experts per token: using 2" in r.stderr


def test_sizes_are_binary_units_everywhere(tmp_path, capsys):
    """Memory and file sizes in KiB/MiB/GiB (one helper), bandwidth in GB/s."""
    from rapidmoe.app.cmd_bench import _table
    from rapidmoe.app.cmd_plan import pack_disk_note
    from rapidmoe.app.tui.widgets import status_bar
    from rapidmoe.engine.units import fmt_bytes

    assert [fmt_bytes(n) for n in (0, 1023, 1024, 12_600_000, 5 * 2**30 + 2**28, 121 * 2**30, 2**50)] == [
        "0 B", "1023 B", "1.00 KiB", "12.0 MiB", "5.25 GiB", "121 GiB", "1024 TiB"]
    assert status_bar.fmt_bytes is fmt_bytes
    row = {"model": "m", "precision": "split", "policy": "fixed", "critical": 2, "threads": 2, "test": "tg8",
           "tokens_per_s": 10.0, "mean_r": 2.0, "bytes_per_token": 5_000_000, "achieved_gbs": 0.05,
           "read_bandwidth_gbs": 10.0, "peak_rss_bytes": 3 * 2**30 // 2, "placement": "CPU"}
    _table([row])
    out = capsys.readouterr().out
    assert "1.50 GiB" in out and "GB/s" in out and "10.00 GB/s" in out

    class Sizes:
        nonexpert_bytes, n_moe_layers, n_expert, expert_bytes = 2**20, 2, 4, 2**20

    assert pack_disk_note(Sizes, 0, False).startswith("the residual-split pack (9.00 MiB) is written")
