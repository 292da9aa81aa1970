"""`rapidmoe-chat serve`: a real server process on the demo model, driven with the
official `openai` client and raw HTTP. One server per module keeps this quick;
replies are a few tokens long."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading

import pytest

openai = pytest.importorskip("openai")

from serve_helpers import TOOLS_TEMPLATE, Server  # noqa: E402

KEY = "test-key-1"
HI = [{"role": "user", "content": "Say hi"}]
COUNT = [{"role": "user", "content": "Count from 1 to 500, separated by commas."}]


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


@pytest.fixture(scope="module")
def tsrv(tmp_path_factory):
    """A second server with a template that knows tools and can open <think> (full precision: no pack)."""
    path = tmp_path_factory.mktemp("tmpl") / "tools.jinja"
    path.write_text(TOOLS_TEMPLATE)
    s = Server("-m", "demo", "--precision", "full", "--chat-template", str(path))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def chat(client, messages=HI, **kw):
    kw.setdefault("max_tokens", 6)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="demo", messages=messages, **kw)


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
    full = chat(client, messages=COUNT, max_tokens=10).choices[0].message.content
    assert "3" in full, full
    for stop in ("3", ["zzz", "3"]):
        r = chat(client, messages=COUNT, max_tokens=10, stop=stop)
        assert r.choices[0].message.content == full[:full.index("3")]
        assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       chat(client, messages=COUNT, max_tokens=10, stop="3", stream=True) if c.choices)
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


def test_reasoning_goes_to_its_own_field_or_stays_inline(tsrv):
    c = openai.OpenAI(base_url=tsrv.base_url, api_key="none", max_retries=0, timeout=120)
    think = {"chat_template_kwargs": {"think": True}}
    r = chat(c, max_tokens=5, extra_body=think)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"] and not msg.content  # the template opened <think>
    inline = chat(c, max_tokens=5, extra_body={**think, "reasoning_format": "inline"}).choices[0].message
    assert inline.content.startswith("<think>\n") and "reasoning_content" not in inline.model_extra
    assert inline.content.endswith(msg.model_extra["reasoning_content"])
    chunks = list(chat(c, max_tokens=5, stream=True, extra_body=think))
    streamed = "".join(ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in chunks if ch.choices)
    assert streamed == msg.model_extra["reasoning_content"]
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_tools_are_rendered_by_the_template(tsrv):
    c = openai.OpenAI(base_url=tsrv.base_url, api_key="none", max_retries=0, timeout=120)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    plain = chat(c, max_tokens=1)
    with_tools = chat(c, max_tokens=1, tools=tools)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 10
    assert chat(c, max_tokens=1, tools=tools, tool_choice="none").usage.prompt_tokens == plain.usage.prompt_tokens
    history = HI + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = chat(c, messages=history, max_tokens=1, tools=tools)
    assert r.usage.prompt_tokens > with_tools.usage.prompt_tokens


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a city",
                                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _call_of(r, names):
    """The reply's one tool call, checked: one of `names`, its arguments a JSON object."""
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name in names and call.id.startswith("call_")
    assert isinstance(json.loads(call.function.arguments), dict)
    return call


def test_tool_choice_required_makes_the_reply_a_call(tsrv):
    c = openai.OpenAI(base_url=tsrv.base_url, api_key="none", max_retries=0, timeout=120)
    whole = _call_of(chat(c, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=64),
                     {"get_weather", "get_time"})
    chunks = list(chat(c, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=64, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert not "".join(d.content or "" for d in deltas)  # nothing but the call
    (call,) = [tc for d in deltas for tc in d.tool_calls or []]
    assert (call.function.name, call.function.arguments) == (whole.function.name, whole.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # a template that opened <think>: it is closed, the reply is the call all the same
    r = chat(c, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=64,
             extra_body={"chat_template_kwargs": {"think": True}})
    assert _call_of(r, {"get_weather"}) and "reasoning_content" not in r.choices[0].message.model_extra


def test_a_named_tool_choice_offers_that_tool_alone(tsrv):
    c = openai.OpenAI(base_url=tsrv.base_url, api_key="none", max_retries=0, timeout=120)
    named = {"type": "function", "function": {"name": "get_time"}}
    both = chat(c, messages=ASK, tools=[WEATHER, TIME], tool_choice=named, max_tokens=64)
    alone = chat(c, messages=ASK, tools=[TIME], tool_choice=named, max_tokens=64)
    assert _call_of(both, {"get_time"}).function.arguments == _call_of(alone, {"get_time"}).function.arguments
    assert both.usage.prompt_tokens == alone.usage.prompt_tokens  # get_weather never reached the template
    assert alone.usage.prompt_tokens_details.cached_tokens == alone.usage.prompt_tokens - 1


def test_a_forced_call_cut_by_max_tokens_is_an_error_not_a_reply(tsrv):
    c = openai.OpenAI(base_url=tsrv.base_url, api_key="none", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as e:
        chat(c, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=2)
    err = e.value.body
    assert err["code"] == "tool_call_incomplete" and err["param"] == "max_tokens" and "max_tokens" in err["message"]
    with pytest.raises(openai.APIError, match="before its tool call was complete"):
        list(chat(c, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=2, stream=True))
    # "none": no tools rendered, a text reply
    r = chat(c, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=3)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and msg.content and not msg.tool_calls


def test_non_loopback_host_needs_a_key():
    r = subprocess.run([sys.executable, "-m", "rapidmoe.app.cli", "serve", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60, env={**__import__("os").environ,
                                                                       "RAPIDMOE_API_KEY": ""})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "API key" in r.stderr, r.stderr


def test_reply_parsing_unit():
    from rapidmoe.app.serve.reply import ReplyView, parse_tool_calls

    text, calls = parse_tool_calls('Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>')
    assert text == "Sure." and calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    ds = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{\"x\": \"y\"}\n```"
          "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    text, calls = parse_tool_calls(ds)
    assert text == "" and calls[0]["function"] == {"name": "get", "arguments": '{"x": "y"}'}
    assert parse_tool_calls("<tool_call>{not json}</tool_call>")[1] == []
    v = ReplyView(tools=True)
    out = [v.push(d) for d in ("Hi <tool", "_call>{\"name\": \"f\", ", "\"arguments\": {}}</tool_call>")]
    assert "".join(c for _, c in out) == "Hi "
    v.finish()
    assert v.tool_calls[0]["function"]["name"] == "f"
    v = ReplyView(tools=False)  # tool_choice "none": a call's text stays text
    v.push('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert v.finish()[1] == "" and v.content.startswith("<tool_call>") and not v.tool_calls
    v = ReplyView()
    deltas = [v.push(d) for d in ("<th", "ink>plan", "</thi", "nk>answer")]
    assert "".join(r for r, _ in deltas) == "plan" and "".join(c for _, c in deltas) == "answer"


def test_forced_call_text_unit():
    from rapidmoe.app.serve.constrain import DEEPSEEK_V3, HERMES, CallText, JsonObject, call_format

    def accepts(text):
        j = JsonObject()
        return all(j.feed(ch) for ch in text) and j.done

    assert accepts('{"a": [1, -2.5e-3, true, null, {"b": "x\\u00e9\\n"}]}') and accepts("{}")
    for bad in ('{"a": 01}', '{"a":  1}', "[1]", '{"a": 1}}', '{"a": tru}', '{"a": "\n"}'):
        assert not accepts(bad), bad
    t = CallText(HERMES.mid, names=["get", "get_weather"])
    assert t.feed('get_weather", "arguments": {"city": "Paris"}') and t.done
    assert (t.name, t.args_text) == ("get_weather", '{"city": "Paris"}')
    assert not CallText(HERMES.mid, names=["get"]).feed("got")
    assert call_format("{{ '<tool_call>' }}") is HERMES
    assert call_format("'<｜tool▁call▁begin｜>' + t.type + '<｜tool▁sep｜>' + '```json'") is DEEPSEEK_V3
    assert call_format("{{ messages }}") is None


def test_forced_call_mask_unit():
    import torch

    from rapidmoe.app.serve.constrain import HERMES, MASKED, CallConstraint, CallText
    from rapidmoe.engine.hub.demo import demo_model_path
    from rapidmoe.engine.gguf.reader import GGUFFile
    from rapidmoe.engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(GGUFFile(demo_model_path()).metadata)
    (hello,), (brace,), (end,) = (tok.encode(t, add_special=False) for t in ("Hello", "{", "}"))
    c = CallConstraint(tok, CallText(HERMES.mid, name="f"))
    logits = torch.zeros(tok.n_vocab)
    logits[hello], logits[brace] = 10.0, 5.0
    out = c.mask(logits)
    assert int(out.argmax()) == brace and out[hello] == MASKED and bool(torch.isfinite(out).all())
    assert all(out[i] == MASKED for i in tok.eog_ids)  # no end before the call is whole
    c.advance(brace)
    logits[end] = 1.0
    assert int(c.mask(logits).argmax()) == end and c.result() is None
    c.advance(end)
    out = c.mask(logits)
    assert int(out.argmax()) == c.end_id and int((out > MASKED).sum()) == 1 and c.result() == ("f", "{}")
