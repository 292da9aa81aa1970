"""Chat through any OpenAI-compatible server (our `serve`, llama-server, vLLM,
SGLang, ...): the same interface as engine.generate.ChatSession (`messages`,
`params`, `send`, `regenerate`) and the same events, so the app cannot tell.

Reasoning comes back inline as `<think>...</think>` whichever shape the server
uses (`reasoning_content`, `reasoning`, or inline tags), so it is shown as local
thinking is. Time to first token and decode tok/s are measured here, on the
client. Cancelling closes the stream."""
from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

from ...engine.errors import UserError
from ...engine.events import Finished, PromptProcessed, TextDelta
from ...engine.sampling import SamplingParams

RETRY_STATUS = (429, 503)


class RemoteError(UserError):
    """The server failed us; `partial` is what it had sent of the reply."""

    def __init__(self, message: str, partial: str = ""):
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # ".../v1"
    api_key: str | None = None
    model: str | None = None
    name: str = ""  # the provider's name in config.toml, "" for --endpoint

    def url(self, path: str) -> tuple[str, str, int, str, bool]:
        u = urlsplit(self.base_url.rstrip("/") + path)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UserError(f"{self.base_url}: not an http(s) URL")
        tls = u.scheme == "https"
        try:
            port = u.port
        except ValueError:  # not a number, or past 65535
            raise UserError(f"{self.base_url}: bad port") from None
        return u.hostname, u.netloc, port or (443 if tls else 80), u.path + (f"?{u.query}" if u.query else ""), tls


def _connection(ep: Endpoint, path: str, timeout: float):
    host, _, port, full, tls = ep.url(path)
    cls = http.client.HTTPSConnection if tls else http.client.HTTPConnection
    return cls(host, port, timeout=timeout), full


def _headers(ep: Endpoint) -> dict:
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if ep.api_key:
        h["Authorization"] = f"Bearer {ep.api_key}"
    return h


def _error_text(status: int, raw: bytes, ep: Endpoint) -> str:
    try:
        err = json.loads(raw).get("error")
        msg = err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        msg = raw.decode("utf-8", "replace").strip()[:200]
    where = ep.name or ep.base_url
    if status == 401:
        return f"{where}: the server refused the API key (401){': ' + msg if msg else ''}"
    if status == 404:
        return (f"{where}: not found (404) - check the URL (it ends in /v1) and the model name"
                f"{': ' + msg if msg else ''}")
    return f"{where}: HTTP {status}{': ' + ' '.join(str(msg).split()) if msg else ''}"


def request(ep: Endpoint, method: str, path: str, body: dict | None = None, timeout: float = 30,
            retries: int = 3, backoff: float = 0.5):
    """-> (connection, response) with status 200; 429/503 are retried `retries` times."""
    for attempt in range(retries + 1):
        conn, full = _connection(ep, path, timeout)
        try:
            conn.request(method, full, body=json.dumps(body) if body is not None else None, headers=_headers(ep))
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            why = "timed out" if isinstance(e, socket.timeout) else (
                getattr(e, "strerror", None) or str(e) or type(e).__name__)
            raise RemoteError(f"cannot reach {ep.base_url}: {why}") from None
        if resp.status == 200:
            return conn, resp
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException):
            raw = b""
        finally:
            conn.close()
        if resp.status in RETRY_STATUS and attempt < retries:
            wait = resp.getheader("Retry-After")
            told = wait and wait.replace(".", "", 1).isdigit()
            time.sleep(min(float(wait), 10.0) if told else backoff * 2 ** attempt)
            continue
        raise RemoteError(_error_text(resp.status, raw, ep))
    raise AssertionError("unreachable")


def list_models(ep: Endpoint, timeout: float = 10) -> list[dict]:
    """The provider's /v1/models: [{"id", "context_length" (when it says), ...}]."""
    conn, resp = request(ep, "GET", "/models", timeout=timeout, retries=1)
    try:
        answer = json.loads(resp.read())
    except ValueError:
        raise RemoteError(f"{ep.base_url}/models: not JSON") from None
    except (OSError, http.client.HTTPException) as e:
        raise RemoteError(f"{ep.base_url}/models: the answer broke off ({type(e).__name__})") from None
    finally:
        conn.close()
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise RemoteError(f"{ep.base_url}/models: not a list of models")
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _lines(resp, out: queue.Queue) -> None:
    try:
        for raw in resp:
            out.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
    except Exception as e:  # noqa: BLE001 - incl. a response closed under the reader (cancel)
        out.put(e)
    out.put(None)


class ThinkInline:
    """Reasoning from its own field -> inline `<think>...</think>` before the answer."""

    def __init__(self):
        self.open = False

    def __call__(self, reasoning: str, content: str) -> str:
        out = ""
        if reasoning:
            out += ("" if self.open else "<think>\n") + reasoning
            self.open = True
        if content:
            out += ("\n</think>\n\n" if self.open else "") + content
            self.open = False
        return out


def payload(model: str | None, messages: list[dict], p: SamplingParams) -> dict:
    body = {"messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens}
    if model:
        body["model"] = model
    if p.top_k:
        body["top_k"] = p.top_k  # llama-server, vLLM, SGLang and our serve take these
    if p.min_p:
        body["min_p"] = p.min_p
    if p.repeat_penalty != 1.0:
        body["repeat_penalty"] = body["repetition_penalty"] = p.repeat_penalty
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    return body


_DONE = object()


def _chunk(line: str):
    """An SSE line -> its JSON chunk (a dict), _DONE at `data: [DONE]`, or None for
    anything else (comments, keep-alives, junk no server should send: skipped)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return _DONE
    # (the JSON-object-or-None of store_sql.parse_stats, kept apart on purpose: the remote client
    # does not depend on the history store for five lines)
    try:
        chunk = json.loads(data)
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


def stream_chat(ep: Endpoint, messages: list[dict], p: SamplingParams, cancel: threading.Event | None = None,
                stall_s: float = 60.0, retries: int = 3, extra_body: dict | None = None) -> Iterator:
    """Stream one reply as engine events. Errors (unreachable, 401, 404, a stall, a server
    that dies mid-reply) raise RemoteError with the partial reply."""
    t0 = time.perf_counter()
    body = {**payload(ep.model, messages, p), **(extra_body or {})}
    conn, resp = request(ep, "POST", "/chat/completions", body, timeout=stall_s, retries=retries)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(resp, lines), daemon=True).start()
    inline, text, n, t_first, use, finish = ThinkInline(), "", 0, None, None, None
    timings, ours = {}, {}  # llama-server's and our serve's `timings`; our serve's `rapidmoe`
    last = time.monotonic()
    try:
        while True:
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            try:
                line = lines.get(timeout=0.05)
            except queue.Empty:
                if time.monotonic() - last > stall_s:
                    raise RemoteError(f"{ep.name or ep.base_url}: the server stopped responding "
                                      f"({stall_s:.0f} s without data)", text) from None
                continue
            last = time.monotonic()
            if line is None or isinstance(line, Exception):
                raise RemoteError(f"{ep.name or ep.base_url}: the connection ended before the reply did", text)
            chunk = _chunk(line)
            if chunk is _DONE:
                break
            if chunk is None:
                continue
            if "error" in chunk:
                err = chunk["error"]
                raise RemoteError(f"{ep.name or ep.base_url}: {err.get('message') if isinstance(err, dict) else err}",
                                  text)
            use = chunk.get("usage") if isinstance(chunk.get("usage"), dict) else use
            timings = chunk.get("timings") if isinstance(chunk.get("timings"), dict) else timings
            ours = chunk.get("rapidmoe") if isinstance(chunk.get("rapidmoe"), dict) else ours
            choices = chunk.get("choices")
            for ch in choices if isinstance(choices, list) else []:
                if not isinstance(ch, dict):
                    continue
                d = ch.get("delta") if isinstance(ch.get("delta"), dict) else {}
                text_of = lambda k: d[k] if isinstance(d.get(k), str) else ""  # noqa: E731
                piece = inline(text_of("reasoning_content") or text_of("reasoning"), text_of("content"))
                finish = ch.get("finish_reason") if isinstance(ch.get("finish_reason"), str) else finish
                if not piece:
                    continue
                now = time.perf_counter()
                n += 1
                if t_first is None:
                    t_first = now
                    yield PromptProcessed(0, 0, 0.0, now - t0)
                text += piece
                rate = (n - 1) / (now - t_first) if n > 1 and now > t_first else 0.0
                yield TextDelta(piece, n, rate)
    finally:
        conn.close()
    if inline.open:
        tail = "\n</think>\n"
        text += tail
        yield TextDelta(tail, n, 0.0)
    per_layer = ours.get("critical_per_layer")
    if isinstance(per_layer, list) and per_layer:  # our serve's critical-set size r per MoE layer
        live = (n - 1) / (time.perf_counter() - t_first) if t_first and n > 1 else 0.0
        yield TextDelta("", n, live, tuple(float(v) for v in per_layer))
    end = time.perf_counter()
    n_out = (use or {}).get("completion_tokens") or n
    prompt = (use or {}).get("prompt_tokens") or 0
    rate = (n_out - 1) / (end - t_first) if t_first and n_out > 1 and end > t_first else 0.0
    reason = {"stop": "stop", "length": "length", "tool_calls": "stop", "cancelled": "cancelled"}.get(finish, "stop")
    prompt_rate = timings.get("prompt_per_second")  # only the server sees its prompt speed
    prompt_rate = float(prompt_rate) if isinstance(prompt_rate, (int, float)) else 0.0
    yield Finished(reason, text, prompt, n_out, (t_first - t0) if t_first else 0.0, prompt_rate, rate,
                   prompt + n_out, 0)
