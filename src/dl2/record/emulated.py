"""The recording group's side of the emulated send semantics (see dl2.record.emulate).

An eager send (``DL2_BUFFER_SIZE``) is issued on a copy of its tensors and completes for
its caller at once (:func:`eager_args`, :func:`issue_eager`); under fused batches
(``DL2_FUSED_BATCHES``) every P2P op is counted as posted in the job's store, and the
ops of a batch are deferred to the batch's launch (:func:`post`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING
from typing import Any

import torch

from dl2.record.emulate import Deferred
from dl2.record.recorder import Recorder
from dl2.record.works import DeferredWork
from dl2.record.works import EagerWork

if TYPE_CHECKING:
    from dl2.record.pg import RecordingProcessGroup

_now = time.monotonic_ns
_tid = threading.get_ident
_Tensor = torch.Tensor


def _eager_fits(args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> bool:
    """Whether a send's tensors (positional, dense) hold at most ``limit`` bytes."""
    if not args or kwargs or type(args[0]) is not list:
        return False
    total = 0
    for t in args[0]:
        if not isinstance(t, _Tensor) or t.layout is not torch.strided:
            return False
        total += int(t.numel()) * int(t.element_size())
    return total <= limit


def _eager_copy(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The send's arguments with its tensors copied (the eager buffer: the receiver gets
    the values of the moment of the call); None if they cannot be copied."""
    try:
        buffer = [t.detach().clone(memory_format=torch.contiguous_format) for t in args[0]]
    except Exception:
        return None
    return (buffer, *args[1:])


def eager_args(args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> tuple[Any, ...] | None:
    """A send's arguments with its tensors copied, to issue it eagerly, when it holds at
    most ``limit`` bytes; else None."""
    return _eager_copy(args) if _eager_fits(args, kwargs, limit) else None


def issue_eager(
    rec: Recorder, oid: int, fn: Any, args: tuple[Any, ...], sync: bool, stack: int
) -> Any:
    """Issue an eager send (``args`` from :func:`eager_args`): gloo sends the copy in the
    background, the caller goes on."""
    buffer = args[0]
    try:
        work = fn(*args)
    except BaseException as err:
        rec.ret(oid, err)
        raise
    try:
        rec.eager.add(work, buffer)
    except Exception:
        pass
    if sync:
        # The blocking send returns at once: its ret, wait and wait's ret together.
        wid = next(rec.ids)
        rec.issued_wait(oid, wid, _now(), _tid(), stack, returned=True)
        return EagerWork(oid, rec, buffer, waited=True)
    rec.ret(oid)
    return EagerWork(oid, rec, buffer, waited=False)


def post(
    pg: RecordingProcessGroup,
    gate: Any,
    direction: str,
    peer: int | None,
    tag: int,
    deferred: bool,
    oid: int,
    fn: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    eager: tuple[Any, ...] | None,
    anyranks: list[int] | None,
    stack: int,
) -> Any:
    """Fused-batch emulation: count the op as posted in the job's store; for an op of a
    batch, defer its issue to the batch's launch and return the caller's placeholder
    work (None: issue it now).  ``eager``: the op's :func:`eager_args`."""
    me = pg._dl2_ranks[pg.rank()]
    src: int | None
    if direction == "send":
        if peer is None:
            raise ValueError("a send without a peer")
        src, dst = me, peer
    else:
        src, dst = peer, me
    gid = pg._dl2_gid
    position = gate.post(direction, gid, src, dst, tag)
    if not deferred:
        return None

    def issue() -> Any:
        if eager is not None:
            return issue_eager(pg._dl2_rec, oid, fn, eager, False, stack)
        return pg._dl2_issue(oid, fn, args, kwargs, True, anyranks, stack, _tid(), True)

    placeholder = DeferredWork()
    keys = gate.partner_keys(direction, gid, src, dst, tag)
    gate.defer(_tid(), Deferred(issue, keys, position, placeholder))
    return placeholder
