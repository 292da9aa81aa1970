"""What the chat screen asks beyond a key: its `/` commands, each ending in one of
the screen's actions (or its controller's), so a key, a `/` command and the
palette do the same thing; and the dialogs it opens (chats, models, settings),
with what their answers do."""
from __future__ import annotations

from ....engine.errors import UserError
from ...catalog import available_models
from ..commands import parse_set, parse_slash, static_choices
from .chats import ChatsScreen


def arg_choices(app, command: str) -> list[str]:
    """Tab completion of a `/` command's argument."""
    if command == "/theme":
        return list(app.available_themes)
    if command == "/model":
        return [spec for spec, _ in available_models() if spec]
    return static_choices(command)


async def run_slash(screen, text: str) -> None:
    """screen: the ChatScreen; a command's UserError is a note in the chat."""
    try:
        await _slash(screen, *parse_slash(text))
    except UserError as e:
        screen.note(str(e), "error")


async def _slash(screen, name: str, arg: str) -> None:
    app, c = screen.app, screen.controller
    if name == "/model":
        screen.load(arg) if arg else screen.action_models()
    elif name == "/system":
        if not arg:
            screen.note(f"system prompt: {c.system_prompt() or '(none)'}")
        else:
            screen.apply_settings(system="" if arg == "-" else arg)
            screen.note("system prompt " + ("cleared" if arg == "-" else "set"))
    elif name == "/set":
        _set(screen, arg)
    elif name == "/clear":
        await screen.action_clear()
    elif name == "/regen":
        await screen.action_regenerate()
    elif name == "/edit":
        await screen.action_edit_last()
    elif name == "/stats":
        if arg in ("on", "off"):
            screen.stats_after_reply = arg == "on"
            screen.note(f"stats after each reply: {arg}")
        else:
            screen.action_stats()
    elif name == "/new":
        await screen.action_new_chat()
    elif name == "/chats":
        screen.action_chats()
    elif name == "/rename":
        c.rename(arg)
        screen.set_title()
    elif name == "/export":
        screen.action_export(arg)
    elif name == "/copy":
        screen.action_copy_code() if arg == "code" else screen.action_copy_reply()
    elif name == "/theme":
        if not arg:
            screen.note("themes: " + ", ".join(sorted(app.available_themes)))
        elif arg not in app.available_themes:
            raise UserError(f"no theme {arg!r}; /theme lists them")
        else:
            app.theme = arg
    elif name == "/attach":
        if not arg:
            raise UserError("/attach needs a file path")
        screen.action_attach(arg)
    elif name == "/editor":
        screen.action_editor()
    elif name == "/help":
        screen.action_help()
    elif name == "/quit":
        app.exit()


def _set(screen, arg: str) -> None:
    """/set: show the sampling settings, or change this chat's."""
    c = screen.controller
    if not arg:
        screen.note("sampling: " + ", ".join(f"{k}={v}" for k, v in vars(c.params()).items()))
        return
    kv = parse_set(arg)
    params = dict(c.chat_params())
    params.update({k: list(v) if isinstance(v, tuple) else v for k, v in kv.items()})
    screen.app.to_params_checked(params)
    screen.apply_settings(params=params)
    screen.note("set " + ", ".join(f"{k}={v}" for k, v in kv.items()))


# --- the dialogs; screen: the ChatScreen ---
def open_chats(screen) -> None:
    async def done(result) -> None:
        if result is None:
            return
        kind, chat_id = result
        if kind == "open":
            await screen.show_chat(chat_id)
        elif screen.chat is not None:  # renamed or deleted: re-read the open chat
            try:
                screen.controller.reread_chat()
                screen.set_title()
            except UserError:
                await screen.show_chat(None)

    screen.app.push_screen(ChatsScreen(current=screen.chat.id if screen.chat else None), done)


def open_models(screen) -> None:
    from .model_picker import ModelPicker  # deferred: loads psutil, rich

    def done(spec) -> None:
        if spec:
            screen.load(spec)

    screen.app.push_screen(ModelPicker(current=screen.model.spec if screen.model else None), done)


def open_settings(screen) -> None:
    from .settings import SettingsScreen  # deferred: loads platformdirs

    def done(result) -> None:
        if result is not None:
            screen.apply_settings(result["system"], result["params"])

    c = screen.controller
    screen.app.push_screen(SettingsScreen(c.system_prompt(), c.params(), c.chat_params()), done)
