"""A small Hugging Face Hub on 127.0.0.1 for tests: the endpoints huggingface_hub
2.x calls, serving in-memory repos, with faults on demand.

Hub origin (HF_ENDPOINT):
  GET  /api/models/{repo}[/revision/{rev}][?blobs=true]  model info, siblings (+ sizes, lfs)
  GET  /api/models/{repo}/tree/{rev}[/{path}][?recursive=true]
  HEAD/GET /{repo}/resolve/{rev}/{path}  small files: 200 + ETag; LFS files: 302 to the CDN
       origin with X-Linked-Etag / X-Linked-Size / X-Repo-Commit, like the real Hub
CDN origin (another port, so a different origin: no auth header may reach it):
  GET  /lfs/{sha256}  with Range -> 206 + Content-Range
Errors carry X-Error-Code (RepoNotFound, GatedRepo, EntryNotFound, RevisionNotFound)
as huggingface_hub's error mapping expects.

Misbehaviours on demand (attributes of FakeHub): an API that never answers, an HTML
page for every request, garbage JSON, redirect loops, a CDN that stalls after part of
every body, trickles, or never sends past a byte, files served without any size; and
black_hole(), a port that never accepts a connection.
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    gated_token: str | None = None  # when set, only `Bearer <token>` gets in
    declared_size: dict[str, int] = field(default_factory=dict)  # lie about a size (disk check)

    def size(self, path: str) -> int:
        return self.declared_size.get(path, len(self.files[path]))

    @staticmethod
    def is_lfs(path: str) -> bool:
        return path.endswith(".gguf")


@dataclass
class Seen:
    origin: str  # "hub" or "cdn"
    method: str
    path: str
    headers: dict[str, str]


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 -> content
        self.seen: list[Seen] = []
        self.cut_after: dict[str, int] = {}  # sha256 -> bytes to send before dropping the line (once)
        self.stall_after: dict[str, int] = {}  # sha256 -> bytes to send before hanging (once)
        self.release = threading.Event()  # ends a stall
        self.ignore_range = False  # answer 200 + the whole file to a Range request
        self.expire_on_cut = False  # a cut also expires the signed CDN link it used (403 after)
        self.expired: set[str] = set()  # signatures the CDN refuses
        self.api_stall = False  # /api/ requests get no answer (until release)
        self.html_everywhere = False  # every request: 200 and a short HTML page
        self.garbage_json: bytes | None = None  # /api/ answers: 200, application/json, these bytes
        self.redirect_loop: str | None = None  # "api", "resolve" or "cdn": redirects to itself
        self.stall_every: float | None = None  # each CDN body stalls after this fraction of it
        self.cut_at: int | None = None  # the CDN never sends past this byte of a file (closes there)
        self.no_sizes = False  # no size anywhere but the tree API: no blobs sizes, no lengths
        self.on_sent = None  # called with the CDN's running byte count as bytes go out
        self.trickle_s: float | None = None  # the CDN sends one byte per this many seconds
        self.sent = 0
        self._sig = 0
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self._conns: set = set()  # open client sockets: stop() cuts kept-alive ones too

    # -- repos -------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes], *, gated_token: str | None = None) -> Repo:
        commit = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode())
        r = Repo(dict(files), commit.hexdigest(), gated_token)
        for content in files.values():
            self.blobs[hashlib.sha256(content).hexdigest()] = content
        self.repos[repo_id] = r
        return r

    @staticmethod
    def sha256(content: bytes) -> str:
        return hashlib.sha256(content).hexdigest()

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> "FakeHub":
        for origin in ("hub", "cdn"):
            handler = type("Handler", (_Handler,), {"hub": self, "origin": origin})
            srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            srv.daemon_threads = True
            srv.block_on_close = False
            threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self._servers.append(srv)
        return self

    def stop(self) -> None:
        """Stop answering, on every connection (a stopped Hub must look unreachable)."""
        self.release.set()
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        self._servers.clear()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def requests(self, origin: str | None = None, method: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if (origin in (None, s.origin)) and (method in (None, s.method))]


class _Handler(BaseHTTPRequestHandler):
    """A request to the Hub or its CDN: FakeHub.start makes a subclass per origin that sets these two."""
    hub: FakeHub
    origin: str  # "hub" or "cdn"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub._conns.add(self.connection)

    def finish(self) -> None:
        with self.hub._lock:
            self.hub._conns.discard(self.connection)
        super().finish()

    def _record(self) -> None:
        with self.hub._lock:
            seen = Seen(self.origin, self.command, self.path, {k.title(): v for k, v in self.headers.items()})
            self.hub.seen.append(seen)

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message})

    def do_HEAD(self) -> None:
        self._record()
        self._route()

    def do_GET(self) -> None:
        self._record()
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        if self.hub.html_everywhere:
            return self._send(200, b"<html><body>Sign in</body></html>", {"Content-Type": "text/html"})
        where = "cdn" if self.origin == "cdn" else "api" if path.startswith("/api/") else "resolve"
        if self.hub.redirect_loop == where:
            return self._send(302, b"", {"Location": self.path})
        if where == "api" and self.hub.api_stall:
            self.hub.release.wait(20)
            self.close_connection = True
            return
        if where == "api" and self.hub.garbage_json is not None:
            return self._send(200, self.hub.garbage_json, {"Content-Type": "application/json"})
        if self.origin == "cdn":
            m = re.fullmatch(r"/lfs/([0-9a-f]{64})", path)
            sig = query.get("X-Amz-Signature", [""])[0]
            if sig in self.hub.expired:
                return self._send(403, b"<Error><Code>AccessDenied</Code></Error>")
            return self._cdn(m.group(1), sig) if m else self._error(404, "EntryNotFound", "no such blob")
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self._info(m.group(1), m.group(2) or "main", query)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m:
            return self._tree(m.group(1), m.group(2), m.group(3) or "", query)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(m.group(1), m.group(2), m.group(3))
        self._error(404, "RepoNotFound", "not found")

    def _repo(self, repo_id: str, rev: str) -> Repo | None:
        r = self.hub.repos.get(repo_id)
        if r is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if r.gated_token and self.headers.get("Authorization") != f"Bearer {r.gated_token}":
            self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it.")
            return None
        if rev not in ("main", r.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return r

    def _sibling(self, r: Repo, p: str, blobs: bool) -> dict:
        d: dict = {"rfilename": p}
        if blobs and not self.hub.no_sizes:
            sha = hashlib.sha256(r.files[p]).hexdigest()
            d.update(size=r.size(p), blobId=hashlib.sha1(r.files[p]).hexdigest())
            if r.is_lfs(p):
                d["lfs"] = {"size": r.size(p), "sha256": sha, "pointerSize": 134}
        return d

    def _info(self, repo_id: str, rev: str, query) -> None:
        r = self._repo(repo_id, rev)
        if r is None:
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        self._json({
            "_id": "0" * 24, "id": repo_id, "modelId": repo_id, "sha": r.commit, "private": False,
            "gated": "auto" if r.gated_token else False, "disabled": False, "tags": ["gguf"],
            "siblings": [self._sibling(r, p, blobs) for p in sorted(r.files)],
        })

    def _tree(self, repo_id: str, rev: str, sub: str, query) -> None:
        r = self._repo(repo_id, rev)
        if r is None:
            return
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = sub.strip("/") + "/" if sub.strip("/") else ""
        entries: dict[str, dict] = {}
        for p in sorted(r.files):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):]
            if "/" in rest and not recursive:
                d = prefix + rest.split("/", 1)[0]
                entries[d] = {"type": "directory", "oid": "0" * 40, "size": 0, "path": d}
                continue
            if recursive:
                parts = rest.split("/")[:-1]
                for k in range(1, len(parts) + 1):
                    d = prefix + "/".join(parts[:k])
                    entries[d] = {"type": "directory", "oid": "0" * 40, "size": 0, "path": d}
            e = {"type": "file", "oid": hashlib.sha1(r.files[p]).hexdigest(), "size": r.size(p), "path": p}
            if r.is_lfs(p):
                e["lfs"] = {"oid": hashlib.sha256(r.files[p]).hexdigest(), "size": r.size(p), "pointerSize": 134}
            entries[p] = e
        self._json(list(entries.values()))

    def _resolve(self, repo_id: str, rev: str, p: str) -> None:
        r = self._repo(repo_id, rev)
        if r is None:
            return
        if p not in r.files:
            self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": r.commit})
            return
        content = r.files[p]
        git_oid = hashlib.sha1(content).hexdigest()
        common = {"X-Repo-Commit": r.commit, "Accept-Ranges": "bytes"}
        if r.is_lfs(p):
            sha = hashlib.sha256(content).hexdigest()
            with self.hub._lock:
                self.hub._sig += 1
                loc = f"{self.hub.cdn}/lfs/{sha}?X-Amz-Signature=s{self.hub._sig}"
            sized = {} if self.hub.no_sizes else {"X-Linked-Size": str(r.size(p))}
            self._send(302, b"", {**common, "Location": loc, "ETag": f'"{git_oid}"',
                                  "X-Linked-Etag": f'"{sha}"', **sized})
            return
        self._send(200, content, {**common, "ETag": f'"{git_oid}"', "Content-Type": "application/octet-stream"})

    def _cdn(self, sha: str, sig: str) -> None:
        content = self.hub.blobs.get(sha)
        if content is None:
            return self._error(404, "EntryNotFound", "no such blob")
        start = 0
        rng = None if self.hub.ignore_range else self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-", rng.strip())
            start = int(m.group(1)) if m else 0
            if start >= len(content):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(content)}"})
        body = content[start:]
        if self.hub.cut_at is not None:
            body = body[: max(0, self.hub.cut_at - start)]
        self.send_response(206 if rng else 200)
        if self.hub.no_sizes:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/octet-stream")
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        with self.hub._lock:
            cut = self.hub.cut_after.pop(sha, None)
            stall = self.hub.stall_after.pop(sha, None)
        if self.hub.stall_every is not None:
            stall = int(len(body) * self.hub.stall_every)
        limit = cut if cut is not None else stall
        if limit is None:
            self._write(body)
            return
        self._write(body[:limit])
        self.wfile.flush()
        if stall is not None:
            self.hub.release.wait(20)
        if cut is not None and self.hub.expire_on_cut:
            self.hub.expired.add(sig)
        # Drop the line mid-body: the client sees fewer bytes than Content-Length.
        self.close_connection = True
        self.connection.shutdown(2)

    def _write(self, body: bytes) -> None:
        if self.hub.trickle_s is not None:
            for i in range(len(body)):
                if self.hub.release.wait(self.hub.trickle_s):
                    break
                try:
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                except OSError:  # the client gave up on it
                    self.close_connection = True
                    break
            return
        if self.hub.on_sent is None:
            return self.wfile.write(body)
        for i in range(0, len(body), 8192):  # in pieces, telling the test as they go out
            self.wfile.write(body[i:i + 8192])
            self.wfile.flush()
            with self.hub._lock:
                self.hub.sent += len(body[i:i + 8192])
                sent = self.hub.sent
            self.hub.on_sent(sent)


def serve_repo(repo: str, files: dict[str, bytes], home, monkeypatch, timeout_s: float | None = None) -> "FakeHub":
    """A started FakeHub serving `repo`, the Hugging Face variables pointing at it and a
    fresh HF_HOME under `home`; timeout_s sets RAPIDMOE_HUB_TIMEOUT. The caller stops it."""
    h = FakeHub().start()
    h.add_repo(repo, files)
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    if timeout_s is not None:
        monkeypatch.setenv("RAPIDMOE_HUB_TIMEOUT", str(timeout_s))
    return h


def black_hole() -> tuple[list[socket.socket], str]:
    """A port that never accepts: a listening socket whose backlog is full, so new
    connections get no answer at all (as behind a firewall that drops them)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        fillers.append(c)
    return [srv, *fillers], f"http://127.0.0.1:{port}"  # close them all to end it


if __name__ == "__main__":  # a manual look: python tests/hub_server.py
    h = FakeHub().start()
    h.add_repo("demo/tiny-GGUF", {"tiny-Q4_K_M.gguf": b"GGUF" + bytes(1000)})
    print("HF_ENDPOINT=" + h.endpoint)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        h.stop()
