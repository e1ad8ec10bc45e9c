"""Checkpoints synthesised from a trace prefix, for tests.

:func:`checkpoint_of` writes the :class:`~dl2.model.checkpoint.CheckpointRecord` that
stands for the first records of a rank's trace: what the recorder must write at the
head of a rotated segment (see :mod:`dl2.model.checkpoint` for the contract).
:func:`resumed` cuts a session's trace of one rank there, as if its earlier segments
had been rotated away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from dl2.model.checkpoint import CheckpointRecord
from dl2.model.program import channel_key
from dl2.trace.rotated import segment_start
from dl2.trace.rotated import track
from dl2.trace.schema.decode import DoneRecord
from dl2.trace.schema.decode import DropRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.session import Session

_P2P = ("send", "recv")
#: blocking ops complete when their call returns
_RETURN_COMPLETES = ("create_group", "monitored_barrier")


def checkpoint_of(prefix: Sequence[Record], rank: int) -> CheckpointRecord | None:
    """The checkpoint standing for ``prefix`` (a rank's first records), or None when
    none can: an op of the prefix failed (a checkpoint has no failures), an op left
    open was dropped (a checkpoint does not carry ``drop`` records yet), or an op left
    incomplete is followed on its channel by a complete one (the recorder marks such
    works done, since gloo completes a channel's messages in order, before it writes
    a checkpoint; a trace written otherwise cannot be cut there)."""
    entered: dict[int, OpRecord] = {}
    returned: set[int] = set()
    complete: set[int] = set()
    failed: set[int] = set()
    dropped: set[int] = set()
    sender: dict[int, int] = {}
    waiting: dict[int, WaitRecord] = {}
    for record in prefix:
        match record:
            case OpRecord(id=oid):
                entered[oid] = record
            case WaitRecord(id=wid):
                waiting[wid] = record
            case RetRecord(id=rid, err=err, src=src) if rid in waiting:
                work = waiting.pop(rid).work
                (failed if err else complete).add(work)
                if src is not None and not err:
                    sender[work] = src
            case RetRecord(id=rid, err=err) if rid in entered:
                returned.add(rid)
                op = entered[rid]
                if err:
                    failed.add(rid)
                elif op.eager or (
                    not op.is_async and op.op in ("create_group", "monitored_barrier")
                ):
                    complete.add(rid)
            case DoneRecord(id=oid, src=src):
                complete.add(oid)
                if src is not None:
                    sender[oid] = src
            case DropRecord(id=oid):
                dropped.add(oid)
    if failed or dropped - complete:
        return None
    channels: Counter[tuple[object, ...]] = Counter()
    last_complete: dict[tuple[object, ...], int] = {}
    first_open: dict[tuple[object, ...], int] = {}
    for index, op in enumerate(entered.values()):
        if op.op not in _P2P:
            continue
        key = channel_key(op.op, op.gid, rank, op.peer, op.tag, sender.get(op.id))
        assert key is not None
        channels[key] += 1
        side = (*key, op.op)
        if op.id in complete:
            last_complete[side] = index
        else:
            first_open.setdefault(side, index)
    if any(last_complete.get(side, -1) > index for side, index in first_open.items()):
        return None
    return CheckpointRecord(
        ops_before=len(entered),
        collectives=dict(
            Counter(op.gid for op in entered.values() if op.op not in (*_P2P, "create_group"))
        ),
        channels=tuple((*key, n) for key, n in channels.items()),  # type: ignore[misc]
        groups={
            op.gid: op.ranks
            for op in entered.values()
            if op.op == "create_group" and op.id in complete
        },
        open=tuple(op for op in entered.values() if op.id not in complete),
        issued=tuple(i for i in entered if i in returned and i not in complete),
        waits=tuple(waiting.values()),
        pending=tuple(
            i for i, op in entered.items() if op.is_async and i in returned and i not in complete
        ),
    )


def resumed(session: Session, rank: int, cut: int) -> Session | None:
    """The session with ``rank``'s trace starting at a checkpoint after its first
    ``cut`` records, or None if no checkpoint can stand there."""
    trace = session.traces[rank]
    checkpoint = checkpoint_of(trace.records[:cut], rank)
    if checkpoint is None:
        return None
    written, *after = recorder_segment_start(trace.records[:cut], rank, trace.header.t0)
    assert isinstance(written, CheckpointRecord)
    assert model_view(written) == model_view(checkpoint), (written, checkpoint)
    # the checkpoint, then what the encoder repeats after it (live and dead threads)
    records = (written, *after, *trace.records[cut:])
    traces = dict(session.traces)
    traces[rank] = replace(trace, records=records)  # type: ignore[arg-type]
    return replace(session, traces=traces)


def recorder_checkpoint(prefix: Sequence[Record], rank: int, t0: int) -> CheckpointRecord:
    """The checkpoint the recorder's stream encoder writes after ``prefix``, read back."""
    checkpoint = recorder_segment_start(prefix, rank, t0)[0]
    assert isinstance(checkpoint, CheckpointRecord)
    return checkpoint


def recorder_segment_start(prefix: Sequence[Record], rank: int, t0: int) -> list[Record]:
    """What the recorder's stream encoder writes to start a segment after ``prefix``
    (its checkpoint first), read back."""
    t = max((getattr(r, "t", 0) for r in prefix), default=t0)
    return segment_start(track(prefix, rank, t0), t, 1)


def model_view(cp: CheckpointRecord) -> tuple[object, ...]:
    """What the model reads of a checkpoint (see :mod:`dl2.model.checkpoint`)."""
    creating = {op.gid for op in cp.open if op.op == "create_group"}
    return (
        cp.ops_before,
        {g: n for g, n in cp.collectives.items() if n},
        sorted(c for c in cp.channels if c[4]),
        # a group whose create_group is still open is in ``open`` too (the recorder
        # lists it at issue, the synthesiser once complete)
        {g: r for g, r in cp.groups.items() if g not in creating},
        [(op.id, op.seq) for op in cp.open],
        sorted(cp.issued),
        sorted((w.id, w.work) for w in cp.waits),
        sorted(cp.dropped),
    )
