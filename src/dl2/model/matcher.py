"""Cross-rank matching, kept up to date op by op, and the folding of finished history.

The :class:`Matcher` receives every op of every rank (from the rank models of
:mod:`dl2.model.rank_state`) and keeps:

* **collective slots**, keyed by group and position: a rank's i-th collective on a group
  goes to slot i of the group (positions are counted per rank and per group, so they
  are the recorded ``seq`` of a rank's collectives);
* **P2P channels** (:func:`dl2.model.program.channel_key`): per channel, the sends and
  the receives in program order; the k-th send meets the k-th receive.  A wildcard
  receive waits in its *mailbox* (group, receiver, tag) until its sender is known, and
  then joins that sender's channel at its place in program order.  While it waits, it
  meets the earliest send of the mailbox that no receive of its channel meets;
* the groups the traces create, and which ranks created each.

**Folding.** A slot that every member issued, that matches (no mismatch) and whose ops
all completed, and a send and receive that meet, agree and both completed, can never
matter to a verdict again: once the model keeps more ops than its window, the oldest
such units are dropped and counted (:attr:`Matcher.folded`).  Mismatched, unmatched,
failed or pending ops are never folded.  Each unit is queued once, when its last op
completes, so folding costs what the folded ops cost to read.

Each channel side is a list of the ops it keeps plus a ``base``: the position of its
first op kept (ops folded before it, or issued before a checkpoint).  A rank that
resumes from a checkpoint (:mod:`dl2.model.checkpoint`) has its positions start at the
checkpoint's counts: an op of a peer at a lower position met an op that was issued
before the checkpoint, which stands as a completed *absent* op.
"""

from __future__ import annotations

from bisect import bisect_left
from bisect import insort
from collections import deque
from collections.abc import Callable
from collections.abc import Iterable

from dl2.model.checkpoint import CheckpointRecord
from dl2.model.execution_graph import EXCHANGE_OPS
from dl2.model.execution_graph import CollectiveSlot
from dl2.model.execution_graph import OpKey
from dl2.model.execution_graph import differing_fields
from dl2.model.program import WILD
from dl2.model.program import Channel
from dl2.model.program import Mailbox
from dl2.model.program import channel_key
from dl2.model.program import mailbox
from dl2.model.rank_state import OpState
from dl2.trace.schema.decode import OpRecord

_P2P = ("send", "recv")


def _index(st: OpState) -> int:
    return st.index


class _Slot:
    """A collective slot as it fills: member rank -> its op at this position."""

    __slots__ = ("done", "gid", "ops", "pos", "queued")

    def __init__(self, gid: str, pos: int) -> None:
        self.gid = gid
        self.pos = pos
        self.ops: dict[int, OpState] = {}
        self.done = 0  # ops seen done
        self.queued = False


class _Side:
    """One direction of a channel: its ops kept, in program order, from position
    ``base`` on (``ops[head:]``: the front is dropped by moving ``head``)."""

    __slots__ = ("base", "head", "ops")

    def __init__(self) -> None:
        self.base = 0
        self.head = 0
        self.ops: list[OpState] = []

    def __len__(self) -> int:
        return len(self.ops) - self.head

    @property
    def end(self) -> int:
        """The position after the last op: the ops issued on this side."""
        return self.base + len(self.ops) - self.head

    def first(self) -> OpState | None:
        return self.ops[self.head] if self.head < len(self.ops) else None

    def at(self, position: int) -> OpState | None:
        """The op kept at an absolute position, if any."""
        j = position - self.base + self.head
        return self.ops[j] if self.head <= j < len(self.ops) else None

    def position(self, st: OpState) -> int:
        j = bisect_left(self.ops, st.index, lo=self.head, key=_index)
        assert j < len(self.ops) and self.ops[j] is st
        return self.base + j - self.head

    def add(self, st: OpState) -> None:
        if not len(self) or self.ops[-1].index < st.index:
            self.ops.append(st)
        else:
            insort(self.ops, st, lo=self.head, key=_index)

    def remove(self, st: OpState) -> None:
        del self.ops[self.position(st) - self.base + self.head]

    def popleft(self) -> OpState:
        st = self.ops[self.head]
        self.head += 1
        self.base += 1
        if self.head > 64 and self.head * 2 > len(self.ops):
            del self.ops[: self.head]
            self.head = 0
        return st

    def clear(self) -> None:
        self.base = self.head = 0
        self.ops = []


class _Channel:
    __slots__ = ("key", "queued", "recvs", "sends")

    def __init__(self, key: Channel) -> None:
        self.key = key
        self.sends = _Side()
        self.recvs = _Side()
        self.queued = False


def _agree(send: OpState, recv: OpState) -> bool:
    """dtype and count agree where both are recorded (else the pair is a defect)."""
    a, b = send.rec, recv.rec
    return (a.dtype is None or b.dtype is None or a.dtype == b.dtype) and (
        a.count is None or b.count is None or a.count == b.count
    )


def _absent(st: OpState, key: Channel) -> OpState:
    """The partner of ``st`` issued before its peer's checkpoint: complete, not kept."""
    gid, sender, receiver, tag = key
    send = st.rec.op == "recv"
    rec = OpRecord(
        id=-1, gid=gid, op="send" if send else "recv", peer=receiver if send else sender, tag=tag
    )
    other = OpState(rec, sender if send else receiver, -1)
    other.issued = other.completed = True
    return other


class Matcher:
    """Matches every rank's ops as they arrive (see the module docstring).

    Args:
        drop: called with each op folded away (its rank model forgets it).

    Attributes:
        slots: group -> position -> the collective slot kept there.
        creators: (group, ranks as recorded) -> the ranks that created it.
        world_size: ranks of the job (set by the model).
        retained: ops kept.
        folded: ops folded away.
    """

    def __init__(self, drop: Callable[[OpState], None]) -> None:
        self._drop = drop
        self.world_size = 0
        self.retained = 0
        self.folded = 0
        self.slots: dict[str, dict[int, _Slot]] = {}
        self.creators: dict[tuple[str, tuple[int, ...] | None], set[int]] = {}
        self._created: dict[str, dict[int, tuple[int, ...]]] = {}  # gid -> rank -> members
        self._issued: dict[str, dict[int, int]] = {}  # gid -> rank -> next position
        self._bases: dict[str, dict[int, int]] = {}  # gid -> resumed rank -> its first position
        self._channels: dict[Channel, _Channel] = {}
        self._mail: dict[Mailbox, set[Channel]] = {}  # mailbox -> channels into it
        self._pending: dict[Mailbox, list[OpState]] = {}  # wildcards of unknown sender
        self._queue: deque[_Slot | _Channel] = deque()
        self._members: dict[str, tuple[int, ...]] = {}

    # -- groups ------------------------------------------------------------------------

    def set_world(self, size: int) -> None:
        if size != self.world_size:
            self.world_size = size
            self._members.clear()

    def groups(self) -> dict[str, tuple[int, ...]]:
        """Group -> members: the world for "0", else what the highest rank that created
        the group (its last creation) gave it."""
        found = {"0": tuple(range(self.world_size))}
        for gid, by_rank in self._created.items():
            if by_rank:
                found[gid] = by_rank[max(by_rank)]
        return found

    def members(self, gid: str) -> tuple[int, ...]:
        """The members a slot of ``gid`` waits on: the group's, or for a group no trace
        created (other than the world), the ranks that issued on it."""
        found = self._members.get(gid)
        if found is None:
            created = self._created.get(gid)
            if created:
                found = created[max(created)]
            elif gid == "0":
                found = tuple(range(self.world_size))
            else:
                found = tuple(sorted(self._issued.get(gid, ())))
            self._members[gid] = found
        return found

    def _create(self, gid: str, rank: int, ranks: tuple[int, ...] | None) -> None:
        self.creators.setdefault((gid, ranks), set()).add(rank)
        if ranks is not None:
            self._created.setdefault(gid, {})[rank] = tuple(sorted(ranks))
            self._members.pop(gid, None)

    # -- ops arriving ------------------------------------------------------------------

    def add(self, st: OpState, pos: int | None = None) -> None:
        """A new op (``pos``: a resumed collective's recorded position)."""
        rec = st.rec
        self.retained += 1
        op = rec.op
        if op == "send" or op == "recv":
            self._add_p2p(st)
            return
        if op == "create_group":
            self._create(rec.gid, st.rank, rec.ranks)
            return
        gid, rank = rec.gid, st.rank
        issued = self._issued.get(gid)
        if issued is None:
            issued = self._issued[gid] = {}
        if pos is None:
            pos = issued.get(rank)
            if pos is None:
                pos = 0
                self._members.pop(gid, None)
            issued[rank] = pos + 1
        st.pos = pos
        group = self.slots.get(gid)
        if group is None:
            group = self.slots[gid] = {}
        slot = group.get(pos)
        if slot is None:
            slot = group[pos] = _Slot(gid, pos)
        slot.ops[rank] = st

    def _add_p2p(self, st: OpState) -> None:
        rec = st.rec
        if st.pending_wildcard:
            box = (rec.gid, st.rank, rec.tag or 0)
            waiting = self._pending.setdefault(box, [])
            if not waiting or waiting[-1].index < st.index:
                waiting.append(st)
            else:
                insort(waiting, st, key=_index)
            return
        key = channel_key(rec.op, rec.gid, st.rank, rec.peer, rec.tag, st.src)
        if key is None:
            return  # a send without a peer: never matched
        chan = self._channels.get(key)
        if chan is None:
            chan = self._channels[key] = _Channel(key)
            self._mail.setdefault(mailbox(key), set()).add(key)
        (chan.sends if rec.op == "send" else chan.recvs).add(st)

    def resolved(self, st: OpState) -> None:
        """A wildcard receive learned its sender: it joins the sender's channel."""
        rec = st.rec
        box = (rec.gid, st.rank, rec.tag or 0)
        waiting = self._pending.get(box)
        if waiting is not None and st in waiting:
            waiting.remove(st)
            if not waiting:
                del self._pending[box]
        self._add_p2p(st)

    def done(self, st: OpState) -> None:
        """An op completed: queue its slot or channel for folding once all of it did."""
        rec = st.rec
        op = rec.op
        if op == "send" or op == "recv":
            chan = self._channel(st)
            if chan is not None and not chan.queued:
                chan.queued = True
                self._queue.append(chan)
            return
        gid = rec.gid
        group = self.slots.get(gid)
        slot = group.get(st.pos) if group is not None else None
        if slot is None or slot.queued:
            return
        slot.done += 1
        have = len(slot.ops)
        if slot.done < have:
            return
        members = self._members.get(gid)
        if members is None:
            members = self.members(gid)
        if (have >= len(members) or gid in self._bases) and self._finished(slot):
            slot.queued = True
            self._queue.append(slot)

    def _channel(self, st: OpState) -> _Channel | None:
        rec = st.rec
        if st.pending_wildcard:
            return None
        key = channel_key(rec.op, rec.gid, st.rank, rec.peer, rec.tag, st.src)
        return self._channels.get(key) if key is not None else None

    # -- folding -----------------------------------------------------------------------

    def _finished(self, slot: _Slot) -> bool:
        """Every member issued the slot (or did before its checkpoint), and every op
        of it is done."""
        members = self.members(slot.gid)
        bases = self._bases.get(slot.gid)
        have = len(slot.ops)
        if bases:
            have += sum(1 for r, b in bases.items() if b > slot.pos and r not in slot.ops)
        if have < len(members):
            return False
        ops = slot.ops
        if not all(r in ops or (bases and bases.get(r, 0) > slot.pos) for r in members):
            return False
        return all(st.done for st in ops.values())

    def _mismatched(self, slot: _Slot) -> bool:
        if not self._varied(slot):
            return False
        return bool(
            differing_fields({st.rank: st.rec for st in slot.ops.values()}, self.members(slot.gid))
        )

    def fold(self, limit: int) -> None:
        """Fold the oldest finished units until at most ``limit`` ops are kept."""
        queue = self._queue
        while self.retained > limit and queue:
            unit = queue.popleft()
            unit.queued = False
            if isinstance(unit, _Slot):
                self._fold_slot(unit)
            else:
                self._fold_channel(unit, limit)

    def _fold_slot(self, slot: _Slot) -> None:
        group = self.slots.get(slot.gid)
        if group is None or group.get(slot.pos) is not slot:
            return
        if not self._finished(slot) or self._mismatched(slot):
            return
        del group[slot.pos]
        if not group:
            del self.slots[slot.gid]
        for st in slot.ops.values():
            self._forget(st)

    def _forget(self, st: OpState) -> None:
        self.retained -= 1
        self.folded += 1
        self._drop(st)

    def _fold_channel(self, chan: _Channel, limit: int) -> None:
        if self._channels.get(chan.key) is not chan:
            return
        sends, recvs = chan.sends, chan.recvs
        waiting = self._pending.get(mailbox(chan.key))
        # a receive after a pending wildcard may still move back by one place
        before = waiting[0].index if waiting else None
        while self.retained > limit:
            send, recv = sends.first(), recvs.first()
            if recv is not None and before is not None and before < recv.index:
                recv = None
            if send is not None and recv is not None and sends.base == recvs.base:
                if not (send.done and recv.done and _agree(send, recv)):
                    return
                self._forget(sends.popleft())
                self._forget(recvs.popleft())
            elif send is not None and sends.base < recvs.base and send.done:
                self._forget(sends.popleft())  # its receive came before a checkpoint
            elif recv is not None and recvs.base < sends.base and recv.done:
                self._forget(recvs.popleft())
            else:
                return

    # -- ranks leaving and resuming ----------------------------------------------------

    def remove_rank(self, rank: int, ops: Iterable[OpState]) -> None:
        """Forget a rank's ops and positions (its trace went away, or restarts)."""
        for st in list(ops):
            self.retained -= 1
            rec = st.rec
            if st.pos >= 0:
                group = self.slots.get(rec.gid, {})
                slot = group.get(st.pos)
                if slot is not None:
                    slot.ops.pop(rank, None)
                    if not slot.ops:
                        del group[st.pos]
        for per_group in (self._issued, self._bases, self._created):
            for by_rank in per_group.values():
                by_rank.pop(rank, None)  # type: ignore[attr-defined]
        for creators in self.creators.values():
            creators.discard(rank)
        for key, chan in self._channels.items():
            if key[1] == rank:
                chan.sends.clear()
            if key[2] == rank:
                chan.recvs.clear()
        for box in [b for b in self._pending if b[1] == rank]:
            del self._pending[box]
        self._members.clear()

    def resume(self, rank: int, ck: CheckpointRecord, open_ops: list[OpState]) -> None:
        """Start a rank at a checkpoint: its positions, groups and open ops."""
        for gid, count in ck.collectives.items():
            self._issued.setdefault(gid, {})[rank] = count
            self._bases.setdefault(gid, {})[rank] = count
            self._members.pop(gid, None)
        for gid, ranks in ck.groups.items():
            self._create(gid, rank, ranks)
        opened: dict[tuple[Channel, str], int] = {}
        for st in open_ops:
            key = self._key(st)
            if key is not None:
                opened[(key, st.rec.op)] = opened.get((key, st.rec.op), 0) + 1
        for gid, sender, receiver, tag, count in ck.channels:
            key = (gid, sender, receiver, tag)
            if sender == rank:
                self._side_base(key, "send", count - opened.get((key, "send"), 0))
            if receiver == rank and sender != WILD:
                self._side_base(key, "recv", count - opened.get((key, "recv"), 0))
        later: dict[str, int] = {}  # open collectives of each group after this one
        positions: list[int | None] = []
        for st in reversed(open_ops):
            rec = st.rec
            if rec.op in _P2P or rec.op == "create_group":
                positions.append(None)
                continue
            count = ck.collectives.get(rec.gid, 0)
            positions.append(rec.seq if rec.seq is not None else count - 1 - later.get(rec.gid, 0))
            later[rec.gid] = later.get(rec.gid, 0) + 1
        for st, pos in zip(open_ops, reversed(positions), strict=True):
            self.add(st, pos)

    def _key(self, st: OpState) -> Channel | None:
        rec = st.rec
        if rec.op not in _P2P or st.pending_wildcard:
            return None
        return channel_key(rec.op, rec.gid, st.rank, rec.peer, rec.tag, st.src)

    def _side_base(self, key: Channel, op: str, base: int) -> None:
        chan = self._channels.get(key)
        if chan is None:
            chan = self._channels[key] = _Channel(key)
            self._mail.setdefault(mailbox(key), set()).add(key)
        side = chan.sends if op == "send" else chan.recvs
        side.clear()
        side.base = max(base, 0)

    # -- reading -----------------------------------------------------------------------

    def slot(self, gid: str, pos: int) -> CollectiveSlot | None:
        """The slot at a position of a group, as a :class:`CollectiveSlot`."""
        slot = self.slots.get(gid, {}).get(pos)
        if slot is None:
            return None
        members = self.members(gid)
        ops = {r: slot.ops[r].op() for r in sorted(slot.ops)}
        bases = self._bases.get(gid, {})
        missing = tuple(r for r in members if r not in ops and bases.get(r, 0) <= pos)
        return CollectiveSlot(gid, pos, ops, missing, differing_fields(ops, members))

    def unsettled(self, gid: str) -> list[int]:
        """The positions of a group's slots kept that may be mismatched or miss a
        member, ascending (a superset: every other slot is full and uniform)."""
        members = len(self.members(gid))
        bases = self._bases.get(gid)
        found = []
        for pos, slot in self.slots[gid].items():
            ops = slot.ops
            if len(ops) < members or bases or self._varied(slot):
                found.append(pos)
        found.sort()
        return found

    @staticmethod
    def _varied(slot: _Slot) -> bool:
        """Whether the slot's ops may disagree: not all recorded alike (an all_to_all's
        sizes are always checked)."""
        recs = [st.rec for st in slot.ops.values()]
        first = recs[0]
        if first.op in EXCHANGE_OPS:
            return True
        same = (first.op, first.root, first.redop, first.dtype, first.count, first.splits)
        return any((r.op, r.root, r.redop, r.dtype, r.count, r.splits) != same for r in recs)

    def partner(self, st: OpState, read: dict[Mailbox, dict[OpKey, OpState]]) -> OpState | None:
        """The op that meets a send or receive, if any (``read``: the wildcard matches
        of the mailboxes read so far, filled as needed)."""
        rec = st.rec
        key = self._key(st)
        if key is not None:
            chan = self._channels[key]
            own, other = (chan.sends, chan.recvs) if rec.op == "send" else (chan.recvs, chan.sends)
            position = own.position(st)
            if position < other.base:
                return _absent(st, key)
            found = other.at(position)
            if found is not None or rec.op == "recv":
                return found
            box = mailbox(key)
        elif st.pending_wildcard:
            box = (rec.gid, st.rank, rec.tag or 0)
        else:
            return None
        matches = read.get(box)
        if matches is None:
            matches = read[box] = self._wildcard_matches(box)
        return matches.get((st.rank, rec.id))

    def _wildcard_matches(self, box: Mailbox) -> dict[OpKey, OpState]:
        """The pending wildcards of a mailbox, each with the earliest send no receive
        of its channel meets (in program order, then rank), both ways."""
        waiting = self._pending.get(box)
        if not waiting:
            return {}
        available: list[OpState] = []
        for key in self._mail.get(box, ()):
            chan = self._channels[key]
            sends = chan.sends
            start = max(chan.recvs.end, sends.base)
            available.extend(st for p in range(start, sends.end) if (st := sends.at(p)) is not None)
        available.sort(key=lambda s: (s.index, s.rank))
        found: dict[OpKey, OpState] = {}
        for recv, send in zip(waiting, available, strict=False):
            found[(recv.rank, recv.rec.id)] = send
            found[(send.rank, send.rec.id)] = recv
        return found
