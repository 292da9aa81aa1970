"""`rapidmoe-chat list`: the models on this machine (the demo, GGUFs in the
Hugging Face cache) and the packs converted from them, with sizes.

Packs live in <cache>/packs as GGUF files; a pack records the file it was
converted from under PACK_SOURCE_KEY. A pack whose source is gone, an unreadable
pack, and a temp file left by an interrupted convert are stale: `rm --stale`
removes them.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine.paths import cache_dir

PACK_SOURCE_KEY = "rapidmoe.pack.source"  # absolute path of the source GGUF (first part)


@dataclass
class Entry:
    kind: str  # "demo" | "hf" | "pack"
    name: str  # what `rm` and `-m` accept
    size: int
    path: str
    note: str = ""
    stale: bool = False


def packs_dir() -> Path:
    return cache_dir() / "packs"


def _pack_source(path: Path) -> str | None:
    from ..engine.gguf.reader import GGUFFile

    meta = GGUFFile(path).metadata
    src = meta.get(PACK_SOURCE_KEY)
    return str(src) if src else None


def list_packs() -> list[Entry]:
    root = packs_dir()
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        size = p.stat().st_size
        name = p.relative_to(root).as_posix()
        if p.name.startswith(".") or p.suffix in (".tmp", ".part", ".lock"):
            if p.suffix != ".lock":
                out.append(Entry("pack", name, size, str(p), "left by an interrupted convert", True))
            continue
        try:
            src = _pack_source(p)
        except Exception as e:  # any damage makes it unusable: the loader would refuse it too
            out.append(Entry("pack", name, size, str(p), f"unreadable ({type(e).__name__})", True))
            continue
        if src is None:
            out.append(Entry("pack", name, size, str(p), "source unknown"))
        elif not Path(src).exists():
            out.append(Entry("pack", name, size, str(p), f"source gone: {src}", True))
        else:
            out.append(Entry("pack", name, size, str(p), f"from {src}"))
    return out


def list_models() -> list[Entry]:
    from ..engine.demo import DEMO_NAME, demo_cache_path

    out = []
    demo = demo_cache_path()
    if demo.is_file():
        out.append(Entry("demo", "demo", demo.stat().st_size, str(demo), DEMO_NAME))
    else:
        out.append(Entry("demo", "demo", 0, str(demo), "built on first use"))
    try:
        from ..engine.hub import list_cached
    except ImportError:
        list_cached = None
    for m in list_cached() if list_cached else []:
        note = "" if m.complete else f"incomplete: {len(m.missing)} split part(s) missing"
        out.append(Entry("hf", m.spec, m.size, str(m.files[0]) if m.files else "", note))
    return out


def fmt_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--paths", action="store_true", help="show where each file is")


def run(args) -> int:
    entries = list_models() + list_packs()
    if args.json:
        for e in entries:
            print(json.dumps(asdict(e)))
        return 0
    width = max(len(e.name) for e in entries)
    for section, kinds in (("models", ("demo", "hf")), ("packs", ("pack",))):
        rows = [e for e in entries if e.kind in kinds]
        print(f"{section}:" if rows else f"{section}: none")
        for e in rows:
            size = fmt_size(e.size) if e.size else "—"
            flag = "  STALE" if e.stale else ""
            print(f"  {e.name.ljust(width)}  {size:>10}  {e.note}{flag}")
            if args.paths:
                print(f"  {'':{width}}  {'':>10}  {e.path}")
    total = sum(e.size for e in entries)
    stale = [e for e in entries if e.stale]
    print(f"total {fmt_size(total)}" + (f"; {len(stale)} stale pack(s), {fmt_size(sum(e.size for e in stale))}"
                                        f": rapidmoe-chat rm --stale" if stale else ""))
    return 0
