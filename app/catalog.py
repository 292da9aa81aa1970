"""What a user can pick to chat with, each as (spec, one-line label): the offline demo
and GGUFs already in the Hugging Face cache (with what their first use costs),
the models each provider of config.toml serves, and recommended Hub models with
whether their plan fits this machine. The TUI's model picker lists them; nothing
here imports Textual."""
from __future__ import annotations

import psutil

from ..engine.plan.hardware import detect
from ..engine.units import fmt_bytes


def available_models() -> list[tuple[str, str]]:
    """(spec, label) of what can load without a download."""
    from ..engine.hub.demo import DEMO_NAME, demo_cache_path  # deferred: loads gguf, numpy

    demo = demo_cache_path()
    built = f"{fmt_bytes(demo.stat().st_size)}" if demo.is_file() else "built on first use"
    out = [("demo", f"demo · {DEMO_NAME} · {built}{_first_use(demo) if demo.is_file() else ''}")]
    try:
        from ..engine.hub.pull import list_cached  # deferred: loads huggingface_hub, httpx2

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
    from .remote.client import list_models  # deferred: loads torch
    from .remote.providers import provider_endpoint  # deferred: loads torch

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
    from ..engine.pack.cost import first_use_label  # deferred: loads platformdirs

    try:
        label = first_use_label(path)
    except Exception:  # a damaged file says so when it is loaded, not here
        return ""
    return f" · {label}" if label else ""


def _conversion(sizes) -> str:
    """' · then about 25 min to convert, 17.6 GiB of disk' (the converter's rate on this machine)."""
    from ..engine.pack.cost import fmt_duration, sizes_cost  # deferred: loads platformdirs

    if not sizes.n_moe_layers:
        return ""
    c = sizes_cost(sizes)
    return f" · then about {fmt_duration(c['seconds'])} to convert, {fmt_bytes(c['pack_bytes'])} of disk"


def recommended_models(hw=None) -> list[tuple[str, str]]:
    """(spec, label) of recommended Hub models: download size and whether the
    residual-split plan fits this machine (planned from metadata, nothing fetched)."""
    from ..engine.plan.recommend import recommendations  # deferred: loads gguf, numpy

    out = []
    for r in recommendations(hw or detect(amx=False)):
        p = r.plan
        where = "CPU-centric" if p.mode == "cpu" else f"{p.mode}, W_Q {p.wq_cache_fraction:.0%} on GPU"
        fit = f"fits ({where})" if p.fits else "does not fit: " + "; ".join(p.over_budget())
        out.append((r.spec, f"{r.title} · ≈{fmt_bytes(r.sizes.source_bytes)} · {fit}{_conversion(r.sizes)}"))
    return out
