"""HTTP to the Hub with a bound on everything: connect and read timeouts on every
request, a total time for each API answer, a cap on redirects (and loops refused at
once), a cap on the size of a JSON answer, and answers that are not the JSON the
Hub sends (an HTML page, garbage) said in one line. huggingface_hub's session,
headers and error mapping (gated, not found, ...) are used as they are; its
model-info call is not (it waits without a timeout).

RAPIDMOE_HUB_TIMEOUT (seconds, default 10) sets the connect and read timeouts; an
API answer gets three times that in total.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from urllib.parse import quote, urljoin, urlsplit

import httpx2
from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from ..errors import UserError


class NotAHub(UserError):
    """An answer no Hugging Face Hub gives (a page, garbage, a redirect loop): like no
    answer at all, a fully cached model still works."""


MAX_REDIRECTS = 5
MAX_JSON_BYTES = 64 << 20  # a repo with tens of thousands of files lists in a few MB
SHA256 = re.compile(r"^[0-9a-f]{64}$")  # an LFS object id as the Hub gives it


def timeout_s() -> float:
    v = os.environ.get("RAPIDMOE_HUB_TIMEOUT", "").strip()
    try:
        t = float(v) if v else 10.0
    except ValueError:
        t = -1.0
    if not 0 < t <= 3600:
        raise UserError(f"RAPIDMOE_HUB_TIMEOUT must be a number of seconds in (0, 3600], got {v!r}")
    return t


def client_timeout() -> httpx2.Timeout:
    return httpx2.Timeout(timeout_s())  # connect, read, write and pool alike


def same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def short(url: str) -> str:
    return url.split("?", 1)[0]


def request(method: str, url: str, headers: dict, *, limit: int = MAX_JSON_BYTES) -> httpx2.Response:
    """One answer, its body read (at most `limit` bytes), within timeout_s() per read and
    3 * timeout_s() in all. Same-origin redirects are followed (at most MAX_REDIRECTS, a
    loop refused at once); a redirect to another origin (a CDN) is returned as it is."""
    deadline = time.monotonic() + 3 * timeout_s()
    seen = [url]
    while True:
        with get_session().stream(method, url, headers=headers, timeout=client_timeout(),
                                  follow_redirects=False) as r:
            body = bytearray()
            for piece in r.iter_bytes():
                body += piece
                if len(body) > limit:
                    raise NotAHub(f"{short(url)} answered with more than {limit} bytes; "
                                    "is HF_ENDPOINT a Hugging Face Hub?")
                if time.monotonic() > deadline:
                    raise httpx2.ReadTimeout(f"no complete answer within {3 * timeout_s():g} s")
            r._content = bytes(body)  # what Response.read() keeps: errors and .json() read it
        nxt = urljoin(url, r.headers.get("Location", "")) if r.is_redirect else None
        if nxt is None or not same_origin(nxt, url):
            return r
        if nxt in seen:
            back = "to itself" if nxt == url else f"back to {short(nxt)}"
            raise NotAHub(f"{short(url)} redirects in a loop ({back}); is HF_ENDPOINT a Hugging Face Hub?")
        if len(seen) > MAX_REDIRECTS:
            raise NotAHub(f"{short(seen[0])} redirects more than {MAX_REDIRECTS} times; "
                            "is HF_ENDPOINT a Hugging Face Hub?")
        seen.append(nxt)
        url = nxt
        if time.monotonic() > deadline:
            raise httpx2.ReadTimeout(f"no complete answer within {3 * timeout_s():g} s")


def get_json(url: str, what: str):
    r = request("GET", url, build_hf_headers())
    hf_raise_for_status(r)
    try:
        return json.loads(r.content)
    except (ValueError, UnicodeDecodeError):
        kind = r.headers.get("Content-Type", "no content type").split(";")[0]
        raise NotAHub(f"{short(url)} answered {what} with {len(r.content)} bytes of {kind} that are not "
                        "JSON; is HF_ENDPOINT a Hugging Face Hub?") from None


@dataclass(frozen=True)
class RepoFile:
    size: int | None
    sha256: str | None  # the LFS sha256 when the file is in LFS


@dataclass(frozen=True)
class RepoInfo:
    commit: str | None
    files: dict[str, RepoFile]


def _bad(url: str, why: str) -> UserError:
    return NotAHub(f"{short(url)} answered with JSON that is not a model's file list ({why}); "
                     "is HF_ENDPOINT a Hugging Face Hub?")


def _file(entry: dict, url: str) -> RepoFile:
    size = entry.get("size")
    lfs = entry.get("lfs")
    sha = lfs.get("sha256") or lfs.get("oid") if isinstance(lfs, dict) else None
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise _bad(url, f"size {str(size)[:20]!r}")
    if sha is not None and not (isinstance(sha, str) and SHA256.match(sha)):
        raise _bad(url, "an LFS sha256 that is not one")
    return RepoFile(size, sha)


def model_info(endpoint: str, repo: str) -> RepoInfo:
    """The repo's commit and files (with sizes and LFS sha256s)."""
    url = f"{endpoint}/api/models/{repo}?blobs=true"
    data = get_json(url, "the model-info request")
    if not isinstance(data, dict):
        raise _bad(url, f"a JSON {type(data).__name__}")
    sib = data.get("siblings") or []
    sha = data.get("sha")
    if not isinstance(sib, list) or not all(isinstance(s, dict) and isinstance(s.get("rfilename"), str)
                                            for s in sib):
        raise _bad(url, "siblings")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{40}", sha)):
        raise _bad(url, "a commit that is not one")
    return RepoInfo(sha, {s["rfilename"]: _file(s, url) for s in sib})


def tree(endpoint: str, repo: str, commit: str, folder: str) -> dict[str, RepoFile]:
    """The files of one folder of the repo at `commit` (the tree API)."""
    url = f"{endpoint}/api/models/{repo}/tree/{commit}" + (f"/{quote(folder)}" if folder else "")
    data = get_json(url, "the file-tree request")
    if not isinstance(data, list) or not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in data):
        raise _bad(url, "not a list of entries")
    return {e["path"]: _file(e, url) for e in data if e.get("type") == "file"}


@dataclass(frozen=True)
class FileMeta:
    etag: str | None
    size: int | None
    location: str
    commit: str | None


def file_meta(endpoint: str, repo: str, revision: str, filename: str) -> FileMeta:
    """HEAD on the file, as huggingface_hub reads it: the linked (LFS) ETag and size of a
    redirect to the CDN, else the answer's own."""
    url = hf_hub_url(repo, filename, revision=revision, endpoint=endpoint)
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"
    r = request("HEAD", url, headers, limit=1 << 20)
    hf_raise_for_status(r)
    etag = (r.headers.get("X-Linked-Etag") or r.headers.get("ETag") or "").strip()
    etag = re.sub(r'^W/', "", etag).strip('"') or None
    if etag is not None and not re.fullmatch(r"[0-9A-Za-z_-][0-9A-Za-z._-]{0,127}", etag):
        raise NotAHub(f"{short(url)} answered with an ETag that cannot name a file; "
                        "is HF_ENDPOINT a Hugging Face Hub?")  # it names the blob on disk
    size = r.headers.get("X-Linked-Size") or (None if r.is_redirect else r.headers.get("Content-Length"))
    location = urljoin(url, r.headers["Location"]) if r.is_redirect else str(r.request.url)
    return FileMeta(etag, int(size) if size and size.isdigit() else None, location,
                    r.headers.get("X-Repo-Commit"))
