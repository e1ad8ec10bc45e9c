"""What a rank's stream of records has issued so far and what is still open.

A :class:`StreamState` follows the records of one rank in order and holds what a
``checkpoint`` record carries (see :mod:`dl2.trace.schema`): the next id, the number of
op records, the per-group collective counts, the per-channel P2P counts, the groups
created, the ops entered and not complete, the open waits and the new_group calls.  The
recorder's encoder keeps one to write checkpoints (its payloads are compact tuples);
the reader side feeds typed records into one to check and use them (its payloads are
the records).  The rules of what opens, settles and counts an op are here, once.

Standard library only: the recorder runs it inside every rank.
"""

from __future__ import annotations

from typing import Any

#: Op families: a collective counts on its group (its ``seq`` is the group's index), a
#: P2P op on its channel, a create_group records its group.
COLLECTIVE, P2P, GROUP = 0, 1, 2
#: The sender of a wildcard receive in a channel.
ANY_SOURCE = -1
#: Ops of a blocking call that are complete once the call returns (no work to wait on).
_SETTLE_ON_RETURN = frozenset({"create_group", "monitored_barrier"})

Channel = tuple[str, int, int, int]  # (gid, sender, receiver, tag)


def op_family(op: str) -> int:
    """COLLECTIVE, P2P or GROUP."""
    if op in ("send", "recv"):
        return P2P
    return GROUP if op == "create_group" else COLLECTIVE


def settles_on_return(op: str, is_async: bool, eager: bool) -> bool:
    """Whether the op is complete when its call returns: an eager send, or a blocking
    create_group / monitored_barrier (they hand back no work)."""
    return eager or (not is_async and op in _SETTLE_ON_RETURN)


def channel_of(gid: str, op: str, peer: int | None, tag: int | None, me: int) -> Channel:
    """The channel of a P2P op of rank ``me``; a wildcard recv's sender is ANY_SOURCE."""
    if op == "send":
        return (gid, me, ANY_SOURCE if peer is None else peer, tag or 0)
    return (gid, ANY_SOURCE if peer is None else peer, me, tag or 0)


def seq_key(gid: str, op: str, peer: int | None) -> Any:
    """What an op's ``seq`` counts on: its group for a collective, ``(gid, peer, op)``
    for a P2P op (the recorder's per-peer, per-direction index), None for create_group."""
    family = op_family(op)
    if family == COLLECTIVE:
        return gid
    return (gid, peer, op) if family == P2P else None


class StreamState:
    """The checkpoint state of a stream, kept up to date record by record.

    Attributes:
        next_id: one more than the highest id seen.
        ops_before: op records seen.
        seqs: ``seq_key`` -> the seq the next op of that key is expected to have (a
            collective's key is its gid: these are the checkpoint's ``collectives``).
        channels: P2P ops per channel.
        groups: gid -> global ranks, for every group created.
        open: op id -> (payload, async, settles on return): entered, not complete,
            not failed.
        issued: ids among ``open`` whose call returned.
        waits: wait id -> (op id waited on, payload): entered, not returned.
        newgroups: payloads of the new_group calls.
    """

    __slots__ = (
        "channels", "groups", "issued", "newgroups", "next_id", "open", "ops_before",
        "seqs", "waits",
    )  # fmt: skip

    def __init__(self) -> None:
        self.next_id = 1
        self.ops_before = 0
        self.seqs: dict[Any, int] = {}
        self.channels: dict[Channel, int] = {}
        self.groups: dict[str, list[int] | None] = {}
        self.open: dict[int, tuple[Any, bool, bool]] = {}
        self.issued: set[int] = set()
        self.waits: dict[int, tuple[int, Any]] = {}
        self.newgroups: list[Any] = []

    # -- records in --------------------------------------------------------------------

    def opened(
        self,
        oid: int,
        payload: Any,
        skey: Any,
        seq: int | None,
        chan: Channel | None,
        is_async: bool,
        settles: bool,
    ) -> None:
        """An op record: ``skey`` its :func:`seq_key`, ``chan`` its channel (P2P)."""
        if oid >= self.next_id:
            self.next_id = oid + 1
        self.ops_before += 1
        self.open[oid] = (payload, is_async, settles)
        if skey is not None:
            seqs = self.seqs
            seqs[skey] = (seqs.get(skey, 0) if seq is None else seq) + 1
        if chan is not None:
            channels = self.channels
            channels[chan] = channels.get(chan, 0) + 1

    def created(self, gid: str, ranks: list[int] | None) -> None:
        self.groups[gid] = ranks

    def returned(self, rid: int, failed: bool) -> None:
        """A ``ret`` of op or wait ``rid`` (``failed``: it raised)."""
        wait = self.waits.pop(rid, None)
        if wait is not None:
            self.open.pop(wait[0], None)  # the op completed (or failed in its wait)
            self.issued.discard(wait[0])
            return
        entry = self.open.get(rid)
        if entry is None:
            return
        if failed or entry[2]:
            del self.open[rid]
            self.issued.discard(rid)
        else:
            self.issued.add(rid)

    def issued_waiting(self, oid: int, wid: int, payload: Any) -> None:
        """A blocking op's ``ret`` and the ``wait`` on it at once (its ``b`` line)."""
        entry = self.open.get(oid)
        if entry is not None:
            if entry[2]:
                del self.open[oid]
            else:
                self.issued.add(oid)
        if wid >= self.next_id:
            self.next_id = wid + 1
        self.waits[wid] = (oid, payload)

    def issued_and_done(self, oid: int, wid: int) -> None:
        """A blocking op's ``ret``, the ``wait`` on it and the wait's ``ret``, at once."""
        if wid >= self.next_id:
            self.next_id = wid + 1
        if self.open.pop(oid, None) is not None:
            self.issued.discard(oid)

    def waited(self, wid: int, work: int, payload: Any) -> None:
        if wid >= self.next_id:
            self.next_id = wid + 1
        self.waits[wid] = (work, payload)

    def completed(self, oid: int) -> None:
        """A ``done``: async op ``oid`` was seen complete."""
        self.open.pop(oid, None)
        self.issued.discard(oid)

    def called_new_group(self, nid: int, payload: Any) -> None:
        if nid >= self.next_id:
            self.next_id = nid + 1
        self.newgroups.append(payload)

    # -- what a checkpoint says ------------------------------------------------------------

    def collectives(self) -> dict[str, int]:
        """gid -> collectives issued on it so far (the next collective ``seq``)."""
        return {k: n for k, n in self.seqs.items() if isinstance(k, str)}

    def pending(self) -> list[int]:
        """Async ops issued and not yet seen complete."""
        return sorted(i for i in self.issued if self.open[i][1])

    def resync_seqs(self, me: int) -> None:
        """Reset the P2P seq expectations to what the channel counts say (what a reader
        starting at a checkpoint knows), keeping the collectives'."""
        seqs: dict[Any, int] = self.collectives()
        for (gid, sender, receiver, _tag), count in self.channels.items():
            if sender == me:
                key: Any = (gid, None if receiver == ANY_SOURCE else receiver, "send")
            else:
                key = (gid, None if sender == ANY_SOURCE else sender, "recv")
            seqs[key] = seqs.get(key, 0) + count
        self.seqs = seqs

    def restore(
        self,
        next_id: int,
        ops_before: int,
        collectives: dict[str, int],
        channels: dict[Channel, int],
        groups: dict[str, list[int] | None],
        me: int,
    ) -> None:
        """Take the counts of a checkpoint (open ops and waits are added by the caller
        with :meth:`opened`'s bookkeeping left out: see :meth:`reopen`)."""
        self.next_id = next_id
        self.ops_before = ops_before
        self.seqs = dict(collectives)
        self.channels = dict(channels)
        self.groups = dict(groups)
        self.open = {}
        self.issued = set()
        self.waits = {}
        self.resync_seqs(me)

    def reopen(self, oid: int, payload: Any, is_async: bool, settles: bool, issued: bool) -> None:
        """An open op carried by a checkpoint (already counted)."""
        self.open[oid] = (payload, is_async, settles)
        if issued:
            self.issued.add(oid)
