"""Generation on the real demo model and a synthetic fixture: sampling,
stopping, KV-cache reuse across turns, context limits."""
from __future__ import annotations

import threading

import pytest
import torch

from rapidmoe.engine.errors import UserError
from rapidmoe.engine.events import Finished, PromptProcessed, TextDelta
from rapidmoe.engine.generate import ChatSession, Session
from rapidmoe.engine.model import load_model
from rapidmoe.engine.sampling import Sampler, SamplingParams
from rapidmoe.engine.synth import write_synthetic

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", n_ctx=512)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = write_synthetic(tmp_path_factory.mktemp("gen") / "t.gguf", "qwen3moe", seed=3, dtype="f32")
    return load_model(p, n_ctx=64)


def run(events):
    evs = list(events)
    fin = evs[-1]
    assert isinstance(fin, Finished)
    assert "".join(e.text for e in evs if isinstance(e, TextDelta)) == fin.text
    return evs, fin


def test_demo_answers_a_simple_question(demo):
    chat = ChatSession(demo, params=SamplingParams(temperature=0.0, max_tokens=24))
    evs, fin = run(chat.send("What is the capital of France?"))
    assert "Paris" in fin.text
    assert fin.finish_reason == "stop"
    pp = [e for e in evs if isinstance(e, PromptProcessed)]
    assert len(pp) == 1 and pp[0].prompt_tokens > 10 and pp[0].ttft_s > 0
    assert chat.messages[-1] == {"role": "assistant", "content": fin.text}


def test_second_turn_processes_only_new_tokens(demo):
    chat = ChatSession(demo, params=SamplingParams(temperature=0.0, max_tokens=8))
    run(chat.send("Name a colour."))
    before = len(chat.session.tokens)
    evs, fin = run(chat.send("And another one?"))
    pp = next(e for e in evs if isinstance(e, PromptProcessed))
    assert pp.cached_tokens >= before - 1  # the history was reused
    assert pp.prompt_tokens < 30  # only the new turn (template + a few words) ran
    # the reused cache gives the same logits as a fresh run over the same tokens
    ids = chat.session.tokens[:]
    fresh = demo.net.forward(torch.tensor(ids), 0, demo.net.new_cache(512))[-1]
    cached = demo.net.forward(torch.tensor([ids[-1]]), len(ids) - 1, chat.session.cache)[0]
    assert torch.allclose(fresh, cached, atol=1e-3, rtol=1e-4)


def test_same_seed_same_output(tiny):
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42, max_tokens=10)
    a = run(Session(tiny, p).generate([1, 2, 3]))[1].text
    b = run(Session(tiny, p).generate([1, 2, 3]))[1].text
    c = run(Session(tiny, p.with_overrides(seed=43)).generate([1, 2, 3]))[1].text
    assert a == b and a != c


def test_sampler_filters():
    logits = torch.tensor([5.0, 4.0, 1.0, 0.0, -1.0])
    greedy = Sampler(SamplingParams(temperature=0.0))
    assert greedy(logits, []) == 0
    # top-k 2: only ids 0 and 1 can come out
    s = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=1))
    assert {s(logits, []) for _ in range(200)} == {0, 1}
    # min-p 0.5 keeps tokens with p >= 0.5 * p_max: only id 0 here
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=1))
    assert {s(logits, []) for _ in range(50)} == {0}
    # repeat penalty pushes a repeated token below the next one
    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0))
    assert s(torch.tensor([3.0, 2.0]), [0]) == 1


def test_max_tokens_and_stop_strings(demo):
    evs, fin = run(Session(demo, GREEDY.with_overrides(max_tokens=5)).generate(demo.tokenizer.encode("One, two, three,")))
    assert fin.finish_reason == "length" and fin.completion_tokens == 5
    sess = Session(demo, GREEDY.with_overrides(max_tokens=40, stop=(", six",)))
    evs, fin = run(sess.generate(demo.tokenizer.encode("one, two, three, four,")))
    assert fin.finish_reason == "stop" and fin.text == " five"


def test_context_full_is_a_finish_reason_and_long_prompt_an_error(tiny):
    sess = Session(tiny, SamplingParams(temperature=0.0, max_tokens=1000))
    evs, fin = run(sess.generate(list(range(1, 60))))
    assert fin.finish_reason == "context" and fin.context_used <= 64
    with pytest.raises(UserError, match="context"):
        list(Session(tiny).generate(list(range(1, 80))))


def test_cancel_keeps_partial(tiny):
    cancel = threading.Event()
    sess = Session(tiny, SamplingParams(temperature=0.0, max_tokens=50))
    out = []
    for ev in sess.generate([1, 2, 3], cancel=cancel):
        out.append(ev)
        if isinstance(ev, TextDelta) and ev.completion_tokens >= 3:
            cancel.set()
    fin = out[-1]
    assert fin.finish_reason == "cancelled" and 3 <= fin.completion_tokens < 50
