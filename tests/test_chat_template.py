"""Chat templates: the two real templates that ship offline (SmolLM2's ChatML and
DeepSeek-R1-Distill-Qwen's), transformers' whitespace rules, the helpers HF
templates call, and the sandbox."""
from __future__ import annotations

import datetime

import pytest

from rapidmoe.engine.text.chat_template import default_template, render_chat
from rapidmoe.engine.errors import UserError
from test_tokenizer import case, real_metadata

BOS_DS = "<｜begin▁of▁sentence｜>"
EOS_DS = "<｜end▁of▁sentence｜>"


def render(template, messages, **kw):
    kw.setdefault("bos_token", "<s>")
    kw.setdefault("eos_token", "</s>")
    return render_chat(template, messages, **kw)


def test_smollm2_template_adds_its_default_system_prompt():
    t = real_metadata("smollm2")["tokenizer.chat_template"]
    out = render(t, [{"role": "user", "content": "Hi"}])
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    out = render(t, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Café 🤖?"}],
                 add_generation_prompt=False)
    assert out == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCafé 🤖?<|im_end|>\n"


def test_deepseek_r1_template_strips_past_thinking():
    t = real_metadata("qwen")["tokenizer.chat_template"]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
            {"role": "user", "content": "And?"}]
    out = render(t, msgs, bos_token=BOS_DS, eos_token=EOS_DS)
    assert out == (f"{BOS_DS}Be brief.<｜User｜>Hi<｜Assistant｜>\n\nHello!{EOS_DS}"
                   "<｜User｜>And?<｜Assistant｜>")
    # rendered text tokenizes with the template's markers as single special tokens
    _, tok = case("qwen")
    ids = tok.encode(out, add_special=True, parse_special=True)
    assert ids[:2] == [tok.bos_id, tok.bos_id]  # the template wrote BOS and add_bos adds one more
    assert tok.token_to_id["<｜User｜>"] in ids and tok.eos_id in ids
    assert tok.decode(ids, special=True) == BOS_DS + out


def test_block_whitespace_follows_transformers():
    # trim_blocks + lstrip_blocks: tag lines leave no blank lines or indentation behind
    t = ("{% for m in messages %}\n"
         "    {% if m['role'] == 'user' %}\n"
         "{{ '[INST] ' + m['content'] + ' [/INST]' }}\n"
         "    {% else %}\n"
         "{{ m['content'] + eos_token }}\n"
         "    {% endif %}\n"
         "{% endfor %}")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert render(t, msgs) == "[INST] a [/INST]\nb</s>\n"


def test_helpers_that_hf_templates_use():
    t = ("{{ bos_token }}{{ messages[0] | tojson }}|{{ {'k': [1, 2]} | tojson(indent=1) }}|"
         "{{ strftime_now('%Y') }}|{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
         "{% generation %}{{ m.role }}{% endgeneration %}{% endfor %}|{{ tools is none }}")
    out = render(t, [{"role": "user", "content": "é\"🤖"}, {"role": "x", "content": ""}], tools=None)
    year = datetime.datetime.now().strftime("%Y")
    assert out == '<s>{"role": "user", "content": "é\\"🤖"}|{\n "k": [\n  1,\n  2\n ]\n}|' + year + "|user|True"


def test_default_template_is_chatml():
    msgs = [{"role": "user", "content": "Hi"}]
    expect = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(default_template(), msgs) == expect
    assert render("", msgs) == expect  # a file without a template gets the default


@pytest.mark.parametrize("template, message", [
    ("{{ raise_exception('Conversation roles must alternate user/assistant') }}", "refused.*alternate"),
    ("{% for m in messages %}", "invalid \\(line 1\\)"),
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
    ("{% set _ = messages.append(1) %}", "unsafe"),
    ("{{ 'x' * 10**10 }}", "unsafe"),
    ("{{ cycler.__init__.__globals__ }}", "unsafe"),
    ("{{ messages[3].content }}", "failed: UndefinedError"),
    ("{{ 2.0 ** 1024 }}", "failed: OverflowError"),
])
def test_bad_templates_are_one_line_user_errors(template, message):
    with pytest.raises(UserError, match=message) as e:
        render(template, [{"role": "user", "content": "hi"}])
    assert "\n" not in str(e.value)


DOUBLING = "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = OP %}{% endfor %}{{ ns.s }}"


@pytest.mark.parametrize("template", [
    # the string doubling of the fuzz run, spelled every way a template can spell it
    *(DOUBLING.replace("OP", op) for op in (
        "ns.s ~ ns.s", "ns.s + ns.s", "[ns.s, ns.s] | join", "''.join([ns.s, ns.s])", "'%s%s' % (ns.s, ns.s)",
        "'{}{}'.format(ns.s, ns.s)", "ns.s | replace('x', 'xx')", "ns.s.replace('x', 'xx')")),
    "{% macro d(s, n) %}{{ d(s ~ s, n - 1) if n else s }}{% endmacro %}{{ d('x', 64) }}",
    # one call asking for gigabytes
    "{{ 'x'.ljust(10**9) }}", "{{ 'x' | center(10**9) }}", "{{ '%1000000000s' % 'x' }}",
    "{{ ('{:>999999}' * 100).format(*range(100)) }}",
    "{{ ('\\n' * 1000000) | indent(1000) }}", "{{ ('x ' * 500000) | wordwrap(1, true, 'y' * 1000) }}",
    "{{ ('\\t' * 1000000).expandtabs(1000) }}",
    # output that never ends, loops that never end
    "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% set s = 'x' * 1000000 %}{% for c in s %}{% for d in s %}{% endfor %}{% endfor %}",
])
def test_rendering_is_bounded_in_size_and_steps(template):
    with pytest.raises(UserError, match="the chat template (was stopped|tried something unsafe)") as e:
        render(template, [{"role": "user", "content": "hi"}])
    assert "\n" not in str(e.value)


def test_rendering_is_bounded_in_time(monkeypatch):
    t = "{% for i in range(100000) %}{{ i }}{% endfor %}"
    assert len(render(t, [])) > 400_000
    monkeypatch.setenv("RAPIDMOE_TEMPLATE_TIMEOUT", "0")  # the deadline has passed at the first check
    with pytest.raises(UserError, match="stopped: it ran out of time"):
        render(t, [])


def test_bounds_leave_real_conversations_alone():
    t = real_metadata("qwen")["tokenizer.chat_template"]
    long = "word " * 200_000  # a megabyte pasted into one message
    msgs = [m for i in range(500) for m in ({"role": "user", "content": f"q{i}"},
                                            {"role": "assistant", "content": f"a{i}"})]
    out = render(t, msgs + [{"role": "user", "content": long}], bos_token=BOS_DS, eos_token=EOS_DS)
    assert out.endswith(long + "<｜Assistant｜>") and "q499" in out
    assert render("{{ 'x'.ljust(80) | length }} {{ messages | tojson(indent=2) | length > 0 }}",
                  msgs[:2]) == "80 True"
