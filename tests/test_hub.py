"""Hub pulls against a real HTTP server on 127.0.0.1 (tests/hub_server.py), driving
huggingface_hub's own HTTP client, model-info call, HEAD metadata and errors."""
from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import FakeHub, serve_repo  # noqa: E402

from rapidmoe.app.cli import main  # noqa: E402
from rapidmoe.engine.errors import UserError  # noqa: E402
from rapidmoe.engine.hub.pull import list_cached, pull, resolve  # noqa: E402
from rapidmoe.engine.hub.resolve import group_ggufs, parse_spec, quant_label  # noqa: E402

REPO = "org/Tiny-MoE-GGUF"


def blob(n: int, seed: int) -> bytes:
    return b"GGUF" + random.Random(seed).randbytes(n - 4)


FILES = {
    "README.md": b"# tiny\n",
    "Tiny-MoE-Q4_K_M.gguf": blob(300_000, 1),
    "Tiny-MoE-Q8_0.gguf": blob(50_000, 2),
    "mmproj-F16.gguf": blob(1_000, 3),
    # a split quant in a subfolder, parts listed out of order on purpose
    "BF16/Tiny-MoE-BF16-00002-of-00003.gguf": blob(20_000, 5),
    "BF16/Tiny-MoE-BF16-00001-of-00003.gguf": blob(20_000, 4),
    "BF16/Tiny-MoE-BF16-00003-of-00003.gguf": blob(10_000, 6),
}
Q4 = FILES["Tiny-MoE-Q4_K_M.gguf"]


@pytest.fixture
def hub(tmp_path, monkeypatch):
    h = serve_repo(REPO, FILES, tmp_path, monkeypatch)
    yield h
    h.stop()


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def cdn_gets(h: FakeHub) -> list:
    return h.requests("cdn", "GET")


# -- spec parsing and quant selection (pure) --------------------------------------------

def test_parse_spec():
    assert parse_spec("unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M") == ("unsloth/Qwen3-30B-A3B-GGUF", "Q4_K_M")
    assert parse_spec("hf.co/unsloth/Qwen3-30B-A3B-GGUF:q4_k_m") == ("unsloth/Qwen3-30B-A3B-GGUF", "q4_k_m")
    assert parse_spec("https://huggingface.co/org/name") == ("org/name", None)
    for bad in ("justaname", "a/b/c", "org/name:", "org/na me", "org/name:Q4 K", "../x/y"):
        with pytest.raises(UserError, match="bad model spec"):
            parse_spec(bad)


def test_quant_labels_and_groups():
    assert quant_label("Qwen3-30B-A3B-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_label("UD-Q4_K_XL/Qwen3-235B-UD-Q4_K_XL-00001-of-00003.gguf") == "UD-Q4_K_XL"
    assert quant_label("IQ1_S/model-00001-of-00002.gguf") == "IQ1_S"  # label from the folder
    assert quant_label("qwen2-7b-instruct.q8_0.gguf") == "q8_0"
    groups = group_ggufs(list(FILES))
    assert [(g.label, len(g.files)) for g in groups] == [("BF16", 3), ("Q4_K_M", 1), ("Q8_0", 1)]
    assert groups[0].files == tuple(f"BF16/Tiny-MoE-BF16-0000{k}-of-00003.gguf" for k in (1, 2, 3))


# -- resolve against the server ---------------------------------------------------------

def test_resolve_default_case_insensitive_and_missing(hub):
    ref = resolve(REPO)
    assert (ref.quant, ref.files, ref.sizes) == ("Q4_K_M", ("Tiny-MoE-Q4_K_M.gguf",), (len(Q4),))
    assert ref.sha256 == (hashlib.sha256(Q4).hexdigest(),) and ref.revision == hub.repos[REPO].commit
    assert resolve(f"{REPO}:q8_0").files == ("Tiny-MoE-Q8_0.gguf",)
    assert resolve(f"{REPO}:bf16").files == tuple(f"BF16/Tiny-MoE-BF16-0000{k}-of-00003.gguf" for k in (1, 2, 3))
    with pytest.raises(UserError) as e:
        resolve(f"{REPO}:Q5_K_S")
    assert str(e.value) == f"{REPO} has no Q5_K_S GGUF; available: BF16, Q4_K_M, Q8_0"
    assert cdn_gets(hub) == []  # resolving downloads nothing


def test_default_quant_absent_lists_alternatives_or_takes_the_only_one(hub):
    hub.add_repo("org/Two-GGUF", {"two-Q8_0.gguf": blob(100, 7), "two-IQ2_XXS.gguf": blob(100, 8)})
    with pytest.raises(UserError, match=r"no Q4_K_M \(the default\) GGUF; available: IQ2_XXS, Q8_0"):
        resolve("org/Two-GGUF")
    hub.add_repo("org/One-GGUF", {"one-Q8_0.gguf": blob(100, 9)})
    assert resolve("org/One-GGUF").quant == "Q8_0"


def test_missing_split_part_is_named(hub):
    files = {k: v for k, v in FILES.items() if "00002-of" not in k}
    hub.add_repo("org/Broken-GGUF", files)
    with pytest.raises(UserError) as e:
        pull("org/Broken-GGUF:BF16")
    assert str(e.value) == (
        "org/Broken-GGUF: BF16 is split in 3 parts but BF16/Tiny-MoE-BF16-00002-of-00003.gguf is missing"
    )
    assert cdn_gets(hub) == []


def test_unknown_repo(hub):
    with pytest.raises(UserError, match="org/Nope-GGUF: no such model on http://127.0.0.1"):
        resolve("org/Nope-GGUF")


# -- downloads --------------------------------------------------------------------------

def test_pull_into_hf_cache_with_progress(hub, tmp_path):
    seen = []
    paths = pull(REPO, progress=seen.append)
    commit = hub.repos[REPO].commit
    snap = tmp_path / "hf" / "hub" / "models--org--Tiny-MoE-GGUF" / "snapshots" / commit
    assert paths == [snap / "Tiny-MoE-Q4_K_M.gguf"]
    assert sha(paths[0]) == hashlib.sha256(Q4).hexdigest()
    # huggingface_hub's layout: the snapshot entry links to the one blob (no second copy).
    assert paths[0].is_symlink()
    assert Path(os.path.realpath(paths[0])).parent.name == "blobs"
    assert (snap.parent.parent / "refs" / "main").read_text() == commit
    assert seen[0].done == 0 and not seen[0].finished
    last = seen[-1]
    assert (last.finished, last.done, last.total, last.index, last.count) == (True, len(Q4), len(Q4), 0, 1)
    assert last.filename == "Tiny-MoE-Q4_K_M.gguf" and last.rate > 0
    # The Hub's token-bearing origin sent the file to the CDN origin, as on huggingface.co.
    assert [s.path.split("?")[0] for s in cdn_gets(hub)] == [f"/lfs/{hashlib.sha256(Q4).hexdigest()}"]
    assert pull(REPO) == paths and len(cdn_gets(hub)) == 1  # second pull: from the cache


def test_shares_the_cache_with_huggingface_hub(hub):
    """huggingface_hub's own downloader finds our files, and we find its: one copy either way."""
    from huggingface_hub import HfApi, hf_hub_download

    from rapidmoe.engine.hub.cache import hub_cache_dir

    ours = pull(REPO)
    theirs = hf_hub_download(REPO, "Tiny-MoE-Q4_K_M.gguf", cache_dir=hub_cache_dir(), endpoint=hub.endpoint)
    assert Path(theirs) == ours[0] and len(cdn_gets(hub)) == 1
    q8 = hf_hub_download(REPO, "Tiny-MoE-Q8_0.gguf", cache_dir=hub_cache_dir(), endpoint=hub.endpoint)
    assert pull(f"{REPO}:Q8_0") == [Path(q8)] and len(cdn_gets(hub)) == 2
    tree = {f.path: getattr(f, "size", "dir") for f in HfApi(endpoint=hub.endpoint).list_repo_tree(REPO, recursive=True)}
    assert tree["BF16/Tiny-MoE-BF16-00003-of-00003.gguf"] == 10_000 and tree["BF16"] == "dir"


def test_split_pull_returns_parts_in_order(hub):
    paths = pull(f"{REPO}:BF16")
    assert [p.name for p in paths] == [f"Tiny-MoE-BF16-0000{k}-of-00003.gguf" for k in (1, 2, 3)]
    for p in paths:
        assert p.read_bytes() == FILES[f"BF16/{p.name}"]
    cached = {m.quant: m for m in list_cached()}
    assert set(cached) == {"BF16"}
    m = cached["BF16"]
    assert (m.repo, m.files, m.size, m.complete) == (REPO, tuple(paths), 50_000, True)


def test_cut_connection_resumes_with_range(hub):
    digest = hashlib.sha256(Q4).hexdigest()
    hub.cut_after[digest] = 123_457
    seen = []
    paths = pull(REPO, progress=seen.append)
    gets = cdn_gets(hub)
    assert len(gets) == 2
    assert "Range" not in gets[0].headers and gets[1].headers["Range"] == "bytes=123457-"
    assert sha(paths[0]) == digest
    assert seen[-1].done == len(Q4) and seen[-1].finished


def test_expired_cdn_link_is_renewed(hub):
    digest = hashlib.sha256(Q4).hexdigest()
    hub.cut_after[digest] = 150_000
    hub.expire_on_cut = True
    paths = pull(REPO)
    gets = [(g.path.rsplit("=", 1)[1], g.headers.get("Range")) for g in cdn_gets(hub)]
    assert gets == [("s1", None), ("s1", "bytes=150000-"), ("s2", "bytes=150000-")]
    assert len(hub.requests("hub", "HEAD")) == 2 and sha(paths[0]) == digest


def test_server_ignoring_range_restarts_cleanly(hub):
    digest = hashlib.sha256(Q4).hexdigest()
    hub.cut_after[digest] = 200_000
    hub.ignore_range = True
    paths = pull(REPO)
    assert [g.headers.get("Range") for g in cdn_gets(hub)] == [None, "bytes=200000-"]
    assert sha(paths[0]) == digest


def test_ctrl_c_leaves_resumable_partial(hub, tmp_path):
    """A real Ctrl+C on the CLI mid-file (exit 130), then a pull that continues with Range."""
    digest = hashlib.sha256(Q4).hexdigest()
    hub.stall_after[digest] = 100_001
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Ctrl+C as in a terminal: a runner started in the background hands its children
    # SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "rapidmoe.app.cli", "pull", REPO],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    part = tmp_path / "hf" / "hub" / "models--org--Tiny-MoE-GGUF" / "blobs" / f"{digest}.incomplete"
    deadline = time.monotonic() + 20
    while not (part.exists() and part.stat().st_size == 100_001) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert part.exists() and part.stat().st_size == 100_001
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    hub.release.set()
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and out == ""
    assert part.stat().st_size == 100_001
    assert list_cached() == []  # a partial is not a model
    seen = []
    paths = pull(REPO, progress=seen.append)
    assert cdn_gets(hub)[-1].headers["Range"] == "bytes=100001-"
    assert seen[0].resumed_from == 100_001
    assert sha(paths[0]) == digest and not part.exists()


def test_corrupt_download_is_rejected(hub, tmp_path):
    """Bytes that never match the Hub's sha256: fetched once more, then one line that says
    whose fault it is and does not invite a retry that would fail the same way."""
    digest = hashlib.sha256(Q4).hexdigest()
    hub.blobs[digest] = Q4[:-1] + b"!"  # the CDN serves other bytes than the Hub's sha256
    with pytest.raises(UserError, match="did its bytes match the sha256") as e:
        pull(REPO)
    msg = str(e.value)
    assert "run again" not in msg and "retry will not help" in msg and "\n" not in msg
    assert "Q4_K_M.gguf" in msg and digest not in msg  # the file the user asked for, not the blob's hash
    assert len([s for s in cdn_gets(hub) if digest in s.path]) == 2  # one more try, not more
    folder = tmp_path / "hf" / "hub" / "models--org--Tiny-MoE-GGUF"
    assert list((folder / "blobs").iterdir()) == [] and not (folder / "snapshots").exists()


def test_checksum_error_names_the_file(hub, tmp_path):
    from rapidmoe.engine.hub.download import fetch_blob

    digest = hashlib.sha256(Q4).hexdigest()
    hub.blobs[digest] = Q4[:-1] + b"!"
    blob_path = tmp_path / "blobs" / digest
    with pytest.raises(UserError) as e:
        fetch_blob(url=f"{hub.cdn}/lfs/{digest}", endpoint=hub.endpoint, blob=blob_path,
                   lock_path=tmp_path / "locks" / f"{digest}.lock", size=len(Q4), sha256=digest,
                   report=lambda *a: None, filename="Tiny-MoE-Q4_K_M.gguf")
    assert str(e.value).startswith("Tiny-MoE-Q4_K_M.gguf: ") and not str(e.value).startswith(digest)
    assert list(blob_path.parent.iterdir()) == []


def test_stale_partial_is_fetched_again_once(hub, tmp_path):
    """A partial left by an earlier run that does not fit the file: the sha256 catches it
    and the file is fetched again from the start, in the same run."""
    digest = hashlib.sha256(Q4).hexdigest()
    folder = tmp_path / "hf" / "hub" / "models--org--Tiny-MoE-GGUF"
    part = folder / "blobs" / f"{digest}.incomplete"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"GGUF" + b"\0" * 99_996)  # other bytes than the file's first 100 kB
    paths = pull(REPO)
    assert sha(paths[0]) == digest and not part.exists()
    assert [s.headers.get("Range") for s in cdn_gets(hub) if digest in s.path] == ["bytes=100000-", None]


def test_disk_space_checked_before_download(hub):
    r = hub.add_repo("org/Huge-GGUF", {"huge-Q4_K_M.gguf": blob(1000, 10)})
    r.declared_size["huge-Q4_K_M.gguf"] = 1 << 60
    with pytest.raises(UserError, match=rf"not enough free disk space in .*needs {1 << 60} more bytes"):
        pull("org/Huge-GGUF")
    assert cdn_gets(hub) == []


# -- offline ----------------------------------------------------------------------------

def test_offline_with_filled_cache(hub, monkeypatch):
    paths = pull(REPO)
    hub.stop()  # nothing answers any more
    assert pull(REPO, offline=True) == paths
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pull(f"{REPO}:q4_k_m") == paths
    with pytest.raises(UserError, match=r"\(cached\) has no Q8_0 GGUF; available: Q4_K_M"):
        pull(f"{REPO}:Q8_0")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert pull(REPO) == paths  # online but unreachable: the cached copy still works
    with pytest.raises(UserError, match=r"^cannot reach http://127\.0\.0\.1:\d+ \(ConnectError\) and org/Other"):
        pull("org/Other-GGUF")


def test_offline_empty_cache_one_line(hub, capsys):
    with pytest.raises(UserError) as e:
        pull(REPO, offline=True)
    msg = str(e.value)
    assert "\n" not in msg and "is not in the Hugging Face cache" in msg and "offline" in msg
    assert main(["pull", REPO, "--offline"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rapidmoe-chat: error: org/Tiny-MoE-GGUF is not in")
    assert "--offline" not in msg and "offline mode is on" in msg
    assert hub.seen == []  # offline means no request at all


# -- tokens -----------------------------------------------------------------------------

def test_gated_repo_and_token_never_shown(hub, monkeypatch, capfd, caplog):
    token = "hf_SeCrEtTokenValue0123456789"
    hub.add_repo("org/Gated-GGUF", {"g-Q4_K_M.gguf": blob(40_000, 11)}, gated_token=token)
    caplog.set_level(logging.DEBUG)
    assert main(["pull", "org/Gated-GGUF"]) == 2
    assert "org/Gated-GGUF is gated" in capfd.readouterr().err
    monkeypatch.setenv("HF_TOKEN", token[:-1] + "X")  # a wrong token: refused, and not echoed
    assert main(["pull", "org/Gated-GGUF"]) == 2
    monkeypatch.setenv("HF_TOKEN", token)
    assert main(["pull", "org/Gated-GGUF"]) == 0
    out, err = capfd.readouterr()
    assert out.strip().endswith("g-Q4_K_M.gguf") and "done [1/1] g-Q4_K_M.gguf" in err
    logs = "\n".join(r.getMessage() for r in caplog.records)
    for text in (out, err, logs):
        assert token[:-1] not in text
    hub_auth = [s.headers.get("Authorization") for s in hub.requests("hub")]
    assert f"Bearer {token}" in hub_auth  # sent to the Hub...
    assert all("Authorization" not in s.headers for s in cdn_gets(hub))  # ...never to the CDN


# -- CLI --------------------------------------------------------------------------------

def test_cli_exit_codes(hub, capsys):
    assert main(["pull", f"{REPO}:Q8_0"]) == 0
    out, err = capsys.readouterr()
    assert Path(out.strip()).read_bytes() == FILES["Tiny-MoE-Q8_0.gguf"]
    assert "downloading [1/1] Tiny-MoE-Q8_0.gguf (50.0 kB)" in err
    assert main(["pull", "not a repo"]) == 2
    assert "bad model spec" in capsys.readouterr().err
    assert main(["pull", f"{REPO}:Q5_K_S"]) == 2
    assert "available: BF16, Q4_K_M, Q8_0" in capsys.readouterr().err


def test_cli_bar_on_a_terminal(hub):
    from rich.console import Console

    from rapidmoe.app.cmd_pull import BarProgress

    buf = io.StringIO()
    bar = BarProgress(Console(file=buf, force_terminal=True, width=120))
    pull(REPO, progress=bar)
    bar.close()
    text = buf.getvalue()
    assert "[1/1] Tiny-MoE-Q4_K_M.gguf" in text and "300.0/300.0 kB" in text and "MB/s" in text


def test_local_paths(tmp_path):
    single = tmp_path / "m-Q4_K_M.gguf"
    single.write_bytes(b"GGUF")
    assert pull(str(single)) == [single]
    for k in (1, 3):
        (tmp_path / f"s-0000{k}-of-00003.gguf").write_bytes(b"GGUF")
    with pytest.raises(UserError, match="s-00002-of-00003.gguf"):
        pull(str(tmp_path / "s-00001-of-00003.gguf"))
    (tmp_path / "s-00002-of-00003.gguf").write_bytes(b"GGUF")
    assert [p.name for p in pull(str(tmp_path / "s-00001-of-00003.gguf"))] == [
        f"s-0000{k}-of-00003.gguf" for k in (1, 2, 3)
    ]
    with pytest.raises(UserError, match="no such file"):
        pull(str(tmp_path / "absent.gguf"))
