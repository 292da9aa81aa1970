"""`REPO[:QUANT]` specs and choosing one quant's GGUF file(s) from a repo's file list.

Pure functions (no network, no cache): the same selection runs on the Hub's
file list online and on the cached snapshot's file list offline.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

DEFAULT_QUANT = "Q4_K_M"

# ollama-style prefixes people paste: hf.co/org/name:quant, https://huggingface.co/org/name
_URL_PREFIX = re.compile(r"^(?:https?://)?(?:www\.)?(?:hf\.co|huggingface\.co)/", re.I)
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_QUANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$", re.I)
# A quant label at the end of a file stem (or as a folder name): Q4_K_M, IQ1_S,
# UD-Q4_K_XL, Q8_0, BF16, MXFP4_MOE, TQ1_0 ...
_LABEL = re.compile(
    r"(?:^|[-._])((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4(?:_MOE)?|BF16|F16|FP16|F32|FP32))$",
    re.I,
)


@dataclass(frozen=True)
class ModelRef:
    """One model's GGUF file(s): on the Hub (repo set) or on disk (repo None)."""

    repo: str | None  # "org/name"; None for a local path
    quant: str | None  # label as spelled in the file name, e.g. "Q4_K_M"
    files: tuple[str, ...]  # repo-relative paths (local: absolute paths), first part first
    sizes: tuple[int | None, ...] = ()  # bytes per file when known
    sha256: tuple[str | None, ...] = ()  # LFS sha256 per file when known
    revision: str | None = None  # commit sha the files belong to

    @property
    def is_local(self) -> bool:
        return self.repo is None

    @property
    def total_size(self) -> int | None:
        if not self.sizes or any(s is None for s in self.sizes):
            return None
        return sum(self.sizes)  # type: ignore[arg-type]

    @property
    def spec(self) -> str:
        if self.repo is None:
            return self.files[0]
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


@dataclass(frozen=True)
class GgufGroup:
    """The file(s) of one quant: a single .gguf, or every part of a split one."""

    label: str  # quant label ("" when the name carries none)
    files: tuple[str, ...]  # present files, part order
    missing: tuple[str, ...]  # absent parts of a split group (paths they would have)


def looks_local(spec: str) -> bool:
    """A path on disk rather than a Hub repo: exists, or is spelled like a path."""
    if spec.startswith(("/", "./", "../", "~", "\\")) or re.match(r"^[A-Za-z]:[\\/]", spec):
        return True
    if spec.lower().endswith(".gguf"):
        return True
    return Path(spec).exists() and not _REPO.match(spec.split(":", 1)[0])


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`org/name[:QUANT]` -> (repo, quant or None). Raises UserError when malformed."""
    s = _URL_PREFIX.sub("", spec.strip()).rstrip("/")
    repo, sep, quant = s.partition(":")
    if not _REPO.match(repo) or ".." in repo or (sep and not _QUANT.match(quant)):
        raise UserError(
            f"bad model spec {spec!r}: expected ORG/NAME[:QUANT] (e.g. unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M)"
            " or a path to a .gguf file"
        )
    return repo, (quant or None)


def quant_label(path: str) -> str:
    """The quant a .gguf path names, from its file stem, else its folder ("" if none)."""
    name = path.rsplit("/", 1)[-1]
    m = _SPLIT.match(name)
    stem = m.group("stem") if m else name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    for candidate in (stem, path.rsplit("/", 2)[-2] if "/" in path else ""):
        lm = _LABEL.search(candidate)
        if lm:
            return lm.group(1)
    return ""


def _is_model_gguf(path: str) -> bool:
    # Vision projectors ship next to the LLM weights but are not a chat model.
    base = path.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and not base.startswith("mmproj")


def group_ggufs(paths: list[str]) -> list[GgufGroup]:
    """Group .gguf paths into quants; split files `x-0000k-of-0000N.gguf` form one group."""
    singles: list[str] = []
    splits: dict[tuple[str, str, int], dict[int, str]] = {}
    for p in sorted(set(paths)):
        if not _is_model_gguf(p):
            continue
        folder, _, name = p.rpartition("/")
        m = _SPLIT.match(name)
        if m and 1 <= int(m.group("part")) <= int(m.group("total")):
            key = (folder, m.group("stem"), int(m.group("total")))
            splits.setdefault(key, {})[int(m.group("part"))] = p
        else:
            singles.append(p)
    groups = [GgufGroup(quant_label(p), (p,), ()) for p in singles]
    for (folder, stem, total), parts in splits.items():
        prefix = f"{folder}/" if folder else ""
        missing = tuple(
            f"{prefix}{stem}-{k:05d}-of-{total:05d}.gguf" for k in range(1, total + 1) if k not in parts
        )
        present = tuple(parts[k] for k in sorted(parts))
        groups.append(GgufGroup(quant_label(present[0]), present, missing))
    return sorted(groups, key=lambda g: (g.label.lower(), g.files))


def select_quant(repo: str, paths: list[str], quant: str | None, *, where: str = "") -> GgufGroup:
    """The one complete group matching `quant` (case-insensitive; default Q4_K_M).

    Without an explicit quant, a repo holding a single quant uses it. Raises
    UserError naming the quants that exist, or the split parts that are missing.
    """
    groups = group_ggufs(paths)
    if not groups:
        raise UserError(f"{repo}{where} has no .gguf files")
    wanted = (quant or DEFAULT_QUANT).lower()
    hits = [g for g in groups if g.label.lower() == wanted]
    if not hits:
        # `UD-Q4_K_XL` asked as `Q4_K_XL`; a file name without a standard label by its stem.
        hits = [g for g in groups if g.label.lower().endswith("-" + wanted)] or [
            g for g in groups if not g.label and wanted in g.files[0].lower()
        ]
        if len({g.label.lower() for g in hits}) > 1:
            hits = []
    if not hits and quant is None and len(groups) == 1:
        hits = groups
    if not hits:
        avail = ", ".join(sorted({g.label or g.files[0] for g in groups}, key=str.lower))
        asked = quant or f"{DEFAULT_QUANT} (the default)"
        raise UserError(f"{repo}{where} has no {asked} GGUF; available: {avail}")
    # Prefer a complete group when a quant exists both split and whole.
    group = next((g for g in hits if not g.missing), hits[0])
    if group.missing:
        total = len(group.files) + len(group.missing)
        raise UserError(
            f"{repo}{where}: {group.label or 'model'} is split in {total} parts but "
            f"{', '.join(group.missing)} {'is' if len(group.missing) == 1 else 'are'} missing"
        )
    return group
