"""The stateful encoder of one rank's stream of records (format v2, writer side).

A :class:`StreamEncoder` turns the recorder's events into lines of
:mod:`dl2.trace.schema.encode`, making them small: it interns stacks and op
descriptions (each defined once per segment, on first use), writes times as µs deltas,
leaves out ids, seqs and threads that follow from the previous records, and merges the
issue and the wait of a blocking op into one record.  The reader
(:mod:`dl2.trace.schema.reader`) undoes all of it with the same rules, so both sides
must see the same lines in the same order: a caller writes every line it gets, in the
order it got them, under one lock.

It also keeps the stream's :class:`~dl2.trace.schema.state.StreamState`, from which it
writes ``checkpoint`` records: at the start of every segment but the first, and every
so often within a segment (a reader that met a corrupt line resynchronises there).

Standard library only: the recorder runs it inside every rank.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from typing import Any

from dl2.trace.schema import encode
from dl2.trace.schema.state import GROUP
from dl2.trace.schema.state import P2P
from dl2.trace.schema.state import StreamState
from dl2.trace.schema.state import channel_of
from dl2.trace.schema.state import op_family
from dl2.trace.schema.state import seq_key
from dl2.trace.schema.state import settles_on_return

#: Descriptions kept in memory before the table is trimmed to those of open ops.
DESC_LIMIT = 20_000


class StackTable:
    """Encoded stacks by id, process-wide: id 0 is the empty stack (never defined).
    Threads intern without a lock: ids come from an atomic counter, and a stack two
    threads intern at once keeps the id published first."""

    def __init__(self) -> None:
        self._texts: dict[int, str] = {0: encode.EMPTY_STACK}
        self._ids: dict[str, int] = {encode.EMPTY_STACK: 0}
        self._next = itertools.count(1)

    def intern(self, text: str) -> int:
        """The id of an encoded stack (:func:`~dl2.trace.schema.encode.stack_json`)."""
        sid = self._ids.get(text)
        if sid is None:
            candidate = next(self._next)
            self._texts[candidate] = text  # before the id is published
            sid = self._ids.setdefault(text, candidate)
        return sid

    def text(self, sid: int) -> str:
        return self._texts.get(sid, encode.EMPTY_STACK)


# An interned op description: (did, its "d" line, seq key, channel, async, settles on
# return, tid, stack id, ranks of a create_group).
_Desc = tuple[int, str, Any, Any, bool, bool, int, int, Any]


class StreamEncoder:
    """Encodes one rank's records, segment after segment.

    Args:
        rank: the global rank (P2P channels are named by global ranks).
        t0: ``time.monotonic_ns()`` of the stream's start (every segment's header has it).
        stacks: where stack ids come from (the recorder's capture interns into it).
    """

    __slots__ = (
        "_by_did", "_descs", "_descs_defined", "_dids", "_last", "_last_sid", "_last_tid",
        "_stacks_defined", "_us", "me", "segment", "stacks", "state", "t0",
    )  # fmt: skip

    def __init__(self, rank: int, t0: int, stacks: StackTable) -> None:
        self.me = rank
        self.t0 = t0
        self.stacks = stacks
        self.state = StreamState()
        self.segment = 0
        self._descs: dict[tuple[Any, ...], _Desc] = {}
        self._by_did: dict[int, _Desc] = {}
        self._dids = itertools.count(1)
        self._stacks_defined: set[int] = {0}
        self._descs_defined: set[int] = set()
        self._last = 0  # the id of the last record that created one
        self._last_tid = 0  # thread and stack of the last op record
        self._last_sid = -1
        self._us = 0  # time of the last timed record, µs after t0

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
        self,
        key: tuple[Any, ...],
        gid: str,
        peer: int | None,
        tag: int,
        ranks: Sequence[int] | None,
    ) -> _Desc:
        gid_json, op, api, fields, is_async, tid, sid, eager, deferred = key
        if len(self._descs) >= DESC_LIMIT:
            self._trim()
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

    def _trim(self) -> None:
        """Forget the descriptions no open op uses (a job whose every op differs)."""
        used = {payload[2] for payload, _, _ in self.state.open.values()}
        self._descs = {k: d for k, d in self._descs.items() if d[0] in used}
        self._by_did = {d[0]: d for d in self._descs.values()}

    # -- time and ids -----------------------------------------------------------------

    def _dt(self, t: int) -> int:
        us = (t - self.t0) // 1000
        dt = us - self._us
        self._us = us
        return dt

    def _new_id(self, rid: int) -> str:
        """An id being created: implied when it follows the last one."""
        implied = rid == self._last + 1
        self._last = rid
        return "null" if implied else str(rid)

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
    ) -> str:
        """An op entered (see :func:`~dl2.trace.schema.encode.op_fields` for
        ``fields``; ``peer`` and ``tag`` repeat a P2P op's, ``ranks`` a create_group's)."""
        key = (gid_json, op, api, fields, is_async, tid, sid, eager, deferred)
        desc = self._descs.get(key)
        if desc is None:
            desc = self._describe(key, gid, peer, tag, ranks)
        did = desc[0]
        head = "" if did in self._descs_defined else self._define(desc)
        state = self.state
        skey = desc[2]
        seq_text = "null"
        if skey is not None and seq is not None and seq != state.seqs.get(skey, 0):
            seq_text = str(seq)
        us = (t - self.t0) // 1000
        dt = us - self._us
        self._us = us
        if oid == self._last + 1 and seq_text == "null" and batch is None:
            line = f'["o",{dt},{did}]\n'
        else:
            line = encode.op_line(dt, did, self._new_id(oid), seq_text, encode.json_int(batch))
        self._last = oid
        self._last_tid = tid
        self._last_sid = desc[7]
        state.opened(oid, (oid, us, did, seq, batch), skey, seq, desc[3], is_async, desc[5])
        if desc[8] is not None:
            state.created(*desc[8])
        return head + line

    def issued_wait(
        self,
        oid: int,
        wid: int,
        t: int,
        tid: int,
        sid: int,
        returned: int = 0,
        src: int | None = None,
    ) -> str:
        """Blocking op ``oid`` was issued and thread ``tid`` waits on it (wait ``wid``,
        at the op's stack ``sid``); ``returned``: when the wait returned (``src``: a
        wildcard's sender), if it did."""
        last = self._last
        us = (t - self.t0) // 1000
        dt = us - self._us
        self._us = us
        self._last = wid
        short = oid == last and wid == oid + 1 and tid == self._last_tid and sid == self._last_sid
        if returned:
            self.state.issued_and_done(oid, wid)
            end = (returned - self.t0) // 1000
            self._us = end
            if short and src is None:  # the hot path: one record for all three
                return f'["k",{dt},{end - us}]\n'
            done = encode.ret_line(end - us, 0, None, src)
        else:
            self.state.issued_waiting(oid, wid, (wid, us, tid, oid, sid))
            done = ""
        if short:
            return f'["b",{dt}]\n' + done
        wid_text = "null" if wid == last + 1 else str(wid)
        line = encode.issued_wait_line(dt, last - oid, wid_text, str(tid), str(sid))
        return self._stack(sid) + line + done

    def ret(self, rid: int, t: int, err: str | None = None, src: int | None = None) -> str:
        """Op or wait ``rid`` returned (``err``: it raised; ``src``: a wildcard's sender)."""
        self.state.returned(rid, err is not None)
        us = (t - self.t0) // 1000
        dt = us - self._us
        self._us = us
        if rid == self._last and err is None and src is None:
            return f'["r",{dt}]\n'  # the hot path: a blocking op's wait returned
        return encode.ret_line(dt, self._last - rid, err, src)

    def held(self, records: deque[tuple[Any, ...]]) -> str:
        """The records a writer held back, taken from ``records`` (under the writer's
        lock): ``(op id, wait id, t, tid, sid)`` for :meth:`issued_wait`, ``(id, t,
        src)`` for a wait's :meth:`ret`."""
        if len(records) == 1 and len(records[0]) == 3:  # the usual: one ret
            rid, t, src = records.popleft()
            return self.ret(rid, t, None, src)
        text = ""
        while records:
            record = records.popleft()
            if len(record) == 3:
                text += self.ret(record[0], record[1], None, record[2])
            elif records and len(records[0]) == 3 and records[0][0] == record[1]:
                _, t, src = records.popleft()  # its wait returned already: the op is complete
                oid, wid, at, tid, sid = record
                text += self.issued_wait(oid, wid, at, tid, sid, t, src)
            else:
                text += self.issued_wait(*record)
        return text

    def wait(self, wid: int, t: int, tid: int, work: int, sid: int) -> str:
        """Thread ``tid`` waits on op ``work`` from stack ``sid``."""
        head = self._stack(sid)
        dt = self._dt(t)
        back = self._last - work
        tid_text = "null" if tid == self._last_tid else str(tid)
        self.state.waited(wid, work, (wid, self._us, tid, work, sid))
        return head + encode.wait_line(dt, back, sid, tid_text, self._new_id(wid))

    def done(self, oid: int, t: int, src: int | None = None) -> str:
        """Async op ``oid`` was seen complete."""
        self.state.completed(oid)
        return encode.done_line(self._dt(t), self._last - oid, src)

    def newgroup(
        self, nid: int, t: int, ranks: Sequence[int] | None, gid: str | None, sid: int
    ) -> str:
        """A call of new_group (``ranks`` None: all; ``gid`` None: not a member)."""
        head = self._stack(sid)
        dt = self._dt(t)
        ranks_list = list(ranks) if ranks is not None else None
        self.state.called_new_group(nid, (nid, self._us, ranks_list, gid, sid))
        return head + encode.newgroup_line(dt, ranks_list, gid, sid, self._new_id(nid))

    def nonmember(self, t: int, api: str, sid: int) -> str:
        return self._stack(sid) + encode.nonmember_line(self._dt(t), api, sid)

    def state_record(self, t: int, pending: Sequence[int], where: str, sid: int) -> str:
        """The watchdog's ``state``."""
        return self._stack(sid) + encode.state_line(self._dt(t), pending, where, sid)

    def end(self, t: int, how: str) -> str:
        return encode.end_line(self._dt(t), how)

    # -- segments and checkpoints ------------------------------------------------------------

    def start_segment(self, segment: int, t: int) -> str:
        """What a new segment starts with after its header: its checkpoint (with the
        definitions it needs), or nothing for the first segment."""
        self.segment = segment
        self._stacks_defined = {0}
        self._descs_defined = set()
        return self.checkpoint(t) if segment else ""

    def checkpoint(self, t: int) -> str:
        """A ``checkpoint`` record of the stream so far, after the definitions it needs."""
        state = self.state
        head: list[str] = []
        opened = []
        for payload, _, _ in state.open.values():
            desc = self._by_did.get(payload[2])
            if desc is None:
                continue
            if desc[0] not in self._descs_defined:
                head.append(self._define(desc))
            opened.append(list(payload))
        waits = [list(payload) for _, payload in state.waits.values()]
        newgroups = [list(payload) for payload in state.newgroups]
        for entry in (*waits, *newgroups):
            head.append(self._stack(entry[-1]))
        body = {
            "segment": self.segment,
            "next_id": state.next_id,
            "ops_before": state.ops_before,
            "collectives": state.collectives(),
            "channels": [[*key, count] for key, count in state.channels.items()],
            "groups": state.groups,
            "open": opened,
            "issued": sorted(state.issued),
            "waits": waits,
            "pending": state.pending(),
            "newgroups": newgroups,
        }
        us = (t - self.t0) // 1000
        self._us = us
        self._last = state.next_id - 1
        self._last_tid = 0
        self._last_sid = -1
        state.resync_seqs(self.me)
        return "".join(head) + encode.checkpoint_line(us, body)
