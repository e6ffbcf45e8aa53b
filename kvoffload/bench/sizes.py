"""Byte sizes as the benchmarks' options take and print them."""

from __future__ import annotations

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"256K"``, ``"256KiB"`` -> 262144; plain integers are bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


def format_size(num_bytes: int) -> str:
    """262144 -> ``"256 KiB"``: the largest unit that divides it."""
    for unit in ("G", "M", "K"):
        if num_bytes % _UNITS[unit] == 0:
            return f"{num_bytes // _UNITS[unit]} {unit}iB"
    return f"{num_bytes} B"
