"""What the chat screen says while a model loads, in plain words: the loading
panel's label for each engine step, and the engine's one-off load notes
rewritten for someone who has never heard of a pack or a profile (what is
happening, and what to do, if anything). A note not known here is shown as the
engine wrote it."""
from __future__ import annotations

import re


def progress_label(what: str, done: int, total: int) -> str:
    if what == "load":
        return f"loading the model: layer {done} of {total}"
    if what == "convert":
        return "preparing the model for fast CPU use (first start only; later starts skip this)"
    if what == "demo":
        return "building the demo model (first start only)"
    if what == "CUDA kernels":
        return "preparing the GPU code (first use only)"
    if what == "place":
        return "placing the weights in memory"
    return what  # "download x.gguf (1/1) · 12.0 MiB/s · 30 s left" says itself


# (engine note pattern, plain text); groups are filled in with str.format
_NOTES: list[tuple[re.Pattern, str]] = [
    (re.compile(r"UMIA: default profile\b"),
     "Using standard speed settings for this model. Optional: `rapidmoe-chat calibrate` "
     "tunes them to this model and computer."),
    (re.compile(r"^first use of this model: converting"), ""),  # the loading panel shows the time left
    (re.compile(r"converted ([\d.]+) M expert weights in ([\d.]+) s\b"),
     "Prepared the model for fast CPU use in {1} s. This happens once: later starts skip it."),
    (re.compile(r"resuming the conversion \((\d+) of (\d+) layers done\)"),
     "Continuing the one-time preparation of this model where it stopped ({0} of {1} layers were done)."),
    (re.compile(r"rebuilding the pack: (.*)"),
     "The prepared copy of this model could not be used ({0}); preparing it again, once."),
    (re.compile(r"this model has no routed experts"),
     "This model has no experts to split, so it runs in full precision."),
]


def plain_note(note: str) -> str:
    for pattern, text in _NOTES:
        m = pattern.search(note)
        if m:
            return text.format(*m.groups())
    return note
