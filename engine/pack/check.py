"""A pack's checksums: CRC-32 of every unit of its bytes, recorded by the
converter as it writes them and checked at load on a random sample, so a pack
damaged on disk (zeroed, truncated in place, overwritten) is caught before use.

Units, in file order: the header (without its magic, which is written last),
each expert's slice of every expert part (`blk.N.ffn_*_exps.{wq,wr,d4}`,
[E, rows, row bytes]: one unit per expert), and every other tensor in 4 MiB
chunks. The table is the pack's last tensor, `rapidmoe.pack.crc32` (I8 bytes,
little-endian u32 per unit), and covers everything before it.
"""
from __future__ import annotations

import os
import random
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

CHUNK = 4 << 20
CRC_TENSOR = "rapidmoe.pack.crc32"
EXPERT_PART_SUFFIXES = (".wq", ".wr", ".d4")
SAMPLE_UNITS = 32  # checked at each load, at random, besides the header and the last unit ...
SAMPLE_BYTES = 64 << 20  # ... or fewer, at least 8, when they would read more than this


def units(tensors: Iterable[tuple[str, tuple[int, ...], int, int]], header_len: int) -> list[tuple[int, int]]:
    """(name, ne, offset, nbytes) of a pack's tensors -> [(offset, length)] of its checksum units."""
    out = [(4, header_len - 4)]
    for name, ne, off, n in sorted(tensors, key=lambda t: t[2]):
        if name == CRC_TENSOR:
            continue
        if name.endswith(EXPERT_PART_SUFFIXES) and len(ne) == 3 and n % ne[2] == 0:
            step = n // ne[2]
        else:
            step = CHUNK
        out += [(off + a, min(step, n - a)) for a in range(0, n, step)]
    return out


def crc(data) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def check(path: Path, tensors, header_len: int, table: np.ndarray, sample: int | None = SAMPLE_UNITS,
          progress=None) -> str | None:
    """None when the sampled units (every unit when sample is None) match the
    table; else what is wrong, in a few words."""
    us = units(tensors, header_len)
    if len(table) != len(us):
        return f"checksum table has {len(table)} entries for {len(us)} units"
    if sample is None or sample + 2 >= len(us):
        pick = list(range(len(us)))
    else:  # the header, the tail (where a short write or a zeroed end shows) and a random sample
        pick, nbytes = {0, len(us) - 1}, 0
        for k in random.sample(range(1, len(us) - 1), sample):
            if len(pick) >= 10 and nbytes + us[k][1] > SAMPLE_BYTES:
                break
            pick.add(k)
            nbytes += us[k][1]
        pick = sorted(pick)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            for i, k in enumerate(pick):
                off, n = us[k]
                data = os.pread(fd, n, off)
                if len(data) != n or crc(data) != int(table[k]):
                    return f"checksum mismatch at byte {off} ({n} bytes)"
                if progress and (i % 64 == 0 or i == len(pick) - 1):
                    progress("verify", i + 1, len(pick))
        finally:
            os.close(fd)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return None
