"""The chat controller (app/chat_controller.py) without a screen: the real history
store and the real engine on a tiny synthetic model (its replies are noise; what
is under test is where they go). The TUI tests drive the same controller through
ChatScreen; here each rule is checked on its own, with no terminal."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from rapidmoe.app.chat_controller import ChatController
from rapidmoe.app.store import ChatStore
from rapidmoe.app.tui.backend import EngineBackend
from rapidmoe.engine.errors import UserError
from rapidmoe.engine.events import Finished, TextDelta

N_CTX = 128  # small: a long prompt overflows it, so a reply fails the way a real one does


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(backend, loaded model, spec): full precision, no pack to convert."""
    from rapidmoe.engine.synth.model import write_synthetic

    src = write_synthetic(tmp_path_factory.mktemp("model") / "s.gguf", "qwen3moe", seed=3, dtype="f16", n_layer=2)
    backend = EngineBackend(critical=None)
    return backend, backend.load(str(src), N_CTX, lambda *a: None), str(src)


def controller(tmp_path, model, max_tokens=6, **kw) -> ChatController:
    backend, loaded, spec = model
    c = ChatController(ChatStore(tmp_path / "history.db"), backend,
                       overrides={"temperature": 0.0, "max_tokens": max_tokens}, **kw)
    c.use_model(loaded, spec)
    return c


def run_reply(c: ChatController, text: str | None) -> Finished:
    """What the screen's reply worker and its Done handler do, in one thread."""
    final = [e for e in c.start_reply(text) if isinstance(e, Finished)][-1]
    c.reply_done(final)
    c.end_reply()
    return final


def turns(c: ChatController) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in c.messages()]


def test_a_reply_is_stored_with_its_prompt(tmp_path, model):
    c = controller(tmp_path, model)
    assert c.store.get_state("last_model") == model[2]
    prompt = "  what is   a mixture of experts?  "
    c.add_prompt(prompt)
    f = run_reply(c, prompt)
    assert f.finish_reason == "length" and f.completion_tokens == 6 and f.text
    assert c.chat.title == "what is a mixture of experts?" and c.chat.model == model[2]
    assert turns(c) == [("user", prompt), ("assistant", f.text)]
    stats = c.messages()[-1].stats
    assert stats["finish_reason"] == "length" and stats["completion_tokens"] == 6
    assert stats["context_size"] == N_CTX and "answered_by" not in stats  # a local model answered
    assert not c.generating and c.last_final is f
    assert c.session.messages[-1] == {"role": "assistant", "content": f.text}
    assert c.store.get_chat(c.chat.id).title == c.chat.title  # the store is the truth


def test_a_failed_reply_takes_its_prompt_back_out_of_the_history(tmp_path, model):
    c = controller(tmp_path, model)
    c.add_prompt("hi")
    first = run_reply(c, "hi")
    long = "word " * 200  # over the context: the engine refuses it
    c.add_prompt(long)
    assert turns(c)[-1] == ("user", long)
    with pytest.raises(UserError, match="context holds 128") as e:
        for _ in c.start_reply(long):
            pass
    failed = c.reply_failed(e.value, long)
    assert failed.returned == long and failed.kept is None  # back into the input, unanswered
    assert turns(c) == [("user", "hi"), ("assistant", first.text)]
    assert c.session.messages == c.store.context(c.chat.id)
    assert c.save_cut("late", tokens=1) is None  # nothing is left unstored to cut


def test_a_failed_regenerate_keeps_its_question(tmp_path, model):
    """A regenerate has no prompt of its own to give back: the question stays, for a retry."""
    c = controller(tmp_path, model)
    long = "word " * 200
    chat = c.store.add_exchange(None, long, "an answer from a model with a longer context", title="t")
    c.open_chat(chat.id)
    assert c.drop_last_reply() is True and turns(c) == [("user", long)]
    assert c.drop_last_reply() is False  # the chat ends on the question now
    with pytest.raises(UserError, match="context holds 128") as e:
        for _ in c.start_reply(None):
            pass
    failed = c.reply_failed(e.value, None)
    assert failed.returned is None and failed.kept is None
    assert turns(c) == [("user", long)] and c.session.messages[-1] == {"role": "user", "content": long}


def test_a_reply_cut_when_the_app_closes_is_kept_marked_cut(tmp_path, model):
    c = controller(tmp_path, model, max_tokens=40)
    c.add_prompt("tell me a story")
    events = c.start_reply("tell me a story")
    deltas = []
    for e in events:
        if isinstance(e, TextDelta):
            deltas.append(e)
            if len(deltas) == 2:
                break
    text = "".join(d.text for d in deltas)
    cut = c.save_cut(text, tokens=deltas[-1].completion_tokens, decode_tok_s=deltas[-1].decode_tok_s)
    events.close()
    assert c.cancel.is_set() and not c.generating
    assert (cut.role, cut.content) == ("assistant", text)
    assert cut.stats["finish_reason"] == "cancelled" and cut.stats["cut"] == "quit"
    assert cut.stats["completion_tokens"] == 2
    assert c.save_cut(text) is None  # stored once
    chat_id = c.chat.id
    c.store.close()

    again = controller(tmp_path, model)  # the app opened again on the same history
    again.open_chat(chat_id)
    assert again.session.messages == [{"role": "user", "content": "tell me a story"},
                                      {"role": "assistant", "content": text}]


def test_a_stopped_reply_is_stored_and_what_waited_for_it_runs_after(tmp_path, model):
    c = controller(tmp_path, model, max_tokens=40)
    c.add_prompt("count")
    ran = []
    final = None
    for e in c.start_reply("count"):
        if isinstance(e, TextDelta) and not c.cancel.is_set():
            # switching chats mid-reply waits until the reply is stored in its own chat
            assert c.defer(lambda: ran.append(c.chat.id)) is True
            assert c.cancel.is_set()
        if isinstance(e, Finished):
            final = e
    assert final.finish_reason == "cancelled" and final.completion_tokens < 40
    assert ran == []  # not yet: the reply is not stored
    c.reply_done(final)
    c.end_reply()
    asyncio.run(c.run_deferred())
    assert ran == [c.chat.id] and len(c.stop_latencies) == 1
    assert c.messages()[-1].stats["finish_reason"] == "cancelled"
    assert c.defer(lambda: ran.append(0)) is False  # nothing being written: run it now yourself


def test_switching_chats_rebuilds_the_session_from_the_store(tmp_path, model):
    c = controller(tmp_path, model, system="Be brief.")
    store = c.store
    a = store.add_exchange(None, "qa", "ra", title="a")
    b = store.add_exchange(None, "qb1", "rb1", title="b", system="You are b.")
    store.add_message(b.id, "user", "left unanswered")  # the app was killed before its reply
    store.set_params(b.id, {"top_k": 7})

    assert [m.content for m in c.open_chat(a.id)] == ["qa", "ra"]
    session = c.session
    assert session.messages == [{"role": "user", "content": "qa"}, {"role": "assistant", "content": "ra"}]
    assert c.params().top_k != 7

    assert [m.content for m in c.open_chat(b.id)][-1] == "left unanswered"  # shown, never sent
    assert c.session is session  # kept per model: its KV cache keeps what the chats share
    assert session.messages == [{"role": "system", "content": "You are b."},
                                {"role": "user", "content": "qb1"}, {"role": "assistant", "content": "rb1"}]
    assert session.params.top_k == 7 and c.params().top_k == 7

    c.apply_settings(system="Now terse.")
    assert store.get_chat(b.id).system == "Now terse." and session.messages[0]["content"] == "Now terse."

    assert c.open_chat(None) == [] and c.chat is None
    assert session.messages == [{"role": "system", "content": "Be brief."}]  # a new chat: the default

    with pytest.raises(UserError):
        c.open_chat(999)
    assert c.chat is None  # a chat that cannot be read changes nothing

    backend, _, spec = model
    c.open_chat(a.id)
    c.use_model(backend.load(spec, N_CTX, lambda *a: None), spec)  # another model: a session of its own
    assert c.session is not session
    assert c.session.messages == store.context(a.id)  # chat a has no system prompt of its own


def test_an_edited_prompt_leaves_the_history_and_the_session(tmp_path, model):
    c = controller(tmp_path, model)
    c.add_prompt("first")
    run_reply(c, "first")
    c.add_prompt("second")
    run_reply(c, "second")
    last = c.take_back_last_prompt()
    assert last.content == "second" and [t[1] for t in turns(c)][0] == "first" and len(turns(c)) == 2
    assert [m["content"] for m in c.session.messages if m["role"] == "user"] == ["first"]
    c.add_prompt("second, edited")
    run_reply(c, "second, edited")
    assert [t[1] for t in turns(c) if t[0] == "user"] == ["first", "second, edited"]


def test_the_controller_needs_no_textual():
    """The controller is the part of the chat a test or another front end drives without a
    terminal: importing it must not import Textual, directly or through what it imports."""
    code = ("import sys, rapidmoe.app.chat_controller; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
