"""Hugging Face Hub pulls: `REPO[:QUANT]` -> the GGUF file(s) in the HF cache.

    ref = resolve("unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M")   # which files, sizes, commit
    paths = pull("unsloth/Qwen3-30B-A3B-GGUF", progress=print)  # first part first

Online, the Hub's file list picks the files; offline (HF_HUB_OFFLINE=1 or
offline=True) the cached snapshot does, with no network access at all. The
token (HF_TOKEN or `hf auth login`) is handled by huggingface_hub and never
appears in our messages.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import httpx2
from huggingface_hub import get_token
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from . import cache as hc
from . import http as hub_http
from ..errors import UserError
from .cache import CachedModel, hub_cache_dir, list_cached
from .download import DownloadProgress, ProgressFn, _Rate, fetch_blob, same_origin
from .resolve import DEFAULT_QUANT, ModelRef, group_ggufs, looks_local, parse_spec, select_quant

__all__ = [
    "CachedModel", "DEFAULT_QUANT", "DownloadProgress", "ModelRef",
    "hub_cache_dir", "list_cached", "pull", "resolve",
]

_NET_ERRORS = (httpx2.TransportError, OfflineModeIsEnabled)
_PROTOCOL_ERRORS = (httpx2.TooManyRedirects, httpx2.DecodingError, httpx2.InvalidURL)


def _redact(text: str) -> str:
    """Belt and braces: a message built from a server's answer never shows the token."""
    tok = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    return text.replace(tok, "***") if tok and len(tok) >= 4 else text


def _hub_error(repo: str, e: Exception, tail: str = "") -> UserError:
    ep = hc.hub_endpoint()
    if isinstance(e, GatedRepoError):
        has = get_token() is not None  # HF_TOKEN or a stored `hf auth login` token
        return UserError(
            f"{repo} is gated: accept its terms at {ep}/{repo}, then "
            + ("check that HF_TOKEN has access to it" if has else "set HF_TOKEN to a token with access")
        )
    if isinstance(e, RepositoryNotFoundError):
        return UserError(f"{repo}: no such model on {ep} (if it is private, set HF_TOKEN)")
    if isinstance(e, (RevisionNotFoundError, RemoteEntryNotFoundError)):
        return UserError(f"{repo}: not found on {ep} ({type(e).__name__})")
    if isinstance(e, HfHubHTTPError) and e.response is not None:
        return UserError(_redact(f"{ep} answered HTTP {e.response.status_code} for {repo}"))
    if isinstance(e, httpx2.TimeoutException):
        t = hub_http.timeout_s()
        return UserError(_redact(f"no answer from {ep} within {t:g} s ({type(e).__name__}; "
                                 f"RAPIDMOE_HUB_TIMEOUT sets the wait){tail}"))
    if isinstance(e, _PROTOCOL_ERRORS):
        return UserError(_redact(f"{ep} answered in a way no Hugging Face Hub does "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:120]}){tail}"))
    return UserError(_redact(f"cannot reach {ep} ({type(e).__name__}){tail}"))


def _local_ref(spec: str) -> ModelRef:
    p = Path(spec).expanduser()
    if not p.is_file():
        raise UserError(f"{spec}: no such file")
    # A local split GGUF: every sibling part is required, like on the Hub.
    group = next((g for g in group_ggufs([p.name]) if g.missing or len(g.files) > 1), None)
    if group is not None:
        names = sorted(q.name for q in p.parent.iterdir())
        g = next(g for g in group_ggufs(names) if p.name in g.files + g.missing)
        if g.missing:
            raise UserError(f"{spec}: split GGUF part(s) missing next to it: {', '.join(g.missing)}")
        files = tuple(str((p.parent / f).resolve()) for f in g.files)
    else:
        files = (str(p.resolve()),)
    return ModelRef(None, None, files, tuple(os.path.getsize(f) for f in files))


def _cached_ref(repo: str, quant: str | None, why: str) -> ModelRef:
    commit = hc.cached_commit(repo)
    files = hc.snapshot_files(repo, commit) if commit else {}
    if not group_ggufs(list(files)):  # none, or a snapshot folder a pull had only begun to fill
        raise UserError(
            f"{repo} is not in the Hugging Face cache ({hub_cache_dir()}) and {why}; pull it once while online"
        )
    g = select_quant(repo, list(files), quant, where=" (cached)")
    return ModelRef(repo, g.label, g.files, tuple(files[f] for f in g.files), (), commit)


def resolve(spec: str, *, offline: bool = False) -> ModelRef:
    """Which file(s) `spec` means. A local path is returned as is (split parts grouped)."""
    if looks_local(spec):
        return _local_ref(spec)
    repo, quant = parse_spec(spec)
    if offline or hc.env_offline():
        return _cached_ref(repo, quant, "offline mode is on" + (" (HF_HUB_OFFLINE)" if hc.env_offline() else ""))
    try:
        info = hub_http.model_info(hc.hub_endpoint(), repo)
    except _NET_ERRORS as e:
        # No network: a fully cached copy still works, like huggingface_hub's own fallback.
        try:
            return _cached_ref(repo, quant, "the Hub cannot be reached")
        except UserError:
            raise _hub_error(repo, e, f" and {repo} is not in the Hugging Face cache") from None
    except hub_http.NotAHub as e:
        try:  # a captive portal, a proxy's error page: a fully cached copy still works
            return _cached_ref(repo, quant, "the Hub's answer was unusable")
        except UserError:
            raise e from None
    except (HfHubHTTPError, *_PROTOCOL_ERRORS) as e:
        raise _hub_error(repo, e) from None
    if not info.commit:
        raise UserError(f"{hc.hub_endpoint()} gave no commit for {repo}; is HF_ENDPOINT a Hugging Face Hub?")
    g = select_quant(repo, list(info.files), quant)
    files = {f: info.files[f] for f in g.files}
    if any(x.size is None for x in files.values()):
        files = _tree_files(repo, info.commit, files)
    return ModelRef(repo, g.label, g.files, tuple(files[f].size for f in g.files),
                    tuple(files[f].sha256 for f in g.files), info.commit)


def _tree_files(repo: str, commit: str, files: dict) -> dict:
    """Sizes (and LFS sha256s) the model-info answer left out, from the tree API: a
    download is checked against them before it counts as complete."""
    out = dict(files)
    for folder in sorted({f.rpartition("/")[0] for f, x in files.items() if x.size is None}):
        try:
            listed = hub_http.tree(hc.hub_endpoint(), repo, commit, folder)
        except (HfHubHTTPError, *_NET_ERRORS, *_PROTOCOL_ERRORS) as e:
            raise _hub_error(repo, e) from None
        for f, x in files.items():
            if x.size is None and f in listed:
                out[f] = hub_http.RepoFile(listed[f].size, x.sha256 or listed[f].sha256)
    return out


def _head(ref: ModelRef, f: str, endpoint: str):
    try:
        meta = hub_http.file_meta(endpoint, ref.repo, ref.revision, f)
    except (HfHubHTTPError, *_NET_ERRORS, *_PROTOCOL_ERRORS) as e:
        raise _hub_error(ref.repo, e) from None
    if not meta.etag:
        raise UserError(f"{endpoint} gave no ETag for {ref.repo}/{f}; is HF_ENDPOINT a Hugging Face Hub?")
    return meta


def _check_disk(ref: ModelRef, todo: dict[int, object]) -> None:
    """Fail before the first byte when what is left to download cannot fit."""
    need = 0
    for i, meta in todo.items():
        size = meta.size if meta.size is not None else ref.sizes[i]
        part = hc.repo_dir(ref.repo) / "blobs" / f"{meta.etag}.incomplete"
        have = part.stat().st_size if part.is_file() else 0
        need += max(0, (size or 0) - have)
    free = hc.free_bytes(hub_cache_dir())
    if need > free:
        raise UserError(
            f"not enough free disk space in {hub_cache_dir()}: {ref.spec} needs {need} more bytes "
            f"({need / 1e9:.2f} GB), {free} bytes ({free / 1e9:.2f} GB) are free"
        )


def pull(spec: str, *, offline: bool = False, progress: ProgressFn | None = None) -> list[Path]:
    """The file(s) of `spec` on disk, downloading what the cache lacks; first part first.

    Ctrl+C (KeyboardInterrupt, also if raised by `progress`) leaves the partial
    file in the cache; the next pull resumes it.
    """
    ref = resolve(spec, offline=offline)
    if ref.is_local:
        return [Path(f) for f in ref.files]
    assert ref.repo is not None and ref.revision is not None
    paths = [hc.pointer_path(ref.repo, ref.revision, f) for f in ref.files]
    if not (offline or hc.env_offline()):
        endpoint = hc.hub_endpoint()
        # Every HEAD first: access problems and disk space show before any download.
        todo = {i: _head(ref, f, endpoint) for i, f in enumerate(ref.files) if not paths[i].is_file()}
        _check_disk(ref, todo)
        for i, f in enumerate(ref.files):
            _pull_file(ref, i, todo.get(i), endpoint, progress)
        hc.write_ref(ref.repo, "main", ref.revision)
    for p in paths:
        if not p.is_file():
            raise UserError(f"{p} is missing from the cache; pull {ref.spec} again")
    return paths


def _pull_file(ref: ModelRef, i: int, meta, endpoint: str, progress: ProgressFn | None) -> None:
    f = ref.files[i]
    pointer = hc.pointer_path(ref.repo, ref.revision, f)
    size = meta.size if meta is not None and meta.size is not None else ref.sizes[i]
    rate = _Rate()

    def report(done: int, resumed_from: int, finished: bool) -> None:
        if progress is None:
            return
        r = rate.add(time.monotonic(), done)
        eta = (size - done) / r if r > 0 and size is not None else None
        progress(DownloadProgress(f, i, len(ref.files), done, size, resumed_from, r, eta, finished))

    if meta is None:  # already cached
        n = pointer.stat().st_size
        report(n, n, True)
        return
    sha256 = (ref.sha256[i] if ref.sha256 else None) or meta.etag
    if size is None and not hub_http.SHA256.match(sha256 or ""):
        raise UserError(f"{ref.repo}/{f}: {endpoint} gives neither its size nor its sha256, so a download "
                        "could not be checked; is HF_ENDPOINT a Hugging Face Hub?")
    folder = hc.repo_dir(ref.repo)
    blob = folder / "blobs" / meta.etag
    for attempt in (0, 1):
        try:
            fetch_blob(
                url=meta.location,
                endpoint=endpoint,
                blob=blob,
                lock_path=hub_cache_dir() / ".locks" / folder.name / f"{meta.etag}.lock",
                size=size,
                sha256=sha256,
                report=report,
                filename=f,
            )
            break
        except (HfHubHTTPError, *_NET_ERRORS, *_PROTOCOL_ERRORS) as e:
            # A signed CDN link can expire during a long pull: ask the Hub for a fresh one, once.
            status = e.response.status_code if isinstance(e, HfHubHTTPError) and e.response is not None else 0
            if attempt == 0 and status in (401, 403) and not same_origin(meta.location, endpoint):
                meta = _head(ref, f, endpoint)
                continue
            raise _hub_error(ref.repo, e, "; run the same command again to resume") from None
    hc.link_pointer(blob, pointer)
