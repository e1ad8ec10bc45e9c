"""A stream's writer state rebuilt from typed records: what its checkpoint would say.

:func:`track` replays a rank's typed records through a
:class:`~dl2.trace.schema.stream.StreamEncoder` that writes nothing, so that its state
(``open``, ``waits``, the counts, ...) is the recorder's after them, and
:func:`snapshot` reads back the checkpoint it would write.  The tests use them to check
the recorder's checkpoints against the records before them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from dl2.trace.format import TraceReader
from dl2.trace.schema import encode
from dl2.trace.schema.decode import CheckpointRecord
from dl2.trace.schema.decode import DoneRecord
from dl2.trace.schema.decode import DropRecord
from dl2.trace.schema.decode import Frame
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import ThreadErrorRecord
from dl2.trace.schema.decode import ThreadsRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.schema.state import expected_seqs
from dl2.trace.schema.stream import StackTable
from dl2.trace.schema.stream import StreamEncoder

_replace = msgspec.structs.replace
# A slot family: ("c", gid) for a group's collectives, ("p", gid, sender, receiver) for
# the messages between two ranks.
Family = tuple[Any, ...]


# -- the state of a stream, from typed records ---------------------------------------------


def track(records: Iterable[Record], me: int, t0: int = 0) -> StreamEncoder:
    """The records of rank ``me`` replayed through a stream encoder that writes nothing:
    its state (``open``, ``waits``, the counts...) is the stream's after them, by the
    recorder's own rules (a leading checkpoint is taken as it says)."""
    enc = StreamEncoder(me, t0, StackTable(), _discard)
    for rec in records:
        if isinstance(rec, OpRecord):
            _replay_op(enc, rec)
        elif isinstance(rec, RetRecord):
            enc.ret(rec.id, rec.t, rec.err, rec.src)
        elif isinstance(rec, WaitRecord):
            enc.wait(rec.id, rec.t, rec.tid, rec.work, _sid(enc, rec.stack))
        elif isinstance(rec, DoneRecord):
            enc.done(rec.id, rec.t, rec.src)
        elif isinstance(rec, DropRecord):
            enc.drop(rec.id, rec.t)
        elif isinstance(rec, ThreadsRecord):
            enc.threads(rec.t, rec.live)
        elif isinstance(rec, ThreadErrorRecord):
            enc.thread_error(rec.t, rec.tid, rec.name, rec.err, _sid(enc, rec.stack))
        elif isinstance(rec, StoreRecord):
            enc.store(rec.id, rec.t, rec.tid, rec.op, rec.store, rec.prefix, rec.keys,
                      rec.block, _sid(enc, rec.stack), rec.timeout)  # fmt: skip
        elif isinstance(rec, NewGroupRecord):
            enc.newgroup(rec.id, rec.t, rec.ranks, rec.gid, _sid(enc, rec.stack))
        elif isinstance(rec, CheckpointRecord):
            _resume(enc, rec, me)
    return enc


def _discard(data: bytes) -> None:
    pass


def _sid(enc: StreamEncoder, stack: tuple[Frame, ...]) -> int:
    return enc.stacks.intern(encode.stack_of((f.file, f.line, f.function) for f in stack))


#: An op record's own fields, as :func:`~dl2.trace.schema.encode.op_fields` takes them.
_OWN_FIELDS = ("peer", "tag", "root", "redop", "dtype", "count", "splits", "ranks", "timeout")


def _replay_op(enc: StreamEncoder, rec: OpRecord) -> None:
    fields = encode.op_fields(**{name: getattr(rec, name) for name in _OWN_FIELDS})
    gid_json = encode.json_str(rec.gid)
    enc.op(rec.id, rec.t, rec.tid, rec.gid, gid_json, rec.seq, rec.op, rec.api, fields,
           rec.is_async, _sid(enc, rec.stack), rec.batch, rec.eager, rec.deferred, rec.peer,
           rec.tag or 0, rec.ranks)  # fmt: skip


def _resume(enc: StreamEncoder, cp: CheckpointRecord, me: int) -> None:
    """Start from a checkpoint: its open ops and waits, then its counts."""
    issued = set(cp.issued)
    for op in cp.open:
        _replay_op(enc, op)
        if op.id in issued:
            enc.ret(op.id, cp.t)
    for wait in cp.waits:
        enc.wait(wait.id, wait.t, wait.tid, wait.work, _sid(enc, wait.stack))
    for call in cp.stores:
        enc.store(call.id, call.t, call.tid, call.op, call.store, call.prefix, call.keys,
                  True, _sid(enc, call.stack), call.timeout)  # fmt: skip
    enc.dropped = set(cp.dropped)
    channels = {(g, s, r, tag): n for g, s, r, tag, n in cp.channels}
    enc.next_id = max(enc.next_id, cp.next_id)
    enc.ops_before = cp.ops_before
    enc.channels = channels
    enc.seqs = expected_seqs(dict(cp.collectives), channels, me)
    enc.groups = {g: (list(r) if r is not None else None) for g, r in cp.groups.items()}
    enc.newgroups = [
        (g.id, (g.t - enc.t0) // 1000, list(g.ranks) if g.ranks is not None else None, g.gid,
         _sid(enc, g.stack))
        for g in cp.newgroups
    ]  # fmt: skip


def snapshot(enc: StreamEncoder, t: int, segment: int) -> CheckpointRecord:
    """The checkpoint ``enc`` writes at ``t`` to start ``segment``, read back."""
    checkpoint = segment_start(enc, t, segment)[0]
    assert isinstance(checkpoint, CheckpointRecord)
    return checkpoint


def segment_start(enc: StreamEncoder, t: int, segment: int) -> list[Record]:
    """What ``enc`` writes at ``t`` to start ``segment``, read back: its checkpoint, then
    what the encoder repeats after one (the live threads, the threads that died)."""
    header = encode.header_line(
        rank=enc.me,
        world_size=enc.me + 1,
        pid=0,
        host="",
        t0=enc.t0,
        wall=0,
        dl2="",
        segment=segment,
    )
    return TraceReader("checkpoint").feed((header + enc.start_segment(segment, t)).encode())
