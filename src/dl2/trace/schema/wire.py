"""Format v2's lines as written: msgspec structs, decoded many lines per call.

Every line after the header is a JSON array whose first element names its kind (see
:mod:`dl2.trace.schema`); each kind is an array-like struct here, tagged by that first
element, with its optional trailing elements defaulted.  Elements past those this dl2
knows are ignored, and a line of a kind it does not know decodes as an
:class:`~dl2.trace.schema.decode.UnknownRecord`.  These structs are not records yet:
:mod:`dl2.trace.schema.reader` resolves them (ids, seqs, times, stacks) into the typed
records of :mod:`dl2.trace.schema.decode`.

For the analysis side only (msgspec).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from dl2.trace.schema.decode import CorruptRecord
from dl2.trace.schema.decode import Frame
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import UnknownRecord
from dl2.trace.schema.decode import mend_surrogates

#: The fields of an ``op`` record that an op description (a ``d`` line) holds: all but
#: those that change from op to op, and the stack, which the description names by id.
DESC_FIELDS = tuple(
    f
    for f in msgspec.structs.fields(OpRecord)
    if f.name not in ("id", "t", "seq", "batch", "stack")
)


class RankRange(msgspec.Struct, frozen=True, gc=False):
    """Ranks ``start, start + step, ...`` below ``stop``: a group's ranks written short
    (the world, a tensor-parallel block, a strided data-parallel group)."""

    start: int
    stop: int
    step: int = 1


#: ranks as a line may write them: a list, a range, or null (all)
Ranks = tuple[int, ...] | RankRange | None

#: The object of a ``d`` line: :data:`DESC_FIELDS` plus ``stack`` (a stack id).
OpDesc = msgspec.defstruct(
    "OpDesc",
    [
        *(
            (
                f.name,
                Ranks if f.name == "ranks" else f.type,
                msgspec.field(default=f.default, name=f.encode_name),
            )
            for f in DESC_FIELDS
        ),
        ("stack", int, 0),
    ],
    kw_only=True,
    frozen=True,
    gc=False,
)


class _Line(msgspec.Struct, array_like=True, frozen=True, gc=False):
    pass


class StackDef(_Line, tag="s", frozen=True):
    sid: int
    frames: tuple[Frame, ...]


class DescDef(_Line, tag="d", frozen=True):
    did: int
    desc: OpDesc  # type: ignore[valid-type]


class OpLine(_Line, tag="o", frozen=True):
    dt: int
    did: int
    id: int | None = None
    seq: int | None = None
    batch: int | None = None


class IssuedWaitLine(_Line, tag="b", frozen=True):
    dt: int
    back: int | None = None
    wid: int | None = None
    tid: int | None = None
    sid: int | None = None


class IssuedDoneLine(_Line, tag="k", frozen=True):
    dt: int
    dt_ret: int


class RetLine(_Line, tag="r", frozen=True):
    dt: int
    back: int | None = None
    src: int | None = None
    err: str | None = None


class WaitLine(_Line, tag="w", frozen=True):
    dt: int
    back: int
    sid: int
    tid: int | None = None
    id: int | None = None


class DoneLine(_Line, tag="x", frozen=True):
    dt: int
    back: int
    src: int | None = None


class NewGroupLine(_Line, tag="g", frozen=True):
    dt: int
    ranks: Ranks
    gid: str | None
    sid: int
    id: int | None = None


class NonMemberLine(_Line, tag="n", frozen=True):
    dt: int
    api: str | None
    sid: int


class StateLine(_Line, tag="q", frozen=True):
    dt: int
    pending: tuple[int, ...]
    where: str | None
    sid: int


class EndLine(_Line, tag="e", frozen=True):
    dt: int
    how: str
    err: str | None = None
    sid: int = 0


class ThreadsLine(_Line, tag="h", frozen=True):
    dt: int
    live: int


class ThreadErrorLine(_Line, tag="u", frozen=True):
    dt: int
    tid: int
    name: str
    err: str
    sid: int


class DropLine(_Line, tag="p", frozen=True):
    dt: int
    back: int


class StoreLine(_Line, tag="t", frozen=True):
    dt: int
    sid: int
    tid: int
    op: str
    store: str | None
    prefix: str
    keys: tuple[str, ...]
    block: bool
    timeout: float | None = None
    id: int | None = None


class CheckpointBody(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A ``c`` line's object; ops, waits and new_group calls in compact form."""

    segment: int = 0
    next_id: int = 1
    ops_before: int = 0
    collectives: dict[str, int] = msgspec.field(default_factory=dict)
    channels: tuple[tuple[str, int, int, int, int], ...] = ()
    groups: dict[str, Ranks] = msgspec.field(default_factory=dict)
    open: tuple[tuple[int, int, int, int | None, int | None], ...] = ()  # id, us, did, seq, batch
    issued: tuple[int, ...] = ()
    waits: tuple[tuple[int, int, int, int, int], ...] = ()  # id, us, tid, work, sid
    pending: tuple[int, ...] = ()
    newgroups: tuple[tuple[int, int, Ranks, str | None, int], ...] = ()
    dropped: tuple[int, ...] = ()
    stores: tuple[
        tuple[int, int, int, str, str | None, str, tuple[str, ...], float | None, int], ...
    ] = ()


class CheckpointLine(_Line, tag="c", frozen=True):
    us: int
    body: CheckpointBody


Line = (
    StackDef
    | DescDef
    | OpLine
    | IssuedWaitLine
    | IssuedDoneLine
    | RetLine
    | WaitLine
    | DoneLine
    | NewGroupLine
    | NonMemberLine
    | StateLine
    | EndLine
    | ThreadsLine
    | ThreadErrorLine
    | DropLine
    | StoreLine
    | CheckpointLine
)
#: The kinds of line after the header, as their first element names them.
LINE_KINDS = frozenset(
    str(cls.__struct_config__.tag)
    for cls in (
        StackDef,
        DescDef,
        OpLine,
        IssuedWaitLine,
        IssuedDoneLine,
        RetLine,
        WaitLine,
        DoneLine,
        NewGroupLine,
        NonMemberLine,
        StateLine,
        EndLine,
        ThreadsLine,
        ThreadErrorLine,
        DropLine,
        StoreLine,
        CheckpointLine,
    )
)

_LINE = msgspec.json.Decoder(Line)
_LINES = msgspec.json.Decoder(list[Line])
_ANY = msgspec.json.Decoder()


def decode_line(line: bytes) -> Line | UnknownRecord:
    """One line (without its newline).

    Raises:
        CorruptRecord: not a JSON array naming a kind, or a line of a known kind whose
            elements have the wrong types.
    """
    try:
        return _LINE.decode(line)
    except msgspec.ValidationError as err:
        try:
            raw: Any = _ANY.decode(line)
        except (msgspec.DecodeError, RecursionError):
            raw = None
        if isinstance(raw, list) and raw and isinstance(raw[0], str) and raw[0] not in LINE_KINDS:
            return UnknownRecord(raw[0])
        raise CorruptRecord(str(err)) from None
    except (msgspec.DecodeError, RecursionError) as err:
        mended = mend_surrogates(line)
        if mended is not None:
            return decode_line(mended)
        raise CorruptRecord(str(err)) from None


def decode_lines(lines: Sequence[bytes]) -> list[Line | UnknownRecord | CorruptRecord]:
    """Many lines: in one decoder call when they are all well formed (the usual case),
    else line by line, a line that cannot be read given as its :class:`CorruptRecord`."""
    if not lines:
        return []
    blob = b"\n".join(lines)
    n = len(lines)
    # every line starts with "[" and ends with "]" (a line holds no raw newline: each
    # "\n" of the blob ends one line and starts the next), counted at C speed
    if (
        blob[:1] == b"["
        and blob[-1:] == b"]"
        and blob.count(b"\n[") == n - 1
        and blob.count(b"]\n") == n - 1
    ):
        try:
            batch: list[Any] = _LINES.decode(b"[" + blob.replace(b"\n", b",") + b"]")
        except (msgspec.DecodeError, RecursionError):
            pass
        else:
            if len(batch) == len(lines):
                return batch
    out: list[Line | UnknownRecord | CorruptRecord] = []
    for line in lines:
        try:
            out.append(decode_line(line))
        except CorruptRecord as err:
            out.append(err)
    return out
