"""One way to print sizes: memory and file sizes in binary units (KiB, MiB, GiB,
TiB: what `free -h`, the kernel and nvidia-smi count), bandwidth in decimal GB/s
(what memory and disk makers quote). Budgets are typed in GiB (`--vram-budget`)."""
from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(n: float) -> str:
    """Bytes -> '512 B', '12.6 MiB', '5.27 GiB', '121 GiB' (three significant digits)."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            break
        n /= 1024
    if unit == "B":
        return f"{sign}{n:.0f} B"
    digits = 2 if n < 10 else 1 if n < 100 else 0
    return f"{sign}{n:.{digits}f} {unit}"

