"""Pick a model: the offline demo, GGUFs already in the Hugging Face cache,
recommended Hub models with whether they fit this machine (from `plan`), or a
path / `repo[:quant]` typed in (a repo is pulled, resumably, when loaded)."""
from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from .status_bar import fmt_bytes


def available_models() -> list[tuple[str, str]]:
    """(spec, label) of what can load without a download."""
    from ...engine.demo import DEMO_NAME, demo_cache_path

    demo = demo_cache_path()
    built = f"{fmt_bytes(demo.stat().st_size)}" if demo.is_file() else "built on first use"
    out = [("demo", f"demo · {DEMO_NAME} · {built}{_first_use(demo) if demo.is_file() else ''}")]
    try:
        from ...engine.hub import list_cached

        import psutil

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


def provider_models(timeout: float = 2.0) -> list[tuple[str, str]]:
    """(PROVIDER:MODEL, label) of what each provider of config.toml serves (its /v1/models);
    a provider that does not answer is one disabled line, not a picker that will not open."""
    from ..remote.client import list_models
    from ..remote.providers import load_providers

    out = []
    try:
        providers = load_providers()
    except Exception as e:  # noqa: BLE001 - a bad [providers] block says so when one is loaded
        return [("", f"(providers unreadable: {e})")]
    for name, ep in providers.items():
        try:
            models = list_models(ep, timeout=timeout)
        except Exception as e:  # noqa: BLE001
            out.append(("", f"{name} · {ep.base_url} · {' '.join(str(e).split())[:80]}"))
            continue
        for m in models:
            ctx = m.get("context_length") or m.get("max_model_len")
            out.append((f"{name}:{m['id']}", f"{name}:{m['id']} · {ep.base_url}{f' · {ctx} ctx' if ctx else ''}"))
    return out


def _first_use(path) -> str:
    """' · first use: about 25 min to convert, 17.6 GiB of disk' until the model's pack is made."""
    from ...engine.pack_cost import first_use_label

    try:
        label = first_use_label(path)
    except Exception:  # a damaged file says so when it is loaded, not here
        return ""
    return f" · {label}" if label else ""


def _conversion(sizes) -> str:
    """' · then about 25 min to convert, 17.6 GiB of disk' (the converter's rate on this machine)."""
    from ...engine.pack_cost import fmt_duration, sizes_cost

    if not sizes.n_moe_layers:
        return ""
    c = sizes_cost(sizes)
    return f" · then about {fmt_duration(c['seconds'])} to convert, {fmt_bytes(c['pack_bytes'])} of disk"


def recommended_models(hw=None) -> list[tuple[str, str]]:
    """(spec, label) of recommended Hub models: download size and whether the
    residual-split plan fits this machine (planned from metadata, nothing fetched)."""
    from ...engine.hardware import detect
    from ...engine.recommend import recommendations

    out = []
    for r in recommendations(hw or detect(amx=False)):
        p = r.plan
        where = "CPU-centric" if p.mode == "cpu" else f"{p.mode}, W_Q {p.wq_cache_fraction:.0%} on GPU"
        fit = f"fits ({where})" if p.fits else "does not fit: " + "; ".join(p.over_budget())
        out.append((r.spec, f"{r.title} · ≈{fmt_bytes(r.sizes.source_bytes)} · {fit}{_conversion(r.sizes)}"))
    return out


class ModelPicker(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, current: str | None = None):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="picker", classes="dialog"):
            yield Static("Models", classes="dialog-title")
            opts = []
            for spec, label in available_models():
                mark = "● " if spec == self.current else "  "
                opts.append(Option(mark + label, id=spec or None, disabled=not spec))
            remote = provider_models()
            if remote:
                opts.append(Option("Providers (config.toml)", disabled=True))
                for spec, label in remote:
                    mark = "● " if spec and spec == self.current else "  "
                    opts.append(Option(mark + label, id=spec or None, disabled=not spec))
            try:
                rec = recommended_models()
            except Exception as e:  # hardware detection must not keep the picker from opening
                rec = [("", f"(recommendations unavailable: {type(e).__name__})")]
            if rec:
                opts.append(Option("Recommended from the Hugging Face Hub", disabled=True))
                for spec, label in rec:
                    opts.append(Option("  " + label, id=spec or None, disabled=not spec))
            yield OptionList(*opts, id="model-list")
            yield Input(placeholder="a GGUF path, or REPO[:QUANT] to pull from the Hugging Face Hub",
                        id="model-spec")
            yield Static("type a name and Enter, or Tab to the list · Esc closes", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#model-spec", Input).focus()

    @on(OptionList.OptionSelected)
    def _picked(self, ev: OptionList.OptionSelected) -> None:
        if ev.option.id:
            self.dismiss(ev.option.id)

    @on(Input.Submitted)
    def _typed(self, ev: Input.Submitted) -> None:
        spec = ev.value.strip()
        if spec:
            self.dismiss(spec)
