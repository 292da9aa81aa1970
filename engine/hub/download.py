"""Download one Hub file into the HF cache, resumable across runs.

huggingface_hub 2.x writes each download to a process-unique temp file and
deletes it on failure, so an interrupted multi-GB GGUF would start over. We keep
the partial at `blobs/<etag>.incomplete` (the name scan_cache_dir reports) and
continue it with an HTTP Range request: after a dropped connection within this
run, and after Ctrl+C / a crash / a full disk on the next run. The HTTP client,
auth headers and error types are huggingface_hub's own.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx2
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import WeakFileLock, build_hf_headers, get_session, hf_raise_for_status

from ..errors import UserError
from .http import SHA256, client_timeout, same_origin, short, timeout_s

_PIECE_LOG_S = 0.1  # at most this often a progress report mid-file
_RETRIES = 5  # consecutive failed attempts without new bytes before giving up
_ATTEMPTS = 30  # requests for one file in one run, whatever they brought
_STALLS = 3  # read timeouts (a server that stops sending) for one file in one run
_MIN_BYTES = 1024  # a body trickling slower than this per 3 read timeouts counts as a stall


@dataclass(frozen=True)
class DownloadProgress:
    """A progress report for one file of a pull (all sizes in bytes)."""

    filename: str  # repo-relative path
    index: int  # 0-based position of this file in the pull
    count: int  # files in the pull
    done: int  # bytes of this file on disk (resumed bytes included)
    total: int | None  # size of this file
    resumed_from: int  # bytes already on disk when this run started the file
    rate: float  # bytes/s over the last few seconds (0.0 until known)
    eta_s: float | None  # seconds left for this file at `rate`
    finished: bool = False


ProgressFn = Callable[[DownloadProgress], None]


class _Rate:
    """Transfer rate over a sliding window of recent samples."""

    def __init__(self, window_s: float = 5.0):
        self.window = window_s
        self.samples: list[tuple[float, int]] = []

    def add(self, t: float, done: int) -> float:
        self.samples.append((t, done))
        while len(self.samples) > 2 and t - self.samples[1][0] >= self.window:
            self.samples.pop(0)
        (t0, d0) = self.samples[0]
        return (done - d0) / (t - t0) if t > t0 else 0.0


def fetch_blob(
    *,
    url: str,
    endpoint: str,
    blob: Path,
    lock_path: Path,
    size: int | None,
    sha256: str | None,
    report: Callable[[int, int, bool], None],
    filename: str | None = None,
) -> None:
    """Stream `url` into `blob` (via `blob.incomplete`), resuming a partial left by an earlier run.

    `report(done, resumed_from, finished)` is called at the start, every ~0.1 s, and at the end.
    `filename` (the repo path) names the file in errors: the blob's own name is a hash.
    Bytes that do not match `sha256` are fetched once more from the start (a partial from
    an earlier run or one bad transfer can cause that); a second mismatch is the server's
    doing and is said to be, rather than suggesting a retry that would fail the same way.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    blob.parent.mkdir(parents=True, exist_ok=True)
    name = filename or blob.name
    with WeakFileLock(lock_path):  # the lock huggingface_hub takes for this blob
        if blob.exists():
            return
        part = blob.with_name(blob.name + ".incomplete")
        for attempt in (0, 1):
            done, resumed_from, digest = _fetch_part(url, endpoint, part, size, sha256, report, name)
            if digest is None or digest == sha256:
                break
            part.unlink()
            if attempt:
                raise UserError(
                    f"{name}: downloaded twice, and neither time did its bytes match the sha256 the Hub lists "
                    f"(expected {sha256[:12]}..., got {digest[:12]}...); nothing was kept. The server sends "
                    "other bytes than the repository declares, so a retry will not help: tell its owner")
        os.replace(part, blob)
        report(done, resumed_from, True)


def _fetch_part(url: str, endpoint: str, part: Path, size: int | None, sha256: str | None,
                report: Callable[[int, int, bool], None], name: str) -> tuple[int, int, str | None]:
    """Download into `part` until it is complete -> (bytes, bytes resumed from, sha256 of
    the bytes or None when there is no sha256 to check)."""
    done = part.stat().st_size if part.exists() else 0
    if size is not None and done > size:
        part.unlink()
        done = 0
    resumed_from = done
    report(done, resumed_from, False)
    hasher = hashlib.sha256() if sha256 and SHA256.match(sha256) else None
    if hasher and done:
        with part.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                hasher.update(chunk)
    # The token goes to the Hub only, never to a CDN the Hub redirects to.
    headers = build_hf_headers() if same_origin(url, endpoint) else build_hf_headers(token=False)
    headers["Accept-Encoding"] = "identity"
    st = _State(done, size, hasher)
    failures = stalls = 0
    with part.open("ab") as out:
        for attempt in range(1, _ATTEMPTS + 1):
            if st.size is not None and st.done >= st.size:
                break  # a partial an earlier run finished but had no time to move into place
            before = st.done
            try:
                _stream(url, headers, out, st, resumed_from, report, name)
                if st.size is None or st.done >= st.size:
                    break
                # the body ended early without an error (no Content-Length, or a server
                # that closes): a dropped line like any other, resumed with Range
                err: Exception = _EndedEarly(f"the body ended at byte {st.done} of {st.size}")
            except (httpx2.TransportError, HfHubHTTPError) as e:
                status = e.response.status_code if isinstance(e, HfHubHTTPError) and e.response is not None else 0
                if isinstance(e, HfHubHTTPError) and status < 500 and status != 429:
                    raise
                err = e
            except httpx2.TooManyRedirects:
                raise UserError(f"{short(url)} redirects in a loop; is HF_ENDPOINT a Hugging Face Hub?") from None
            except OSError as e:  # disk full, permissions: the partial stays for a later resume
                raise UserError(f"cannot write {part}: {e.strerror or e} (partial download kept)") from None
            failures = 0 if st.done > before else failures + 1
            stalls += isinstance(err, httpx2.TimeoutException)
            if failures >= _RETRIES or stalls >= _STALLS or attempt == _ATTEMPTS:
                why = (f"stalled {stalls} times: no bytes for {timeout_s():g} s, or under {_MIN_BYTES} bytes "
                       f"in {3 * timeout_s():g} s" if stalls >= _STALLS
                       else f"{attempt} requests" if attempt == _ATTEMPTS
                       else str(err) if isinstance(err, _EndedEarly) else type(err).__name__)
                raise UserError(f"download of {name} keeps failing ({why}); "
                                "the partial file is kept: run the same command again to resume")
            time.sleep(min(0.25 * 2**failures, 2.0, timeout_s()))
    if st.size is not None and st.done != st.size:
        raise UserError(f"{name}: got {st.done} bytes, expected {st.size} ({part} kept)")
    return st.done, resumed_from, st.hasher.hexdigest() if st.hasher else None


class _EndedEarly(Exception):
    pass


@dataclass
class _State:
    done: int  # bytes in the partial file
    size: int | None
    hasher: "hashlib._Hash | None"


def _stream(url: str, headers: dict, out, st: _State, resumed_from: int, report, name: str) -> None:
    """One GET (with Range when resuming), appending to `out` and updating `st` as bytes land."""
    h = dict(headers)
    if st.done:
        h["Range"] = f"bytes={st.done}-"
    with get_session().stream("GET", url, headers=h, timeout=client_timeout(), follow_redirects=True) as r:
        if r.status_code == 416:  # the partial does not fit the file any more: start over
            out.seek(0)
            out.truncate()
            st.done = 0
            st.hasher = hashlib.sha256() if st.hasher is not None else None
            return
        hf_raise_for_status(r)
        if st.done and r.status_code == 200:  # the server ignored Range: start over
            out.seek(0)
            out.truncate()
            st.done = 0
            st.hasher = hashlib.sha256() if st.hasher is not None else None
        elif st.done:
            m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", r.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != st.done:
                raise UserError(f"{url.split('?')[0]}: server answered a resume with a wrong range")
        length = r.headers.get("Content-Length", "")
        length = int(length) if length.isdigit() else None
        if r.status_code == 200 and st.size is not None and length is not None and length != st.size:
            kind = r.headers.get("Content-Type", "no content type").split(";")[0]
            raise UserError(f"{name}: {short(url)} sent {length} bytes of {kind} for a file of {st.size} "
                            "bytes; is HF_ENDPOINT a Hugging Face Hub?")
        if st.size is None and length is not None:
            st.size = st.done + length
        last = window_t = time.monotonic()
        window_done = st.done
        for piece in r.iter_bytes():
            out.write(piece)
            out.flush()  # what is counted is on disk: a crash loses nothing we would skip on resume
            if st.hasher is not None:
                st.hasher.update(piece)
            st.done += len(piece)
            if st.size is not None and st.done > st.size:
                raise UserError(f"{url.split('?')[0]}: server sent more than the {st.size} bytes announced")
            now = time.monotonic()
            if now - window_t >= 3 * timeout_s():  # a trickle that never lets the read timeout fire
                if st.done - window_done < _MIN_BYTES:
                    raise httpx2.ReadTimeout(f"under {_MIN_BYTES} bytes in {3 * timeout_s():g} s")
                window_t, window_done = now, st.done
            if now - last >= _PIECE_LOG_S:
                last = now
                report(st.done, resumed_from, False)
