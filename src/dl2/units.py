"""Byte sizes as the command line reads and prints them (``64KiB``, ``4 MiB``).

Here rather than in the analysis so that every command can parse its options without
importing the analysis.
"""

from __future__ import annotations

import re

from dl2.errors import ConfigError

__all__ = ["format_size", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 1000,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 1000**2,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 1000**3,
}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes from ``"65536"``, ``"64KiB"``, ``"64k"``, ``"4MiB"``, ``"1MB"`` (10**6), ``"1,024"``.

    K, M and G without ``B`` are binary (1024-based), as for NCCL_BUFFSIZE values.

    Raises:
        ConfigError: not a size.
    """
    match = _SIZE.match(text.replace(",", "").replace("_", ""))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(f"not a byte size: {text!r} (try 0, 1024, 64KiB or 4MiB)")
    return int(match.group(1)) * _UNITS[unit]


def format_size(n: int) -> str:
    """``4 MiB``, ``64 KiB``, ``0 bytes``, ``1,048,577 bytes``."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} byte" + ("" if n == 1 else "s")
