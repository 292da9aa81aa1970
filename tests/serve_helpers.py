"""A real `rapidmoe-chat serve` process for the tests: started on a free port,
its stderr collected line by line so a test can wait for what it logs."""
from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

# ChatML with tools and an optional <think> opened by the template, as Qwen3's does
TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nYou may call these tools:\\n' }}"
    "{%- for t in tools %}{{- t | tojson }}{{- '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{{- '<|im_start|>assistant\\n' }}"
    "{%- for c in m.tool_calls %}{{- '<tool_call>\\n' + {'name': c.function.name, "
    "'arguments': c.function.arguments} | tojson + '\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + m.content "
    "+ '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if think is defined and think %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


class Server:
    def __init__(self, *args: str, env: dict | None = None):
        cmd = [sys.executable, "-m", "rapidmoe.app.cli", "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, bufsize=1)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        m = self.wait_line(r"listening on http://([\d.]+):(\d+)/v1", 120)
        self.host, self.port = m.group(1), int(m.group(2))
        self.base_url = f"http://{self.host}:{self.port}/v1"

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<exit>")
            self._cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = 60, start: int = 0) -> re.Match:
        """The first line from index `start` on that matches; fails on exit or timeout."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    if self.lines[i] == "<exit>":
                        raise AssertionError(f"serve exited waiting for {pattern!r}:\n" + "\n".join(self.lines))
                    m = rx.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line matching {pattern!r} in {timeout} s:\n" + "\n".join(self.lines))
                self._cond.wait(left)

    def mark(self) -> int:
        with self._cond:
            return len(self.lines)

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict | None = None) -> tuple[int, dict]:
        """A raw HTTP request -> (status, JSON body)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            data = json.dumps(body) if isinstance(body, dict) else body
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else {}
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 300) -> None:
        """Until the model is loaded (the server says so), then /health must answer 200."""
        self.wait_line(r"rapidmoe-chat: ready: ", timeout)
        status, body = self.request("GET", "/health")
        assert status == 200, body

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class StandIn:
    """A real local HTTP server that speaks the OpenAI API as another engine would (not
    our `serve`): /v1/models lists `models` (once `release` is set: a slow provider),
    chat completions stream `reply` word by word, then usage, and `rapidmoe` when given
    (what our serve adds). With `key`, a request without `Authorization: Bearer KEY` is a 401."""

    def __init__(self, models=("m",), reply="Hello from the stand-in.", key=None, rapidmoe=None, slow=False):
        import http.server

        outer = self
        self.requests: list[dict] = []
        self.asked = threading.Event()  # /v1/models was asked
        self.release = threading.Event()
        if not slow:
            self.release.set()

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, body: bytes, kind="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if key and self.headers.get("Authorization") != f"Bearer {key}":
                    self._send(401, b'{"error": {"message": "bad key", "type": "authentication_error"}}')
                    return False
                return True

            def do_GET(self):
                outer.asked.set()
                outer.release.wait(60)
                if self._authorized():
                    data = [{"id": m, "object": "model", "context_length": 2048} for m in models]
                    self._send(200, json.dumps({"object": "list", "data": data}).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self._authorized():
                    return
                outer.requests.append(body)
                words = reply.split(" ")
                chunks = [{"choices": [{"index": 0, "delta": {"content": w if i == 0 else " " + w}}]}
                          for i, w in enumerate(words)]
                chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                               **({"rapidmoe": rapidmoe} if rapidmoe else {})})
                chunks.append({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": len(words)}})
                self._send(200, "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode()
                           + b"data: [DONE]\n\n", "text/event-stream")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
