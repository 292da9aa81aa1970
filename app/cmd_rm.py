"""`rapidmoe-chat rm NAME` removes a model (the built demo, a repo[:quant] from
the Hugging Face cache, or a pack) and then the packs its removal made stale;
`rm --stale` removes only stale packs. Asks first unless --yes."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ..engine.errors import UserError
from .cmd_list import Entry, fmt_size, list_models, list_packs, packs_dir, packs_of


def add_arguments(p) -> None:
    p.add_argument("name", nargs="?", help="a name from `rapidmoe-chat list` (demo, REPO[:QUANT], a pack)")
    p.add_argument("--stale", action="store_true", help="remove stale packs (source gone, unreadable, temp)")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def _match(name: str) -> list[Entry]:
    models = list_models()
    hits = [e for e in models + list_packs() if e.name == name and (e.kind != "demo" or e.size)]
    if hits:
        return hits
    # a repo without :QUANT means every quant of it; quants match case-insensitively
    low = name.lower()
    hits = [e for e in models if e.kind == "hf" and (e.name.lower() == low or e.name.lower().startswith(low + ":"))]
    if hits:
        return hits
    known = ", ".join(e.name for e in models if e.kind != "demo" or e.size) or "none"
    raise UserError(f"{name}: no such model or pack here (models: {known}; see `rapidmoe-chat list`)")


def _remove_hf_files(files: list[Path]) -> None:
    """Remove snapshot pointers and the blobs no other pointer of the repo uses,
    then empty snapshot / repo folders (the layout huggingface_hub keeps)."""
    for pointer in files:
        blob = pointer.resolve() if pointer.is_symlink() else None
        pointer.unlink(missing_ok=True)
        if blob is None:
            continue
        repo_dir = next((p for p in pointer.parents if p.name.startswith("models--")), None)
        still_used = repo_dir is not None and any(
            q.is_symlink() and q.resolve() == blob for q in (repo_dir / "snapshots").rglob("*"))
        if not still_used:
            blob.unlink(missing_ok=True)
        snap = pointer.parent
        while repo_dir is not None and snap != repo_dir / "snapshots" and not any(snap.iterdir()):
            snap.rmdir()
            snap = snap.parent
        if repo_dir is not None and not any((repo_dir / "snapshots").iterdir()):
            shutil.rmtree(repo_dir)


def _remove(e: Entry) -> None:
    if e.kind == "hf":
        from ..engine.hub.pull import list_cached  # deferred: loads huggingface_hub, httpx2

        for m in list_cached():
            if m.spec == e.name:
                _remove_hf_files(list(m.files))
    else:
        Path(e.path).unlink(missing_ok=True)
        if e.kind == "pack":  # drop empty per-model folders under packs/
            d = Path(e.path).parent
            while d != packs_dir() and d.is_dir() and not any(d.iterdir()):
                d.rmdir()
                d = d.parent


def _confirm(entries: list[Entry], yes: bool) -> bool:
    for e in entries:
        print(f"  {e.name}  {fmt_size(e.size)}  {e.note}".rstrip())
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UserError("not removing anything without confirmation: add --yes")
    answer = input(f"remove {len(entries)} item(s), {fmt_size(sum(e.size for e in entries))}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def run(args) -> int:
    if not args.name and not args.stale:
        raise UserError("name a model or pack to remove (see `rapidmoe-chat list`), or use --stale")
    doomed = _match(args.name) if args.name else []
    # a model's packs go with it (found now: their names derive from the source file)
    packs = [Entry("pack", q.relative_to(packs_dir()).as_posix(), q.stat().st_size, str(q), f"pack of {e.name}")
             for e in doomed if e.kind in ("demo", "hf") for q in packs_of(e.path)]
    doomed = packs + [e for e in doomed if e.path not in {p.path for p in packs}]
    if doomed:
        print("to remove:")
        if not _confirm(doomed, args.yes):
            print("nothing removed")
            return 1
    for e in doomed:
        _remove(e)
        print(f"removed {e.name} ({fmt_size(e.size)})")
    stale = [e for e in list_packs() if e.stale]
    if stale:
        print("stale packs:")
        if _confirm(stale, args.yes):
            for e in stale:
                _remove(e)
            print(f"removed {len(stale)} stale pack(s), {fmt_size(sum(e.size for e in stale))}")
    elif args.stale:
        print("no stale packs")
    return 0
