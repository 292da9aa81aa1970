"""`rapidmoe-chat list`: the models on this machine (the demo, GGUFs in the
Hugging Face cache) and the RESplit packs converted from them, with sizes.

Packs are GGUF files in <cache>/packs (engine/pack/convert.py). A pack is stale when it
cannot be used any more: unreadable, an older pack format, its recorded source
path gone or changed, or a `.partial` left without its resume record. `rm`
of a model also removes the packs made from it (their names are keyed by the
source's content). `rm --stale` removes stale packs.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine.paths import cache_dir
from ..engine.units import fmt_bytes

fmt_size = fmt_bytes  # the name `rm` imports

PACK_SOURCE_KEY = "rapidmoe.pack.source_path"  # absolute path of the source GGUF, when recorded


@dataclass
class Entry:
    kind: str  # "demo" | "hf" | "pack"
    name: str  # what `rm` and `-m` accept
    size: int
    path: str
    note: str = ""
    stale: bool = False
    shared_with: str = ""  # another entry whose file(s) these are: counted once in totals


def packs_dir() -> Path:
    return cache_dir() / "packs"


def _sources() -> dict[str, str]:
    """pack file name -> model name, for every model here that has a pack name."""
    try:
        from ..engine.pack.convert import pack_path  # deferred: loads the compiled kernels, gguf
    except ImportError:
        return {}
    out = {}
    for m in list_models():
        if m.kind in ("demo", "hf") and m.size and m.path:
            try:
                out[pack_path(Path(m.path)).name] = m.name
            except Exception:  # an unreadable model: it has no pack of ours either
                continue
    return out


def _pack_state(p: Path, sources: dict[str, str]) -> tuple[str, bool]:
    """(note, stale) of a finished pack."""
    from ..engine.gguf.reader import GGUFFile  # deferred: loads gguf, numpy

    try:
        from ..engine.pack.convert import PACK_VERSION  # deferred: loads the compiled kernels, gguf
    except ImportError:
        PACK_VERSION = None
    try:
        g = GGUFFile(p)
        meta = dict(g.metadata)
        getattr(g, "close", lambda: None)()
    except Exception as e:  # any damage makes it unusable: the loader would refuse it too
        return f"unreadable ({type(e).__name__})", True
    version = meta.get("rapidmoe.pack.version")
    if PACK_VERSION is not None and version != PACK_VERSION:
        return f"pack format {version}, this version reads {PACK_VERSION}", True
    if p.name in sources:  # packs are keyed by content: a model here may be a copy of the recorded source
        return f"from {sources[p.name]}", False
    src = meta.get(PACK_SOURCE_KEY)
    if src:
        sp = Path(str(src))
        if not sp.exists():
            return f"source gone: {src}", True
    return f"from {meta.get('rapidmoe.pack.source_name', '?')}" + ("" if src else " (a local file?)"), False


def list_packs() -> list[Entry]:
    root = packs_dir()
    if not root.is_dir():
        return []
    sources = _sources()
    out = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.suffix in (".lock", ".done-layers"):
            continue
        size = p.stat().st_size
        name = p.relative_to(root).as_posix()
        if p.suffix == ".partial":
            resumable = p.with_name(p.name[: -len(".partial")] + ".done-layers").exists()
            out.append(Entry("pack", name, size, str(p), "interrupted convert" +
                             (" (resumes on next load)" if resumable else ""), not resumable))
        elif p.name.startswith(".") or p.suffix == ".tmp":
            out.append(Entry("pack", name, size, str(p), "temp file", True))
        else:
            note, stale = _pack_state(p, sources)
            out.append(Entry("pack", name, size, str(p), note, stale))
    return out


def packs_of(model_path: str) -> list[Path]:
    """The pack files (finished or partial) made from this model file."""
    try:
        from ..engine.pack.convert import pack_path  # deferred: loads the compiled kernels, gguf

        pp = pack_path(Path(model_path))
    except Exception:
        return []
    return [q for q in (pp, pp.with_name(pp.name + ".partial"), pp.with_name(pp.name + ".done-layers"))
            if q.exists()]


def list_models() -> list[Entry]:
    from ..engine.hub.demo import DEMO_NAME, demo_cache_path  # deferred: loads gguf, numpy

    out = []
    demo = demo_cache_path()
    if demo.is_file():
        out.append(Entry("demo", "demo", demo.stat().st_size, str(demo), DEMO_NAME))
    else:
        out.append(Entry("demo", "demo", 0, str(demo), "built on first use"))
    try:
        from ..engine.hub.pull import list_cached  # deferred: loads huggingface_hub, httpx2
    except ImportError:
        list_cached = None
    cached = list_cached() if list_cached else []
    owner: dict[tuple, str] = {}  # blob (device, inode) -> the first model listed with it
    for m in cached:
        notes = [] if m.complete else [f"incomplete: {len(m.missing)} split part(s) missing"]
        label = m.spec
        if sum(c.spec == m.spec for c in cached) > 1:  # the same quant at several revisions
            notes.append(f"revision {m.revision[:8]}")
            label += f" ({notes[-1]})"
        blobs = [_blob_id(f) for f in m.files]
        shared = {owner.get(b) for b in blobs}
        shared_with = shared.pop() if len(shared) == 1 and None not in shared else ""
        if shared_with:
            notes.append(f"same file as {shared_with}")
        for b in blobs:
            owner.setdefault(b, label)
        out.append(Entry("hf", m.spec, m.size, str(m.files[0]) if m.files else "", "; ".join(notes),
                         shared_with=shared_with))
    return out


def _blob_id(p: Path) -> tuple:
    try:
        st = p.stat()  # follows the snapshot's symlink to its blob
    except OSError:  # gone since the scan: its own entry
        return ("unreadable", str(p))
    return st.st_dev, st.st_ino


def total_bytes(entries: list[Entry]) -> int:
    """Bytes on disk: a blob listed under two names counts once."""
    return sum(e.size for e in entries if not e.shared_with)


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
            size = fmt_bytes(e.size) if e.size else "—"
            flag = "  STALE" if e.stale else ""
            print(f"  {e.name.ljust(width)}  {size:>10}  {e.note}{flag}")
            if args.paths:
                print(f"  {'':{width}}  {'':>10}  {e.path}")
    total = total_bytes(entries)
    stale = [e for e in entries if e.stale]
    print(f"total {fmt_bytes(total)}" + (f"; {len(stale)} stale pack(s), {fmt_bytes(sum(e.size for e in stale))}"
                                        f": rapidmoe-chat rm --stale" if stale else ""))
    return 0
