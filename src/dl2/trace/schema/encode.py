"""Encoders of every line of a trace file (format v2): the only code that writes them.

Each ``*_line`` function returns one line (a ``str`` ending in a newline), already in
its compact wire form: the values it takes are those :mod:`dl2.trace.schema.stream`
worked out (time deltas in µs, id back-references, interned stack and description
ids), which is what keeps a repeated op at a few bytes.  Lines are assembled with
f-strings rather than ``json.dumps``: about ten times faster on the recorder's hot path,
and safe because every string pasted in is an identifier dl2 chose (op, api, dtype and
reduce-op names, ``where``, ``how``), a number, or JSON-encoded here once (file and
group names; a caller on a hot path encodes them with :func:`json_str` once and caches
the result).

A :class:`StackTable` interns encoded stacks (the ids that ``s`` lines define).  The
op-specific fields of an op description (see :func:`desc_line`) are fragments from
the ``*_field(s)`` functions, in the order of :func:`op_fields`; they keep the names of
the typed :class:`~dl2.trace.schema.decode.OpRecord` fields.

Imports nothing but the standard library: the recorder runs it inside every rank.  The
lines are documented in :mod:`dl2.trace.schema`; :mod:`dl2.trace.schema.wire` reads them.
"""

from __future__ import annotations

import itertools
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


def json_str(text: str) -> str:
    """``text`` as a JSON string (quoted and escaped), to paste into a line."""
    return json.dumps(text)


def _ints(values: Any) -> str:
    """A list of ints (or of lists of ints) as compact JSON."""
    return json.dumps(values, separators=(",", ":"))


def _opt(value: int | None) -> int | str:
    return "null" if value is None else value


def json_int(value: int | None) -> str:
    """An optional int as JSON text."""
    return "null" if value is None else str(value)


def _trailing(*values: str) -> str:
    """Optional trailing array elements: ``,a,b`` without the trailing nulls."""
    end = len(values)
    while end and values[end - 1] == "null":
        end -= 1
    return "".join("," + value for value in values[:end])


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


class StackTable:
    """Encoded stacks by id, process-wide: id 0 is the empty stack (never defined).
    Threads intern without a lock: ids come from an atomic counter, and a stack two
    threads intern at once keeps the id published first."""

    def __init__(self) -> None:
        self._texts: dict[int, str] = {0: EMPTY_STACK}
        self._ids: dict[str, int] = {EMPTY_STACK: 0}
        self._next = itertools.count(1)

    def intern(self, text: str) -> int:
        """The id of an encoded stack (:func:`~dl2.trace.schema.encode.stack_json`)."""
        sid = self._ids.get(text)
        if sid is None:
            candidate = next(self._next)
            self._texts[candidate] = text  # before the id is published
            sid = self._ids.setdefault(text, candidate)
        return sid

    def text(self, sid: int) -> str:
        return self._texts.get(sid, EMPTY_STACK)


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
    segment: int = 0,
    retain: tuple[int, int] | None = None,
    follows: bool = False,
    follows_groups: bool = False,
    child_of: int | None = None,
    run_id: str | None = None,
    ppid: int | None = None,
) -> str:
    """The header line of a segment; ``emulate`` is ``(eager_bytes, fused_batches)``,
    ``retain`` is ``(segment_bytes, keep)``; ``follows``: P2P ops carry ``via`` (see
    :class:`~dl2.trace.schema.decode.Header`), ``follows_groups``: on subgroups
    too.  Optional fields left None (or False)
    are not written."""
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
        "segment": segment,
    }
    if torch is not None:
        record["torch"] = torch
    if backend is not None:
        record["backend"] = backend
    if argv is not None:
        record["argv"] = list(argv)
    if follows:
        record["follows"] = True
    if follows_groups:
        record["follows_groups"] = True
    if child_of is not None:
        record["child_of"] = child_of
    if run_id is not None:
        record["run_id"] = run_id
    if ppid is not None:
        record["ppid"] = ppid
    if emulate is not None:
        record["emulate"] = {"eager_bytes": emulate[0], "fused_batches": emulate[1]}
    if retain is not None:
        record["retain"] = {"segment_bytes": retain[0], "keep": retain[1]}
    return json.dumps(record, separators=(",", ":"), default=str) + "\n"


# -- the fields of an op description ------------------------------------------------------


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


def via_field(op_id: int) -> str:
    """A P2P op's peer was derived from the sender wildcard receive ``op_id`` returned."""
    return f',"via":{op_id}'


def splits_field(splits: Sequence[Sequence[int]]) -> str:
    return f',"splits":{_ints(splits)}'


def ranks_value(ranks: Sequence[int]) -> Any:
    """Ranks as a line writes them: an arithmetic progression of four or more (the
    world, a block, a strided group) as ``{"start", "stop", "step"}``, else a list (so
    that a group of every rank costs a few bytes, not one number per rank, in every
    rank's trace)."""
    n = len(ranks)
    if n >= 4:
        step = ranks[1] - ranks[0]
        if step > 0 and all(ranks[i + 1] - ranks[i] == step for i in range(n - 1)):
            return {"start": ranks[0], "stop": ranks[-1] + 1, "step": step}
    return list(ranks)


def ranks_json(ranks: Sequence[int]) -> str:
    """:func:`ranks_value` as JSON text."""
    return json.dumps(ranks_value(ranks), separators=(",", ":"))


def ranks_field(ranks: Sequence[int]) -> str:
    return f',"ranks":{ranks_json(ranks)}'


def timeout_field(seconds: float) -> str:
    """A timeout in seconds: short (``1800``, ``0.5``), yet exact (``{seconds:g}`` keeps
    6 digits); empty for a non-finite one, which JSON cannot hold."""
    if not math.isfinite(seconds):
        return ""
    text = f"{seconds:g}"
    if float(text) != seconds:
        text = repr(float(seconds))
    return f',"timeout":{text}'


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
    via: int | None = None,
) -> str:
    """An op's own fields in wire order; those left None are not written (a P2P op
    has both peer and tag, a wildcard recv's peer is null)."""
    p2p = peer_tag_fields(peer, tag or 0) if peer is not None or tag is not None else ""
    if via is not None:
        p2p += via_field(via)
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


# -- definitions: interned stacks and op descriptions ------------------------------------------


def stack_line(sid: int, stack: str) -> str:
    """``["s", sid, stack]``: stack ``sid`` of this segment is ``stack`` (encoded)."""
    return f'["s",{sid},{stack}]\n'


def desc_line(
    did: int,
    gid_json: str,
    op: str,
    api: str | None,
    fields: str,
    is_async: bool,
    tid: int,
    sid: int,
    eager: bool = False,
    deferred: bool = False,
) -> str:
    """``["d", did, {...}]``: op description ``did`` of this segment, the part of an op
    record that repeats (see :mod:`dl2.trace.schema`).  ``fields``: the op's own fields
    (:func:`op_fields`)."""
    api_json = "null" if api is None else f'"{api}"'
    flags = (',"eager":true' if eager else "") + (',"deferred":true' if deferred else "")
    return (
        f'["d",{did},{{"gid":{gid_json},"op":"{op}","api":{api_json}{fields},'
        f'"async":{_BOOL[is_async]}{flags},"tid":{tid},"stack":{sid}}}]\n'
    )


# -- records -----------------------------------------------------------------------------------


def op_line(dt: int, did: int, oid: str = "null", seq: str = "null", batch: str = "null") -> str:
    """``["o", dt, did, id?, seq?, batch?]``: an op entered (optional values are JSON
    text, ``null`` when implied)."""
    return f'["o",{dt},{did}{_trailing(oid, seq, batch)}]\n'


def issued_wait_line(
    dt: int, back: int = 0, wid: str = "null", tid: str = "null", sid: str = "null"
) -> str:
    """``["b", dt, back?, wid?, tid?, sid?]``: a blocking op was issued and its thread
    now waits on it."""
    return f'["b",{dt}{_trailing(str(back) if back else "null", wid, tid, sid)}]\n'


def ret_line(dt: int, back: int = 0, err: str | None = None, src: int | None = None) -> str:
    """``["r", dt, back?, src?, err?]``: op or wait ``last - back`` returned."""
    if err is None and src is None:
        return f'["r",{dt}]\n' if not back else f'["r",{dt},{back}]\n'
    err_json = "null" if err is None else json.dumps(err)
    return f'["r",{dt}{_trailing(str(back), str(_opt(src)), err_json)}]\n'


def wait_line(dt: int, back: int, sid: int, tid: str = "null", wid: str = "null") -> str:
    """``["w", dt, back, sid, tid?, id?]``: a thread waits on op ``last - back``."""
    if tid == "null" and wid == "null":
        return f'["w",{dt},{back},{sid}]\n'
    return f'["w",{dt},{back},{sid}{_trailing(tid, wid)}]\n'


def done_line(dt: int, back: int, src: int | None = None) -> str:
    """``["x", dt, back, src?]``: async op ``last - back`` was seen complete."""
    if src is None:
        return f'["x",{dt},{back}]\n'
    return f'["x",{dt},{back},{src}]\n'


def drop_line(dt: int, back: int) -> str:
    """``["p", dt, back]``: the work of async P2P op ``last - back`` was dropped."""
    return f'["p",{dt},{back}]\n'


def newgroup_line(
    dt: int, ranks: Sequence[int] | None, gid: str | None, sid: int, nid: str = "null"
) -> str:
    """``["g", dt, ranks, gid, sid, id?]``: a call of new_group."""
    gid_json = "null" if gid is None else json.dumps(gid)
    written = "null" if ranks is None else ranks_json(ranks)
    return f'["g",{dt},{written},{gid_json},{sid}{_trailing(nid)}]\n'


def nonmember_line(dt: int, api: str, sid: int) -> str:
    """``["n", dt, api, sid]``: ``api`` called on a group the rank is not in."""
    return f'["n",{dt},{json.dumps(api)},{sid}]\n'


def state_line(dt: int, pending: Sequence[int], where: str, sid: int) -> str:
    """``["q", dt, pending, where, sid]``: the watchdog's view of a quiet rank."""
    return f'["q",{dt},{_ints(list(pending))},"{where}",{sid}]\n'


def end_line(dt: int, how: str, err: str | None = None, sid: int = 0) -> str:
    """``["e", dt, how, err?, sid?]``: the rank shuts down cleanly ("exit" or "destroy");
    ``err``: the uncaught exception that ended its program, raised at stack ``sid``."""
    if err is None:
        return f'["e",{dt},"{how}"]\n'
    return f'["e",{dt},"{how}",{json.dumps(err)},{sid}]\n'


def thread_error_line(dt: int, tid: int, name: str, err: str, sid: int) -> str:
    """``["u", dt, tid, name, err, sid]``: a thread of the rank (``tid``, named ``name``)
    ended with an uncaught exception ``err`` ("Type: message") raised at stack ``sid``."""
    return f'["u",{dt},{tid},{json.dumps(name)},{json.dumps(err)},{sid}]\n'


def threads_line(dt: int, live: int) -> str:
    """``["h", dt, live]``: threads of the user's own code alive besides the main one."""
    return f'["h",{dt},{live}]\n'


def store_line(
    dt: int,
    sid: int,
    tid: int,
    op: str,
    store: str | None,
    prefix: str,
    keys: Sequence[str],
    block: bool,
    timeout: float | None = None,
    nid: str = "null",
) -> str:
    """``["t", dt, sid, tid, op, store, prefix, keys, block, timeout?, id?]``: a c10d
    Store call ``op`` on ``keys`` (``block``: it waits for them, and a ``ret``
    follows); ``store`` None: the store cannot be told."""
    store_json = "null" if store is None else json.dumps(store)
    keys_json = json.dumps([str(k) for k in keys], separators=(",", ":"))
    timeout_json = "null" if timeout is None else repr(float(timeout))
    return (
        f'["t",{dt},{sid},{tid},{json.dumps(op)},{store_json},{json.dumps(prefix)},'
        f"{keys_json},{_BOOL[block]}{_trailing(timeout_json, nid)}]\n"
    )


def checkpoint_line(us: int, body: dict[str, Any]) -> str:
    """``["c", us, {...}]``: a checkpoint at ``us`` µs after t0 (absolute, not a delta)."""
    return f'["c",{us},{json.dumps(body, separators=(",", ":"))}]\n'
