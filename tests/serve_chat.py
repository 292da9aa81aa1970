"""What the serve tests (tests/test_serve*.py) send: the prompts, and a chat request
through the `openai` client with the tests' defaults (a few greedy tokens)."""
from __future__ import annotations

HI = [{"role": "user", "content": "Say hi"}]
COUNT = [{"role": "user", "content": "Count from 1 to 500, separated by commas."}]
TEN = [{"role": "user", "content": "List the numbers from 1 to 10, separated by commas."}]  # "1, 2, 3, ..."


def chat(client, messages=HI, **kw):
    kw.setdefault("max_tokens", 6)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="demo", messages=messages, **kw)
