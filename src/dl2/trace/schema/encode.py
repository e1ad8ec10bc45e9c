"""Encoders of every record kind: the only code that writes trace lines (format v1).

Each function returns one record as a JSON line (a ``str`` ending in a newline) or a
fragment of one.  Records are assembled with f-strings rather than ``json.dumps``: about
ten times faster on the recorder's hot path, and safe because every string pasted in is
an identifier dl2 chose (op, api, dtype and reduce-op names, ``where``, ``how``), a
number, or JSON-encoded here once (file and group names; a caller on a hot path encodes
them with :func:`json_str` once and caches the result, as it does stacks).

Stacks come encoded: :func:`frame_json` encodes one frame, :func:`stack_json` a list of
encoded frames.  The op-specific fields of an ``op`` record (see :func:`op_line`) are
fragments from the ``*_field(s)`` functions, in the order of :func:`op_fields`.

Imports nothing but the standard library: the recorder runs it inside every rank.  The
fields are documented in :mod:`dl2.trace.schema`; :mod:`dl2.trace.schema.decode` reads
them back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

from dl2.trace.schema import FORMAT_VERSION
from dl2.trace.schema import MAGIC

_BOOL = ("false", "true")

#: An encoded stack with no frame.
EMPTY_STACK = "[]"
#: The op field of an eager send (see dl2.record.emulate).
EAGER_FIELD = ',"eager":true'
#: The op field of a deferred op of a fused batch (see dl2.record.emulate).
DEFERRED_FIELD = ',"deferred":true'


def json_str(text: str) -> str:
    """``text`` as a JSON string (quoted and escaped), to paste into a record."""
    return json.dumps(text)


def _ints(values: Any) -> str:
    """A list of ints (or of lists of ints) as compact JSON."""
    return json.dumps(values, separators=(",", ":"))


def _opt(value: int | None) -> int | str:
    return "null" if value is None else value


# -- stacks ----------------------------------------------------------------------------


def frame_json(file: str, line: int, function: str) -> str:
    """One stack frame, ``[file, line, function]``."""
    return f"[{json.dumps(file)},{line},{json.dumps(function)}]"


def stack_json(frames: Iterable[str]) -> str:
    """A stack from frames encoded by :func:`frame_json`, innermost first."""
    return "[" + ",".join(frames) + "]"


def stack_of(frames: Iterable[tuple[str, int, str]]) -> str:
    """A stack from ``(file, line, function)`` triples, innermost first."""
    return stack_json(frame_json(*frame) for frame in frames)


# -- the header -------------------------------------------------------------------------


def header_line(
    *,
    rank: int,
    world_size: int,
    pid: int,
    host: str,
    t0: int,
    wall: int,
    dl2: str,
    torch: str | None = None,
    backend: str | None = None,
    argv: Sequence[str] | None = None,
    emulate: tuple[int, bool] | None = None,
) -> str:
    """The header line; ``emulate`` is ``(eager_bytes, fused_batches)``.  Optional
    fields left None are not written."""
    record: dict[str, Any] = {
        "k": "header",
        "magic": MAGIC,
        "format": FORMAT_VERSION,
        "dl2": dl2,
        "rank": rank,
        "world_size": world_size,
        "pid": pid,
        "host": host,
        "t0": t0,
        "wall": wall,
    }
    if torch is not None:
        record["torch"] = torch
    if backend is not None:
        record["backend"] = backend
    if argv is not None:
        record["argv"] = list(argv)
    if emulate is not None:
        record["emulate"] = {"eager_bytes": emulate[0], "fused_batches": emulate[1]}
    return json.dumps(record, separators=(",", ":"), default=str) + "\n"


# -- op records -------------------------------------------------------------------------


def op_line(
    oid: int,
    t: int,
    tid: int,
    gid_json: str,
    seq: int | None,
    op: str,
    api: str | None,
    fields: str,
    is_async: bool,
    stack: str,
    after: str = "",
) -> str:
    """An ``op`` record.

    Args:
        gid_json: the group name, encoded by :func:`json_str`.
        api: the API function's name (an identifier), or None.
        fields: the op's own fields before ``async`` (peer and tag, root, redop, dtype
            and count, splits, ranks, timeout: see :func:`op_fields`).
        after: the fields after ``async`` (batch, eager, deferred).
        stack: the encoded stack.
    """
    api_json = "null" if api is None else f'"{api}"'
    return (
        f'{{"k":"op","id":{oid},"t":{t},"tid":{tid},"gid":{gid_json},'
        f'"seq":{"null" if seq is None else seq},"op":"{op}","api":{api_json}{fields},'
        f'"async":{_BOOL[is_async]}{after},"stack":{stack}}}\n'
    )


def tensor_fields(dtype: str, count: int) -> str:
    """An op's input dtype and element count."""
    return f',"dtype":"{dtype}","count":{count}'


def reduce_fields(redop: str, dtype: str, count: int) -> str:
    """:func:`redop_field` plus :func:`tensor_fields` (the hot path of all_reduce)."""
    return f',"redop":"{redop}","dtype":"{dtype}","count":{count}'


def dtype_field(dtype: str) -> str:
    return f',"dtype":"{dtype}"'


def count_field(count: int) -> str:
    return f',"count":{count}'


def redop_field(redop: str) -> str:
    return f',"redop":"{redop}"'


def root_field(root: int | None) -> str:
    """The root's global rank (None: unknown)."""
    return f',"root":{_opt(root)}'


def peer_tag_fields(peer: int | None, tag: int) -> str:
    """A P2P op's peer (None: any source) and tag."""
    return f',"peer":{_opt(peer)},"tag":{tag}'


def splits_field(splits: Sequence[Sequence[int]]) -> str:
    return f',"splits":{_ints(splits)}'


def ranks_field(ranks: Sequence[int]) -> str:
    return f',"ranks":{_ints(ranks)}'


def timeout_field(seconds: float) -> str:
    """A timeout in seconds: short (``1800``, ``0.5``), yet exact (``{seconds:g}`` keeps
    6 digits); empty for a non-finite one, which JSON cannot hold."""
    if not math.isfinite(seconds):
        return ""
    text = f"{seconds:g}"
    if float(text) != seconds:
        text = repr(float(seconds))
    return f',"timeout":{text}'


def batch_field(batch: int) -> str:
    return f',"batch":{batch}'


def op_fields(
    *,
    peer: int | None = None,
    tag: int | None = None,
    root: int | None = None,
    redop: str | None = None,
    dtype: str | None = None,
    count: int | None = None,
    splits: Sequence[Sequence[int]] | None = None,
    ranks: Sequence[int] | None = None,
    timeout: float | None = None,
) -> str:
    """An op's own fields in wire order; those left None are not written (a P2P op
    has both peer and tag, a wildcard recv's peer is null)."""
    p2p = peer_tag_fields(peer, tag or 0) if peer is not None or tag is not None else ""
    fields: tuple[tuple[Any, Callable[[Any], str]], ...] = (
        (root, root_field),
        (redop, redop_field),
        (dtype, dtype_field),
        (count, count_field),
        (splits, splits_field),
        (ranks, ranks_field),
        (timeout, timeout_field),
    )
    return p2p + "".join(encoder(value) for value, encoder in fields if value is not None)


def after_fields(batch: int | None = None, eager: bool = False, deferred: bool = False) -> str:
    """An op's fields after ``async`` in wire order (None / False: not written)."""
    return (
        (batch_field(batch) if batch is not None else "")
        + (EAGER_FIELD if eager else "")
        + (DEFERRED_FIELD if deferred else "")
    )


# -- the other records -------------------------------------------------------------------


def ret_line(oid: int, t: int, err: str | None = None, src: int | None = None) -> str:
    """A ``ret`` record: ``err`` if the call raised, else ``src`` for a wildcard recv."""
    if err is not None:
        return f'{{"k":"ret","id":{oid},"t":{t},"err":{json.dumps(err)}}}\n'
    if src is not None:
        return f'{{"k":"ret","id":{oid},"t":{t},"src":{src}}}\n'
    return f'{{"k":"ret","id":{oid},"t":{t}}}\n'


def wait_line(wid: int, t: int, tid: int, work: int, stack: str) -> str:
    """A ``wait`` record: thread ``tid`` waits on op ``work``."""
    return f'{{"k":"wait","id":{wid},"t":{t},"tid":{tid},"work":{work},"stack":{stack}}}\n'


def issued_then_wait_lines(oid: int, wid: int, t: int, tid: int, stack: str) -> str:
    """:func:`ret_line` of op ``oid`` plus :func:`wait_line` of wait ``wid`` on it, at
    the same ``t``: a blocking call waits on its work as soon as it is issued (the
    recorder's hot path, one f-string)."""
    return (
        f'{{"k":"ret","id":{oid},"t":{t}}}\n'
        f'{{"k":"wait","id":{wid},"t":{t},"tid":{tid},"work":{oid},"stack":{stack}}}\n'
    )


def done_line(oid: int, t: int, src: int | None = None) -> str:
    """A ``done`` record: async op ``oid`` was seen complete."""
    if src is not None:
        return f'{{"k":"done","id":{oid},"t":{t},"src":{src}}}\n'
    return f'{{"k":"done","id":{oid},"t":{t}}}\n'


def drop_line(oid: int, t: int) -> str:
    """A ``drop`` record: the work of async P2P op ``oid`` was dropped, never waited."""
    return f'{{"k":"drop","id":{oid},"t":{t}}}\n'


def newgroup_line(
    nid: int, t: int, ranks: Sequence[int] | None, gid: str | None, stack: str
) -> str:
    """A ``newgroup`` record (``ranks`` None: all; ``gid`` None: the caller is not a
    member)."""
    gid_json = "null" if gid is None else json.dumps(gid)
    return (
        f'{{"k":"newgroup","id":{nid},"t":{t},"ranks":{_ints(ranks)},"gid":{gid_json},'
        f'"stack":{stack}}}\n'
    )


def nonmember_line(t: int, api: str, stack: str) -> str:
    """A ``nonmember`` record: ``api`` called on a group the rank is not in."""
    return f'{{"k":"nonmember","t":{t},"api":{json.dumps(api)},"stack":{stack}}}\n'


def state_line(t: int, pending: Sequence[int], where: str, stack: str) -> str:
    """A watchdog ``state`` record."""
    return (
        f'{{"k":"state","t":{t},"pending":{_ints(list(pending))},"where":"{where}",'
        f'"stack":{stack}}}\n'
    )


def end_line(t: int, how: str) -> str:
    """An ``end`` record: "exit" or "destroy"."""
    return f'{{"k":"end","t":{t},"how":"{how}"}}\n'


def store_line(
    sid: int,
    t: int,
    tid: int,
    op: str,
    store: str | None,
    prefix: str,
    keys: Sequence[str],
    block: bool,
    stack: str,
    timeout: float | None = None,
) -> str:
    """A ``store`` record: a c10d Store call ``op`` on ``keys`` (``block``: it waits for
    them, and a ``ret`` follows); ``store`` None: the store cannot be told."""
    store_json = "null" if store is None else json.dumps(store)
    keys_json = json.dumps([str(k) for k in keys], separators=(",", ":"))
    after = timeout_field(timeout) if timeout is not None else ""
    return (
        f'{{"k":"store","id":{sid},"t":{t},"tid":{tid},"op":"{op}","store":{store_json},'
        f'"prefix":{json.dumps(prefix)},"keys":{keys_json},"block":{_BOOL[block]}{after},'
        f'"stack":{stack}}}\n'
    )
