"""The watchdog: a daemon thread that tells what a quiet rank is doing.

Every ``PERIOD_S`` it polls the pending async works (writing ``done`` for those gloo
reports complete: DDP consumes futures and never waits, so this is how its allreduces
are seen to finish).  When the rank has written no record for ``QUIET_NS``, it writes a
``state`` record: the pending op ids (async ops not seen complete, and blocking ops
being waited on), where the rank's thread is ("comm", "backward", "python") and its
user frames; or, when the rank has polled ``is_completed()`` on pending works in each of
the last ``POLL_TICKS`` ticks, those works with "where": "poll" and the stack of the
first poll (a loop spinning on them).  The thread watched is the one that issued the
last op (at first, the main thread); when it sits (still) joining a thread that waits
in communication, a helper waiting on a work's future say, the rank waits where that
thread does.  A state identical to the last one, with no activity in between, is not
written again.

While a device wait holds the rank's records back (:mod:`dl2.record.device`), each tick
first releases what it can (the wait's op seen complete) and says nothing more while the
hold lasts: the trace shows the rank in that wait.

Activity is read from the trace file's size (one ``fstat`` per tick), so recording an
op costs nothing extra for the watchdog's sake.

The GIL is released in every blocking c10d call, so the watchdog runs at full rate
while the main thread is blocked.  It never raises.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from dl2.record.stack import STILL_S
from dl2.record.stack import user_stack_id
from dl2.record.stack import where

PERIOD_S = 0.2
QUIET_NS = 300_000_000
#: ticks in a row with is_completed() polls (and nothing recorded) before a quiet rank
#: is reported as spinning on its pending works ("where": "poll")
POLL_TICKS = 5


#: the sleep system calls (``time.sleep``) by machine: a thread in one waits on a
#: clock, not on communication (a launcher's poll loop, a retry's back-off)
_SLEEPS = {
    "x86_64": (b"35", b"230"),  # nanosleep, clock_nanosleep
    "aarch64": (b"101", b"115"),
}.get(os.uname().machine, ())


def _in_sleep(native: int) -> bool:
    """Whether thread ``native`` is inside a sleep system call now (False when its
    ``/proc/self/task/<tid>/syscall`` cannot be read)."""
    if not _SLEEPS:
        return False
    try:
        with open(f"/proc/self/task/{native}/syscall", "rb") as handle:
            return handle.read().split(b" ", 1)[0] in _SLEEPS
    except OSError:
        return False


def _thread_times(ident: int) -> tuple[int, str] | None:
    """The time (ns) the Python thread ``ident`` has run or waited to run so far (CPU
    time plus time runnable on a run queue, from ``/proc/self/task/<tid>/schedstat``)
    and its scheduler state now ("S" sleeping, "D" in disk I/O, "R" runnable, ...,
    from ``stat``; "C" for a sleep on a clock, :func:`_in_sleep`); None when not known
    (the thread ended, no /proc).  Never ``pthread_getcpuclockid``: given a thread that
    just ended, it may crash the process."""
    try:
        thread = threading._active.get(ident)  # type: ignore[attr-defined]
        native = getattr(thread, "native_id", None)
        if native is None:
            return None
        with open(f"/proc/self/task/{native}/schedstat", "rb") as handle:
            fields = handle.read().split()
        with open(f"/proc/self/task/{native}/stat", "rb") as handle:
            stat = handle.read()
        state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3].decode()
        if state == "S" and _in_sleep(native):
            state = "C"
        return int(fields[0]) + int(fields[1]), state
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _in_comm(ident: int, frame: Any, blocking: dict[int, int]) -> bool:
    """Whether another thread (not the watched one) waits in communication now: a
    work's or its future's wait, or a blocking op it issued."""
    return where(frame, 0.0, ident in blocking) == "comm"


#: threading's functions a thread sits in while it joins another
_JOINS = frozenset({"join", "_wait_for_tstate_lock"})
_THREADING_FILE = threading.__file__


def _joined_wait(frame: Any, frames: dict[int, Any], blocking: dict[int, int]) -> Any:
    """The innermost frame of the thread that ``frame``'s thread joins (following a
    chain of joins, at most 4 deep) when that thread waits in communication (a work's
    or its future's wait, or a blocking op); else None.  The joining thread is still: a
    rank whose main thread joins a helper that waits on a pending work waits there."""
    for _ in range(4):
        if frame is None or frame.f_code.co_filename != _THREADING_FILE:
            return None
        if frame.f_code.co_name not in _JOINS:
            return None
        joined = frame.f_locals.get("self")
        ident = getattr(joined, "ident", None)
        inner = frames.get(ident) if ident is not None else None
        if ident is None or inner is None:
            return None
        if _in_comm(ident, inner, blocking):
            return inner
        frame = inner
    return None


#: the standard library's modules a thread waits in for another thread: a join, a
#: lock, an event or condition, a queue, an executor's future
_STDLIB = os.path.dirname(threading.__file__)
_WAIT_FILES = frozenset(
    {
        threading.__file__,
        os.path.join(_STDLIB, "queue.py"),
        os.path.join(_STDLIB, "concurrent", "futures", "_base.py"),
    }
)


#: CPU (and run-queue) time a thread may gain between two looks and still count as
#: not running: 10 ms
_IDLE_NS = 10_000_000


def _waited_elsewhere(
    frame: Any,
    frames: dict[int, Any],
    blocking: dict[int, int],
    watched: int,
    last: dict[int, int],
) -> Any:
    """When ``frame``'s thread waits in the standard library for another thread (an
    executor's result, a queue, an event): the innermost frame of a thread that waits
    in communication, provided no other thread ran since the last look (``last``: each
    thread's time then, updated here; one that runs may still release the wait, and a
    thread not seen before counts as running); else None."""
    if frame is None or frame.f_code.co_filename not in _WAIT_FILES:
        return None
    me = threading.get_ident()
    found = None
    ran = False
    for ident, inner in frames.items():
        if ident in (watched, me):
            continue
        if _in_comm(ident, inner, blocking):
            found = found or inner
            continue
        times = _thread_times(ident)
        before = last.get(ident)
        if times is None or before is None or times[0] - before > _IDLE_NS:
            ran = True
        if times is not None:
            last[ident] = times[0]
    for ident in [i for i in last if i not in frames]:
        del last[ident]
    return None if ran else found


class Watchdog:
    """The per-process watchdog thread.

    Args:
        recorder: the process's :class:`~dl2.record.recorder.Recorder`.
        period_s: seconds between ticks.
        quiet_ns: how long the rank must have written nothing before a ``state``.
    """

    def __init__(self, recorder: Any, period_s: float = PERIOD_S, quiet_ns: int = QUIET_NS) -> None:
        self._rec = recorder
        self._period_s = period_s
        self._quiet_ns = quiet_ns
        self._stop = threading.Event()
        self._main_ident = threading.main_thread().ident
        self._last_size = -1
        self._last_activity = time.monotonic_ns()
        self._last_state: tuple[tuple[int, ...], str, int] | None = None
        self._last_state_activity = 0
        self._poll_ticks = 0
        # the watched thread, its code and instruction at the last look, and since when
        # it has stayed there without running (see _still_s)
        self._spot: tuple[int, int, int] | None = None
        self._spot_since = 0
        self._spot_at = 0
        self._spot_cpu = -1
        self._others: dict[int, int] = {}  # other threads' times at the last look
        self._thread = threading.Thread(target=self._run, name="dl2-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (it does within one period); never blocks long."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self._period_s)

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            try:
                self.tick()
            except Exception:
                pass

    def _still_s(self, frame: Any, ident: int, now: int) -> float:
        """Seconds the watched thread has been at one code and instruction, asleep: in
        a C call that waits.  0 when it moved; when it ran or wanted to (its CPU time
        plus its time runnable but not scheduled moved by more than a tenth of the time
        between looks: a thread starved of CPU on a busy host stays at its instruction
        too); when it is in disk I/O (state "D": an ``fsync`` under write-back, not
        communication) or in ``time.sleep`` (a poll loop of torch.distributed's
        launcher utilities); or when its times cannot be read."""
        times = _thread_times(ident)
        spot = (ident, id(frame.f_code), frame.f_lasti) if frame is not None else None
        if times is None:
            self._spot = None
            return 0.0
        cpu, state = times
        previous, self._spot = self._spot, spot
        ran = cpu - self._spot_cpu > (now - self._spot_at) // 10 if self._spot_cpu >= 0 else True
        self._spot_cpu, self._spot_at = cpu, now
        if spot is None or spot != previous or ran or state != "S":
            self._spot_since = now
            return 0.0
        return (now - self._spot_since) / 1e9

    def tick(self) -> None:
        """One look at the rank (also called directly by tests)."""
        rec = self._rec
        writer = rec.writer
        if writer is None or not rec.active:
            return
        rec.flush()  # a held-back ret (a wait completed, nothing recorded since)
        if getattr(rec, "holding", False):
            rec.release()  # a device wait: its ret and what followed, once it completed
            if rec.holding:
                return  # the rank is seen in that wait: nothing more to say
        now = time.monotonic_ns()
        size = writer.size()
        if size != self._last_size:
            self._last_size = size
            self._last_activity = now
        still = rec.poll_pending()
        polled, rec.polled = rec.polled, {}
        self._poll_ticks = self._poll_ticks + 1 if polled else 0
        if now - self._last_activity < self._quiet_ns:
            self._last_size = writer.size()  # our own done records are not activity
            return
        frames = sys._current_frames()
        # The thread that issues the ops (the main thread until one issues any), if
        # Python's threading knows it and it is in Python code now; else the main
        # thread: ops issued from a thread C++ created (a future's callback on gloo's
        # thread: PowerSGD's hook) while the main thread waits in backward for them.
        watched = rec.last_tid
        if not (watched in frames and watched in threading._active):  # type: ignore[attr-defined]
            watched = self._main_ident or 0
        frame = frames.get(watched)
        blocking = rec.blocking
        pending = still + list(blocking.values())
        still_s = self._still_s(frame, watched, now)
        doing = where(frame, still_s, watched in blocking)
        if doing == "python" and still_s >= STILL_S:
            # asleep in a join of a thread that waits in communication (or in another
            # wait of the standard library while such a thread waits and none runs):
            # the rank waits there
            joined = _joined_wait(frame, frames, blocking) or _waited_elsewhere(
                frame, frames, blocking, watched, self._others
            )
            if joined is not None:
                frame, doing = joined, "comm"
            del joined
        del frames
        spinning = sorted(oid for oid in polled if oid in still)
        if doing != "comm" and spinning and self._poll_ticks >= POLL_TICKS:
            # Quiet, yet polling is_completed() on pending works tick after tick: the
            # rank spins on them (its stack is the one of its first poll).
            state = (tuple(spinning), "poll", polled[spinning[0]])
        else:
            state = (tuple(sorted(pending)), doing, user_stack_id(frame))
        del frame
        if state != self._last_state or self._last_activity != self._last_state_activity:
            rec.state(time.monotonic_ns(), state[0], state[1], state[2])
            self._last_state = state
            self._last_state_activity = self._last_activity
        self._last_size = writer.size()
