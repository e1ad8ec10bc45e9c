"""The writer of one rank's stream of records (format v2, writer side).

A :class:`StreamEncoder` turns the recorder's events into lines of
:mod:`dl2.trace.schema.encode` and writes them, making them small: it interns stacks
and op descriptions (each defined once per segment, on first use), writes times as µs
deltas, leaves out ids, seqs and threads that follow from the previous records, and
merges the issue and the wait of a blocking op (and its return) into one record.  The
reader (:mod:`dl2.trace.schema.reader`) undoes all of it with the same rules, so it
must see the lines in the order they were encoded: every record is encoded and written
under the encoder's lock, in one write.  Records a caller holds back (``hold_*``: the
issue and wait of a blocking op, a return) go out with the next write, or at
:meth:`StreamEncoder.flush`.

It also keeps what the stream has issued and left open, and writes ``checkpoint``
records of it: at the start of every segment but the first (``roll``, given by the
owner, opens the next one) and every ``SYNC_BYTES`` within a segment (a reader that met
a corrupt line resynchronises there).  That bookkeeping is done inline, on the
recorder's hot path; :func:`dl2.trace.rotated.track` replays typed records through an
encoder to get the same state on the reader side.

Standard library only: the recorder runs it inside every rank.  Where
:mod:`dl2._speedups` was built, the encoder's hot fields live in its C base class
(plain attributes to the code here) and ``op_hot`` writes the steady state of a
training loop in C; anything else it declines, untouched, to :meth:`StreamEncoder.op`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from dl2 import speedups
from dl2.trace.schema import encode
from dl2.trace.schema.encode import StackTable as StackTable  # the stacks a stream interns
from dl2.trace.schema.state import ANY_SOURCE
from dl2.trace.schema.state import GROUP
from dl2.trace.schema.state import P2P
from dl2.trace.schema.state import channel_of
from dl2.trace.schema.state import collectives
from dl2.trace.schema.state import expected_seqs
from dl2.trace.schema.state import op_family
from dl2.trace.schema.state import seq_key
from dl2.trace.schema.state import settles_on_return

#: Descriptions kept in memory before the table is trimmed to those of open ops.
DESC_LIMIT = 20_000
#: Threads an exception ended, kept (and repeated after each checkpoint): the newest.
THREAD_ERRORS = 16
#: A checkpoint within a segment every so many bytes.
SYNC_BYTES = 1 << 20

Sink = Callable[[bytes], object]
#: ``roll(segment, prologue)``: open that segment, write its header and ``prologue``;
#: return the new sink and the bytes the segment may still take, or None on failure.
Roll = Callable[[int, str], "tuple[Sink, int] | None"]


def _discard(data: bytes) -> None:
    """The sink of a stream that can no longer write."""


# An interned op description: (did, its "d" line, seq key, channel, async, settles on
# return, tid, stack id, (gid, ranks) of a create_group).
_Desc = tuple[int, str, Any, Any, bool, bool, int, int, Any]


class _PythonCore:
    """The base of :class:`StreamEncoder` where :mod:`dl2._speedups` is not used: its
    hot fields are plain attributes, and :meth:`op_hot` leaves every op to ``op``."""

    def op_hot(
        self, oid: int, t: int, tid: int, key: tuple[Any, ...], seq: int | None, *rest: Any
    ) -> bool:
        """``op`` of a collective in the steady state, done in C (see
        ``src/dl2/_speedups.c``); here it never is: False."""
        return False


def _core() -> type:
    fast = speedups.module()
    return fast.EncoderCore if fast is not None else _PythonCore


class StreamEncoder(_core()):  # type: ignore[misc]
    """Encodes and writes one rank's records, segment after segment.

    Args:
        rank: the global rank (P2P channels are named by global ranks).
        t0: ``time.monotonic_ns()`` of the stream's start (every segment's header has it).
        stacks: where stack ids come from (the recorder's capture interns into it).
        sink: takes each write (one or more whole lines, as bytes).
        room: bytes the first segment may take; ``roll``: opens the next (none: one
            segment).  ``on_error``: told of an ``OSError`` of the sink, after which the
            stream writes nothing.  ``clock``: the time of checkpoints.

    Attributes:
        lock: held while a record is encoded and written.
        tail: the records held back, appended without the lock (deque appends are
            atomic) and taken under it.
        next_id, ops_before, seqs, channels, groups, open, issued, waits, newgroups,
        dropped, stores: what a checkpoint says (see :mod:`dl2.trace.schema`):
            ``seqs`` is the seq each key expects next; ``open`` maps an op id to
            ``(id, us, did, seq, batch, async, settles on return)``; ``waits`` a wait
            id to ``(id, us, tid, op id, sid)``; ``newgroups`` holds ``(id, us, ranks,
            gid, sid)``; ``dropped`` the open ops whose work was dropped; ``stores`` a
            blocking store call's id to ``(id, us, tid, op, store, prefix, keys,
            timeout, sid)``.
    """

    def __init__(
        self,
        rank: int,
        t0: int,
        stacks: StackTable,
        sink: Sink,
        *,
        room: int = 1 << 62,
        roll: Roll | None = None,
        on_error: Callable[[OSError], None] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.me = rank
        self.t0 = t0
        self.stacks = stacks
        self.lock = threading.Lock()
        self.live_threads = 0  # the last ``threads`` record's count
        # the threads an exception ended (tid, name, err, sid): the newest THREAD_ERRORS
        self.thread_errors: list[tuple[int, str, str, int]] = []
        self.tail: deque[tuple[Any, ...]] = deque()
        self.segment = 0
        self._sink = sink
        self._roll = roll
        self._on_error = on_error
        self._clock = clock
        self._room = room
        self._due = self._due_set = min(room, SYNC_BYTES)
        self.next_id = 1
        self.ops_before = 0
        self.seqs: dict[Any, int] = {}
        self.channels: dict[tuple[str, int, int, int], int] = {}
        self.groups: dict[str, list[int] | None] = {}
        self.open: dict[int, tuple[int, int, int, int | None, int | None, bool, bool]] = {}
        self.issued: set[int] = set()
        self.waits: dict[int, tuple[int, int, int, int, int]] = {}
        self.newgroups: list[tuple[int, int, list[int] | None, str | None, int]] = []
        self.dropped: set[int] = set()
        self.stores: dict[int, tuple[Any, ...]] = {}
        self._descs: dict[tuple[Any, ...], _Desc] = {}
        self._by_did: dict[int, _Desc] = {}
        self._dids = itertools.count(1)
        self._stacks_defined: set[int] = {0}
        self._descs_defined: set[int] = set()
        self._last = 0  # the id of the last record that created one
        self._last_tid = 0  # thread and stack of the last op record
        self._last_sid = -1
        self._us = 0  # time of the last timed record, µs after t0

    # -- writing ------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        data = text.encode()
        try:
            self._sink(data)
        except OSError as err:
            self._failed(err)
            return
        self._due -= len(data)

    def _failed(self, err: OSError) -> None:
        self._sink = _discard
        if self._on_error is not None:
            self._on_error(err)

    def _head(self) -> str:
        """What goes before the next record: a new segment or checkpoint when due, and
        the records held back."""
        text = ""
        if self._due <= 0:
            self._room -= self._due_set - self._due
            if self._room <= 0 and self._roll is not None:
                if self.tail:
                    self._write(self._held())  # to the segment they were encoded for
                rolled = self._roll(self.segment + 1, self.start_segment(self.segment + 1))
                if rolled is None:
                    self._sink = _discard
                else:
                    self._sink, self._room = rolled
            else:
                text = (self._held() if self.tail else "") + self._checkpoint(self._clock())
            self._due = self._due_set = min(self._room, SYNC_BYTES)
        return text + self._held() if self.tail else text

    def _held(self) -> str:
        """The records held back, taken from :attr:`tail`."""
        tail = self.tail
        text = ""
        while tail:
            record = tail.popleft()
            size = len(record)
            if size == 5:
                if tail and len(tail[0]) == 3 and tail[0][0] == record[1]:
                    _, t, src = tail.popleft()  # its wait returned already: one record
                    oid, wid, at, tid, sid = record
                    if (
                        t
                        and src is None
                        and oid == self._last
                        and wid == oid + 1
                        and tid == self._last_tid
                        and sid == self._last_sid
                    ):
                        # The hot path (a blocking op that returned, right after its
                        # op record): _issued_wait's one ["k"] record, inlined.
                        t0 = self.t0
                        us = (at - t0) // 1000
                        dt = us - self._us
                        self._last = wid
                        if wid >= self.next_id:
                            self.next_id = wid + 1
                        if self.open.pop(oid, None) is not None:
                            self.issued.discard(oid)
                        end = (t - t0) // 1000
                        self._us = end
                        text += f'["k",{dt},{end - us}]\n'
                    else:
                        text += self._issued_wait(oid, wid, at, tid, sid, t, src)
                else:
                    text += self._issued_wait(*record)
            elif size == 3:
                text += self._ret(record[0], record[1], None, record[2])
            elif size == 2:
                text += self._drop(*record)
            else:
                text += self._done(*record[:3])
        return text

    def hold_issued_wait(self, oid: int, wid: int, t: int, tid: int, sid: int) -> None:
        """Blocking op ``oid`` was issued and thread ``tid`` waits on it (wait ``wid``,
        at the op's stack ``sid``): written with the next record, or at :meth:`flush`."""
        self.tail.append((oid, wid, t, tid, sid))

    def hold_ret(self, rid: int, t: int, src: int | None = None) -> None:
        """Op or wait ``rid`` returned (``src``: a wildcard's sender): written with the
        next record, or at :meth:`flush`."""
        self.tail.append((rid, t, src))

    def hold_done(self, oid: int, t: int, src: int | None = None) -> None:
        """Async op ``oid`` was seen complete, where no lock may be taken (a work's
        finaliser): written with the next record."""
        self.tail.append((oid, t, src, None))

    def hold_drop(self, oid: int, t: int) -> None:
        """The work of async P2P op ``oid`` was dropped before it completed (from its
        finaliser): written with the next record."""
        self.tail.append((oid, t))

    def flush(self) -> None:
        """Write the records held back now."""
        if self.tail:
            with self.lock:
                text = self._head()
                if text:
                    self._write(text)

    # -- definitions ------------------------------------------------------------------

    def _stack(self, sid: int) -> str:
        """The ``s`` line of ``sid`` if this segment has not defined it yet."""
        if sid in self._stacks_defined:
            return ""
        self._stacks_defined.add(sid)
        return encode.stack_line(sid, self.stacks.text(sid))

    def _define(self, desc: _Desc) -> str:
        self._descs_defined.add(desc[0])
        return self._stack(desc[7]) + desc[1]

    def _describe(
        self, key: tuple[Any, ...], gid: str, peer: int | None, tag: int, ranks: Any
    ) -> _Desc:
        gid_json, op, api, fields, is_async, tid, sid, eager, deferred = key
        if len(self._descs) >= DESC_LIMIT:
            used = {entry[2] for entry in self.open.values()}
            self._descs = {k: d for k, d in self._descs.items() if d[0] in used}
            self._by_did = {d[0]: d for d in self._descs.values()}
        did = next(self._dids)  # never reused: a segment may hold a trimmed one
        family = op_family(op)
        desc: _Desc = (
            did,
            encode.desc_line(did, gid_json, op, api, fields, is_async, tid, sid, eager, deferred),
            seq_key(gid, op, peer),
            channel_of(gid, op, peer, tag, self.me) if family == P2P else None,
            is_async,
            settles_on_return(op, is_async, eager),
            tid,
            sid,
            (gid, list(ranks) if ranks is not None else None) if family == GROUP else None,
        )
        self._descs[key] = desc
        self._by_did[did] = desc
        return desc

    # -- records ----------------------------------------------------------------------

    def op(
        self,
        oid: int,
        t: int,
        tid: int,
        gid: str,
        gid_json: str,
        seq: int | None,
        op: str,
        api: str | None,
        fields: str,
        is_async: bool,
        sid: int,
        batch: int | None = None,
        eager: bool = False,
        deferred: bool = False,
        peer: int | None = None,
        tag: int = 0,
        ranks: Sequence[int] | None = None,
    ) -> None:
        """An op entered (see :func:`~dl2.trace.schema.encode.op_fields` for
        ``fields``; ``peer`` and ``tag`` repeat a P2P op's, ``ranks`` a create_group's):
        the recorder's hot path."""
        # (the recording group's override builds the same key for op_hot)
        key = (gid_json, op, api, fields, is_async, tid, sid, eager, deferred)
        lock = self.lock
        lock.acquire()  # not ``with``: half the cost, on every op
        try:
            tail = self.tail
            if self._due <= 0:
                text = self._head()
            elif not tail:
                text = ""
            else:
                text = self._held()
            desc = self._descs.get(key)
            if desc is None:
                desc = self._describe(key, gid, peer, tag, ranks)
            did = desc[0]
            if did not in self._descs_defined:
                text += self._define(desc)
            us = (t - self.t0) // 1000
            dt = us - self._us
            self._us = us
            skey = desc[2]
            if skey is not None:
                seqs = self.seqs
                expected = seqs.get(skey, 0)
                if seq is None:
                    seq = expected
                seqs[skey] = seq + 1
            else:
                expected = None
            if oid == self._last + 1 and seq == expected and batch is None:
                text += f'["o",{dt},{did}]\n'
            else:
                oid_text = "null" if oid == self._last + 1 else str(oid)
                seq_text = "null" if seq == expected else encode.json_int(seq)
                text += encode.op_line(dt, did, oid_text, seq_text, encode.json_int(batch))
            self._last = oid
            self._last_tid = tid
            self._last_sid = sid
            self.open[oid] = (oid, us, did, seq, batch, is_async, desc[5])
            self.ops_before += 1
            if oid >= self.next_id:
                self.next_id = oid + 1
            if desc[3] is not None:
                self.channels[desc[3]] = self.channels.get(desc[3], 0) + 1
            if desc[8] is not None:
                self.groups[desc[8][0]] = desc[8][1]
            data = text.encode()  # _write(text), inlined
            try:
                self._sink(data)
            except OSError as err:
                self._failed(err)
                return
            self._due -= len(data)
        finally:
            lock.release()

    def _issued_wait(
        self,
        oid: int,
        wid: int,
        t: int,
        tid: int,
        sid: int,
        returned: int = 0,
        src: int | None = None,
    ) -> str:
        """Blocking op ``oid`` issued, thread ``tid`` waiting on it (wait ``wid``) and,
        when ``returned``, the wait returned then (``src``: a wildcard's sender)."""
        last = self._last
        us = (t - self.t0) // 1000
        dt = us - self._us
        self._us = us
        self._last = wid
        if wid >= self.next_id:
            self.next_id = wid + 1
        short = oid == last and wid == oid + 1 and tid == self._last_tid and sid == self._last_sid
        entry = self.open.get(oid)
        if returned:
            if src is not None:
                self._matched(oid, src)
            if entry is not None:  # complete
                del self.open[oid]
                self.issued.discard(oid)
            end = (returned - self.t0) // 1000
            self._us = end
            if short and src is None:  # the hot path: one record for all three
                return f'["k",{dt},{end - us}]\n'
            done = encode.ret_line(end - us, 0, None, src)
        else:
            if entry is not None:
                if entry[6]:
                    del self.open[oid]
                else:
                    self.issued.add(oid)
            self.waits[wid] = (wid, us, tid, oid, sid)
            done = ""
        if short:
            return f'["b",{dt}]\n' + done
        wid_text = "null" if wid == last + 1 else str(wid)
        line = encode.issued_wait_line(dt, last - oid, wid_text, str(tid), str(sid))
        return self._stack(sid) + line + done

    def _ret(self, rid: int, t: int, err: str | None, src: int | None) -> str:
        waited = self.waits.pop(rid, None)
        if self.stores:
            self.stores.pop(rid, None)
        if waited is not None:  # a wait returned: its op completed (or failed in it)
            if src is not None:
                self._matched(waited[3], src)
            if self.open.pop(waited[3], None) is not None:
                self.issued.discard(waited[3])
        else:
            entry = self.open.get(rid)
            if entry is not None:
                if err is not None or entry[6]:
                    del self.open[rid]
                    self.issued.discard(rid)
                else:
                    self.issued.add(rid)
        us = (t - self.t0) // 1000
        dt = us - self._us
        self._us = us
        if rid == self._last and err is None and src is None:
            return f'["r",{dt}]\n'
        return encode.ret_line(dt, self._last - rid, err, src)

    def ret(self, rid: int, t: int, err: str | None = None, src: int | None = None) -> None:
        """Op or wait ``rid`` returned (``err``: it raised; ``src``: a wildcard's sender)."""
        with self.lock:
            self._write(self._head() + self._ret(rid, t, err, src))

    def wait(self, wid: int, t: int, tid: int, work: int, sid: int, returned: int = 0) -> None:
        """Thread ``tid`` waits on op ``work`` from stack ``sid`` (``returned``: when the
        wait returned, at once)."""
        with self.lock:
            text = self._head() + self._stack(sid)
            us = (t - self.t0) // 1000
            back = self._last - work
            tid_text = "null" if tid == self._last_tid else str(tid)
            wid_text = "null" if wid == self._last + 1 else str(wid)
            text += encode.wait_line(us - self._us, back, sid, tid_text, wid_text)
            self._us = us
            self._last = wid
            if wid >= self.next_id:
                self.next_id = wid + 1
            self.waits[wid] = (wid, us, tid, work, sid)
            self._write(text + self._ret(wid, returned, None, None) if returned else text)

    def _matched(self, oid: int, src: int) -> None:
        """Open op ``oid``, a wildcard receive, matched sender ``src``: it counts on that
        sender's channel from now on (as the model reads a checkpoint)."""
        entry = self.open.get(oid)
        desc = self._by_did.get(entry[2]) if entry is not None else None
        channel = desc[3] if desc is not None else None
        if channel is None or channel[1] != ANY_SOURCE:
            return
        channels = self.channels
        left = channels.get(channel, 0) - 1
        if left > 0:
            channels[channel] = left
        else:
            channels.pop(channel, None)
        named = (channel[0], src, channel[2], channel[3])
        channels[named] = channels.get(named, 0) + 1

    def _done(self, oid: int, t: int, src: int | None) -> str:
        if src is not None:
            self._matched(oid, src)
        if self.open.pop(oid, None) is not None:
            self.issued.discard(oid)
            self.dropped.discard(oid)
        us = (t - self.t0) // 1000
        dt = us - self._us
        self._us = us
        return encode.done_line(dt, self._last - oid, src)

    def done(self, oid: int, t: int, src: int | None = None) -> None:
        """Async op ``oid`` was seen complete."""
        with self.lock:
            text = self._head()
            self._write(text + self._done(oid, t, src))

    def _drop(self, oid: int, t: int) -> str:
        if oid in self.open:
            self.dropped.add(oid)
        us = (t - self.t0) // 1000
        dt = us - self._us
        self._us = us
        return encode.drop_line(dt, self._last - oid)

    def drop(self, oid: int, t: int) -> None:
        """The work of async P2P op ``oid`` was dropped (see :meth:`hold_drop`)."""
        with self.lock:
            text = self._head()
            self._write(text + self._drop(oid, t))

    def store(
        self,
        cid: int,
        t: int,
        tid: int,
        op: str,
        store: str | None,
        prefix: str,
        keys: Sequence[str],
        block: bool,
        sid: int,
        timeout: float | None = None,
    ) -> None:
        """A c10d Store call ``cid`` (``block``: it waits for its keys, a ``ret``
        follows)."""
        with self.lock:
            text = self._head() + self._stack(sid)
            us = (t - self.t0) // 1000
            keys = [str(key) for key in keys]
            cid_text = "null" if cid == self._last + 1 else str(cid)
            text += encode.store_line(
                us - self._us, sid, tid, op, store, prefix, keys, block, timeout, cid_text
            )
            self._us = us
            self._last = cid
            if cid >= self.next_id:
                self.next_id = cid + 1
            if block:
                self.stores[cid] = (cid, us, tid, op, store, prefix, keys, timeout, sid)
            self._write(text)

    def newgroup(
        self, nid: int, t: int, ranks: Sequence[int] | None, gid: str | None, sid: int
    ) -> None:
        """A call of new_group (``ranks`` None: all; ``gid`` None: not a member)."""
        with self.lock:
            text = self._head() + self._stack(sid)
            us = (t - self.t0) // 1000
            ranks_list = list(ranks) if ranks is not None else None
            nid_text = "null" if nid == self._last + 1 else str(nid)
            text += encode.newgroup_line(us - self._us, ranks_list, gid, sid, nid_text)
            self._us = us
            self._last = nid
            if nid >= self.next_id:
                self.next_id = nid + 1
            self.newgroups.append((nid, us, ranks_list, gid, sid))
            self._write(text)

    def _timed(self, t: int, line: Callable[[int], str], sid: int = 0) -> None:
        """A record that changes no state: ``line(dt)``, after its stack's definition."""
        with self.lock:
            text = self._head() + self._stack(sid)
            us = (t - self.t0) // 1000
            text += line(us - self._us)
            self._us = us
            self._write(text)

    def nonmember(self, t: int, api: str, sid: int) -> None:
        self._timed(t, lambda dt: encode.nonmember_line(dt, api, sid), sid)

    def state_record(self, t: int, pending: Sequence[int], where: str, sid: int) -> None:
        """The watchdog's ``state``."""
        self._timed(t, lambda dt: encode.state_line(dt, pending, where, sid), sid)

    def threads(self, t: int, live: int) -> None:
        """The ``threads`` record: ``live`` threads of the user's code besides the main
        one (repeated after every checkpoint while not 0)."""
        self.live_threads = live
        self._timed(t, lambda dt: encode.threads_line(dt, live))

    def thread_error(self, t: int, tid: int, name: str, err: str, sid: int) -> None:
        """The ``thread_error`` record: thread ``tid`` (``name``) ended with the uncaught
        exception ``err`` raised at stack ``sid`` (repeated after every checkpoint)."""
        self.thread_errors = [*self.thread_errors[1 - THREAD_ERRORS :], (tid, name, err, sid)]
        self._timed(t, lambda dt: encode.thread_error_line(dt, tid, name, err, sid), sid)

    def end(self, t: int, how: str, err: str | None = None, sid: int = 0) -> None:
        """The ``end`` record (``err``, ``sid``: the uncaught exception that ended the
        program and where it was raised)."""
        self._timed(t, lambda dt: encode.end_line(dt, how, err, sid), sid if err else 0)

    # -- segments and checkpoints ------------------------------------------------------------

    def start_segment(self, segment: int, t: int | None = None) -> str:
        """What a new segment starts with after its header: its checkpoint (with the
        definitions it needs), or nothing for the first segment."""
        self.segment = segment
        self._stacks_defined = {0}
        self._descs_defined = set()
        return self._checkpoint(self._clock() if t is None else t) if segment else ""

    def checkpoint(self, t: int) -> None:
        """Write a checkpoint now (the encoder writes them by itself as bytes go by)."""
        with self.lock:
            self._write(self._head() + self._checkpoint(t))

    def pending(self) -> list[int]:
        """Async ops issued and not yet seen complete."""
        return sorted(i for i in self.issued if self.open[i][5])

    def _checkpoint(self, t: int) -> str:
        """A ``checkpoint`` record of the stream so far, after the definitions it needs."""
        head: list[str] = []
        opened = []
        for entry in self.open.values():
            desc = self._by_did.get(entry[2])
            if desc is None:
                continue
            if desc[0] not in self._descs_defined:
                head.append(self._define(desc))
            opened.append(list(entry[:5]))
        waits = [list(wait) for wait in self.waits.values()]
        newgroups = [
            [nid, us, None if ranks is None else encode.ranks_value(ranks), gid, sid]
            for nid, us, ranks, gid, sid in self.newgroups
        ]
        self.dropped &= self.open.keys()
        stores = [list(call) for call in self.stores.values()]
        for sid in (
            *(w[4] for w in self.waits.values()),
            *(g[4] for g in self.newgroups),
            *(c[8] for c in self.stores.values()),
        ):
            head.append(self._stack(sid))
        body = {
            "segment": self.segment,
            "next_id": self.next_id,
            "ops_before": self.ops_before,
            "collectives": collectives(self.seqs),
            "channels": [[*key, count] for key, count in self.channels.items()],
            "groups": {
                gid: None if ranks is None else encode.ranks_value(ranks)
                for gid, ranks in self.groups.items()
            },
            "open": opened,
            "issued": sorted(self.issued),
            "waits": waits,
            "pending": self.pending(),
            "newgroups": newgroups,
            "dropped": sorted(self.dropped),
            "stores": stores,
        }
        us = (t - self.t0) // 1000
        self._us = us
        self._last = self.next_id - 1
        self._last_tid = 0
        self._last_sid = -1
        self.seqs = expected_seqs(collectives(self.seqs), self.channels, self.me)
        live = encode.threads_line(0, self.live_threads) if self.live_threads else ""
        died = "".join(
            self._stack(sid) + encode.thread_error_line(0, tid, name, err, sid)
            for tid, name, err, sid in self.thread_errors
        )
        return "".join(head) + encode.checkpoint_line(us, body) + live + died
