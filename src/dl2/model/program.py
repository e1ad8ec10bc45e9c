"""Facts about the recorded programs that every reader of them shares.

The execution graph, the prediction's abstract machine and the replay planner each read
the ranks' op sequences as programs; these rules say, once, which ranks the job has,
where a rank blocks on each op, and which channel a send or receive travels on.
"""

from __future__ import annotations

from collections.abc import Iterable

from dl2.model.ops import Op

#: The sender of a wildcard receive (``recv(src=None)``) in a channel.
WILD = -1

Channel = tuple[str, int, int, int]  # (group, sender, receiver, tag); sender WILD for any
Mailbox = tuple[str, int, int]  # (group, receiver, tag): where a receive of any sender reads


def world_ranks(world_size: int, traced: Iterable[int]) -> range:
    """Every rank of the job: the recorded world size, widened to the highest traced rank
    (a header may under-report the world, a trace never invents a rank)."""
    return range(max(world_size, max(traced, default=-1) + 1))


def wait_position(op: Op) -> int | None:
    """Where its rank blocks until the op completes: the number of the rank's ops issued
    before that point, or None if it never waits on the op.

    A blocking op (``async`` false) blocks right after it is issued (``index + 1``);
    an async op where the trace has the first ``wait`` on it (:attr:`Op.waited_at`), and
    never earlier than right after it is issued; an async op never waited on blocks
    nothing.
    """
    at = op.waited_at
    if at is None and not op.is_async:
        at = op.index + 1
    return None if at is None else max(at, op.index + 1)


def channel_key(
    op: str, gid: str, rank: int, peer: int | None, tag: int | None, sender: int | None = None
) -> Channel | None:
    """The channel of a send or receive of ``rank`` (fields as recorded), or None for any
    other op; see :func:`channel_of`."""
    tag = tag or 0
    if op == "send" and peer is not None:
        return (gid, rank, peer, tag)
    if op == "recv":
        source = peer if peer is not None else sender
        return (gid, WILD if source is None else source, rank, tag)
    return None


def channel_of(op: Op, sender: int | None = None) -> Channel | None:
    """The channel of a send or receive, or None for any other op.

    Messages of one channel (group, sender, receiver, tag) never overtake each other:
    the i-th send of a channel meets the i-th receive of it.  A missing tag is torch's
    default, 0.  A receive's sender is its peer; a wildcard's is ``sender`` when given
    (the sender it is known to have matched), else :data:`WILD`.
    """
    return channel_key(op.op, op.gid, op.rank, op.peer, op.tag, sender)


def mailbox(channel: Channel) -> Mailbox:
    """Where a channel's messages arrive: (group, receiver, tag), whatever the sender."""
    return (channel[0], channel[2], channel[3])
