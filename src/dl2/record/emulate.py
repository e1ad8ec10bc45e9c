"""Emulating another backend's send semantics on gloo, inside the recorder.

gloo's ``send`` waits until the peer has posted the matching receive, at every size, and
``batch_isend_irecv`` issues its ops one by one.  Other backends differ (see
:mod:`dl2.analysis.prediction.semantics`): NCCL and MPI complete small sends without their receive
(eager sends), and NCCL launches a batch as one unit.  ``dl2 run --buffer-size`` and
``dl2 replay`` turn these behaviours on in the recorder, so that a job (or a replay of
one) runs under the configuration dl2 predicts for:

``DL2_BUFFER_SIZE=N`` (bytes)
    A send (``send``, ``isend``, a send of ``batch_isend_irecv``) of at most N bytes
    (element count × element size) is *eager*: its message is copied (the copy is the
    buffer, so the caller may reuse its tensor at once, and the receiver gets the values
    of the moment of the call), gloo sends the copy in the background, and the caller's
    blocking ``send`` returns at once, as does its work's ``wait()``.  The gloo work and
    the copy are kept by :class:`EagerSends` until a reaper thread has seen the message
    delivered.  Before the process group is destroyed, and at exit, the rank first
    writes its ``end`` record (its program is over) and then waits for its eager
    messages to be delivered (at most ``DL2_EAGER_DRAIN_S`` seconds, default 120), as a
    buffered backend delivers what it holds: the job's results are those of a backend
    with that buffer.

``DL2_FUSED_BATCHES=1``
    The ops of one ``batch_isend_irecv`` launch as one unit, once each of them can be
    matched by an op its peer has *posted* (NCCL's group launch as dl2's prediction
    models it, :attr:`dl2.analysis.prediction.semantics.Semantics.fused_batches_atomic`).  Every
    P2P op counts itself as posted in the job's store; a batch's ops are recorded (with
    ``"deferred": true``) when called, and issued to gloo only when the batch can launch.
    Until then the rank sits in the batch call, which its trace shows as open calls.
    Meant for ``dl2 replay`` (it costs a store round trip per P2P op).

Neither ever raises into the job: a failure here costs the emulation, never the run.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from dl2.notice import notice

ENV_BUFFER_SIZE = "DL2_BUFFER_SIZE"
ENV_FUSED_BATCHES = "DL2_FUSED_BATCHES"
ENV_DRAIN_S = "DL2_EAGER_DRAIN_S"

#: Seconds a rank waits, at exit or destroy_process_group, for its eager messages.
DEFAULT_DRAIN_S = 120.0


def eager_bytes_from_env(environ: Any = None) -> int:
    """The eager threshold in bytes from ``DL2_BUFFER_SIZE``; -1 when unset or invalid
    (a notice says so; ``dl2 run`` writes plain byte counts)."""
    env = os.environ if environ is None else environ
    text = str(env.get(ENV_BUFFER_SIZE, "")).strip()
    if not text:
        return -1
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        notice(f"{ENV_BUFFER_SIZE}={text!r} is not a byte count; sends are not emulated")
        return -1
    return value


def fused_batches_from_env(environ: Any = None) -> bool:
    env = os.environ if environ is None else environ
    return str(env.get(ENV_FUSED_BATCHES, "")).strip() not in ("", "0")


def drain_seconds_from_env(environ: Any = None) -> float:
    env = os.environ if environ is None else environ
    try:
        return max(0.0, float(env.get(ENV_DRAIN_S, DEFAULT_DRAIN_S)))
    except (TypeError, ValueError):
        return DEFAULT_DRAIN_S


class EagerSends:
    """The eager sends gloo has not delivered yet, and the thread that reaps them.

    The reaper waits on each gloo work in turn (gloo's P2P ``is_completed`` only flips
    after a ``wait``), then drops the work and its buffer.
    """

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[Any, Any]] = collections.deque()
        self._cond = threading.Condition()
        self._busy = 0  # works taken off the queue and still being waited on
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self._queue) + self._busy

    def add(self, work: Any, buffer: Any) -> None:
        """Keep ``work`` and its ``buffer`` alive until gloo has delivered the message."""
        with self._cond:
            self._queue.append((work, buffer))
            self._cond.notify_all()
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._reap, name="dl2-eager-sends", daemon=True
                )
                self._thread.start()

    def _reap(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                work, buffer = self._queue.popleft()
                self._busy += 1
            try:
                work.wait()
            except BaseException:  # the peer failed or the group was aborted
                pass
            del work, buffer
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds until every message is delivered; returns how
        many are still undelivered."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            return len(self._queue) + self._busy

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's works are not the child's to wait on."""
        self._queue = collections.deque()
        self._cond = threading.Condition()
        self._busy = 0
        self._thread = None
        self._pid = os.getpid()


@dataclass
class Deferred:
    """A P2P op of a fused batch, recorded and not yet issued to gloo.

    Attributes:
        issue: issues it (to gloo) and returns the work to hand to the caller.
        partner_keys: the store counters that count the ops able to match it.
        position: how many ops of its own channel the rank posted before it.
        placeholder: the work handed to the caller, bound to the real one at launch.
    """

    issue: Any
    partner_keys: tuple[str, ...]
    position: int
    placeholder: Any


WILD = "*"


def channel_key(direction: str, gid: str, src: int | str, dst: int, tag: int) -> str:
    """The store counter of ops posted on one channel."""
    return f"dl2/posted/{direction}/{gid}/{src}/{dst}/{tag}"


class BatchGate:
    """Fused-batch launch: posted-op counters in the job's store, and the launch wait."""

    def __init__(self) -> None:
        self._store: Any = None
        self._local: dict[str, int] = collections.defaultdict(int)
        self.deferred: dict[int, list[Deferred]] = {}  # thread id -> its batch's ops

    def _get_store(self) -> Any:
        if self._store is None:
            from torch.distributed import distributed_c10d

            self._store = distributed_c10d._get_default_store()
        return self._store

    def post(self, direction: str, gid: str, src: int | None, dst: int, tag: int) -> int:
        """Count a P2P op as posted; return its position on its channel."""
        store = self._get_store()
        key = channel_key(direction, gid, WILD if src is None else src, dst, tag)
        position = self._local[key]
        self._local[key] = position + 1
        store.add(key, 1)
        if direction == "send":
            store.add(channel_key("send", gid, WILD, dst, tag), 1)
        return position

    @staticmethod
    def partner_keys(
        direction: str, gid: str, src: int | None, dst: int, tag: int
    ) -> tuple[str, ...]:
        """The counters whose sum must exceed an op's position for it to be matchable."""
        if direction == "send":
            return (
                channel_key("recv", gid, WILD if src is None else src, dst, tag),
                channel_key("recv", gid, WILD, dst, tag),
            )
        return (channel_key("send", gid, WILD if src is None else src, dst, tag),)

    def defer(self, tid: int, item: Deferred) -> None:
        self.deferred.setdefault(tid, []).append(item)

    def launch(self, tid: int) -> None:
        """Wait until every deferred op of this thread's batch can be matched, then
        issue them all, in call order."""
        items = self.deferred.pop(tid, [])
        if not items:
            return
        store = self._get_store()
        delay = 0.002
        while True:
            try:
                ready = all(
                    sum(int(store.add(k, 0)) for k in item.partner_keys) > item.position
                    for item in items
                )
            except Exception as err:  # the store is gone: launch rather than hang here
                notice(f"fused-batch emulation: cannot read the store ({err!r}); launching")
                ready = True
            if ready:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        for item in items:
            item.placeholder._dl2_bind(item.issue())

    def reset_after_fork(self) -> None:
        self._store = None
        self._local = collections.defaultdict(int)
        self.deferred = {}
