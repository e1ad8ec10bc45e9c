"""P2P matching, kept up to date op by op: channels, mailboxes, folding from the front.

Per channel (:func:`dl2.model.program.channel_key`: group, sender, receiver, tag) the
sends and the receives in program order; the k-th send meets the k-th receive.  A
wildcard receive waits in its *mailbox* (group, receiver, tag) until its sender is
known, then joins that sender's channel at its place in program order.  While it waits,
it meets the earliest send of the mailbox that no receive of its channel meets.

Each channel side is a list of the ops it keeps plus a ``base``: the position of its
first op kept (ops folded before it, or issued before a checkpoint).  An op whose
partner's position lies below the other side's base met an op issued before that
side's checkpoint: an *absent* op, complete.  A channel folds from its front: a pair
that meets, agrees and completed (or an op whose partner is absent); a receive after a
pending wildcard of its mailbox is kept, since the wildcard may still take its place.
"""

from __future__ import annotations

from bisect import bisect_left
from bisect import insort
from collections.abc import Callable

from dl2.model.execution_graph import OpKey
from dl2.model.program import Channel
from dl2.model.program import Mailbox
from dl2.model.program import channel_key
from dl2.model.program import mailbox
from dl2.model.rank_state import OpState
from dl2.trace.schema.decode import OpRecord


def _index(st: OpState) -> int:
    return st.index


class Side:
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


class Link:
    """A channel: its sends and receives, and whether it waits in the fold queue."""

    __slots__ = ("key", "queued", "recvs", "sends")

    def __init__(self, key: Channel) -> None:
        self.key = key
        self.sends = Side()
        self.recvs = Side()
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


def _box(st: OpState) -> Mailbox:
    return (st.rec.gid, st.rank, st.rec.tag or 0)


class Channels:
    """Every channel and mailbox (see the module docstring)."""

    def __init__(self) -> None:
        self._links: dict[Channel, Link] = {}
        self._pairs: dict[tuple[str, int, int], list[Link]] = {}  # (group, from, to) -> links
        self._mail: dict[Mailbox, set[Channel]] = {}  # mailbox -> channels into it
        self._pending: dict[Mailbox, list[OpState]] = {}  # wildcards of unknown sender

    @staticmethod
    def key(st: OpState) -> Channel | None:
        """The channel of a send or receive whose sender is known."""
        rec = st.rec
        if (rec.op != "send" and rec.op != "recv") or st.pending_wildcard:
            return None
        return channel_key(rec.op, rec.gid, st.rank, rec.peer, rec.tag, st.src)

    def _link(self, key: Channel) -> Link:
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = Link(key)
            self._mail.setdefault(mailbox(key), set()).add(key)
            self._pairs.setdefault((key[0], key[1], key[2]), []).append(link)
        return link

    def issued(self, gid: str, sender: int, receiver: int) -> tuple[int, int]:
        """The sends and the receives issued from ``sender`` to ``receiver`` on ``gid``,
        every tag, folded ones included (a wildcard receive once its sender is known)."""
        sends = recvs = 0
        for link in self._pairs.get((gid, sender, receiver), ()):
            sends += link.sends.end
            recvs += link.recvs.end
        return sends, recvs

    def unmatched(self, gid: str, sender: int, receiver: int, kind: str) -> list[OpState]:
        """The sends (``kind`` "send") or receives from ``sender`` to ``receiver`` on
        ``gid``, every tag, that no op of the other side meets, in program order: what
        the channels keep past the other side's end."""
        found = []
        for link in self._pairs.get((gid, sender, receiver), ()):
            side, other = (link.sends, link.recvs) if kind == "send" else (link.recvs, link.sends)
            for position in range(max(other.end, side.base), side.end):
                st = side.at(position)
                if st is not None:
                    found.append(st)
        found.sort(key=_index)
        return found

    def add(self, st: OpState) -> None:
        if st.pending_wildcard:
            waiting = self._pending.setdefault(_box(st), [])
            if not waiting or waiting[-1].index < st.index:
                waiting.append(st)
            else:
                insort(waiting, st, key=_index)
            return
        key = self.key(st)
        if key is not None:  # else a send without a peer: never matched
            link = self._link(key)
            (link.sends if st.rec.op == "send" else link.recvs).add(st)

    def resolved(self, st: OpState) -> None:
        """A wildcard receive learned its sender: it joins the sender's channel."""
        box = _box(st)
        waiting = self._pending.get(box, [])
        at = next((i for i, other in enumerate(waiting) if other is st), None)
        if at is not None:
            del waiting[at]
            if not waiting:
                del self._pending[box]
        self.add(st)

    def done(self, st: OpState) -> Link | None:
        """An op completed: its channel, to queue for folding unless it is queued."""
        key = self.key(st)
        link = self._links.get(key) if key is not None else None
        return link if link is not None and not link.queued else None

    def fold(self, link: Link, more: Callable[[], bool], forget: Callable[[OpState], None]) -> None:
        """Fold a channel's finished front while ``more`` says to."""
        if self._links.get(link.key) is not link:
            return
        sends, recvs = link.sends, link.recvs
        waiting = self._pending.get(mailbox(link.key))
        # a receive after a pending wildcard may still move back by one place
        before = waiting[0].index if waiting else None
        while more():
            send, recv = sends.first(), recvs.first()
            if recv is not None and before is not None and before < recv.index:
                recv = None
            if send is not None and recv is not None and sends.base == recvs.base:
                if not (send.done and recv.done and _agree(send, recv)):
                    return
                forget(sends.popleft())
                forget(recvs.popleft())
            elif send is not None and sends.base < recvs.base and send.done:
                forget(sends.popleft())  # its receive came before a checkpoint
            elif recv is not None and recvs.base < sends.base and recv.done:
                forget(recvs.popleft())
            else:
                return

    def remove_rank(self, rank: int) -> None:
        """Forget what a rank sent and received (its sides of every channel)."""
        for key, link in self._links.items():
            if key[1] == rank:
                link.sends.clear()
            if key[2] == rank:
                link.recvs.clear()
        for box in [b for b in self._pending if b[1] == rank]:
            del self._pending[box]

    def set_base(self, key: Channel, op: str, base: int) -> None:
        """A resumed rank's side of a channel starts at position ``base``."""
        link = self._link(key)
        side = link.sends if op == "send" else link.recvs
        side.clear()
        side.base = max(base, 0)

    def partner(self, st: OpState, read: dict[Mailbox, dict[OpKey, OpState]]) -> OpState | None:
        """The op that meets a send or receive, if any (``read``: the wildcard matches
        of the mailboxes read so far, filled as needed)."""
        rec = st.rec
        key = self.key(st)
        if key is not None:
            link = self._links[key]
            own, other = (link.sends, link.recvs) if rec.op == "send" else (link.recvs, link.sends)
            position = own.position(st)
            if position < other.base:
                return _absent(st, key)
            found = other.at(position)
            if found is not None or rec.op == "recv":
                return found
            box = mailbox(key)
        elif st.pending_wildcard:
            box = _box(st)
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
            link = self._links[key]
            sends = link.sends
            start = max(link.recvs.end, sends.base)
            available.extend(st for p in range(start, sends.end) if (st := sends.at(p)) is not None)
        available.sort(key=lambda s: (s.index, s.rank))
        found: dict[OpKey, OpState] = {}
        for recv, send in zip(waiting, available, strict=False):
            found[(recv.rank, recv.rec.id)] = send
            found[(send.rank, send.rec.id)] = recv
        return found
