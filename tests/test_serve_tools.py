"""`rapidmoe-chat serve` with tools and reasoning: a server on the demo model with a
template that knows tools and can open <think>, driven with the official `openai`
client (reasoning split or inline, tools rendered, tool_choice required / named /
none), and the units under it: the reply parser and the forced-call constraint."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from serve_chat import HI, chat  # noqa: E402
from serve_helpers import TOOLS_TEMPLATE, Server  # noqa: E402


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
