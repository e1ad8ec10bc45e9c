"""Loading a Flight Recorder dump without trusting it.

Dumps come from other machines.  A pickle is read by an unpickler that refuses every
class and every persistent id, so nothing but plain containers and scalars (dict,
list, tuple, str, bytes, int, float, bool, None) can come out of it and no code runs;
a JSON dump is read by the standard parser.  Files past :data:`MAX_DUMP_BYTES` are
refused before they are read.  Any failure is a :class:`FlightDumpError`, one line.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

from dl2.errors import TraceFormatError

#: the largest dump read (a full 2,000-entry ring buffer with frames is a few MiB)
MAX_DUMP_BYTES = 256 * 1024 * 1024
#: the deepest nesting accepted (a dump nests five levels)
MAX_DEPTH = 32
#: values visited when a loaded dump is checked (shared references count each time)
MAX_NODES = 5_000_000

PICKLE = "pickle"
JSON = "json"


class FlightDumpError(TraceFormatError):
    """A file that is not a Flight Recorder dump this dl2 can read safely."""


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that admits no class, function or persistent object."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to load {module}.{name} (only plain values)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses persistent ids (only plain values)")


def sniff(head: bytes) -> str | None:
    """The dump form its first bytes suggest: PICKLE, JSON or None (neither)."""
    if head[:1] == b"\x80":  # PROTO opcode: pickle protocol 2 and later
        return PICKLE
    if head.lstrip()[:1] == b"{":
        return JSON
    return None


def read_bytes(path: Path, limit: int = MAX_DUMP_BYTES) -> bytes:
    """The file's bytes, refused past ``limit``."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise FlightDumpError(f"{path}: {size:,} bytes, more than a dump holds ({limit:,})")
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise FlightDumpError(f"{path}: unreadable: {err.strerror or err}") from None
    if len(data) > limit:
        raise FlightDumpError(f"{path}: more than {limit:,} bytes")
    return data


def loads(data: bytes, form: str, name: str = "dump") -> Any:
    """Decode a dump's bytes as ``form`` (PICKLE or JSON) into plain values.

    Raises:
        FlightDumpError: a class or persistent id in a pickle, corrupt data, or values
            nested past :data:`MAX_DEPTH`.
    """
    try:
        if form == PICKLE:
            value = _PlainUnpickler(io.BytesIO(data)).load()
        else:
            value = json.loads(data.decode("utf-8"))
    except pickle.UnpicklingError as err:
        raise FlightDumpError(f"{name}: not a plain pickle: {_first_line(err)}") from None
    except RecursionError:
        raise FlightDumpError(f"{name}: nested too deeply") from None
    except MemoryError:
        raise FlightDumpError(f"{name}: too large to decode") from None
    except Exception as err:  # hostile or corrupt input: any decoder error is one line
        raise FlightDumpError(
            f"{name}: corrupt {form} ({type(err).__name__}: {_first_line(err)})"
        ) from None
    check_plain(value, name)
    return value


#: the scalar types a plain dump holds (exact types: neither pickle without classes nor
#: JSON makes subclasses)
_SCALARS = frozenset({type(None), bool, int, float, str, bytes})


def check_plain(value: Any, name: str = "dump") -> None:
    """Check that ``value`` holds only plain values, nested at most MAX_DEPTH deep.

    Walked level by level with exact-type lookups: a dump holds tens of values per
    entry, and this is the loader's own cost per value.

    Raises:
        FlightDumpError: another type, or too deep or too large a structure.
    """
    level: list[Any] = [value]
    depth = 0
    visited = 0
    scalars = _SCALARS
    while level:
        visited += len(level)
        if visited > MAX_NODES:
            raise FlightDumpError(f"{name}: too many values")
        deeper: list[Any] = []
        for item in level:
            kind = type(item)
            if kind in scalars:
                continue
            if depth >= MAX_DEPTH:
                raise FlightDumpError(f"{name}: nested more than {MAX_DEPTH} levels")
            if kind is dict:
                deeper.extend(item)
                deeper.extend(item.values())
            elif kind is list or kind is tuple:
                deeper.extend(item)
            else:
                raise FlightDumpError(f"{name}: holds a {kind.__name__}, not a plain value")
        level = deeper
        depth += 1


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else "no detail"
