"""`rapidmoe-chat serve`: a real server process on the demo model, driven with the
official `openai` client and raw HTTP. One server per module keeps this quick;
replies are a few tokens long. The tools server and the tool-call and reasoning
units are in tests/test_serve_tools.py."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading

import pytest

openai = pytest.importorskip("openai")

from serve_chat import COUNT, HI, TEN, chat  # noqa: E402
from serve_helpers import Server  # noqa: E402

KEY = "test-key-1"


@pytest.fixture(scope="module")
def srv():
    s = Server("-m", "demo", "--api-key", KEY, "--queue", "1", "--max-body-kb", "64")
    # the socket is open before the model is: both must answer 503 in the OpenAI shape
    loading = [s.request("GET", "/health"),
               s.request("POST", "/v1/chat/completions", {"messages": HI}, {"Authorization": f"Bearer {KEY}"})]
    s.loading = loading
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0, timeout=120)


def test_health_and_requests_answer_503_while_loading(srv):
    (hs, hb), (cs, cb) = srv.loading
    assert hs == 503 and hb["error"]["code"] == "loading"
    assert cs == 503 and set(cb["error"]) >= {"message", "type", "code"}
    assert srv.request("GET", "/health") == (200, {"status": "ok"})


def test_models_lists_the_model_and_its_context(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["demo"]
    assert models[0].model_extra["context_length"] == 4096


def test_chat_reply_usage_timings_and_critical_sets(client):
    from rapidmoe.engine.text.chat_template import render_chat
    from rapidmoe.engine.hub.demo import demo_model_path
    from rapidmoe.engine.gguf.reader import GGUFFile
    from rapidmoe.engine.text.tokenizer import Tokenizer

    r = chat(client, max_tokens=5)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content and r.choices[0].finish_reason == "length"
    # the prompt as the model's own template and tokenizer make it
    meta = GGUFFile(demo_model_path()).metadata
    tok = Tokenizer.from_metadata(meta)
    text = render_chat(meta["tokenizer.chat_template"], HI, bos_token="", eos_token="")
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special=True, parse_special=True))
    assert r.usage.completion_tokens == 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5
    t, rm = r.model_extra["timings"], r.model_extra["rapidmoe"]
    assert t["predicted_n"] == 5 and t["predicted_per_second"] > 0 and t["ttft_ms"] > 0
    assert t["prompt_n"] + t["cache_n"] == r.usage.prompt_tokens
    assert len(rm["critical_per_layer"]) == 30 and 0 <= rm["critical_mean"] <= 16
    assert rm["placement"] and rm["decode_steps"] == 4
    # the same conversation again: its prompt comes from the KV cache
    again = chat(client, max_tokens=5)
    assert again.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1
    assert again.choices[0].message.content == r.choices[0].message.content  # greedy


def test_stream_matches_the_whole_reply_and_reports_usage(client):
    whole = chat(client, messages=COUNT, max_tokens=8)
    chunks = list(chat(client, messages=COUNT, max_tokens=8, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # the critical-set sizes a client's status bar shows (tests/test_tui_remote.py), beside the finish
    (rm,) = [c.model_extra["rapidmoe"] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(rm["critical_per_layer"]) == 30 and rm["decode_steps"] == 7


def test_stop_strings_cut_the_reply(client):
    full = chat(client, messages=TEN, max_tokens=10).choices[0].message.content
    assert "3" in full, full
    for stop in ("3", ["zzz", "3"]):
        r = chat(client, messages=TEN, max_tokens=10, stop=stop)
        assert r.choices[0].message.content == full[:full.index("3")]
        assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       chat(client, messages=TEN, max_tokens=10, stop="3", stream=True) if c.choices)
    assert streamed == full[:full.index("3")]


def test_same_seed_same_reply(client):
    kw = dict(messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=8, temperature=1.0, top_p=1.0)
    a = chat(client, seed=7, **kw).choices[0].message.content
    b = chat(client, seed=7, **kw).choices[0].message.content
    assert a == b
    # sampling fields the engine takes, as OpenAI and llama-server name them
    r = chat(client, seed=1, max_tokens=3, temperature=0.5, frequency_penalty=0.5, presence_penalty=0.5,
             extra_body={"top_k": 10, "min_p": 0.1, "repeat_penalty": 1.1},
             messages=[{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    assert r.usage.completion_tokens == 3


def test_text_completions(client):
    r = client.completions.create(model="demo", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens == 4
    parts = list(client.completions.create(model="demo", prompt="The capital of France is", max_tokens=4,
                                           temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text


def test_disconnect_mid_stream_cancels_and_the_next_request_is_served(srv, client):
    mark = srv.mark()
    stream = chat(client, messages=COUNT, max_tokens=3000, stream=True)
    got = 0
    for c in stream:
        got += bool(c.choices and c.choices[0].delta.content)
        if got == 3:
            break
    stream.close()
    m = srv.wait_line(r"chat: .* (\d+) generated, .* finish (\w+)", 120, start=mark)
    assert m.group(2) == "cancelled" and int(m.group(1)) < 100, "\n".join(srv.lines[mark:])
    assert chat(client, max_tokens=2).usage.completion_tokens == 2


def test_a_client_that_leaves_a_whole_reply_request_cancels_it(srv, client):
    mark = srv.mark()
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps({"messages": COUNT, "max_tokens": 3000}),
                 {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    conn.close()  # without reading the reply
    srv.wait_line(r"chat: .*(finish cancelled|before its turn)", 120, start=mark)
    assert chat(client, max_tokens=2).usage.completion_tokens == 2


def test_concurrent_clients_are_queued_and_all_served(client):
    results: dict[int, object] = {}

    def one(i):
        results[i] = chat(client, messages=[{"role": "user", "content": f"Say {i}"}], max_tokens=3)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1]
    assert all(r.usage.completion_tokens == 3 for r in results.values())


def test_a_full_queue_refuses_with_429(srv, client):
    mark = srv.mark()
    running = chat(client, messages=COUNT, max_tokens=3000, stream=True)
    next(iter(running))  # headers and the role chunk: this one has the model
    waiting = chat(client, messages=COUNT, max_tokens=3000, stream=True)  # --queue 1: waits
    with pytest.raises(openai.RateLimitError) as e:
        chat(client)
    assert e.value.body["code"] == "queue_full"
    running.close()
    waiting.close()
    srv.wait_line(r"finish cancelled", 120, start=mark)
    assert chat(client, max_tokens=2).usage.completion_tokens == 2


def test_api_key_is_required(srv):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, body = srv.request("POST", "/v1/chat/completions", {"messages": HI}, headers)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=srv.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b"\xff\xfe", None),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "messages"),
    ({"messages": HI, "repeat_penalty": 10 ** 400}, "repeat_penalty"),
    ({"messages": HI, "reasoning_format": [1]}, "reasoning_format"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": HI, "temperature": "hot"}, "temperature"),
    ({"messages": HI, "top_p": 0}, "top_p"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens"),
    ({"messages": HI, "max_tokens": 5000}, "max_tokens"),
    ({"messages": HI, "max_completion_tokens": 99999}, "max_completion_tokens"),
    ({"messages": HI, "n": 2}, "n"),
    ({"messages": HI, "stop": [1]}, "stop"),
    ({"messages": HI, "stream": "yes"}, "stream"),
    ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"messages": HI, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"messages": HI, "tool_choice": "required"}, "tool_choice"),
    ({"messages": HI, "tool_choice": "any"}, "tool_choice"),
    ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "word " * 5000}]}, "messages"),
])
def test_bad_requests_get_400_in_the_openai_shape(srv, body, param):
    status, resp = srv.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {KEY}"})
    assert status == 400, resp
    err = resp["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["code"]
    assert err["param"] == param and "\n" not in err["message"]


def test_other_refusals_and_the_server_keeps_serving(srv, client):
    auth = {"Authorization": f"Bearer {KEY}"}
    status, resp = srv.request("POST", "/v1/chat/completions", b'{"messages": "' + b"x" * 70000 + b'"}', auth)
    assert status == 413 and resp["error"]["code"] == "body_too_large"
    assert srv.request("POST", "/v1/completions", {"prompt": ""}, auth)[0] == 400
    status, resp = srv.request("GET", "/v1/nothing", None, auth)
    assert status == 404 and resp["error"]["code"] == "not_found"
    assert srv.request("GET", "/v1/chat/completions", None, auth)[0] == 405
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, max_tokens=10**6)
    assert e.value.body["param"] == "max_tokens"
    # a message is data for the template, never template code
    r = chat(client, messages=[{"role": "user", "content": "{{ raise_exception('no') }}{% for x in y %}"}],
             max_tokens=2)
    assert r.usage.completion_tokens == 2
    assert srv.proc.poll() is None


def test_a_request_body_cut_short_is_refused_and_the_server_goes_on(srv, client):
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Length", "1000")
    conn.putheader("Authorization", f"Bearer {KEY}")
    conn.endheaders(b'{"messages": [')
    conn.close()
    assert chat(client, max_tokens=2).usage.completion_tokens == 2


def test_non_loopback_host_needs_a_key():
    r = subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", "serve", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60, env={**__import__("os").environ,
                                                                       "RAPIDMOE_API_KEY": ""})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "API key" in r.stderr, r.stderr
