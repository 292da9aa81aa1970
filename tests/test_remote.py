"""The app as a client (app/remote/): RemoteChat streams through an OpenAI-compatible
server, here our own `serve` on the demo model, and gives the app the engine's events."""
from __future__ import annotations

import http.client
import json
import re
import socket
import threading
from urllib.parse import urlsplit

import pytest

from serve_helpers import TOOLS_TEMPLATE, Server

from rapidmoe.app.remote.chat import RemoteChat
from rapidmoe.app.remote.client import Endpoint, RemoteError, list_models
from rapidmoe.app.remote.providers import load_providers, resolve
from rapidmoe.engine.errors import UserError
from rapidmoe.engine.events import Finished, PromptProcessed, TextDelta
from rapidmoe.engine.sampling import SamplingParams

KEY = "remote-key"
GREEDY = SamplingParams(temperature=0, max_tokens=6)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    path = tmp_path_factory.mktemp("tmpl") / "think.jinja"
    path.write_text(TOOLS_TEMPLATE)
    s = Server("-m", "demo", "--precision", "full", "--api-key", KEY, "--queue", "0", "--chat-template", str(path))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def ep(srv, key=KEY, model="demo") -> Endpoint:
    return Endpoint(srv.base_url, key, model, "local")


def run(chat, text="Say hi", **kw):
    return list(chat.send(text, **kw))


def test_a_reply_streams_as_engine_events(srv):
    chat = RemoteChat(ep(srv), params=GREEDY)
    events = run(chat)
    assert isinstance(events[0], PromptProcessed) and events[0].ttft_s > 0
    deltas = [e for e in events if isinstance(e, TextDelta)]
    final = events[-1]
    assert isinstance(final, Finished) and final.finish_reason == "length"
    assert final.completion_tokens == 6 and final.prompt_tokens > 0  # the server's usage
    assert "".join(d.text for d in deltas) == final.text
    assert chat.messages[-1] == {"role": "assistant", "content": final.text}
    _, body = srv.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi"}],
                                                           "max_tokens": 6, "temperature": 0},
                          {"Authorization": f"Bearer {KEY}"})
    assert final.text == body["choices"][0]["message"]["content"]
    # the next turn carries the history
    more = run(chat, "And again")[-1]
    assert more.prompt_tokens > final.prompt_tokens + final.completion_tokens


def test_models_come_from_the_provider(srv):
    assert [(m["id"], m["context_length"]) for m in list_models(ep(srv))] == [("demo", 4096)]


def test_reasoning_field_comes_back_as_inline_thinking(srv):
    from rapidmoe.app.think import split_think

    chat = RemoteChat(ep(srv), params=GREEDY, extra_body={"chat_template_kwargs": {"think": True}})
    final = run(chat)[-1]
    thinking, answer, still = split_think(final.text)
    assert final.text.startswith("<think>\n") and thinking and not answer and not still
    assert chat.messages[-1]["content"] == ""  # reasoning is not sent back


def test_cancel_closes_the_stream_and_the_server_stops(srv):
    mark = srv.mark()
    cancel = threading.Event()
    chat = RemoteChat(ep(srv), params=SamplingParams(temperature=0, max_tokens=3000))
    events = []
    for e in chat.send("Count from 1 to 500, separated by commas.", cancel=cancel):
        events.append(e)
        if sum(isinstance(x, TextDelta) for x in events) == 2:
            cancel.set()
    assert events[-1].finish_reason == "cancelled"
    srv.wait_line(r"finish cancelled|before its turn", 120, start=mark)


def test_a_busy_server_is_retried_then_reported(srv):
    # the model is held by a streamed completion that counts (hundreds of tokens whatever the
    # machine's speed; a chat reply may end before the retry comes)
    u = urlsplit(srv.base_url)
    hold = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    body = {"prompt": ", ".join(map(str, range(1, 16))) + ",", "max_tokens": 2000, "temperature": 0, "stream": True}
    hold.request("POST", "/v1/completions", json.dumps(body),
                 {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    resp = hold.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data:")  # generating: it has the model (--queue 0)
    other = RemoteChat(ep(srv), params=GREEDY, retries=1)
    with pytest.raises(RemoteError, match="429"):
        run(other)
    mark = srv.mark()
    hold.close()  # the server cancels the counting at its next decode step
    srv.wait_line(r"finish cancelled", 120, start=mark)
    assert run(other)[-1].completion_tokens == 6


@pytest.mark.parametrize("make, says", [
    (lambda s: Endpoint(s.base_url, "wrong"), "refused the API key"),
    (lambda s: Endpoint(s.base_url.removesuffix("/v1") + "/nope", KEY), "not found (404)"),
])
def test_refusals_are_one_line(srv, make, says):
    with pytest.raises(RemoteError, match=re.escape(says)) as e:
        run(RemoteChat(make(srv), params=GREEDY))
    assert "\n" not in str(e.value)


def test_unreachable_and_stalled_servers_are_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(RemoteError, match="cannot reach"):
        run(RemoteChat(Endpoint(f"http://127.0.0.1:{port}/v1"), params=GREEDY))
    with socket.socket() as s:  # accepts, then says nothing
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        with pytest.raises(RemoteError, match="cannot reach .*timed out|stopped responding"):
            run(RemoteChat(Endpoint(url), params=GREEDY, stall_s=0.5))


def test_providers_from_config(tmp_path):
    conf = tmp_path / "config.toml"
    conf.write_text('[providers.cluster]\nbase_url = "http://node:8000/v1"\napi_key_env = "CLUSTER_KEY"\n'
                    'model = "deepseek-r1"\n[providers.bare]\nbase_url = "http://x/v1"\n')
    provs = load_providers(conf, env={"CLUSTER_KEY": "s3cret"})
    assert provs["cluster"].api_key == "s3cret" and provs["bare"].api_key is None
    assert resolve("cluster", providers=provs, env={}).model == "deepseek-r1"
    assert resolve("cluster:other", providers=provs, env={}).model == "other"
    assert resolve("unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M", providers=provs, env={}) is None  # a Hub model
    with pytest.raises(UserError, match="no default model"):
        resolve("bare", providers=provs, env={})
    assert resolve("m", endpoint="http://h:1/v1", env={}).base_url == "http://h:1/v1"
    conf.write_text('[providers.leak]\nbase_url = "http://x/v1"\napi_key = "plain"\n')
    with pytest.raises(UserError, match="api_key_env"):
        load_providers(conf, env={})


class _OddServer:
    """A real local HTTP server that answers as no OpenAI-compatible server should:
    /models gives a JSON list, a first chat request gets a 500, later ones a stream
    with junk lines around one real chunk. It records each chat request's messages."""

    def __init__(self):
        import http.server
        import json

        outer = self
        self.requests: list[list[dict]] = []

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status, body, kind="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, b"[1, 2]")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body["messages"])
                if len(outer.requests) == 1:
                    return self._send(500, b'{"error": {"message": "boom"}}')
                junk = ["5", "[1]", '{"choices": [1, {"delta": "x"}, {"delta": {"content": 7}}]}',
                        '{"usage": [1], "choices": {"a": 1}}',
                        '{"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}', "[DONE]"]
                self._send(200, "".join(f"data: {j}\n\n" for j in junk).encode(), "text/event-stream")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_odd_answers_and_bad_urls_are_one_line_not_tracebacks():
    odd = _OddServer()
    try:
        with pytest.raises(RemoteError, match="not a list of models"):
            list_models(Endpoint(odd.url))
        chat = RemoteChat(Endpoint(odd.url, model="m"), params=GREEDY, retries=0)
        with pytest.raises(RemoteError, match="HTTP 500: boom"):
            run(chat, "first")
        assert [e for e in run(chat, "second") if isinstance(e, Finished)][0].text == "ok"  # junk lines skipped
        # the question the failed send left is replaced, not followed by a second user turn
        assert odd.requests[1] == [{"role": "user", "content": "second"}]
    finally:
        odd.httpd.shutdown()
    for url in ("http://127.0.0.1:abc/v1", "http://127.0.0.1:99999/v1"):
        with pytest.raises(UserError, match="bad port"):
            run(RemoteChat(Endpoint(url), params=GREEDY))


def test_a_server_killed_mid_stream_keeps_the_partial_reply(srv):
    """Last: it ends the module's server."""
    chat = RemoteChat(ep(srv), params=SamplingParams(temperature=0, max_tokens=3000))
    got = ""
    with pytest.raises(RemoteError, match="ended before the reply") as e:
        for ev in chat.send("Count from 1 to 500, separated by commas."):
            if isinstance(ev, TextDelta):
                got += ev.text
                if len(got) > 4 and srv.proc.poll() is None:
                    srv.proc.kill()
    assert e.value.partial.startswith(got[:4])
    assert chat.messages[-1]["cut"] is True and chat.messages[-1]["content"] == e.value.partial

