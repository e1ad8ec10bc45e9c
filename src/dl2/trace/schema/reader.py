"""The reader of one segment's lines (format v2): wire lines back to typed records.

A :class:`SegmentDecoder` undoes what :class:`~dl2.trace.schema.stream.StreamEncoder`
did, with the same rules: it holds the segment's stack and op-description tables, the
time and id it last saw and the seq each op key expects next, and turns each line into
the typed records of :mod:`dl2.trace.schema.decode` (an ``o`` line into an
:class:`OpRecord`, a ``b`` line into the ``ret`` of its op plus the ``wait`` on it).  It
is fed lines in file order, as many at a time as the caller has, so a live tailer can
feed it chunk by chunk.

A segment after the first starts with a checkpoint, which is given back as a
:class:`CheckpointRecord`; the checkpoints the recorder writes within a segment are not
(they only let the reader check itself, and resynchronise after a corrupt line).

For the analysis side only (msgspec).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import msgspec

from dl2.trace.schema.decode import CheckpointRecord
from dl2.trace.schema.decode import CorruptRecord
from dl2.trace.schema.decode import DoneRecord
from dl2.trace.schema.decode import DropRecord
from dl2.trace.schema.decode import EndRecord
from dl2.trace.schema.decode import Frame
from dl2.trace.schema.decode import Header
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.schema.decode import NonMemberRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import ThreadErrorRecord
from dl2.trace.schema.decode import ThreadsRecord
from dl2.trace.schema.decode import UnknownRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.schema.state import collectives
from dl2.trace.schema.state import expected_seqs
from dl2.trace.schema.state import seq_key
from dl2.trace.schema.wire import DESC_FIELDS
from dl2.trace.schema.wire import CheckpointBody
from dl2.trace.schema.wire import CheckpointLine
from dl2.trace.schema.wire import DescDef
from dl2.trace.schema.wire import DoneLine
from dl2.trace.schema.wire import DropLine
from dl2.trace.schema.wire import EndLine
from dl2.trace.schema.wire import IssuedDoneLine
from dl2.trace.schema.wire import IssuedWaitLine
from dl2.trace.schema.wire import NewGroupLine
from dl2.trace.schema.wire import NonMemberLine
from dl2.trace.schema.wire import OpLine
from dl2.trace.schema.wire import RankRange
from dl2.trace.schema.wire import RetLine
from dl2.trace.schema.wire import StackDef
from dl2.trace.schema.wire import StateLine
from dl2.trace.schema.wire import StoreLine
from dl2.trace.schema.wire import ThreadErrorLine
from dl2.trace.schema.wire import ThreadsLine
from dl2.trace.schema.wire import WaitLine
from dl2.trace.schema.wire import decode_lines

_replace = msgspec.structs.replace


@functools.lru_cache(maxsize=4096)
def _range(start: int, stop: int, step: int) -> tuple[int, ...]:
    return tuple(range(start, stop, step))


#: op templates by (description, stack): the ranks of a job define the same ones, and a
#: shared template is built once (and its fields stored once)
_TEMPLATES: dict[tuple[Any, tuple[Frame, ...]], tuple[OpRecord, Any]] = {}
_TEMPLATES_LIMIT = 1 << 16


def expand_ranks(ranks: tuple[int, ...] | RankRange | None) -> tuple[int, ...] | None:
    """Ranks as written (a list, a :class:`RankRange` or null) as a tuple (or None);
    the ranks of one range are one tuple, shared by every rank that wrote them."""
    if type(ranks) is RankRange:
        return _range(ranks.start, ranks.stop, ranks.step)
    return ranks  # type: ignore[return-value]


_Out = list[Record]


class CallRun(list):  # type: ignore[type-arg]
    """The op records of consecutive plain blocking calls, as a reader in calls mode
    gives them back: each stands for its op, its ``ret``, the ``wait`` on it (whose id
    is the op's id + 1, as a ``k`` line says) and that wait's ``ret``."""

    __slots__ = ()


class SegmentDecoder:
    """Resolves the lines of one segment, in order, into typed records.

    Args:
        header: the segment's header (its ``t0``, ``rank`` and ``segment``).

    Attributes:
        notes: sentences about what the segment's own checkpoints found (records
            lost to a corrupt line); the caller reports them.
    """

    def __init__(self, header: Header, calls: bool = False) -> None:
        self.calls = calls
        self.t0 = header.t0
        self.me = header.rank
        self.notes: list[str] = []
        self._stacks: dict[int, tuple[Frame, ...]] = {0: ()}
        # did -> (OpRecord with id 0, t 0, seq None; the op's seq key; its stack id)
        self._descs: dict[int, tuple[OpRecord, Any, int]] = {}
        self._seqs: dict[Any, int] = {}  # the seq each key expects next
        self._next_id = 1
        self._ops_before = 0
        self._us = 0
        self._last = 0
        self._last_tid = 0
        self._last_sid = -1
        self._first = header.segment > 0  # the next record is the segment's checkpoint
        self._skipped = 0  # corrupt lines since the last checkpoint

    def decode(
        self, lines: Sequence[bytes]
    ) -> tuple[list[Record], list[tuple[int, CorruptRecord]]]:
        """The records of ``lines`` (complete lines, in file order, without newlines)
        and the lines that could not be read or resolved, as (index, error) (a ``b``
        line gives two records, a ``k`` line three, a definition none).

        With ``calls``, a blocking call written as its op line and a ``k`` line right
        after it comes back as its op record in a :class:`CallRun`, one item for
        consecutive calls: it stands for the op, its ``ret``, the ``wait`` on it (id:
        the op's + 1) and the wait's ``ret`` (see
        :meth:`dl2.model.incremental.Model.feed_calls`).

        The two lines of a blocking op (``o``, ``k``) are resolved inline: they are
        nearly every line of a long trace.
        """
        out: list[Record] = []
        corrupt: list[tuple[int, CorruptRecord]] = []
        append = out.append
        handlers = _HANDLERS
        descs = self._descs
        stacks = self._stacks
        seqs = self._seqs
        t0 = self.t0
        calls = self.calls
        # the state the hot lines change, kept in locals (written back before any other
        # line's handler runs, and at the end)
        us, last, next_id = self._us, self._last, self._next_id
        ops_before, last_tid, last_sid = self._ops_before, self._last_tid, self._last_sid
        first = self._first
        items = decode_lines(lines)
        n_items = len(items)
        numbered = enumerate(items)
        for index, item in numbered:
            kind = type(item)
            if kind is OpLine:
                template = descs.get(item.did)  # type: ignore[union-attr]
                if template is not None:
                    first = False
                    us += item.dt  # type: ignore[union-attr]
                    oid = item.id  # type: ignore[union-attr]
                    if oid is None:
                        oid = last + 1
                    last = oid
                    if oid >= next_id:
                        next_id = oid + 1
                    record, skey, last_sid = template
                    seq = item.seq  # type: ignore[union-attr]
                    if skey is not None:
                        if seq is None:
                            seq = seqs.get(skey, 0)
                        seqs[skey] = seq + 1
                    ops_before += 1
                    last_tid = record.tid
                    op = _replace(record, id=oid, t=t0 + us * 1000, seq=seq, batch=item.batch)  # type: ignore[union-attr]
                    if calls and index + 1 < n_items:
                        done = items[index + 1]
                        if type(done) is IssuedDoneLine and last_sid in stacks:
                            # its k line next: the op, its ret, the wait on it and the
                            # wait's ret are one call, into the run it follows (or a new
                            # one); the IssuedDoneLine branch below, for this case
                            next(numbered)
                            us += done.dt + done.dt_ret
                            last = wid = oid + 1
                            if wid >= next_id:
                                next_id = wid + 1
                            if out and type(out[-1]) is CallRun:  # type: ignore[comparison-overlap]
                                out[-1].append(op)  # type: ignore[attr-defined]
                            else:
                                append(CallRun((op,)))  # type: ignore[arg-type]
                            continue
                    append(op)
                    continue
            elif kind is IssuedDoneLine:
                stack = stacks.get(last_sid)
                if stack is not None:
                    first = False
                    us += item.dt  # type: ignore[union-attr]
                    oid = last
                    last = wid = oid + 1
                    if wid >= next_id:
                        next_id = wid + 1
                    if calls and out:
                        issued = out[-1]
                        if type(issued) is OpRecord and issued.id == oid:
                            # the op, its ret, the wait on it and the wait's ret: one
                            # call, into the run of calls it follows (or a new one)
                            out.pop()
                            if out and type(out[-1]) is CallRun:  # type: ignore[comparison-overlap]
                                out[-1].append(issued)  # type: ignore[attr-defined]
                            else:
                                append(CallRun((issued,)))  # type: ignore[arg-type]
                            us += item.dt_ret  # type: ignore[union-attr]
                            continue
                    t = t0 + us * 1000
                    append(RetRecord(id=oid, t=t))
                    append(WaitRecord(id=wid, t=t, tid=last_tid, work=oid, stack=stack))
                    us += item.dt_ret  # type: ignore[union-attr]
                    append(RetRecord(id=wid, t=t0 + us * 1000))
                    continue
            elif kind is CorruptRecord:
                self._skipped += 1
                corrupt.append((index, item))  # type: ignore[arg-type]
                continue
            elif kind is UnknownRecord:
                append(item)  # type: ignore[arg-type]
                continue
            self._us, self._last, self._next_id = us, last, next_id
            self._ops_before, self._last_tid, self._last_sid = ops_before, last_tid, last_sid
            self._first = first
            size = len(out)
            try:
                handlers[kind](self, item, out)
            except CorruptRecord as err:  # raised before the line changed any state
                del out[size:]
                self._skipped += 1
                corrupt.append((index, err))
            us, last, next_id = self._us, self._last, self._next_id
            ops_before, last_tid, last_sid = self._ops_before, self._last_tid, self._last_sid
            first = self._first
            seqs = self._seqs  # a checkpoint sets them anew
        self._us, self._last, self._next_id = us, last, next_id
        self._ops_before, self._last_tid, self._last_sid = ops_before, last_tid, last_sid
        self._first = first
        return out, corrupt

    def unskip(self) -> None:
        """The last corrupt line given back will be fed again (it may be a line still
        being written): it was not skipped."""
        self._skipped -= 1

    # -- helpers ----------------------------------------------------------------------------

    def _t(self, dt: int) -> int:
        us = self._us + dt
        self._us = us
        return self.t0 + us * 1000

    def _frames(self, sid: int) -> tuple[Frame, ...]:
        stack = self._stacks.get(sid)
        if stack is None:
            raise CorruptRecord(f"stack {sid} is not defined in this segment")
        return stack

    def _new_id(self, given: int | None) -> int:
        rid = self._last + 1 if given is None else given
        self._last = rid
        if rid >= self._next_id:
            self._next_id = rid + 1
        return rid

    def _template(self, did: int) -> tuple[OpRecord, Any, int]:
        desc = self._descs.get(did)
        if desc is None:
            raise CorruptRecord(f"op description {did} is not defined in this segment")
        return desc

    def _resolve_op(
        self,
        template: tuple[OpRecord, Any, int],
        oid: int,
        us: int,
        seq: int | None,
        batch: int | None,
    ) -> OpRecord:
        record, skey, _ = template
        if skey is not None:
            seqs = self._seqs
            if seq is None:
                seq = seqs.get(skey, 0)
            seqs[skey] = seq + 1
        return _replace(record, id=oid, t=self.t0 + us * 1000, seq=seq, batch=batch)

    # -- the lines ------------------------------------------------------------------------

    def _stack_def(self, line: StackDef, out: _Out) -> None:
        self._stacks[line.sid] = line.frames

    def _desc_def(self, line: DescDef, out: _Out) -> None:
        desc = line.desc
        sid: int = desc.stack  # type: ignore[attr-defined]
        stack = self._frames(sid)
        key = (desc, stack)
        known = _TEMPLATES.get(key)
        if known is None:
            fields = {f.name: getattr(desc, f.name) for f in DESC_FIELDS}
            fields["ranks"] = expand_ranks(fields["ranks"])
            record = OpRecord(id=0, stack=stack, **fields)
            known = (record, seq_key(record.gid, record.op, record.peer))
            if len(_TEMPLATES) >= _TEMPLATES_LIMIT:
                _TEMPLATES.clear()
            _TEMPLATES[key] = known
        self._descs[line.did] = (known[0], known[1], sid)

    def _op(self, line: OpLine, out: _Out) -> None:
        template = self._template(line.did)
        self._first = False
        us = self._us + line.dt
        self._us = us
        record = self._resolve_op(template, self._new_id(line.id), us, line.seq, line.batch)
        self._ops_before += 1
        self._last_tid = record.tid
        self._last_sid = template[2]
        out.append(record)

    def _issued_wait(self, line: IssuedWaitLine, out: _Out) -> None:
        stack = self._frames(self._last_sid if line.sid is None else line.sid)
        self._first = False
        t = self._t(line.dt)
        oid = self._last - (line.back or 0)
        tid = self._last_tid if line.tid is None else line.tid
        wid = self._new_id(line.wid)
        out.append(RetRecord(id=oid, t=t))
        out.append(WaitRecord(id=wid, t=t, tid=tid, work=oid, stack=stack))

    def _issued_done(self, line: IssuedDoneLine, out: _Out) -> None:
        self._issued_wait(IssuedWaitLine(line.dt), out)
        out.append(RetRecord(id=self._last, t=self._t(line.dt_ret)))

    def _ret(self, line: RetLine, out: _Out) -> None:
        self._first = False
        t = self._t(line.dt)
        out.append(RetRecord(id=self._last - (line.back or 0), t=t, err=line.err, src=line.src))

    def _wait(self, line: WaitLine, out: _Out) -> None:
        stack = self._frames(line.sid)
        self._first = False
        t = self._t(line.dt)
        work = self._last - line.back
        tid = self._last_tid if line.tid is None else line.tid
        out.append(WaitRecord(id=self._new_id(line.id), t=t, tid=tid, work=work, stack=stack))

    def _done(self, line: DoneLine, out: _Out) -> None:
        self._first = False
        out.append(DoneRecord(id=self._last - line.back, t=self._t(line.dt), src=line.src))

    def _newgroup(self, line: NewGroupLine, out: _Out) -> None:
        stack = self._frames(line.sid)
        self._first = False
        t = self._t(line.dt)
        nid = self._new_id(line.id)
        ranks = expand_ranks(line.ranks)
        out.append(NewGroupRecord(id=nid, t=t, ranks=ranks, gid=line.gid, stack=stack))

    def _nonmember(self, line: NonMemberLine, out: _Out) -> None:
        stack = self._frames(line.sid)
        self._first = False
        out.append(NonMemberRecord(t=self._t(line.dt), api=line.api, stack=stack))

    def _state_line(self, line: StateLine, out: _Out) -> None:
        stack = self._frames(line.sid)
        self._first = False
        t = self._t(line.dt)
        out.append(StateRecord(t=t, pending=line.pending, where=line.where, stack=stack))

    def _end(self, line: EndLine, out: _Out) -> None:
        self._first = False
        stack = self._frames(line.sid) if line.err is not None else ()
        out.append(EndRecord(t=self._t(line.dt), how=line.how, err=line.err, stack=stack))

    def _thread_error(self, line: ThreadErrorLine, out: _Out) -> None:
        self._first = False
        out.append(
            ThreadErrorRecord(
                t=self._t(line.dt),
                tid=line.tid,
                name=line.name,
                err=line.err,
                stack=self._frames(line.sid),
            )
        )

    def _threads(self, line: ThreadsLine, out: _Out) -> None:
        self._first = False
        out.append(ThreadsRecord(t=self._t(line.dt), live=line.live))

    def _drop(self, line: DropLine, out: _Out) -> None:
        self._first = False
        out.append(DropRecord(id=self._last - line.back, t=self._t(line.dt)))

    def _store(self, line: StoreLine, out: _Out) -> None:
        stack = self._frames(line.sid)
        self._first = False
        t = self._t(line.dt)
        out.append(
            StoreRecord(
                id=self._new_id(line.id),
                t=t,
                tid=line.tid,
                op=line.op,
                store=line.store,
                prefix=line.prefix,
                keys=line.keys,
                block=line.block,
                timeout=line.timeout,
                stack=stack,
            )
        )

    def _checkpoint(self, line: CheckpointLine, out: _Out) -> None:
        body = line.body
        record = self._checkpoint_record(line.us, body)
        if self._skipped:
            found = (self._next_id, self._ops_before, collectives(self._seqs))
            if found != (body.next_id, body.ops_before, body.collectives):
                self.notes.append(
                    f"{self._skipped} corrupt line(s) lost records: the ids and seqs read "
                    "between them and this checkpoint may be wrong"
                )
            self._skipped = 0
        channels = {(g, s, r, tag): n for g, s, r, tag, n in body.channels}
        self._seqs = expected_seqs(dict(body.collectives), channels, self.me)
        self._next_id = body.next_id
        self._ops_before = body.ops_before
        self._us = line.us
        self._last = body.next_id - 1
        self._last_tid = 0
        self._last_sid = -1
        if self._first:
            out.append(record)
        self._first = False

    def _checkpoint_record(self, us: int, body: CheckpointBody) -> CheckpointRecord:
        t0 = self.t0
        opened = tuple(
            _replace(self._template(did)[0], id=oid, t=t0 + at * 1000, seq=seq, batch=batch)
            for oid, at, did, seq, batch in body.open
        )
        waits = tuple(
            WaitRecord(id=wid, t=t0 + at * 1000, tid=tid, work=work, stack=self._frames(sid))
            for wid, at, tid, work, sid in body.waits
        )
        newgroups = tuple(
            NewGroupRecord(
                id=nid,
                t=t0 + at * 1000,
                ranks=expand_ranks(ranks),
                gid=gid,
                stack=self._frames(sid),
            )
            for nid, at, ranks, gid, sid in body.newgroups
        )
        stores = tuple(
            StoreRecord(
                id=cid,
                t=t0 + at * 1000,
                tid=tid,
                op=op,
                store=store,
                prefix=prefix,
                keys=keys,
                block=True,
                timeout=timeout,
                stack=self._frames(sid),
            )
            for cid, at, tid, op, store, prefix, keys, timeout, sid in body.stores
        )
        return CheckpointRecord(
            t=t0 + us * 1000,
            segment=body.segment,
            next_id=body.next_id,
            ops_before=body.ops_before,
            collectives=dict(body.collectives),
            channels=body.channels,
            groups={gid: expand_ranks(ranks) for gid, ranks in body.groups.items()},
            open=opened,
            issued=body.issued,
            waits=waits,
            pending=body.pending,
            newgroups=newgroups,
            dropped=body.dropped,
            stores=stores,
        )


# line kind -> its SegmentDecoder handler: one table for all decoders (a run of 8,192
# ranks has as many), not a table of bound methods built by each
_HANDLERS: dict[type, Callable[[SegmentDecoder, Any, _Out], None]] = {
    StackDef: SegmentDecoder._stack_def,
    DescDef: SegmentDecoder._desc_def,
    OpLine: SegmentDecoder._op,
    IssuedWaitLine: SegmentDecoder._issued_wait,
    IssuedDoneLine: SegmentDecoder._issued_done,
    RetLine: SegmentDecoder._ret,
    WaitLine: SegmentDecoder._wait,
    DoneLine: SegmentDecoder._done,
    NewGroupLine: SegmentDecoder._newgroup,
    NonMemberLine: SegmentDecoder._nonmember,
    StateLine: SegmentDecoder._state_line,
    EndLine: SegmentDecoder._end,
    DropLine: SegmentDecoder._drop,
    ThreadsLine: SegmentDecoder._threads,
    ThreadErrorLine: SegmentDecoder._thread_error,
    StoreLine: SegmentDecoder._store,
    CheckpointLine: SegmentDecoder._checkpoint,
}
