"""Typed records: one msgspec struct per record kind, what the rest of dl2 reads.

The structs hold each record as the model knows it, whatever its wire form: the
reader (:mod:`dl2.trace.schema.reader`) undoes the interning and merging of format v2
and gives back these records, with stacks resolved into tuples of :class:`Frame`, ids
and seqs written out and times in ns (the fields are documented in
:mod:`dl2.trace.schema`).  A record of a kind this dl2 does not know reads as an
:class:`UnknownRecord`.  A line that cannot be read is corrupt: the reader raises
:class:`CorruptRecord`, which :mod:`dl2.trace.format` turns into a warning (mid-file) or
a truncation note (last line).

:func:`report_frame` is the one rule for the line a report names (:func:`caller_frame`
and :func:`package_frame` the lines around it that a report adds);
:func:`record_to_dict` gives a record as a JSON object (``dl2 dump``).

For the analysis side only: it imports msgspec, which the recorder never loads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from dl2.trace.schema import FORMAT_VERSION
from dl2.trace.schema import MAGIC


class CorruptRecord(ValueError):
    """A line that is not a valid record (or header); the message says why."""


# -- stacks ----------------------------------------------------------------------------


class Frame(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A user source location: ``[file, line, function]`` on the wire."""

    file: str
    line: int
    function: str = "?"


#: Python's own library (``/usr/lib/python3.11/contextlib.py``, a pyenv's or conda's
#: ``.../lib/python3.11/``, Windows' ``...\\Lib\\``): a ``with`` block's ``__exit__``
#: or a thread's ``run`` is not the user's line
_STDLIB = re.compile(r"[/\\]lib[/\\]python\d(?:\.\d+)?[/\\]|[/\\]Lib[/\\][^/\\]+\.py$")


#: file -> is_installed_file's answer (a report asks it of the same few files for every
#: rank's op, thousands of times in a large job)
_INSTALLED: dict[str, bool] = {}


def is_installed_file(file: str) -> bool:
    """A file of an installed package (site-packages) or of Python's own library, not
    of the user's own code."""
    known = _INSTALLED.get(file)
    if known is None:
        known = (
            "site-packages" in file or "dist-packages" in file or _STDLIB.search(file) is not None
        )
        if len(_INSTALLED) < 10_000:
            _INSTALLED[file] = known
    return known


def report_frame(stack: Sequence[Frame]) -> Frame | None:
    """The line a report names for a stack: the innermost frame of the user's own code,
    skipping installed packages (a collective issued inside transformers names the
    script line that called the model); the innermost frame when all are packages'."""
    for frame in stack:
        if not is_installed_file(frame.file):
            return frame
    return stack[0] if stack else None


def caller_frame(stack: Sequence[Frame]) -> Frame | None:
    """The program's line that led to the reported one when that is in another file (a
    helper module, a library of the user's own): the innermost frame in the file of the
    stack's outermost frame of user code; None when the reported line is in that file,
    or the stack does not reach it."""
    named = report_frame(stack)
    if named is None:
        return None
    # the outermost frame of a real file: not a launcher's code string ("<string>" of
    # multiprocessing's spawn, "<stdin>")
    entry = next(
        (f for f in reversed(stack) if not is_installed_file(f.file) and f.file[:1] != "<"),
        None,
    )
    if entry is None or entry.file == named.file:
        return None
    below = False
    for frame in stack:
        if below and frame.file == entry.file:
            return frame
        below = below or frame is named
    return None


def package_frame(stack: Sequence[Frame]) -> Frame | None:
    """The installed package's line that communicates when the reported line is the
    user's code that called into it (the innermost frame, when it is not the reported
    one); None otherwise."""
    if stack and is_installed_file(stack[0].file) and report_frame(stack) is not stack[0]:
        return stack[0]
    return None


# -- the header -------------------------------------------------------------------------


class Emulation(msgspec.Struct, frozen=True, gc=False):
    """The header's ``emulate``: the send semantics dl2 emulated on gloo."""

    eager_bytes: int = 0
    fused_batches: bool = False


class Retention(msgspec.Struct, frozen=True, gc=False):
    """The header's ``retain``: how the recorder bounded the trace."""

    segment_bytes: int = 0
    keep: int = 0  # segments kept; 0: all


class Header(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag_field="k", tag="header"):
    """Line 1 of a trace file (of each segment)."""

    magic: str
    format: int
    rank: int
    world_size: int
    dl2: str = ""
    pid: int = 0
    host: str = ""
    t0: int = 0
    wall: int = 0
    torch: str | None = None
    backend: str | None = None
    argv: tuple[str, ...] = ()
    emulate: Emulation | None = None
    segment: int = 0
    retain: Retention | None = None
    #: the recorder marks a P2P op whose peer came from a wildcard receive's returned
    #: sender (the op's ``via``): an op without one named its peer otherwise
    follows: bool = False
    #: so is one whose peer came from a wildcard's sender on a subgroup (which torch
    #: translates to a global rank: ``recv(src=None, group=g)``)
    follows_groups: bool = False
    #: the pid of the rank process this process descends from (a helper it started,
    #: say a checkpointing process with a group of its own), or None: a rank itself
    child_of: int | None = None
    #: the run it belongs to (``dl2 run`` gives each run an id): a file of another run
    #: found in a run directory is not taken for one of its ranks
    run_id: str | None = None
    #: the pid of the process that started this one (a traced parent makes it a helper)
    ppid: int = 0


_ANY = msgspec.json.Decoder()


#: a pair of UTF-16 surrogate escapes, or one alone
_SURROGATES = re.compile(
    rb"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})|\\u(d[89a-f][0-9a-f]{2})", re.I
)


def mend_surrogates(line: bytes) -> bytes | None:
    """The line with each lone surrogate escape (``\\udce9``) replaced by U+FFFD, or
    None if it has none.

    Python's ``json.dumps`` writes a string that holds an undecodable byte of a file
    name or an argument (``surrogateescape``) as a lone surrogate, which strict JSON
    decoders (msgspec) reject; such a line is read again mended, on the error path only.
    """
    if b"\\u" not in line:
        return None
    mended = _SURROGATES.sub(lambda m: m.group(0) if m.group(3) is None else rb"\ufffd", line)
    return mended if mended != line else None


def _generic(line: bytes) -> Any:
    """The line as plain JSON values, or None if it is not JSON."""
    try:
        return _ANY.decode(line)
    except (msgspec.DecodeError, RecursionError):
        mended = mend_surrogates(line)
        return None if mended is None else _generic(mended)


#: the largest world a header may give (a recorder writes its default group's size)
MAX_WORLD_SIZE = 1 << 22


def decode_header(line: bytes) -> Header:
    """The header of a trace file, checked: a dl2 trace of the version this dl2 reads.

    Raises:
        CorruptRecord: another kind of file, another format version, or a corrupt header.
    """
    raw = _generic(line)
    if not isinstance(raw, dict) or raw.get("magic") != MAGIC:
        raise CorruptRecord("not a dl2 trace file (no dl2 header on line 1)")
    version = raw.get("format")
    if version != FORMAT_VERSION:
        raise CorruptRecord(
            f"trace format version {version}, this dl2 reads version {FORMAT_VERSION}; "
            "analyse it with the dl2 version that recorded it"
        )
    rank, world = raw.get("rank"), raw.get("world_size")
    if not isinstance(rank, int) or not isinstance(world, int):
        raise CorruptRecord("header lacks rank or world_size")
    if not 0 < world <= MAX_WORLD_SIZE or not 0 <= rank < world:
        raise CorruptRecord(f"corrupt header (rank {rank} of a world of {world})")
    try:
        return msgspec.convert(raw, Header)
    except msgspec.ValidationError as err:
        raise CorruptRecord(f"corrupt header ({err})") from None


# -- records ----------------------------------------------------------------------------


class _Record(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag_field="k"):
    @property
    def kind(self) -> str:
        """The record's kind, its ``"k"``."""
        return str(type(self).__struct_config__.tag)


class OpRecord(_Record, tag="op", frozen=True):
    """A communication call, written before it is issued."""

    id: int
    t: int = 0
    tid: int = 0
    gid: str = "0"
    seq: int | None = None
    op: str = "?"
    api: str | None = None
    peer: int | None = None
    root: int | None = None
    tag: int | None = None
    redop: str | None = None
    dtype: str | None = None
    count: int | None = None
    splits: tuple[tuple[int, ...], ...] | None = None
    ranks: tuple[int, ...] | None = None
    timeout: float | None = None
    #: a P2P op whose peer the program derived from the sender wildcard receive ``via``
    #: returned (format 2.x, written since dl2 0.x: older traces never have it)
    via: int | None = None
    is_async: bool = msgspec.field(default=False, name="async")
    batch: int | None = None
    eager: bool = False
    deferred: bool = False
    stack: tuple[Frame, ...] = ()


class RetRecord(_Record, tag="ret", frozen=True):
    """An op or wait ``id`` returned (``err``: it raised; ``src``: a wildcard's sender)."""

    id: int
    t: int = 0
    err: str | None = None
    src: int | None = None


class WaitRecord(_Record, tag="wait", frozen=True):
    """Thread ``tid`` waits on op ``work``."""

    id: int
    t: int = 0
    tid: int = 0
    work: int = -1
    stack: tuple[Frame, ...] = ()


class DoneRecord(_Record, tag="done", frozen=True):
    """Async op ``id`` was seen complete."""

    id: int
    t: int = 0
    src: int | None = None


class DropRecord(_Record, tag="drop", frozen=True):
    """The work of async P2P op ``id`` was dropped before it completed, never waited."""

    id: int
    t: int = 0


class NewGroupRecord(_Record, tag="newgroup", frozen=True):
    """A call of new_group (``ranks`` None: all; ``gid`` None: not a member)."""

    id: int = 0
    t: int = 0
    ranks: tuple[int, ...] | None = None
    gid: str | None = None
    stack: tuple[Frame, ...] = ()


class NonMemberRecord(_Record, tag="nonmember", frozen=True):
    """A collective ``api`` called on a group the rank is not a member of."""

    t: int = 0
    api: str | None = None
    stack: tuple[Frame, ...] = ()


class StateRecord(_Record, tag="state", frozen=True):
    """The watchdog's view of a quiet rank."""

    t: int = 0
    pending: tuple[int, ...] = ()
    where: str | None = None
    stack: tuple[Frame, ...] = ()


class EndRecord(_Record, tag="end", frozen=True):
    """The rank shuts down cleanly ("exit" or "destroy").

    ``err``: the exception that ended the program (uncaught, "Type: message"), with the
    user's ``stack`` where it was raised, innermost first; None when the program ended
    without one.
    """

    t: int = 0
    how: str = "exit"
    err: str | None = None
    stack: tuple[Frame, ...] = ()


class ThreadErrorRecord(_Record, tag="thread_error", frozen=True):
    """A thread of the rank other than the main one ended with an uncaught exception
    (``err``: "Type: message"), raised at the user's ``stack``, innermost first: what
    it was to do (send, set a key, produce data) the rank never does."""

    t: int = 0
    tid: int = 0
    name: str = ""
    err: str = ""
    stack: tuple[Frame, ...] = ()


class ThreadsRecord(_Record, tag="threads", frozen=True):
    """How many threads running the user's own code the rank has besides the one that
    started the program, written when one starts or ends: while one is alive, a rank
    blocked in a call may still be released by what another of its threads does."""

    t: int = 0
    live: int = 0


class StoreRecord(_Record, tag="store", frozen=True):
    """A c10d Store call by user code or a library (``block``: it waits for its keys)."""

    id: int
    t: int = 0
    tid: int = 0
    op: str = "?"
    store: str | None = None
    prefix: str = ""
    keys: tuple[str, ...] = ()
    block: bool = False
    timeout: float | None = None
    stack: tuple[Frame, ...] = ()

    @property
    def namespace(self) -> str | None:
        """What a key is prefixed with to name it across ranks (the store and the
        prefixes in front of the keys), or None when the store cannot be told."""
        return None if self.store is None else f"{self.store}|{self.prefix}"


class CheckpointRecord(_Record, tag="checkpoint", frozen=True):
    """What a segment's reader needs of the records before it (the history rotated away).

    ``open`` are the ops entered and neither complete nor failed, as full records;
    ``issued`` those of them whose call returned; ``waits`` the waits entered and not
    returned; ``pending`` the async ops issued and not seen complete; ``dropped`` the
    ids among ``open`` whose work was dropped; ``stores`` the blocking store calls
    entered and not returned.
    """

    t: int = 0
    segment: int = 0
    next_id: int = 1  # ids below were issued in earlier segments
    ops_before: int = 0  # op records in earlier segments (program-order index base)
    collectives: dict[str, int] = msgspec.field(default_factory=dict)  # gid -> next seq
    channels: tuple[tuple[str, int, int, int, int], ...] = ()  # (gid, sender, receiver, tag, n)
    groups: dict[str, tuple[int, ...] | None] = msgspec.field(default_factory=dict)
    open: tuple[OpRecord, ...] = ()
    issued: tuple[int, ...] = ()
    waits: tuple[WaitRecord, ...] = ()
    pending: tuple[int, ...] = ()
    newgroups: tuple[NewGroupRecord, ...] = ()  # every new_group call so far
    dropped: tuple[int, ...] = ()
    stores: tuple[StoreRecord, ...] = ()


class UnknownRecord(msgspec.Struct, frozen=True, gc=False):
    """A record of a kind this dl2 does not know (written by a newer one): kept, unread."""

    kind: str


KnownRecord = (
    OpRecord
    | RetRecord
    | WaitRecord
    | DoneRecord
    | DropRecord
    | NewGroupRecord
    | NonMemberRecord
    | StateRecord
    | EndRecord
    | ThreadsRecord
    | ThreadErrorRecord
    | StoreRecord
    | CheckpointRecord
)
Record = KnownRecord | UnknownRecord


def record_to_dict(record: Record) -> dict[str, Any]:
    """A record as a JSON object, as version 1 wrote it: its kind as ``"k"``, optional
    fields that are null or false left out (an op's ``seq``, ``api`` and ``async``, a
    P2P op's ``peer`` and a new_group's ``ranks`` and ``gid`` are always there)."""
    if isinstance(record, UnknownRecord):
        return {"k": record.kind}
    raw: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(record))
    if isinstance(record, CheckpointRecord):
        for name in ("open", "waits", "newgroups", "stores"):
            raw[name] = [record_to_dict(r) for r in getattr(record, name)]
    kept: frozenset[str] = frozenset()
    if isinstance(record, OpRecord):
        kept = _OP_P2P_FIELDS if record.op in ("send", "recv") else _OP_FIELDS
    elif isinstance(record, NewGroupRecord):
        kept = _NEWGROUP_FIELDS
    elif isinstance(record, StoreRecord):
        kept = _STORE_FIELDS
    return {
        name: value
        for name, value in raw.items()
        if (value is not None and value is not False) or name in kept
    }


_OP_FIELDS = frozenset({"seq", "api", "async"})
_OP_P2P_FIELDS = _OP_FIELDS | {"peer"}
_NEWGROUP_FIELDS = frozenset({"ranks", "gid"})
_STORE_FIELDS = frozenset({"store", "block"})
