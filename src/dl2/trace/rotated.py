"""Traces whose oldest segments were rotated away, made readable by the execution model.

The model matches collectives by their position on a group and P2P ops by their
position on a channel, from each rank's first op on.  When a rank's trace starts at a
checkpoint, its first ops are gone, and each rank lost a different number: positions no
longer line up.  :func:`align` rewrites a session's traces so that they do again, using
what each checkpoint says (the next ``seq`` of every group, the P2P ops per channel, the
ops still open):

* a rotated rank's trace gets back, after its checkpoint, the groups it had created and
  its new_group calls, then the ops still open at the checkpoint (issued ones with their
  ``ret``) and the waits still open, as records;
* an op *slot* (the ``seq``-th collective of a group, the ``seq``-th message between two
  ranks) that some rank issued before its checkpoint and that is complete there is
  *history*: it is dropped from every rank, unless a rank still waits on it; then each
  rank that completed it gets a stand-in (the op as another member issued it, no stack,
  complete), so that the waiting rank still has its partner.

Wildcard receives are left where they are (their sender is known only once matched).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import msgspec

from dl2.trace.format import RankTrace
from dl2.trace.format import TraceReader
from dl2.trace.schema import encode
from dl2.trace.schema.decode import CheckpointRecord
from dl2.trace.schema.decode import DoneRecord
from dl2.trace.schema.decode import Frame
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.schema.state import GROUP
from dl2.trace.schema.state import P2P
from dl2.trace.schema.state import expected_seqs
from dl2.trace.schema.state import op_family
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
    header = encode.header_line(
        rank=enc.me, world_size=0, pid=0, host="", t0=enc.t0, wall=0, dl2="", segment=segment
    )
    records = TraceReader("checkpoint").feed((header + enc.start_segment(segment, t)).encode())
    checkpoint = records[0]
    assert isinstance(checkpoint, CheckpointRecord)
    return checkpoint


# -- alignment --------------------------------------------------------------------------------


def _family(op: OpRecord, rank: int) -> Family | None:
    if op.seq is None:
        return None
    family = op_family(op.op)
    if family == P2P:
        if op.peer is None:
            return None  # a wildcard receive: its sender is known only once matched
        return ("p", op.gid, rank, op.peer) if op.op == "send" else ("p", op.gid, op.peer, rank)
    return ("c", op.gid) if family != GROUP else None


def _bases(cp: CheckpointRecord) -> dict[Family, int]:
    """Ops of each family the rank issued before its checkpoint."""
    bases: dict[Family, int] = {("c", gid): n for gid, n in cp.collectives.items()}
    for gid, sender, receiver, _tag, n in cp.channels:
        if sender >= 0:
            key = ("p", gid, sender, receiver)
            bases[key] = bases.get(key, 0) + n
    return bases


def _expand(
    trace: RankTrace, stand_ins: Iterable[tuple[Family, int, OpRecord]] = ()
) -> list[Record]:
    """A rotated trace with its checkpoint's groups, new_group calls, open ops and open
    waits written out as records after it, and ``stand_ins`` (complete) among the open
    ops, each family's ops in slot order."""
    cp = trace.records[0]
    assert isinstance(cp, CheckpointRecord)
    out: list[Record] = [cp]
    opened_groups = {op.gid for op in cp.open if op.op == "create_group"}
    for number, (gid, ranks) in enumerate(sorted(cp.groups.items()), start=1):
        if gid not in opened_groups:
            group = OpRecord(id=-number, t=cp.t, gid=gid, op="create_group", ranks=ranks)
            out += [group, RetRecord(id=-number, t=cp.t)]
    out.extend(cp.newgroups)
    issued = set(cp.issued)
    ops: list[tuple[tuple[Any, ...], list[Record]]] = []
    for op in cp.open:
        family = _family(op, trace.rank)
        key = (str(family), op.seq or 0) if family is not None else ("", op.id)
        ops.append((key, [op, RetRecord(id=op.id, t=cp.t)] if op.id in issued else [op]))
    for family, slot, op in stand_ins:
        done: list[Record] = [op, RetRecord(id=op.id, t=op.t), DoneRecord(id=op.id, t=op.t)]
        ops.append(((str(family), slot), done))
    for _, group_records in sorted(ops, key=lambda item: item[0]):
        out.extend(group_records)
    out.extend(cp.waits)
    out.extend(trace.records[1:])
    return out


def _stand_in(template: OpRecord, family: Family, rank: int, oid: int) -> OpRecord:
    """The op ``rank`` issued and completed at the slot of ``template`` (another rank's)."""
    if family[0] == "p":
        sending = family[2] == rank
        peer = family[3] if sending else family[2]
        return _replace(
            template, id=oid, op="send" if sending else "recv", peer=peer, api=None, stack=()
        )
    return _replace(template, id=oid, stack=())


def align(traces: Mapping[int, RankTrace]) -> tuple[dict[int, RankTrace], list[str]]:
    """The traces with positions lined up across ranks, and a note per rotated rank."""
    rotated = {
        r: t for r, t in traces.items() if t.records and isinstance(t.records[0], CheckpointRecord)
    }
    if not rotated:
        return dict(traces), []
    records = {r: (_expand(t) if r in rotated else list(t.records)) for r, t in traces.items()}
    bases: dict[int, dict[Family, int]] = {}
    for r, trace in rotated.items():
        cp = trace.records[0]
        assert isinstance(cp, CheckpointRecord)
        bases[r] = _bases(cp)
    present: dict[Family, dict[int, dict[int, OpRecord]]] = defaultdict(lambda: defaultdict(dict))
    for r, recs in records.items():
        for rec in recs:
            if isinstance(rec, OpRecord) and (family := _family(rec, r)) is not None:
                assert rec.seq is not None
                present[family][r][rec.seq] = rec
    still_open = {r: set(track(recs, r).open) for r, recs in records.items()}
    drop: dict[int, set[int]] = defaultdict(set)
    stand_ins: dict[int, list[tuple[Family, int, OpRecord]]] = defaultdict(list)
    for family, by_rank in present.items():
        for slot in sorted({s for ops in by_rank.values() for s in ops}):
            gone = [
                r
                for r in rotated
                if bases[r].get(family, 0) > slot and slot not in by_rank.get(r, {})
            ]
            if not gone:
                continue
            issued = [(r, ops[slot]) for r, ops in by_rank.items() if slot in ops]
            if any(op.id in still_open[r] for r, op in issued):
                for r in gone:
                    oid = -(len(stand_ins[r]) + 10_000_000)
                    stand_ins[r].append((family, slot, _stand_in(issued[0][1], family, r, oid)))
            else:
                for r, op in issued:
                    drop[r].add(op.id)
    aligned: dict[int, RankTrace] = {}
    notes: list[str] = []
    for r, trace in traces.items():
        recs = _expand(trace, stand_ins[r]) if r in stand_ins else records[r]
        gone_ids = drop.get(r, set())
        if gone_ids:
            recs = [x for x in recs if not (isinstance(x, OpRecord) and x.id in gone_ids)]
        aligned[r] = replace(trace, records=tuple(recs))
        if r in rotated:
            cp = trace.records[0]
            assert isinstance(cp, CheckpointRecord)
            notes.append(
                f"rank {r}: its first {cp.ops_before} ops were rotated away (segments before "
                f"{trace.header.segment}); run with --keep all to keep every segment"
            )
    return aligned, notes
