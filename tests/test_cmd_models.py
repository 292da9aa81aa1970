"""`paths`, `list` and `rm` on real files: a Hugging Face cache laid out as
huggingface_hub lays it out (blobs + snapshot symlinks + refs), packs written as
GGUF files, and the built-in demo path."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from rapidmoe.app.cli import main
from rapidmoe.app.cmd_list import PACK_SOURCE_KEY, packs_dir
from rapidmoe.engine.pack.convert import PACK_VERSION, pack_path


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    for var in ("RAPIDMOE_CACHE_DIR", "RAPIDMOE_CONFIG_DIR", "RAPIDMOE_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.split("_")[1].lower()))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path


def hf_file(root: Path, repo: str, name: str, data: bytes, commit="c0ffee" * 6 + "abcd") -> Path:
    """One file in the HF cache layout: blobs/<etag>, snapshots/<commit>/<name> -> blob, refs/main."""
    rd = root / "hf" / "hub" / ("models--" + repo.replace("/", "--"))
    blob = rd / "blobs" / f"{abs(hash((repo, name))):x}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    ptr = rd / "snapshots" / commit / name
    ptr.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(blob, ptr.parent), ptr)
    (rd / "refs").mkdir(exist_ok=True)
    (rd / "refs" / "main").write_text(commit)
    return ptr


def gguf_bytes(tmp: Path, n: int) -> bytes:
    return pack(tmp / f"src{n}.gguf", None, version=None, n=n).read_bytes()


def pack(path: Path, source: str | None, version: int | None = PACK_VERSION, n: int = 64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "llama")
    if version is not None:
        w.add_uint32("rapidmoe.pack.version", version)
    if source is not None:
        w.add_string(PACK_SOURCE_KEY, source)
    w.add_tensor("wq", np.zeros(n, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_paths_prints_every_location(dirs, capsys):
    assert main(["paths", "--json"]) == 0
    locs = json.loads(capsys.readouterr().out)
    assert locs["config"] == str(dirs / "config" / "config.toml")
    assert locs["history"] == str(dirs / "data" / "history.db")
    assert locs["packs"] == str(dirs / "cache" / "packs")
    assert locs["hf cache"] == str(dirs / "hf" / "hub")
    assert locs["demo model"].startswith(str(dirs / "cache"))
    assert main(["paths"]) == 0
    out = capsys.readouterr().out
    assert "history" in out and "(not created yet)" in out


def test_list_and_rm(dirs, capsys):
    q4 = hf_file(dirs, "org/Tiny-GGUF", "tiny-Q4_K_M.gguf", gguf_bytes(dirs, 700))
    q8 = hf_file(dirs, "org/Tiny-GGUF", "tiny-Q8_0.gguf", gguf_bytes(dirs, 1200))
    q4_size, q8_size = q4.stat().st_size, q8.stat().st_size
    good = pack(pack_path(q4), None)  # where the engine puts q4's pack
    resumable = pack_path(q8).with_name(pack_path(q8).name + ".partial")
    resumable.write_bytes(b"\0" * 100)
    resumable.with_name(pack_path(q8).name + ".done-layers").write_text("{}")
    orphan = pack(packs_dir() / "old.gguf", str(dirs / "deleted.gguf"))
    pack(packs_dir() / "v0.gguf", None, version=PACK_VERSION + 100)
    (packs_dir() / ".half.gguf.123.tmp").write_bytes(b"partial")
    (packs_dir() / "lone.rmpack.gguf.partial").write_bytes(b"no resume record")
    (packs_dir() / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 10)

    assert main(["list", "--json"]) == 0
    rows = {r["name"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["org/Tiny-GGUF:Q4_K_M"]["size"] == q4_size and rows["org/Tiny-GGUF:Q8_0"]["size"] == q8_size
    assert rows["demo"]["kind"] == "demo"
    assert rows[good.name] == {**rows[good.name], "stale": False, "note": "from org/Tiny-GGUF:Q4_K_M"}
    assert not rows[resumable.name]["stale"] and "resumes" in rows[resumable.name]["note"]
    stale = {n for n, r in rows.items() if r["stale"]}
    assert stale == {"old.gguf", "v0.gguf", ".half.gguf.123.tmp", "lone.rmpack.gguf.partial", "broken.gguf"}
    assert "source gone" in rows["old.gguf"]["note"] and "format" in rows["v0.gguf"]["note"]
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "org/Tiny-GGUF:Q4_K_M" in text and "5 stale pack(s)" in text

    # without --yes and without a terminal nothing is removed
    assert main(["rm", "org/tiny-gguf:q4_k_m"]) == 2
    assert q4.exists() and good.exists()
    capsys.readouterr()

    # the quant goes with its pack and blob, the other quant stays, stale packs are cleaned
    assert main(["rm", "org/tiny-gguf:q4_k_m", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"removed {good.name}" in out and "removed org/Tiny-GGUF:Q4_K_M" in out
    assert "removed 5 stale pack(s)" in out
    assert not q4.exists() and not good.exists() and not orphan.exists()
    assert sorted(p.name for p in packs_dir().iterdir()) == sorted(
        [resumable.name, pack_path(q8).name + ".done-layers"])
    blobs = list((dirs / "hf/hub/models--org--Tiny-GGUF/blobs").iterdir())
    assert [b.stat().st_size for b in blobs] == [q8_size]

    # the last quant of a repo takes the repo folder (and its interrupted pack) with it
    assert main(["rm", "org/Tiny-GGUF", "--yes"]) == 0
    assert not (dirs / "hf/hub/models--org--Tiny-GGUF").exists()
    assert list(packs_dir().iterdir()) == []
    capsys.readouterr()
    assert main(["rm", "nope/nothing", "--yes"]) == 2
    assert "no such model or pack" in capsys.readouterr().err
    assert main(["rm", "--stale"]) == 0
    assert "no stale packs" in capsys.readouterr().out


def test_list_counts_a_shared_blob_once(dirs, capsys):
    """Two snapshots of a repo whose file did not change point at one blob: listed under
    both revisions, counted once in the total."""
    data = gguf_bytes(dirs, 3000)
    old = hf_file(dirs, "org/Same-GGUF", "same-Q4_K_M.gguf", data, commit="a" * 40)
    new = hf_file(dirs, "org/Same-GGUF", "same-Q4_K_M.gguf", data, commit="b" * 40)
    assert old.resolve() == new.resolve()
    other = hf_file(dirs, "org/Other-GGUF", "other-Q8_0.gguf", gguf_bytes(dirs, 500))
    assert main(["list", "--json"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    same = [r for r in rows if r["name"] == "org/Same-GGUF:Q4_K_M"]
    assert [r["size"] for r in same] == [len(data)] * 2
    assert [bool(r["shared_with"]) for r in same] == [False, True]
    assert "same file as org/Same-GGUF:Q4_K_M (revision aaaaaaaa)" in same[1]["note"]
    assert "revision bbbbbbbb" in same[1]["note"] and "revision aaaaaaaa" in same[0]["note"]
    assert main(["list"]) == 0
    total = capsys.readouterr().out.splitlines()[-1]
    from rapidmoe.engine.units import fmt_bytes

    assert total == f"total {fmt_bytes(len(data) + other.stat().st_size)}"  # the demo is not built here
