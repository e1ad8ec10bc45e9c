"""One rank's Flight Recorder entries as dl2's typed records.

The rules (docs/design.md, "Flight Recorder dumps"):

* a group is its ``process_group`` name (the default group is "0", the world); its
  global ranks come from ``pg_config`` (a ``create_group`` op per group the rank is a
  member of), or, where ``pg_config`` is broken (gloo), are the ranks that launched on
  it;
* a collective's position in its group is ``collective_seq_id - 1``; when a rank's
  first entry of a group is not the group's first (``record_id`` of the first entry is
  not 0, or the first ``collective_seq_id`` is past 1: the ring buffer wrapped), the
  rank starts at a checkpoint giving each group's position, as a dl2 trace whose oldest
  segments were rotated away;
* ``send a->b`` / ``recv a<-b`` peers are group-local ranks, mapped to global ranks;
* entries that share a sequence id and end with a ``coalesced`` entry are one launch:
  P2P ops become one batch, collectives one ``*_coalesced`` op; the closing entry's state
  is the launch's;
* a launch is complete when FR saw it complete (``state`` completed; on gloo, whose
  state never leaves "scheduled", when it is ``retired``); the rank is read as waiting
  on its earliest incomplete launch (FR does not record whether a launch was blocking):
  later launches FR saw start are issued and pending, the others are queued behind it
  and not counted as posted;
* an op's stack is its ``frames`` without torch's own, innermost first.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from dataclasses import field

from dl2.flight.dump import FrDump
from dl2.flight.dump import FrEntry
from dl2.trace.schema.decode import CheckpointRecord
from dl2.trace.schema.decode import DoneRecord
from dl2.trace.schema.decode import Frame
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import WaitRecord

#: FR operation names (after the backend prefix) -> dl2's op names
OP_NAMES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "_all_gather_base": "all_gather_into_tensor",
    "all_gather_base": "all_gather_into_tensor",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "gather": "gather",
    "scatter": "scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "all_to_all_single": "all_to_all_single",
    "barrier": "barrier",
    "allreduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "send": "send",
    "recv": "recv",
}

#: FR dtype names (``c10::toString``) -> dl2's (``str(dtype)`` without ``torch.``)
DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
}

_SEND = re.compile(r"^send +([0-9]+) *-> *([0-9]+)")
_RECV = re.compile(r"^recv +([0-9]+) *<- *([0-9]+)")
_TORCH_FILE = re.compile(r"(^|[/\\])torch[/\\]")


def is_torch_frame(filename: str) -> bool:
    """A frame of torch itself (``.../torch/distributed/distributed_c10d.py``)."""
    return _TORCH_FILE.search(filename) is not None


@dataclass
class Launch:
    """One launch: a single entry, or the entries of a coalesced group."""

    entries: list[FrEntry]
    closer: FrEntry | None = None  # the ``coalesced`` entry that ended the group

    @property
    def head(self) -> FrEntry:
        return self.entries[0] if self.entries else self.closer  # type: ignore[return-value]

    def completed(self, gloo: bool) -> bool:
        last = self.closer if self.closer is not None else None
        seen = [last] if last is not None else self.entries
        if gloo:
            return all(e.completed or e.retired for e in seen)
        return all(e.completed for e in seen)

    def started(self, gloo: bool) -> bool:
        seen = [self.closer] if self.closer is not None else self.entries
        return self.completed(gloo) or any(e.started for e in seen if e is not None)


@dataclass
class RankRead:
    """What one rank's dump gives: its records and what the report should say."""

    records: list[Record] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wrapped: bool = False
    backend: str = ""
    #: ranks whose absence made one of this rank's collectives fail (they left)
    gone: set[int] = field(default_factory=set)


def _is_closer(entry: FrEntry) -> bool:
    return entry.name == "coalesced"


def _is_p2p(entry: FrEntry) -> bool:
    return entry.is_p2p or entry.name.startswith(("send ", "recv "))


def launches(entries: tuple[FrEntry, ...]) -> list[Launch]:
    """The rank's launches in order: coalesced groups joined."""
    found: list[Launch] = []
    for entry in entries:
        if not _is_closer(entry):
            found.append(Launch([entry]))
            continue
        members: list[FrEntry] = []
        p2p: bool | None = None  # what the group holds: P2P ops or collectives, never both
        while found and len(found[-1].entries) == 1 and found[-1].closer is None:
            prev = found[-1].entries[0]
            prev_p2p = _is_p2p(prev)
            if p2p is not None and prev_p2p != p2p:
                break  # torch 2.11: a P2P batch's closer repeats the collective seq id
            same = prev.pg_name == entry.pg_name and (
                prev.p2p_seq_id == entry.p2p_seq_id
                if prev_p2p
                else prev.collective_seq_id == entry.collective_seq_id
            )
            if not same:
                break
            p2p = prev_p2p
            members.insert(0, prev)
            found.pop()
        found.append(Launch(members, entry))
    return found


def _count(sizes: tuple[tuple[int, ...], ...]) -> int:
    return sum(math.prod(s) for s in sizes)


def _dtype(entry: FrEntry) -> str | None:
    names = entry.input_dtypes or entry.output_dtypes
    if not names:
        return None
    return DTYPES.get(names[0], names[0].lower())


def _stack(entry: FrEntry) -> tuple[Frame, ...]:
    if not entry.frames:
        return ()
    return tuple(
        Frame(f.filename, f.line, f.name) for f in entry.frames if not is_torch_frame(f.filename)
    )[:32]


class _Ids:
    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


def launched(dump: FrDump) -> dict[str, int]:
    """Group -> the highest ``collective_seq_id`` the rank launched on it."""
    top: dict[str, int] = {}
    for entry in dump.entries:
        if not entry.is_p2p and entry.name != "coalesced":
            top[entry.pg_name] = max(top.get(entry.pg_name, 0), entry.collective_seq_id)
    return top


def map_rank(
    rank: int,
    dump: FrDump,
    groups: dict[str, tuple[int, ...]],
    name: str,
    absent: dict[str, list[tuple[int, int]]] | None = None,
) -> RankRead:
    """One rank's records (see the module docstring for the rules).

    Args:
        rank: the rank's global rank.
        dump: its checked dump.
        groups: every group's global ranks known from any rank's ``pg_config``.
        name: the file, for the notes.
        absent: group -> (the highest ``collective_seq_id`` it launched, member rank)
            of its members with a dump, ascending: on gloo, a collective retired at a
            position some member never launched cannot have succeeded (gloo retires a
            work that failed, "Connection closed by peer", as one that completed); it
            is read as failed.
    """
    read = RankRead()
    entries = dump.entries
    backends = {e.backend for e in entries if e.backend}
    read.backend = ",".join(sorted(backends))
    gloo = backends == {"gloo"}
    ids = _Ids()
    # groups: positions where the rank's history in FR starts
    first_seq: dict[str, int] = {}
    last_seq: dict[str, int] = {}
    gaps: list[str] = []
    all_launches = launches(entries)
    for launch in all_launches:
        head = launch.head
        if head.is_p2p or head.name.startswith(("send", "recv")):
            continue
        seq = head.collective_seq_id
        gid = head.pg_name
        if gid not in first_seq:
            first_seq[gid] = seq
        elif seq != last_seq[gid] + 1 and seq > 0:
            gaps.append(f"{gid} ({last_seq[gid] + 1}..{seq - 1})")
        last_seq[gid] = seq
    bases = {gid: seq - 1 for gid, seq in first_seq.items() if seq > 1}
    first_record = entries[0].record_id if entries else 0
    if bases or first_record > 0:
        read.wrapped = True
        read.records.append(CheckpointRecord(segment=1, collectives=dict(bases)))
        lost = f"its {first_record} oldest records are gone" if first_record else "records are gone"
        starts = ", ".join(f"group {g} at collective {s}" for g, s in sorted(first_seq.items()))
        read.notes.append(
            f"rank {rank}: the ring buffer wrapped ({lost}); the rank is read from its "
            f"first entries ({starts or 'no collective'}): mismatches and P2P pairs before "
            "them cannot be checked"
        )
    if gaps:
        read.notes.append(
            f"rank {rank}: collectives missing from the dump in group(s) {', '.join(gaps)}; "
            "positions after a gap may pair up wrongly"
        )
    # groups the rank is a member of, as pg_config gives them
    for gid, members in sorted(groups.items()):
        if gid != "0" and rank in members:
            oid = ids.next()
            read.records.append(
                OpRecord(id=oid, op="create_group", gid=gid, ranks=members, api="new_group")
            )
            read.records.append(RetRecord(id=oid))
    # where the rank stops: its earliest incomplete launch
    stop = next((i for i, ln in enumerate(all_launches) if not ln.completed(gloo)), None)
    queued: list[Launch] = []
    blocked_ids: list[int] = []
    blocked_stack: tuple[Frame, ...] = ()
    unknown_peers: set[str] = set()
    for index, launch in enumerate(all_launches):
        if stop is not None and index > stop and not launch.started(gloo):
            queued.append(launch)
            continue
        op_records = _ops(rank, launch, groups, ids, unknown_peers)
        if not op_records:
            continue
        read.records.extend(op_records)
        short = _never_launched(launch, absent) if gloo and launch.completed(gloo) else []
        if short:
            read.gone.update(short)
            err = (
                f"retired, but rank(s) {', '.join(map(str, short))} never launched it: "
                "it failed (gloo retires failed works too)"
            )
            read.records.extend(RetRecord(id=r.id, t=r.t, err=err) for r in op_records)
            read.notes.append(
                f"rank {rank}: {launch.head.profiling_name} on group "
                f"{launch.head.pg_name} (collective {launch.head.collective_seq_id}) {err}"
            )
            continue
        read.records.extend(RetRecord(id=r.id, t=r.t) for r in op_records)
        if launch.completed(gloo):
            read.records.extend(DoneRecord(id=r.id, t=r.t) for r in op_records)
        elif index == stop:
            blocked_ids = [r.id for r in op_records]
            blocked_stack = op_records[0].stack
    if blocked_ids:
        t = read.records[-1].t if isinstance(read.records[-1], OpRecord | RetRecord) else 0
        if len(blocked_ids) == 1:
            read.records.append(
                WaitRecord(id=ids.next(), t=t, tid=1, work=blocked_ids[0], stack=blocked_stack)
            )
        else:
            read.records.append(
                StateRecord(t=t, pending=tuple(blocked_ids), where="comm", stack=blocked_stack)
            )
    if queued:
        names = ", ".join(_describe(ln) for ln in queued[:3])
        more = f" and {len(queued) - 3} more" if len(queued) > 3 else ""
        read.notes.append(
            f"rank {rank}: {len(queued)} launch(es) after its earliest incomplete one were "
            f"not seen started ({names}{more}); read as queued behind it, not as posted"
        )
    if unknown_peers:
        read.notes.append(
            f"rank {rank}: no ranks in pg_config for group(s) {', '.join(sorted(unknown_peers))}; "
            "their P2P peers are read as global ranks"
        )
    return read


def _never_launched(launch: Launch, absent: dict[str, list[tuple[int, int]]] | None) -> list[int]:
    """The members with a dump that never launched this collective launch (a bisection:
    usually none, whatever the world size)."""
    head = launch.head
    if absent is None or head.is_p2p or head.collective_seq_id <= 0:
        return []
    tops = absent.get(head.pg_name, [])
    below = bisect.bisect_left(tops, (head.collective_seq_id, -1))
    return sorted(r for _, r in tops[:below])


def _describe(launch: Launch) -> str:
    head = launch.head
    return f"{head.profiling_name} on group {head.pg_name}"


def _peer(
    entry: FrEntry, groups: dict[str, tuple[int, ...]], unknown: set[str]
) -> tuple[str, int | None]:
    """(send | recv, the peer's global rank) of a P2P entry."""
    for kind, pattern in (("send", _SEND), ("recv", _RECV)):
        match = pattern.match(entry.name)
        if match:
            local = int(match.group(2))
            members = groups.get(entry.pg_name)
            if members is None:
                if entry.pg_name != "0":
                    unknown.add(entry.pg_name)
                return kind, local
            return kind, members[local] if local < len(members) else local
    kind = "send" if entry.name.startswith("send") else "recv"
    return kind, None


def _ops(
    rank: int,
    launch: Launch,
    groups: dict[str, tuple[int, ...]],
    ids: _Ids,
    unknown: set[str],
) -> list[OpRecord]:
    """The op records of a launch (a coalesced collective is one op)."""
    members = launch.entries
    p2p = [e for e in members if _is_p2p(e)]
    if p2p and len(p2p) == len(members):
        ops = []
        batch: int | None = None
        for entry in p2p:
            kind, peer = _peer(entry, groups, unknown)
            oid = ids.next()
            if len(p2p) > 1 or launch.closer is not None:
                batch = oid if batch is None else batch
            ops.append(
                OpRecord(
                    id=oid,
                    t=entry.time_created_ns,
                    tid=1,
                    gid=entry.pg_name,
                    seq=None,
                    op=kind,
                    peer=peer,
                    tag=0,
                    dtype=_dtype(entry),
                    count=_count(entry.input_sizes),
                    is_async=True,
                    batch=batch,
                    stack=_stack(entry),
                )
            )
        return ops
    if not members:
        return []
    head = members[0]
    name = OP_NAMES.get(head.name, head.name)
    count = sum(_count(e.input_sizes) for e in members)
    if launch.closer is not None and not name.endswith("_coalesced"):
        name = f"{name}_coalesced"
    if name == "scatter":
        count = _count(head.output_sizes)
    return [
        OpRecord(
            id=ids.next(),
            t=head.time_created_ns,
            tid=1,
            gid=head.pg_name,
            seq=head.collective_seq_id - 1 if head.collective_seq_id > 0 else None,
            op=name,
            dtype=_dtype(head),
            count=count,
            is_async=True,
            stack=_stack(head),
        )
    ]
