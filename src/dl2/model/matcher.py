"""Cross-rank matching, kept up to date op by op, and the folding of finished history.

The :class:`Matcher` receives every op of every rank (from the rank models of
:mod:`dl2.model.rank_state`) and keeps:

* **collective slots**, keyed by group and position: a rank's i-th collective on a group
  goes to slot i of the group (positions are counted per rank and per group, so they
  are the recorded ``seq`` of a rank's collectives);
* **P2P channels and mailboxes** (:mod:`dl2.model.channels`);
* the groups the traces create, and which ranks created each;
* the c10d store keys the ranks set, and which ranks set each.

**Folding.** A slot that every member issued, that matches (no mismatch) and whose ops
all completed, and a send and receive that meet, agree and both completed, can never
matter to a verdict again: once the model keeps more ops than its window, the oldest
such units are dropped and counted (:attr:`Matcher.folded`).  Mismatched, unmatched,
failed or pending ops are never folded.  Each unit is queued once, when its last op
completes, so folding costs what the folded ops cost to read.

A rank that resumes from a checkpoint (:mod:`dl2.model.checkpoint`) has its positions
start at the checkpoint's counts: a slot position below a member's count was issued by
it before the checkpoint, and is not missing it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import msgspec

from dl2.model.channels import Channels
from dl2.model.channels import Link
from dl2.model.checkpoint import CheckpointRecord
from dl2.model.execution_graph import EXCHANGE_OPS
from dl2.model.execution_graph import CollectiveSlot
from dl2.model.execution_graph import OpKey
from dl2.model.execution_graph import call_key
from dl2.model.execution_graph import differing_fields
from dl2.model.program import WILD
from dl2.model.program import Channel
from dl2.model.program import Mailbox
from dl2.model.rank_state import OpState
from dl2.trace.schema.decode import OpRecord

_P2P = ("send", "recv")
#: ops that take no collective slot
_UNSLOTTED = frozenset({"send", "recv", "create_group"})


class _Slot(msgspec.Struct, gc=False):
    """A collective slot as it fills: member rank -> its op at this position, and how
    many of them are done (untracked by the garbage collector, like the ops)."""

    gid: str
    pos: int
    ops: dict[int, OpState] = msgspec.field(default_factory=dict)
    done: int = 0
    queued: bool = False
    #: the record of the first op placed here, which every later one is compared with
    first: OpRecord | None = None
    #: the ops may disagree: one was recorded otherwise than ``first``, or ``first`` is
    #: an all_to_all, whose sizes are always checked (never reset: a superset)
    varied: bool = False
    #: the matcher's epoch when the slot was queued, finished (see ``Matcher._epoch``)
    epoch: int = -1


def _differs(rec: OpRecord, first: OpRecord | None) -> bool:
    """Whether a collective's record differs from ``first`` in what matching compares."""
    return first is None or call_key(rec) != call_key(first)


class Matcher:
    """Matches every rank's ops as they arrive (see the module docstring).

    Args:
        kept: rank -> its ops kept (op id -> state, the rank model's ``ops``), which
            the model fills as ranks come and go; a folded op is removed from it.

    Attributes:
        slots: group -> position -> the collective slot kept there.
        creators: (group, ranks as recorded) -> the ranks that created it.
        store_keys: store key (:func:`dl2.model.ops.store_key`) -> the ranks that set it.
        world_size: ranks of the job (set by the model).
        retained: ops kept.
        folded: ops folded away.
    """

    def __init__(self, kept: dict[int, dict[int, OpState]]) -> None:
        self._kept = kept
        self.world_size = 0
        self._world: tuple[int, ...] = ()
        self.retained = 0
        self.folded = 0
        self.slots: dict[str, dict[int, _Slot]] = {}
        self.creators: dict[tuple[str, tuple[int, ...] | None], set[int]] = {}
        self.store_keys: dict[str, set[int]] = {}
        self._created: dict[str, dict[int, tuple[int, ...]]] = {}  # gid -> rank -> members
        self._sorted: dict[int, tuple[Any, tuple[int, ...]]] = {}  # id(ranks) -> (ranks, sorted)
        # (gid, id(ranks)) -> (ranks, its creators set): a tuple's hash is not cached, and
        # hashing the world's ranks for each of W creators cost O(W^2)
        self._creator_sets: dict[tuple[str, int], tuple[Any, set[int]]] = {}
        self._top: dict[str, int] = {}  # gid -> the highest rank that created it
        self._issued: dict[str, dict[int, int]] = {}  # gid -> rank -> next position
        self._bases: dict[str, dict[int, int]] = {}  # gid -> resumed rank -> its first position
        self.channels = Channels()
        self.p2p_ranks: set[int] = set()  # the ranks that issued a send or receive
        self._queue: deque[_Slot | Link] = deque()
        self._members: dict[str, tuple[int, ...]] = {}
        self._member_sets: dict[str, frozenset[int]] = {}
        # bumped whenever members or checkpoint bases may change, and when a rank's ops
        # leave the slots: a slot queued as finished in the current epoch, with as many
        # ops done as it holds, is still finished (its members are all there)
        self._epoch = 0

    # -- groups ------------------------------------------------------------------------

    def set_world(self, size: int) -> None:
        if size != self.world_size:
            self.world_size = size
            self._world = tuple(range(size))
            self._forget_members()

    def groups(self) -> dict[str, tuple[int, ...]]:
        """Group -> members: the world for "0", else what the highest rank that created
        the group (its last creation) gave it."""
        found = {"0": self._world}
        for gid, by_rank in self._created.items():
            if by_rank:
                found[gid] = by_rank[max(by_rank)]
        return found

    def issued_count(self, gid: str, rank: int) -> int:
        """The collectives ``rank`` issued on ``gid``: its next position there."""
        return self._issued.get(gid, {}).get(rank, 0)

    def members(self, gid: str) -> tuple[int, ...]:
        """The members a slot of ``gid`` waits on: the group's, or for a group no trace
        created (other than the world), the ranks that issued on it."""
        found = self._members.get(gid)
        if found is None:
            created = self._created.get(gid)
            if created:
                top = self._top.get(gid)
                if top is None or top not in created:
                    top = self._top[gid] = max(created)
                found = created[top]
            elif gid == "0":
                found = self._world
            else:
                found = tuple(sorted(self._issued.get(gid, ())))
            self._members[gid] = found
        return found

    def _forget_members(self, gid: str | None = None) -> None:
        """The members of ``gid`` (None: of every group) may have changed."""
        self._epoch += 1
        if gid is None:
            self._members.clear()
            self._member_sets.clear()
        else:
            self._members.pop(gid, None)
            self._member_sets.pop(gid, None)

    def _create(self, gid: str, rank: int, ranks: tuple[int, ...] | None) -> None:
        known_set = self._creator_sets.get((gid, id(ranks)))
        if known_set is None or known_set[0] is not ranks:
            creators = self.creators.setdefault((gid, ranks), set())
            known_set = self._creator_sets[(gid, id(ranks))] = (ranks, creators)
        known_set[1].add(rank)
        if ranks is not None:
            # ranks read from a range are one tuple shared by every rank: sort it once
            known = self._sorted.get(id(ranks))
            if known is None or known[0] is not ranks:
                known = self._sorted[id(ranks)] = (ranks, tuple(sorted(ranks)))
            by_rank = self._created.setdefault(gid, {})
            by_rank[rank] = known[1]
            top = self._top.get(gid)
            if top is None:
                top = max(by_rank)
            elif rank > top:
                top = rank
            self._top[gid] = top
            # members are the top creator's: unchanged (the same tuple) costs nothing,
            # so W ranks creating the world group cost O(W), not O(W^2)
            if top == rank and self._members.get(gid) is not known[1]:
                self._forget_members(gid)

    # -- ops arriving ------------------------------------------------------------------

    def add(self, st: OpState, pos: int | None = None) -> None:
        """A new op (``pos``: a resumed collective's recorded position)."""
        rec = st.rec
        self.retained += 1
        op = rec.op
        if op == "send" or op == "recv":
            self.p2p_ranks.add(st.rank)
            self.channels.add(st)
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
                if gid != "0" and not self._created.get(gid):
                    # the members of a group no trace created are the ranks that issued
                    # on it (the world's and a created group's do not change here: forgetting
                    # them for each new rank cost O(world) each, O(world^2) in all)
                    self._forget_members(gid)
            issued[rank] = pos + 1
        st.pos = pos
        group = self.slots.get(gid)
        if group is None:
            group = self.slots[gid] = {}
        slot = group.get(pos)
        if slot is None:
            slot = group[pos] = _Slot(gid, pos, first=rec, varied=op in EXCHANGE_OPS)
        elif not slot.varied:
            slot.varied = _differs(rec, slot.first)
        slot.ops[rank] = st

    def add_done(self, st: OpState) -> None:
        """A new op that is already done (issued and completed without error): what
        :meth:`add` then :meth:`done` do, in one call."""
        self.add_done_many((st,))

    def add_done_many(self, sts: Sequence[OpState]) -> None:
        """:meth:`add_done` of each of ``sts``, in order: the hot path of blocking calls
        (a rank's run of them comes in one call; what depends only on the group is looked
        up once per group, not once per op; dictionary subscripts rather than ``get``)."""
        slots = self.slots
        issued_of = self._issued
        member_sets = self._member_sets
        bases = self._bases
        gid_at: str | None = None
        issued: dict[int, int] = {}
        group: dict[int, _Slot] = {}
        for st in sts:
            rec = st.rec
            op = rec.op
            if op in _UNSLOTTED:
                gid_at = None  # (a group's creation may change what is cached)
                self.add(st)
                self.done(st)
                continue
            gid = rec.gid
            if gid != gid_at:
                try:
                    issued = issued_of[gid]
                except KeyError:
                    issued = issued_of[gid] = {}
                try:
                    group = slots[gid]
                except KeyError:
                    group = slots[gid] = {}
                gid_at = gid
            rank = st.rank
            try:
                pos = issued[rank]
            except KeyError:  # its first op on the group
                pos = 0
                if gid != "0" and not self._created.get(gid):
                    self._forget_members(gid)
            self.retained += 1
            issued[rank] = pos + 1
            st.pos = pos
            slot = group.get(pos)
            if slot is None:
                slot = group[pos] = _Slot(gid, pos, {rank: st}, 1, False, rec, op in EXCHANGE_OPS)
                have = 1
            else:
                if not slot.varied:
                    first = slot.first
                    slot.varied = (
                        rec.op != first.op  # type: ignore[union-attr]
                        or rec.dtype != first.dtype  # type: ignore[union-attr]
                        or rec.count != first.count  # type: ignore[union-attr]
                        or rec.redop != first.redop  # type: ignore[union-attr]
                        or rec.root != first.root  # type: ignore[union-attr]
                        or rec.splits != first.splits  # type: ignore[union-attr]
                    )
                ops = slot.ops
                ops[rank] = st
                slot.done += 1
                have = len(ops)
                if slot.done != have or slot.queued:
                    continue
            members = member_sets.get(gid)
            if members is not None and have < len(members) and gid not in bases:
                continue  # not every member issued it yet
            if self._finished(slot):
                slot.queued = True
                slot.epoch = self._epoch
                self._queue.append(slot)

    def done(self, st: OpState) -> None:
        """An op completed: queue its slot or channel for folding once all of it did."""
        rec = st.rec
        op = rec.op
        if op == "send" or op == "recv":
            link = self.channels.done(st)
            if link is not None:
                link.queued = True
                self._queue.append(link)
            return
        gid = rec.gid
        group = self.slots.get(gid)
        slot = group.get(st.pos) if group is not None else None
        if slot is None:
            return
        slot.done += 1
        have = len(slot.ops)
        if slot.done != have or slot.queued:
            return
        members = self._member_sets.get(gid)
        if members is not None and have < len(members) and gid not in self._bases:
            return  # not every member issued it yet
        if self._finished(slot):
            slot.queued = True
            slot.epoch = self._epoch
            self._queue.append(slot)

    def resolved(self, st: OpState) -> None:
        """A wildcard receive learned its sender."""
        self.channels.resolved(st)

    def undone(self, st: OpState) -> None:
        """A done op failed after all (a later wait on it raised)."""
        rec = st.rec
        if rec.op not in _P2P and rec.op != "create_group":
            slot = self.slots.get(rec.gid, {}).get(st.pos)
            if slot is not None:
                slot.done -= 1

    def _finished(self, slot: _Slot) -> bool:
        """Every op of the slot is done, and every member issued it (or did before its
        checkpoint)."""
        ops = slot.ops
        if slot.done != len(ops):
            return False
        members = self._member_sets.get(slot.gid)
        if members is None:
            members = self._member_sets[slot.gid] = frozenset(self.members(slot.gid))
        if len(ops) >= len(members) and members <= ops.keys():
            return True
        bases = self._bases.get(slot.gid)
        if not bases:
            return False
        return all(r in ops or bases.get(r, 0) > slot.pos for r in members)

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
                self.channels.fold(unit, lambda: self.retained > limit, self._forget)

    def _fold_slot(self, slot: _Slot) -> None:
        group = self.slots.get(slot.gid)
        if group is None or group.get(slot.pos) is not slot:
            return
        fresh = slot.epoch == self._epoch and slot.done == len(slot.ops)
        if not fresh and not self._finished(slot):
            return
        if slot.varied and self._mismatched(slot):
            return
        del group[slot.pos]
        if not group:
            del self.slots[slot.gid]
        folded = len(slot.ops)
        self.retained -= folded
        self.folded += folded
        kept = self._kept
        for rank, st in slot.ops.items():
            kept[rank].pop(st.rec.id, None)

    def _forget(self, st: OpState) -> None:
        self.retained -= 1
        self.folded += 1
        self._kept[st.rank].pop(st.rec.id, None)

    # -- store keys --------------------------------------------------------------------

    def store_set(self, rank: int, key: str) -> None:
        """Rank ``rank`` set the store key ``key`` (a ``store`` record of a set)."""
        self.store_keys.setdefault(key, set()).add(rank)

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
        self._top.clear()
        for creators in self.creators.values():
            creators.discard(rank)
        for setters in self.store_keys.values():
            setters.discard(rank)
        self.channels.remove_rank(rank)
        self.p2p_ranks.discard(rank)
        self._forget_members()

    def resume(self, rank: int, ck: CheckpointRecord, open_ops: list[OpState]) -> None:
        """Start a rank at a checkpoint: its positions, groups and open ops."""
        for gid, count in ck.collectives.items():
            self._issued.setdefault(gid, {})[rank] = count
            self._bases.setdefault(gid, {})[rank] = count
            self._forget_members(gid)
        for gid, ranks in ck.groups.items():
            self._create(gid, rank, ranks)
        opened: dict[tuple[Channel, str], int] = {}
        for st in open_ops:
            key = self.channels.key(st)
            if key is not None:
                opened[(key, st.rec.op)] = opened.get((key, st.rec.op), 0) + 1
        for gid, sender, receiver, tag, count in ck.channels:
            key = (gid, sender, receiver, tag)
            if sender == rank:
                self.channels.set_base(key, "send", count - opened.get((key, "send"), 0))
            if receiver == rank and sender != WILD:
                self.channels.set_base(key, "recv", count - opened.get((key, "recv"), 0))
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
        sizes are always checked); kept as the ops arrive."""
        return slot.varied

    def partner(self, st: OpState, read: dict[Mailbox, dict[OpKey, OpState]]) -> OpState | None:
        """The op that meets a send or receive (see :meth:`Channels.partner`)."""
        return self.channels.partner(st, read)
