"""How an op counts in a stream: the rules a writer and a reader of a stream share.

A checkpoint (see :mod:`dl2.trace.schema`) counts collectives per group and P2P ops per
channel, and a record's ``seq`` is implied by the ones before it of the same key; both
sides work these out with the functions here, so they agree.

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


def collectives(seqs: dict[Any, int]) -> dict[str, int]:
    """gid -> the next collective ``seq`` (collectives issued on it so far), of the
    expected seqs by key."""
    return {key: n for key, n in seqs.items() if isinstance(key, str)}


def expected_seqs(counts: dict[str, int], channels: dict[Channel, int], me: int) -> dict[Any, int]:
    """The seq each key expects next, as a checkpoint says it: a group's collective
    count, and for a P2P key the ops of its channels (what a reader starting at the
    checkpoint knows; both sides reset to it there)."""
    seqs: dict[Any, int] = dict(counts)
    for (gid, sender, receiver, _tag), count in channels.items():
        if sender == me:
            key: Any = (gid, None if receiver == ANY_SOURCE else receiver, "send")
        else:
            key = (gid, None if sender == ANY_SOURCE else sender, "recv")
        seqs[key] = seqs.get(key, 0) + count
    return seqs
