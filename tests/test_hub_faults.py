"""The Hub misbehaving, against a real HTTP server on 127.0.0.1 (tests/hub_server.py):
an API that never answers, a port that never accepts, a body that stalls, HTML or
garbage for JSON, redirect loops, files served with no size and cut short. Each ends
in one line (exit 2 from the CLI), and nothing incomplete is ever called cached;
kill -9 at random points of a pull, then the next pull resumes and nothing corrupt
is used. RAPIDMOE_HUB_TIMEOUT is short here so that each case takes a second or so."""
from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import test_hub as th  # noqa: E402
from hub_server import black_hole, serve_repo  # noqa: E402

from rapidmoe.app.cli import main  # noqa: E402
from rapidmoe.engine.errors import UserError  # noqa: E402
from rapidmoe.engine.hub.pull import list_cached, pull, resolve  # noqa: E402

REPO, FILES, Q4 = th.REPO, th.FILES, th.Q4
Q4_SHA = hashlib.sha256(Q4).hexdigest()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    h = serve_repo(REPO, FILES, tmp_path, monkeypatch, timeout_s=0.5)
    yield h
    h.stop()


def nothing_cached(tmp_path: Path) -> None:
    assert list_cached() == []
    snaps = tmp_path / "hf" / "hub" / "models--org--Tiny-MoE-GGUF" / "snapshots"
    assert not snaps.exists() or not any(p.is_file() for p in snaps.rglob("*"))
    with pytest.raises(UserError, match="not in the Hugging Face cache"):
        resolve(REPO, offline=True)


def pull_fails(capsys) -> str:
    """`rapidmoe-chat pull REPO` -> its one error line (exit 2)."""
    rc = main(["pull", REPO])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and lines[-1].startswith("rapidmoe-chat: error: "), (rc, err)
    assert not [x for x in lines[:-1] if "Traceback" in x or x.startswith("  ")], err
    return lines[-1]


@pytest.mark.parametrize("fault, message", [
    ("api_stall", "no answer from .* within 0.5 s \\(ReadTimeout"),
    ("black_hole", "no answer from .* within 0.5 s \\(ConnectTimeout"),
    ("html_everywhere", "answered the model-info request with 33 bytes of text/html that are not JSON"),
    ("garbage", "that are not JSON"),
    ("wrong_json", "JSON that is not a model's file list \\(siblings\\)"),
    ("api_loop", "redirects in a loop"),
    ("resolve_loop", "redirects in a loop"),
    ("cdn_loop", "redirects in a loop"),
    ("stall_every", "download of Tiny-MoE-Q4_K_M.gguf keeps failing \\(stalled 3 times: no bytes for 0.5 s"),
    ("trickle", "keeps failing \\(stalled 3 times: .* or under 1024 bytes in 0.9 s"),
    ("cut_no_sizes", "download of Tiny-MoE-Q4_K_M.gguf keeps failing \\(the body ended at byte 150000 of 300000\\)"),
])
def test_each_misbehaviour_is_one_line_and_caches_nothing(hub, tmp_path, monkeypatch, capsys, fault, message):
    holes = []
    if fault == "black_hole":
        holes, url = black_hole()
        monkeypatch.setenv("HF_ENDPOINT", url)
    elif fault == "garbage":
        hub.garbage_json = b'{"sha": ["\xff'
    elif fault == "wrong_json":
        hub.garbage_json = b'{"sha": "' + b"a" * 40 + b'", "siblings": {"x": 1}}'
    elif fault.endswith("_loop"):
        hub.redirect_loop = fault[:-5]
    elif fault == "stall_every":
        hub.stall_every = 0.25
    elif fault == "trickle":
        hub.trickle_s = 0.05  # a byte at a time, each well within the read timeout
        monkeypatch.setenv("RAPIDMOE_HUB_TIMEOUT", "0.3")  # shorter windows of 3 timeouts
    elif fault == "cut_no_sizes":
        hub.no_sizes, hub.cut_at = True, len(Q4) // 2
    elif fault in ("api_stall", "html_everywhere"):
        setattr(hub, fault, True)
    try:
        line = pull_fails(capsys)
    finally:
        hub.release.set()
        for s in holes:
            s.close()
    assert re.search(message, line), line
    nothing_cached(tmp_path)


def test_sizes_from_the_tree_api_check_a_download_without_lengths(hub, tmp_path):
    """No size in model info, HEAD or the body's headers: the tree API's size is what
    a download must reach (it is resumed with Range until it does), then the sha256."""
    hub.no_sizes = True
    hub.cut_after[Q4_SHA] = 100_000  # the line drops once, mid-file, with no length to tell
    ref = resolve(f"{REPO}:Q4_K_M")
    assert ref.sizes == (len(Q4),) and ref.sha256 == (Q4_SHA,)
    [p] = pull(REPO)
    assert p.read_bytes() == Q4
    gets = [g.headers.get("Range") for g in th.cdn_gets(hub)]
    assert gets == [None, "bytes=100000-"]
    assert any("/tree/" in s.path for s in hub.requests("hub", "GET"))


def test_a_server_sending_other_bytes_than_the_file_is_one_line(hub, tmp_path):
    hub.blobs[Q4_SHA] = b"<html>" + b"x" * 100  # 200 and a page where the file should be
    with pytest.raises(UserError, match="sent 106 bytes of application/octet-stream for a file of 300000"):
        pull(REPO)
    nothing_cached(tmp_path)


def test_a_bad_timeout_setting_is_one_line(hub, monkeypatch, capsys):
    monkeypatch.setenv("RAPIDMOE_HUB_TIMEOUT", "soon")
    assert "RAPIDMOE_HUB_TIMEOUT must be a number of seconds" in pull_fails(capsys)


PULL = ("import sys; from rapidmoe.engine.hub.pull import pull; "
        "print(pull(sys.argv[1])[0])")


def test_kill_9_at_random_points_of_a_pull_then_resume(hub, tmp_path):
    """The server kills the pulling process when it has sent the N-th byte (N random,
    up to the whole file: then the kill lands while the file is checked and moved into
    place). After each kill, whatever the cache calls a model is complete and correct;
    the next pull resumes the partial and ends with the right bytes."""
    rng = random.Random(4)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    blobs = tmp_path / "hf" / "hub" / "models--org--Tiny-MoE-GGUF" / "blobs"
    kills = 0
    for i in range(20):
        n = rng.randint(1, len(Q4))
        proc = subprocess.Popen([sys.executable, "-c", PULL, f"{REPO}:Q4_K_M"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        hub.sent = 0
        hub.on_sent = lambda sent, n=n, pid=proc.pid: sent >= n and os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        hub.on_sent = None
        assert proc.returncode in (0, -9), err
        kills += proc.returncode == -9
        for m in list_cached():  # what the cache lists is whole and right
            assert [f.read_bytes() for f in m.files] == [FILES[m.files[0].name]]
        for b in blobs.glob("*") if blobs.exists() else ():
            if not b.name.endswith(".incomplete"):
                assert hashlib.sha256(b.read_bytes()).hexdigest() == b.name  # LFS blobs are named by it
        try:
            assert resolve(REPO, offline=True).files == ("Tiny-MoE-Q4_K_M.gguf",)
        except UserError as e:
            assert "not in the Hugging Face cache" in str(e)
        if proc.returncode == 0:  # done: start over from an empty cache
            assert Path(out.strip()).read_bytes() == Q4
            for p in (tmp_path / "hf").glob("hub/models--*"):
                shutil.rmtree(p)
    assert kills >= 15
    [p] = pull(REPO)
    assert p.read_bytes() == Q4


def test_a_cached_model_still_works_behind_a_page_that_is_not_the_hub(hub):
    [p] = pull(REPO)
    hub.html_everywhere = True  # a captive portal now answers every request
    assert pull(REPO) == [p] and p.read_bytes() == Q4
    hub.html_everywhere, hub.garbage_json = False, b"<<<"
    assert pull(REPO) == [p]
    with pytest.raises(UserError, match="that are not JSON"):
        pull(f"{REPO}:Q8_0")  # not cached: the answer is the error


def test_a_snapshot_folder_a_killed_pull_left_empty_is_not_a_model(hub, tmp_path):
    commit = resolve(REPO).revision
    (tmp_path / "hf" / "hub" / "models--org--Tiny-MoE-GGUF" / "snapshots" / commit).mkdir(parents=True)
    nothing_cached(tmp_path)
    [p] = pull(REPO)
    assert p.read_bytes() == Q4


def test_a_partial_that_was_complete_when_killed_is_not_fetched_again(hub, tmp_path):
    blobs = tmp_path / "hf" / "hub" / "models--org--Tiny-MoE-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{Q4_SHA}.incomplete").write_bytes(Q4)  # killed between the last byte and the rename
    [p] = pull(REPO)
    assert p.read_bytes() == Q4 and th.cdn_gets(hub) == []
