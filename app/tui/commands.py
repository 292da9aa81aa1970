"""`/` commands (with Tab completion) and the command palette entries (Ctrl+P).
Both end in actions of the chat screen, so a key, a `/` command and the palette
do the same thing."""
from __future__ import annotations

from dataclasses import fields
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from ...engine.errors import UserError
from ...engine.sampling import SamplingParams

# name -> (argument hint, help)
SLASH: dict[str, tuple[str, str]] = {
    "/model": ("[NAME|PATH]", "load a model (no argument: open the model picker)"),
    "/system": ("[TEXT]", "show or set this chat's system prompt ('/system -' clears it)"),
    "/set": ("[KEY VALUE]", "show or set sampling: temperature top_k top_p min_p repeat_penalty "
                            "seed max_tokens stop"),
    "/clear": ("", "forget this chat's messages (the context starts empty)"),
    "/regen": ("", "regenerate the last reply"),
    "/edit": ("", "put the last prompt back in the input to edit and resend it"),
    "/stats": ("[on|off]", "last reply's figures; what is loaded and where, memory, r (on/off: after each reply)"),
    "/new": ("", "start a new chat"),
    "/chats": ("", "open the chat list (rename, delete, export)"),
    "/rename": ("TITLE", "rename this chat"),
    "/export": ("[PATH]", "export this chat to Markdown (to JSON when PATH ends in .json)"),
    "/copy": ("[code]", "copy the last reply (or its code blocks, one per call)"),
    "/theme": ("[NAME]", "switch theme (saved in the config)"),
    "/attach": ("PATH", "add a text file to the prompt (as a fenced block)"),
    "/editor": ("", "edit the prompt in $VISUAL / $EDITOR"),
    "/help": ("", "this help"),
    "/quit": ("", "leave"),
}

# (title, help, screen action) for the palette
PALETTE = [
    ("New chat", "start an empty chat", "new_chat"),
    ("Chats", "open, rename, delete or export chats", "chats"),
    ("Models", "pick and load a model", "models"),
    ("Settings", "system prompt and sampling for this chat", "settings"),
    ("Regenerate", "a new reply to the last prompt", "regenerate"),
    ("Edit last prompt", "put the last prompt back in the input", "edit_last"),
    ("Stop generation", "stop the reply, keep what was written", "stop"),
    ("Copy last reply", "to the clipboard", "copy_reply"),
    ("Copy code block", "the last reply's code blocks, one per call", "copy_code"),
    ("Export chat to Markdown", "write this chat to a .md file", "export"),
    ("Edit prompt in $EDITOR", "write the prompt in your editor", "editor"),
    ("Clear chat", "forget this chat's messages", "clear"),
    ("Show stats", "the last reply's figures; what is loaded and where, memory, r", "stats"),
    ("Help", "keys and / commands", "help"),
]

SET_KEYS = {f.name: f.type for f in fields(SamplingParams)} | {"temp": "float"}


def _extend(word: str, candidates) -> str | None:
    """The unique match plus a space, or the longest common prefix of the matches."""
    matches = sorted({c for c in candidates if c.startswith(word)})
    if not matches:
        return None
    if len(matches) == 1:
        return matches[0] + " "
    prefix = matches[0]
    for m in matches[1:]:
        while not m.startswith(prefix):
            prefix = prefix[:-1]
    return prefix


def complete(text: str, arg_choices=None) -> str | None:
    """Tab completion of a `/` command name, then of its first argument.
    arg_choices(command) -> the values that argument can take (or none)."""
    name, sep, arg = text.partition(" ")
    if not sep:
        return _extend(name, SLASH)
    if " " in arg or arg_choices is None:
        return None
    done = _extend(arg, arg_choices(name) or ())
    return None if done is None else f"{name} {done}"


def candidates(text: str, arg_choices=None) -> list[str]:
    """What could follow: the matching commands, or the matching values of the argument."""
    name, sep, arg = text.partition(" ")
    if not sep:
        return sorted(c for c in SLASH if c.startswith(name))
    if " " in arg or arg_choices is None:
        return []
    return sorted({c for c in arg_choices(name) or () if c.startswith(arg)})


def static_choices(name: str) -> list[str]:
    return {"/set": [k for k in SET_KEYS if k != "temp"], "/stats": ["on", "off"],
            "/copy": ["code"]}.get(name, [])


def parse_slash(text: str) -> tuple[str, str]:
    name, _, arg = text.strip().partition(" ")
    if name not in SLASH:
        near = [c for c in SLASH if c.startswith(name[:3])]
        raise UserError(f"unknown command {name}" + (f" (did you mean {', '.join(near)}?)" if near else
                                                     "; /help lists them"))
    return name, arg.strip()


def parse_set(arg: str) -> dict:
    """'temperature 0.2' -> {"temperature": 0.2}; 'seed none' clears; 'stop a, b' -> ("a", "b")."""
    key, _, value = arg.strip().partition(" ")
    key = {"temp": "temperature"}.get(key, key)
    if key not in SET_KEYS or key == "temp":
        raise UserError(f"unknown setting {key!r}; one of: {', '.join(k for k in SET_KEYS if k != 'temp')}")
    value = value.strip()
    if not value:
        raise UserError(f"/set {key} needs a value")
    kind = SET_KEYS[key]
    try:
        if value.lower() == "none" and key in ("seed",):
            return {key: None}
        if key == "stop":
            return {key: tuple(s.strip() for s in value.split(",") if s.strip())}
        if "int" in str(kind):
            return {key: int(value)}
        return {key: float(value)}
    except ValueError:
        raise UserError(f"/set {key}: {value!r} is not a number") from None


def help_text(keys: dict[str, str]) -> str:
    width = max(len(c) + len(a) for c, (a, _) in SLASH.items()) + 2
    lines = ["Commands:"] + [f"  {(c + ' ' + a).ljust(width)} {h}" for c, (a, h) in SLASH.items()]
    lines += ["", "Keys:"] + [f"  {k.ljust(12)} {v}" for k, v in keys.items()]
    lines += ["  ctrl+c       stop the reply or the loading, as Esc; quit when there is nothing to stop",
              "  ctrl+p       command palette", "  on a message: c copies it, k copies its code blocks",
              "", "Ctrl+J adds a new line in every terminal; Shift+Enter and Alt+Enter only where the "
              "terminal tells them apart from Enter (where it does not, they send)."]
    return "\n".join(lines)


class ChatCommands(Provider):
    """Our entries in Textual's command palette."""

    def _entries(self):
        screen = self.screen
        for title, help_, action in PALETTE:
            if hasattr(screen, f"action_{action}"):
                yield title, help_, partial(screen.run_action, action)

    async def discover(self) -> Hits:
        for title, help_, cb in self._entries():
            yield DiscoveryHit(title, cb, help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_, cb in self._entries():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), cb, help=help_)
