"""The Hugging Face cache as we share it with huggingface_hub (no second copy).

Layout (huggingface_hub's): <cache>/models--org--name/{blobs/<etag>,
snapshots/<commit>/<path> -> ../../blobs/<etag>, refs/<branch>}. Settings are
read from the environment at call time, not at import, so HF_HOME / HF_HUB_CACHE
/ HF_ENDPOINT / HF_HUB_OFFLINE set after start-up still apply.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from .resolve import group_ggufs

_TRUE = {"1", "true", "yes", "on"}


def hub_cache_dir() -> Path:
    if v := os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.path.expanduser(v)))
    if v := os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.path.expanduser(v))) / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def env_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE or constants.is_offline_mode()


def repo_dir(repo: str) -> Path:
    return hub_cache_dir() / ("models--" + repo.replace("/", "--"))


def pointer_path(repo: str, commit: str, filename: str) -> Path:
    return repo_dir(repo) / "snapshots" / commit / Path(*filename.split("/"))


def cached_commit(repo: str, revision: str = "main") -> str | None:
    """The commit the cache last saw for `revision`, else the newest snapshot."""
    rd = repo_dir(repo)
    ref = rd / "refs" / revision
    if ref.is_file():
        commit = ref.read_text().strip()
        if (rd / "snapshots" / commit).is_dir():
            return commit
    snaps = [p for p in (rd / "snapshots").glob("*") if p.is_dir()] if (rd / "snapshots").is_dir() else []
    return max(snaps, key=lambda p: p.stat().st_mtime).name if snaps else None


def snapshot_files(repo: str, commit: str) -> dict[str, int]:
    """Repo-relative path -> size of every complete file in a cached snapshot."""
    root = repo_dir(repo) / "snapshots" / commit
    out: dict[str, int] = {}
    for p in root.rglob("*"):
        try:
            if p.is_file():  # follows the symlink: a dangling pointer is not a file
                out[p.relative_to(root).as_posix()] = p.stat().st_size
        except OSError:
            continue
    return out


def write_ref(repo: str, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = repo_dir(repo) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.is_file() or ref.read_text(errors="replace").strip() != commit:
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)  # a kill mid-write never leaves a half-written ref


def link_pointer(blob: Path, pointer: Path) -> None:
    """snapshots/<commit>/<file> -> blob, as a relative symlink like huggingface_hub makes.

    Where symlinks are not allowed (Windows without developer mode) the blob
    moves to the pointer path: still one copy on disk.
    """
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.exists():
        return
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:
        shutil.move(str(blob), str(pointer))


def free_bytes(path: Path) -> int:
    """Free space on the file system that will hold `path` (its nearest existing parent)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


@dataclass(frozen=True)
class CachedModel:
    repo: str
    quant: str  # label from the file name ("" when none)
    files: tuple[Path, ...]  # snapshot paths, first part first (complete parts only)
    size: int  # bytes on disk
    revision: str  # commit sha
    missing: tuple[str, ...] = ()  # split parts not in the cache

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def spec(self) -> str:
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


def list_cached() -> list[CachedModel]:
    """GGUF models in the HF cache, one entry per (repo, snapshot, quant)."""
    try:
        info = scan_cache_dir(hub_cache_dir())
    except CacheNotFound:
        return []
    out: list[CachedModel] = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            by_rel = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
            for g in group_ggufs(list(by_rel)):
                out.append(
                    CachedModel(
                        repo=repo.repo_id,
                        quant=g.label,
                        files=tuple(by_rel[f].file_path for f in g.files),
                        size=sum(by_rel[f].size_on_disk for f in g.files),
                        revision=rev.commit_hash,
                        missing=g.missing,
                    )
                )
    return sorted(out, key=lambda m: (m.repo.lower(), m.quant.lower(), m.revision))
