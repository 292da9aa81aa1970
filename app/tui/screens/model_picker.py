"""Pick a model: the offline demo, GGUFs already in the Hugging Face cache, the
models each provider of config.toml serves (asked in the background), recommended
Hub models with whether they fit this machine (from `plan`), or a path /
`repo[:quant]` typed in (a repo is pulled, resumably, when loaded)."""
from __future__ import annotations

import asyncio
import threading

import psutil
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ....engine.plan.hardware import detect
from ..widgets.status_bar import fmt_bytes


def available_models() -> list[tuple[str, str]]:
    """(spec, label) of what can load without a download."""
    from ....engine.hub.demo import DEMO_NAME, demo_cache_path  # deferred: loads gguf, numpy

    demo = demo_cache_path()
    built = f"{fmt_bytes(demo.stat().st_size)}" if demo.is_file() else "built on first use"
    out = [("demo", f"demo · {DEMO_NAME} · {built}{_first_use(demo) if demo.is_file() else ''}")]
    try:
        from ....engine.hub.pull import list_cached  # deferred: loads huggingface_hub, httpx2

        dram = psutil.virtual_memory().total
        for m in list_cached():
            state = "" if m.complete else f" · INCOMPLETE ({len(m.missing)} part(s) missing)"
            # an honest bound until the placement planner can say more: the file against DRAM
            fit = f" · larger than this machine's DRAM ({fmt_bytes(dram)})" if m.size > dram else ""
            first = _first_use(m.files[0]) if m.complete and m.files else ""
            out.append((m.spec, f"{m.spec} · {fmt_bytes(m.size)} · HF cache{state}{fit}{first}"))
    except Exception as e:  # a damaged cache must not keep the picker from opening
        out.append(("", f"(Hugging Face cache unreadable: {type(e).__name__})"))
    return out


def ask_provider(name: str, entry: dict, timeout: float = 10.0) -> list[tuple[str, str]]:
    """(PROVIDER:MODEL, label) of what one provider of config.toml serves (its /v1/models);
    one disabled line saying why when it does not answer. Blocks: the picker runs it in a worker."""
    from ...remote.client import list_models  # deferred: loads torch
    from ...remote.providers import provider_endpoint  # deferred: loads torch

    try:
        ep = provider_endpoint(name, entry)
        models = list_models(ep, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - whatever went wrong is one line in the list
        return [("", f"{name} · {entry['base_url']} · {' '.join(str(e).split())[:80]}")]
    out = []
    for m in models:
        ctx = m.get("context_length") or m.get("max_model_len")
        out.append((f"{name}:{m['id']}", f"{name}:{m['id']} · {ep.base_url}{f' · {ctx} ctx' if ctx else ''}"))
    return out or [("", f"{name} · {ep.base_url} · serves no models")]


def _first_use(path) -> str:
    """' · first use: about 25 min to convert, 17.6 GiB of disk' until the model's pack is made."""
    from ....engine.pack.cost import first_use_label  # deferred: loads platformdirs

    try:
        label = first_use_label(path)
    except Exception:  # a damaged file says so when it is loaded, not here
        return ""
    return f" · {label}" if label else ""


def _conversion(sizes) -> str:
    """' · then about 25 min to convert, 17.6 GiB of disk' (the converter's rate on this machine)."""
    from ....engine.pack.cost import fmt_duration, sizes_cost  # deferred: loads platformdirs

    if not sizes.n_moe_layers:
        return ""
    c = sizes_cost(sizes)
    return f" · then about {fmt_duration(c['seconds'])} to convert, {fmt_bytes(c['pack_bytes'])} of disk"


def recommended_models(hw=None) -> list[tuple[str, str]]:
    """(spec, label) of recommended Hub models: download size and whether the
    residual-split plan fits this machine (planned from metadata, nothing fetched)."""
    from ....engine.plan.recommend import recommendations  # deferred: loads gguf, numpy

    out = []
    for r in recommendations(hw or detect(amx=False)):
        p = r.plan
        where = "CPU-centric" if p.mode == "cpu" else f"{p.mode}, W_Q {p.wq_cache_fraction:.0%} on GPU"
        fit = f"fits ({where})" if p.fits else "does not fit: " + "; ".join(p.over_budget())
        out.append((r.spec, f"{r.title} · ≈{fmt_bytes(r.sizes.source_bytes)} · {fit}{_conversion(r.sizes)}"))
    return out


class ModelPicker(ModalScreen[str | None]):
    """Opens at once: each provider of config.toml is asked for its models in a worker
    of its own, and its lines replace its "asking…" line as they arrive."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, current: str | None = None):
        super().__init__()
        self.current = current
        self._providers: dict[str, dict] = {}
        self._remote: dict[str, list[tuple[str, str]]] = {}  # provider -> its lines, as they arrive

    def _option(self, spec: str, label: str) -> Option:
        mark = "● " if spec and spec == self.current else "  "
        return Option(mark + label, id=spec or None, disabled=not spec)

    def _options(self) -> list[Option]:
        opts = [self._option(spec, label) for spec, label in self._local]
        if self._remote:
            opts.append(Option("Providers (config.toml)", disabled=True))
            opts += [self._option(spec, label) for lines in self._remote.values() for spec, label in lines]
        if self._recommended:
            opts.append(Option("Recommended from the Hugging Face Hub", disabled=True))
            opts += [Option("  " + label, id=spec or None, disabled=not spec) for spec, label in self._recommended]
        return opts

    def compose(self) -> ComposeResult:
        from ...remote.providers import provider_table  # deferred: loads torch

        self._local = available_models()
        try:
            self._providers = provider_table()
        except Exception as e:  # noqa: BLE001 - a bad [providers] block says so when one is loaded
            self._remote["?"] = [("", f"(providers unreadable: {' '.join(str(e).split())})")]
        for name, entry in self._providers.items():
            self._remote[name] = [("", f"{name} · {entry['base_url']} · asking…")]
        try:
            self._recommended = recommended_models()
        except Exception as e:  # hardware detection must not keep the picker from opening
            self._recommended = [("", f"(recommendations unavailable: {type(e).__name__})")]
        with Vertical(id="picker", classes="dialog"):
            yield Static("Models", classes="dialog-title")
            yield OptionList(*self._options(), id="model-list")
            yield Input(placeholder="a GGUF path, or REPO[:QUANT] to pull from the Hugging Face Hub",
                        id="model-spec")
            yield Static("type a name and Enter, or Tab to the list · Esc closes", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#model-spec", Input).focus()
        for name, entry in self._providers.items():
            self.run_worker(self._ask(name, entry), group="providers", exit_on_error=False)

    async def _ask(self, name: str, entry: dict) -> None:
        """The request runs on a daemon thread: a provider that has not answered when the
        picker closes (the worker is cancelled) or the app quits holds nothing up."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()

        def ask() -> None:
            lines = ask_provider(name, entry)
            try:
                loop.call_soon_threadsafe(lambda: answer.done() or answer.set_result(lines))
            except RuntimeError:  # the app has ended
                pass

        threading.Thread(target=ask, name=f"provider-{name}", daemon=True).start()
        self._arrived(name, await answer)

    def _arrived(self, name: str, lines: list[tuple[str, str]]) -> None:
        self._remote[name] = lines
        ol = self.query_one(OptionList)
        keep = ol.highlighted_option.id if ol.highlighted_option is not None else None
        ol.set_options(self._options())
        if keep is not None:
            ol.highlighted = ol.get_option_index(keep)

    @on(OptionList.OptionSelected)
    def _picked(self, ev: OptionList.OptionSelected) -> None:
        if ev.option.id:
            self.dismiss(ev.option.id)

    @on(Input.Submitted)
    def _typed(self, ev: Input.Submitted) -> None:
        spec = ev.value.strip()
        if spec:
            self.dismiss(spec)
