"""Groups whose backend is not gloo (NCCL, a mixed ``cpu:gloo,cuda:nccl``, a custom one).

Such a group is built by torch exactly as the user asked (its options, its device, its
communicators); :func:`wrap_group` then puts a :class:`~dl2.record.pg.DeviceRecordingGroup`
in front of it and in its place in c10d's tables, so the recording group sees every call
as it does for gloo.  A failure leaves torch's own group in place, unrecorded.

What differs is when an op completes.  A gloo ``wait()`` returns when the op is done; an
NCCL ``wait()`` returns at once, having only made the device's current stream wait for
the op (the device blocks, the CPU goes on).  So a wait that returns with its work still
incomplete is a *device wait*: its ``ret`` is written only when the work is seen complete
(:meth:`DeviceHold.release`, from the watchdog's poll of ``is_completed()``, or from the
next record of the rank).  Until then the rank's later records are held back in order
(:class:`DeviceHold`): the ops the CPU issues after the wait cannot start on the device
before the waited op completes, so the trace shows the rank as the device runs it,
waiting in that wait, which is what the model and the live proof read.  A backend whose
``wait()`` blocks until the op is done (gloo inside a mixed group, NCCL with
``TORCH_NCCL_BLOCKING_WAIT=1``) never holds anything.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from dl2.record.works import work_completed

_now = time.monotonic_ns

#: records held at most: past this the hold gives up (all is written, the wait stays
#: open) and the process holds nothing more, so that a backend whose ``is_completed()``
#: never turns true costs bounded memory
HOLD_LIMIT = 200_000


class _HeldTail:
    """The proxy's ``tail``: appends are queued behind the held records."""

    __slots__ = ("_hold",)

    def __init__(self, hold: DeviceHold) -> None:
        self._hold = hold

    def append(self, record: tuple[Any, ...]) -> None:
        self._hold._call("tail", (record,), {})

    def __bool__(self) -> bool:
        return bool(self._hold.queue)

    def __len__(self) -> int:
        return len(self._hold.queue)


class DeviceHold:
    """Stands in for the recorder's stream encoder while a device wait is open.

    Every encoder call made meanwhile (by any thread) is queued; :meth:`release` writes,
    once the waited work is complete, the wait's ``ret`` and then the queued calls in
    their order, up to the next device wait still incomplete (which then heads the hold).

    Args:
        recorder: the process's recorder (its ``enc`` is this object while held).
        enc: the real stream encoder.
        wid: the open device wait's id.
        work: the work it waits on.
    """

    def __init__(self, recorder: Any, enc: Any, wid: int, work: Any) -> None:
        self.recorder = recorder
        self.real = enc
        self.lock = threading.RLock()
        self.queue: deque[tuple[str, tuple[Any, ...], dict[str, Any]]] = deque()
        self.head: tuple[int, Any] | None = (wid, work)
        self.released = False
        self.tail = _HeldTail(self)

    # -- the encoder's interface ----------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self.real, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> None:
            self._call(name, args, kwargs)

        return call

    def op_hot(self, *args: Any) -> bool:
        """Never done while held (``op`` is queued instead)."""
        return False

    def flush(self) -> None:
        """Write what the real encoder holds (records from before the hold)."""
        with self.lock:
            if not self.released:
                self._poll_release()
            self.real.flush()

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with self.lock:
            if self.released:
                self._apply(name, args, kwargs)
                return
            self.queue.append((name, args, kwargs))
            if len(self.queue) > HOLD_LIMIT:
                self.recorder.device_holds = False
                _notice("a device wait held too many records; holding stops for this rank")
                self.release(force=True)
                return
            self._poll_release()

    def device_wait(self, wid: int, work: Any) -> None:
        """Another device wait, issued while held: queued as the point to stop at."""
        with self.lock:
            if self.released:
                self._apply("device_wait", (wid, work), {})
            else:
                self.queue.append(("device_wait", (wid, work), {}))

    # -- release --------------------------------------------------------------------------

    def _poll_release(self) -> None:
        head = self.head
        if head is not None and work_completed(head[1]):
            self.release()

    def release(self, force: bool = False) -> bool:
        """Write what can be written: the head wait's ``ret`` when its work completed,
        then the queued calls up to the next incomplete device wait.  ``force`` writes
        everything now (the rank ends: open waits stay open).  Returns True when the hold
        is over (the real encoder is the recorder's again)."""
        with self.lock:
            if self.released:
                return True
            real = self.real
            while True:
                head = self.head
                if head is not None:
                    if not force and not work_completed(head[1]):
                        real.flush()
                        return False
                    if work_completed(head[1]):
                        real.hold_ret(head[0], _now(), None)
                    self.head = None
                if not self.queue:
                    break
                name, args, kwargs = self.queue.popleft()
                if name == "device_wait":
                    self.head = (args[0], args[1])
                    continue
                self._apply(name, args, kwargs)
            real.flush()
            self.released = True
            if self.recorder.enc is self:
                self.recorder.enc = real
            return True

    def _apply(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        real = self.real
        try:
            if name == "tail":
                real.tail.append(args[0])
            elif name == "device_wait":
                self.recorder.device_wait(args[0], args[1])
            else:
                getattr(real, name)(*args, **kwargs)
        except Exception:
            pass


# -- wrapping torch's group -------------------------------------------------------------


def is_device_group(pg: Any) -> bool:
    """True for a group :func:`wrap_group` made."""
    return bool(getattr(pg, "_dl2_device", False))


def wrap_group(recorder: Any, c10d: Any, result: Any, ranks: list[int], gid: str) -> Any:
    """Put a recording group in front of the group torch built (``result``: the helper's
    ``(pg, store)``); returns the helper's result to hand back, torch's own one if
    anything fails."""
    import torch.distributed as dist

    from dl2.record.pg import DeviceRecordingGroup

    pg, store = result
    if not isinstance(pg, dist.ProcessGroup):
        return result  # not a member (GroupMember.NON_GROUP_MEMBER)
    if is_device_group(pg) or getattr(pg, "_dl2_inner", None) is not None:
        return result
    try:
        rank = int(pg.rank())
        size = int(pg.size())
        wrapper = DeviceRecordingGroup(rank, size, pg, gid, ranks or list(range(size)), recorder)
    except Exception as err:
        _notice(f"group {gid} is not recorded: {err!r}")
        return result
    undo: list[Any] = []
    try:
        _swap(c10d, pg, wrapper, gid, undo)
    except Exception as err:
        for step in reversed(undo):
            try:
                step()
            except Exception:
                pass
        _notice(f"group {gid} is not recorded: {err!r}")
        return result
    return wrapper, store


def _swap(c10d: Any, pg: Any, wrapper: Any, name: str, undo: list[Any]) -> None:
    """Put ``wrapper`` where c10d's tables hold ``pg`` (``undo`` collects the reverse)."""
    world = c10d._world
    for table_name in ("pg_map", "pg_names", "pg_backend_config", "pg_group_ranks", "pg_to_tag"):
        table = getattr(world, table_name, None)
        if isinstance(table, dict) and pg in table:
            value = table.pop(pg)
            table[wrapper] = value
            undo.append(lambda t=table, v=value: (t.pop(wrapper, None), t.__setitem__(pg, v)))
    tags = getattr(world, "tags_to_pg", None)
    if isinstance(tags, dict):
        for members in tags.values():
            for i, member in enumerate(members):
                if member is pg:
                    members[i] = wrapper
                    undo.append(lambda m=members, j=i: m.__setitem__(j, pg))
    register = getattr(c10d, "_register_process_group", None)
    unregister = getattr(c10d, "_unregister_process_group", None)
    if name and register is not None and unregister is not None:
        unregister(name)
        undo.append(lambda: register(name, pg))
        register(name, wrapper)
        undo.append(lambda: unregister(name))


def _notice(message: str) -> None:
    from dl2.notice import notice

    notice(message)
