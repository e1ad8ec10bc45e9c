"""The record schema (format v2): every kind written by the recorder's stream encoder
reads back as the same typed record, interned and merged records included; repeated ops
are small; no input makes the reader fail other than with a clean TraceFormatError."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dl2.errors import TraceFormatError
from dl2.trace.format import TraceReader
from dl2.trace.format import parse_header
from dl2.trace.rotated import snapshot
from dl2.trace.rotated import track
from dl2.trace.schema import RECORD_KINDS
from dl2.trace.schema import encode
from dl2.trace.schema import stream as stream_mod
from dl2.trace.schema.decode import CheckpointRecord
from dl2.trace.schema.decode import CorruptRecord
from dl2.trace.schema.decode import DoneRecord
from dl2.trace.schema.decode import DropRecord
from dl2.trace.schema.decode import Emulation
from dl2.trace.schema.decode import EndRecord
from dl2.trace.schema.decode import Frame
from dl2.trace.schema.decode import Header
from dl2.trace.schema.decode import NewGroupRecord
from dl2.trace.schema.decode import NonMemberRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import Retention
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import ThreadErrorRecord
from dl2.trace.schema.decode import ThreadsRecord
from dl2.trace.schema.decode import UnknownRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.schema.decode import caller_frame
from dl2.trace.schema.decode import decode_header
from dl2.trace.schema.decode import package_frame
from dl2.trace.schema.decode import record_to_dict
from dl2.trace.schema.decode import report_frame
from dl2.trace.schema.stream import StackTable
from dl2.trace.schema.stream import StreamEncoder
from dl2.trace.schema.wire import decode_line

RECORD_TYPES = (
    OpRecord,
    RetRecord,
    WaitRecord,
    DoneRecord,
    DropRecord,
    NewGroupRecord,
    NonMemberRecord,
    StateRecord,
    EndRecord,
    ThreadsRecord,
    ThreadErrorRecord,
    StoreRecord,
    CheckpointRecord,
    UnknownRecord,
)

# File names a stack may carry: unicode, quotes, backslashes, newlines, an installed
# package's file.
ODD_FILES = [
    "train.py",
    "/home/zoë/训练/模型.py",
    'C:\\Users\\me\\"quoted" dir\\train.py',
    "line\nbreak\r\tand\x00nul.py",
    "/venv/lib/python3.11/site-packages/transformers/modeling.py",
    "emoji 🚀.py",
]
STACK = [(f, i + 1, f"fn_{i}") for i, f in enumerate(ODD_FILES)]
FRAMES = tuple(Frame(f, line, function) for f, line, function in STACK)
T0 = 5_000_000_000
TID = 140_123_456_789_012


class Stream:
    """A rank's stream: records encoded by the recorder's encoder, read back by the
    trace reader (the test writes times in µs after t0)."""

    def __init__(self, rank: int = 0, segment: int = 0) -> None:
        self.stacks = StackTable()
        self.lines: list[str] = []  # one entry per write
        self.encoder = StreamEncoder(rank, T0, self.stacks, lambda data: self.add(data.decode()))
        self.header = self.header_line(rank, segment)

    @staticmethod
    def header_line(rank: int, segment: int = 0) -> str:
        return encode.header_line(
            rank=rank, world_size=4, pid=1, host="h", t0=T0, wall=0, dl2="t", segment=segment
        )

    def sid(self, frames: list[tuple[str, int, str]] = STACK) -> int:
        return self.stacks.intern(encode.stack_of(frames))

    def add(self, text: str) -> str:
        self.lines.append(text)
        return text

    def blocked(self, *issue: int, returned: int = 0, src: int | None = None) -> None:
        """A blocking op issued and waited on (``issue``: op id, wait id, t, tid, sid),
        and the wait returned at ``returned``, as the recorder holds them back and
        writes them at the next record."""
        oid, wid, t, tid, sid = issue
        self.encoder.hold_issued_wait(oid, wid, t, tid, sid)
        if returned:
            self.encoder.hold_ret(wid, returned, src)
        self.encoder.flush()

    def op(self, oid: int, us: int, op: str = "all_reduce", **kw: object) -> None:
        fields = kw.pop("fields", ',"redop":"sum","dtype":"float32","count":8')
        args = dict(tid=TID, gid="0", seq=None, api=op, is_async=False, sid=self.sid(), batch=None)
        args.update(kw)  # type: ignore[arg-type]
        gid = str(args["gid"])
        self.encoder.op(
            oid,
            T0 + us * 1000,
            args["tid"],  # type: ignore[arg-type]
            gid,
            encode.json_str(gid),
            args["seq"],  # type: ignore[arg-type]
            op,
            args["api"],  # type: ignore[arg-type]
            fields,  # type: ignore[arg-type]
            bool(args["is_async"]),
            args["sid"],  # type: ignore[arg-type]
            args["batch"],  # type: ignore[arg-type]
            bool(args.get("eager", False)),
            bool(args.get("deferred", False)),
            args.get("peer"),  # type: ignore[arg-type]
            int(args.get("tag", 0)),  # type: ignore[call-overload]
            args.get("ranks"),  # type: ignore[arg-type]
        )

    def text(self) -> bytes:
        return (self.header + "".join(self.lines)).encode()

    def read(self) -> list[Record]:
        reader = TraceReader("f")
        records = reader.feed(self.text())
        assert reader.truncated is None and not reader.warnings and not reader.skipped
        return records


def t(us: int) -> int:
    return T0 + us * 1000


# -- the header ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch", "backend", "argv", "emulate", "retain"),
    [
        (None, None, None, None, None),
        ("2.13.0+cpu", "gloo", ["train.py", "--lr", 'ü "x" \\'], (65536, False), (1 << 24, 4)),
        ("2.13.0", "gloo", [], (0, True), (4096, 0)),
    ],
)
def test_header_round_trip(torch, backend, argv, emulate, retain):
    line = encode.header_line(
        rank=3,
        world_size=8,
        pid=4242,
        host='node-"7"\\ü',
        t0=123,
        wall=1_700_000_000_000_000_000,
        dl2="0.1",
        torch=torch,
        backend=backend,
        argv=argv,
        emulate=emulate,
        segment=7,
        retain=retain,
    )
    assert line.endswith("\n") and line.count("\n") == 1
    assert decode_header(line[:-1].encode()) == Header(
        magic="dl2-trace",
        format=2,
        rank=3,
        world_size=8,
        dl2="0.1",
        pid=4242,
        host='node-"7"\\ü',
        t0=123,
        wall=1_700_000_000_000_000_000,
        torch=torch,
        backend=backend,
        argv=tuple(argv) if argv is not None else (),
        emulate=Emulation(*emulate) if emulate is not None else None,
        segment=7,
        retain=Retention(*retain) if retain is not None else None,
    )


def test_a_version_1_header_is_refused_naming_its_version():
    line = json.dumps({"k": "header", "magic": "dl2-trace", "format": 1, "rank": 0}).encode()
    with pytest.raises(TraceFormatError, match="trace format version 1, this dl2 reads version 2"):
        parse_header(line, "f")


# -- round trips, kind by kind ----------------------------------------------------------------


def test_collective_op_round_trip_with_every_field():
    s = Stream()
    fields = (
        encode.root_field(2)
        + encode.redop_field("max")
        + encode.tensor_fields("bfloat16", 1 << 40)
        + encode.splits_field([[1, 2, 3], [4, 5, 6]])
        + encode.ranks_field([0, 2, 5])
        + encode.timeout_field(1800.0)
    )
    s.op(7, 10**9, "reduce", fields=fields, gid='g"1', seq=3, is_async=True, batch=5)
    assert s.read() == [
        OpRecord(
            id=7,
            t=t(10**9),
            tid=TID,
            gid='g"1',
            seq=3,
            op="reduce",
            api="reduce",
            root=2,
            redop="max",
            dtype="bfloat16",
            count=1 << 40,
            splits=((1, 2, 3), (4, 5, 6)),
            ranks=(0, 2, 5),
            timeout=1800.0,
            is_async=True,
            batch=5,
            stack=FRAMES,
        )
    ]


def test_op_with_optional_fields_absent():
    s = Stream()
    s.op(1, 2, "barrier", fields="", api=None, tid=3, sid=0, seq=0)
    assert s.read() == [OpRecord(id=1, t=t(2), tid=3, gid="0", seq=0, op="barrier")]


@pytest.mark.parametrize("peer", [1, None])
@pytest.mark.parametrize(("eager", "deferred"), [(False, False), (True, False), (True, True)])
def test_p2p_op_round_trip(peer, eager, deferred):
    s = Stream()
    fields = encode.peer_tag_fields(peer, 9) + encode.tensor_fields("uint8", 16)
    s.op(
        4, 5, "recv", api="irecv", fields=fields, seq=0, is_async=True, eager=eager,
        deferred=deferred, peer=peer, tag=9, sid=s.sid(STACK[:1]),
    )  # fmt: skip
    assert s.read() == [
        OpRecord(
            id=4,
            t=t(5),
            tid=TID,
            gid="0",
            seq=0,
            op="recv",
            api="irecv",
            peer=peer,
            tag=9,
            dtype="uint8",
            count=16,
            is_async=True,
            eager=eager,
            deferred=deferred,
            stack=FRAMES[:1],
        )
    ]
    assert '"peer":null' in s.lines[0] if peer is None else '"peer":1' in s.lines[0]


def test_op_fields_write_what_the_describers_write():
    # the builders' general form and the recorder's fragments give the same line
    assert encode.op_fields(root=1, redop="sum", dtype="float32", count=4) == (
        encode.root_field(1) + encode.reduce_fields("sum", "float32", 4)
    )
    assert encode.op_fields(peer=None, tag=3, dtype="int8", count=2) == (
        encode.peer_tag_fields(None, 3) + encode.tensor_fields("int8", 2)
    )
    assert encode.op_fields() == ""


@pytest.mark.parametrize("seconds", [1800.0, 5.0, 0.5, 1234.5678, 1e-7, 86399999999999.99])
def test_timeout_is_short_and_exact(seconds):
    s = Stream()
    field = encode.timeout_field(seconds)
    s.op(1, 1, "monitored_barrier", fields=field, seq=0)
    (record,) = s.read()
    assert isinstance(record, OpRecord) and record.timeout == seconds
    if seconds == 1800.0:
        assert field == ',"timeout":1800'  # as written before: {seconds:g}
    assert encode.timeout_field(float("inf")) == encode.timeout_field(float("nan")) == ""


@pytest.mark.parametrize(
    ("err", "src"), [(None, None), (None, 3), ('RuntimeError: "bad"\n\\ 💥', None)]
)
def test_ret_round_trip(err, src):
    s = Stream()
    s.op(8, 1)
    s.encoder.ret(8, t(9), err, src)
    assert s.read()[1] == RetRecord(id=8, t=t(9), err=err, src=src)


def test_wait_round_trip():
    s = Stream()
    s.op(7, 1, is_async=True)
    s.encoder.wait(10, t(11), 12, 7, s.sid())
    s.encoder.wait(11, t(12), TID, 7, 0)
    assert s.read()[1:] == [
        WaitRecord(id=10, t=t(11), tid=12, work=7, stack=FRAMES),
        WaitRecord(id=11, t=t(12), tid=TID, work=7),
    ]


@pytest.mark.parametrize("src", [None, 0, 5])
def test_done_round_trip(src):
    s = Stream()
    s.op(3, 1, is_async=True)
    s.encoder.done(3, t(4), src)
    assert s.read()[1] == DoneRecord(id=3, t=t(4), src=src)


def test_drop_round_trip():
    s = Stream()
    s.op(3, 1, op="send", is_async=True, peer=1)
    s.encoder.hold_drop(3, t(4))  # from the work's finaliser: written with the next record
    s.encoder.end(t(5), "exit")
    assert s.read()[1:] == [DropRecord(id=3, t=t(4)), EndRecord(t=t(5), how="exit")]


@pytest.mark.parametrize(("ranks", "gid"), [([0, 2], "1"), ([1, 3], None), (None, 'x"y')])
def test_newgroup_round_trip(ranks, gid):
    s = Stream()
    s.encoder.newgroup(5, t(6), ranks, gid, s.sid())
    expected = tuple(ranks) if ranks is not None else None
    assert s.read() == [NewGroupRecord(id=5, t=t(6), ranks=expected, gid=gid, stack=FRAMES)]


@pytest.mark.parametrize("api", ["all_reduce", 'odd "api"\\\n'])
def test_nonmember_round_trip(api):
    s = Stream()
    s.encoder.nonmember(t(5), api, s.sid())
    assert s.read() == [NonMemberRecord(t=t(5), api=api, stack=FRAMES)]


@pytest.mark.parametrize(
    ("pending", "where"), [([], "python"), ([3, 1, 2], "backward"), ([4], "comm"), ([5], "poll")]
)
def test_state_round_trip(pending, where):
    s = Stream()
    s.encoder.state_record(t(5), pending, where, s.sid())
    assert s.read() == [StateRecord(t=t(5), pending=tuple(pending), where=where, stack=FRAMES)]


@pytest.mark.parametrize("how", ["exit", "destroy"])
def test_end_round_trip(how):
    s = Stream()
    s.encoder.end(t(99), how)
    assert s.read() == [EndRecord(t=t(99), how=how)]


def test_thread_error_round_trip():
    s = Stream()
    s.encoder.thread_error(t(4), 140001, 'Thread-1 (send "x")', "KeyError: 'acc'", s.sid())
    assert s.read() == [
        ThreadErrorRecord(
            t=t(4), tid=140001, name='Thread-1 (send "x")', err="KeyError: 'acc'", stack=FRAMES
        )
    ]


def test_threads_round_trip_and_the_count_follows_every_checkpoint():
    s = Stream()
    s.encoder.threads(t(3), 2)
    s.encoder.checkpoint(t(7))
    s.encoder.threads(t(9), 0)
    s.encoder.checkpoint(t(11))
    records = s.read()
    assert [r for r in records if isinstance(r, ThreadsRecord)] == [
        ThreadsRecord(t=t(3), live=2),
        ThreadsRecord(t=t(7), live=2),  # repeated after the checkpoint while not 0
        ThreadsRecord(t=t(9), live=0),
    ]


def test_end_round_trip_with_the_exception_that_ended_the_program():
    s = Stream()
    s.encoder.end(t(99), "exit", 'ValueError: "shard" 1\nis corrupt', s.sid())
    assert s.read() == [
        EndRecord(t=t(99), how="exit", err='ValueError: "shard" 1\nis corrupt', stack=FRAMES)
    ]


def test_checkpoint_round_trip_with_every_kind_of_open_state():
    # GIVEN rank 1's stream: groups, new_group calls, a completed blocking op, an isend
    # issued (pending), a wildcard irecv entered (not issued), a blocking op waited on,
    # and an async op waited on
    s = Stream(rank=1)
    s.op(1, 1, "create_group", fields=encode.ranks_field([0, 1]), ranks=[0, 1], api="new_group")
    s.encoder.ret(1, t(2))
    s.encoder.newgroup(2, t(3), [0, 1], "1", s.sid())
    s.encoder.newgroup(3, t(4), [2, 3], None, 0)
    s.op(4, 5, "create_group", gid="1", fields=encode.ranks_field([0, 1]), ranks=[0, 1])
    s.encoder.ret(4, t(6))
    s.op(5, 7, seq=0)
    s.blocked(5, 6, t(8), TID, s.sid(), returned=t(9))
    p2p = encode.peer_tag_fields(0, 3) + encode.tensor_fields("int8", 2)
    s.op(7, 10, "send", api="isend", fields=p2p, peer=0, tag=3, seq=0, is_async=True, batch=7)
    s.encoder.ret(7, t(11))
    wild = encode.peer_tag_fields(None, 0) + encode.tensor_fields("int8", 2)
    s.op(8, 12, "recv", api="irecv", gid="1", fields=wild, seq=0, is_async=True, sid=0)
    s.op(9, 13, "barrier", gid="1", fields="", seq=0)
    s.blocked(9, 10, t(14), TID, s.sid())
    s.op(11, 15, seq=1, is_async=True, tid=7)
    s.encoder.ret(11, t(16))
    s.encoder.wait(12, t(17), 8, 11, s.sid(STACK[:2]))
    before = s.read()
    # WHEN a new segment starts: its checkpoint, with the definitions it needs
    text = Stream.header_line(1, segment=1) + s.encoder.start_segment(1, t(18))
    reader = TraceReader("seg1")
    (cp,) = reader.feed(text.encode())
    # THEN it reads back as a checkpoint of exactly that state
    assert isinstance(cp, CheckpointRecord) and not reader.warnings
    assert cp == snapshot(track(before, 1, T0), t(18), 1)
    assert (cp.next_id, cp.ops_before, cp.segment) == (13, 7, 1)
    assert cp.collectives == {"0": 2, "1": 1}
    assert cp.channels == (("0", 1, 0, 3, 1), ("1", -1, 1, 0, 1))
    assert cp.groups == {"0": (0, 1), "1": (0, 1)}
    assert [op.id for op in cp.open] == [7, 8, 9, 11]
    assert cp.issued == (7, 9, 11) and cp.pending == (7, 11)
    assert [(w.id, w.work, w.tid) for w in cp.waits] == [(10, 9, TID), (12, 11, 8)]
    assert cp.waits[1].stack == FRAMES[:2] and cp.open[0].batch == 7
    assert [(g.id, g.gid) for g in cp.newgroups] == [(2, "1"), (3, None)]


@pytest.mark.parametrize(
    ("op", "store", "prefix", "keys", "block", "timeout"),
    [
        ("get", "tcp:29500", "default_pg/0//", ["ready"], True, None),
        ("wait", "file:/tmp/x y", "", ["a", 'b"\\\n💥'], True, 2.5),
        ("set", None, "", ["k"], False, None),
        ("check", "tcp:1", "p/", [], False, None),
    ],
)
def test_store_round_trip(op, store, prefix, keys, block, timeout):
    s = Stream()
    s.encoder.store(3, t(4), 5, op, store, prefix, keys, block, s.sid(), timeout)
    (record,) = s.read()
    assert record == StoreRecord(
        id=3,
        t=t(4),
        tid=5,
        op=op,
        store=store,
        prefix=prefix,
        keys=tuple(keys),
        block=block,
        timeout=timeout,
        stack=FRAMES,
    )
    assert isinstance(record, StoreRecord)
    assert record.namespace == (None if store is None else f"{store}|{prefix}")


def test_every_record_kind_has_a_round_trip_test():
    tested = {cls.__struct_config__.tag for cls in RECORD_TYPES if cls is not UnknownRecord}
    assert tested == RECORD_KINDS


# -- interning and merging ----------------------------------------------------------------------


def blocking_loop(
    s: Stream, n: int, first: int = 1, every_us: int = 1500, merged: bool = True
) -> None:
    """``n`` blocking all_reduce of one tensor from one line: op, issued + wait, and the
    wait's ret, merged as the recorder writes them when the wait returned before its
    next write (else the watchdog writes the issue + wait alone first)."""
    oid = first
    for i in range(n):
        us = 10**6 + i * every_us
        s.op(oid, us, seq=i)
        if merged:
            s.blocked(oid, oid + 1, t(us + 40), TID, s.sid(), returned=t(us + 900))
        else:
            s.blocked(oid, oid + 1, t(us + 40), TID, s.sid())
            s.encoder.ret(oid + 1, t(us + 900))
        oid += 2


@pytest.mark.parametrize("merged", [True, False])
def test_a_blocking_op_merges_its_issue_and_wait_and_reads_back_as_four_records(merged):
    s = Stream()
    blocking_loop(s, 2, merged=merged)
    records = s.read()
    op = OpRecord(
        id=1,
        t=t(10**6),
        tid=TID,
        seq=0,
        op="all_reduce",
        api="all_reduce",
        redop="sum",
        dtype="float32",
        count=8,
        stack=FRAMES,
    )
    assert records[:4] == [
        op,
        RetRecord(id=1, t=t(10**6 + 40)),
        WaitRecord(id=2, t=t(10**6 + 40), tid=TID, work=1, stack=FRAMES),
        RetRecord(id=2, t=t(10**6 + 900)),
    ]
    assert [r.kind for r in records[4:]] == ["op", "ret", "wait", "ret"]
    assert records[4] == msgspec.structs.replace(op, id=3, t=t(10**6 + 1500), seq=1)
    # the stack and the description are written once
    text = "".join(s.lines)
    assert text.count('["s",') == 1 and text.count('["d",') == 1
    if merged:
        assert s.lines[2:] == ['["o",600,1]\n', '["k",40,860]\n']
    else:
        assert s.lines[3:6] == ['["o",600,1]\n', '["b",40]\n', '["r",860]\n']


def test_a_repeated_blocking_op_costs_at_most_64_bytes():
    # GIVEN 10,000 blocking all_reduce of one tensor from one line, late in a long run
    # (ids in the millions, times an hour after t0)
    s = Stream()
    s.encoder.next_id = 3_000_000
    s.op(2_999_999, 3_600 * 10**6, "barrier", fields="", seq=0)
    before = len("".join(s.lines))
    blocking_loop(s, 10_000, first=3_000_000)
    per_op = (len("".join(s.lines)) - before) / 10_000
    # THEN all of one op's records together (op, ret, wait, ret) cost at most 64 bytes
    assert per_op <= 64, per_op
    assert len(s.read()) == 1 + 4 * 10_000


def test_out_of_order_ids_and_irregular_seqs_are_written_out():
    s = Stream()
    s.op(5, 1, seq=7, tid=1)
    s.op(3, 2, seq=8, tid=2, sid=0)
    s.blocked(3, 9, t(3), 2, 0)  # not the last op's thread and stack
    s.encoder.ret(5, t(4))
    s.blocked(5, 10, t(5), 1, s.sid())
    records = s.read()
    assert [(r.kind, r.id) for r in records] == [
        ("op", 5),
        ("op", 3),
        ("ret", 3),
        ("wait", 9),
        ("ret", 5),
        ("ret", 5),
        ("wait", 10),
    ]
    assert [r.seq for r in records if isinstance(r, OpRecord)] == [7, 8]
    assert records[3] == WaitRecord(id=9, t=t(3), tid=2, work=3)
    assert records[6] == WaitRecord(id=10, t=t(5), tid=1, work=5, stack=FRAMES)


def test_p2p_seqs_are_implied_per_peer_and_direction():
    s = Stream(rank=1)
    for i, (op, peer) in enumerate([("send", 0), ("send", 2), ("send", 0), ("recv", 0)]):
        fields = encode.peer_tag_fields(peer, 0) + encode.tensor_fields("float32", 1)
        seq = {(op, peer): 0 for op, peer in [("send", 2), ("recv", 0)]}.get((op, peer), i // 2)
        s.op(i + 1, i, op, fields=fields, peer=peer, seq=seq, is_async=True)
    assert [(r.op, r.peer, r.seq) for r in s.read() if isinstance(r, OpRecord)] == [
        ("send", 0, 0),
        ("send", 2, 0),
        ("send", 0, 1),
        ("recv", 0, 0),
    ]
    assert all(line.count(",") <= 2 for line in s.lines if line.startswith('["o"'))


def test_descriptions_past_the_limit_are_trimmed_and_their_ids_never_reused(monkeypatch):
    # GIVEN a job whose ops all differ (a new description each), past the table's limit
    monkeypatch.setattr(stream_mod, "DESC_LIMIT", 4)
    s = Stream()
    for i in range(30):
        s.op(2 * i + 1, i, fields=encode.tensor_fields("float32", i % 7), seq=i, sid=0)
        s.blocked(2 * i + 1, 2 * i + 2, t(i), TID, 0, returned=t(i))
    # THEN every op reads back with its own fields
    records = s.read()
    assert [r.count for r in records if isinstance(r, OpRecord)] == [i % 7 for i in range(30)]
    dids = [json.loads(line)[1] for text in s.lines for line in text.splitlines()
            if line.startswith('["d"')]  # fmt: skip
    assert len(dids) == len(set(dids)) > 7


def test_record_to_dict_names_fields_as_version_1_did():
    s = Stream()
    s.op(1, 1, "send", fields=encode.peer_tag_fields(None, 0), peer=None, seq=0)
    op = record_to_dict(s.read()[0])
    assert op["k"] == "op" and op["peer"] is None and op["async"] is False
    assert op["stack"][0] == ["train.py", 1, "fn_0"]
    assert record_to_dict(RetRecord(id=1, t=2)) == {"k": "ret", "id": 1, "t": 2}
    assert record_to_dict(UnknownRecord("future")) == {"k": "future"}


# -- what readers tolerate, and what is corrupt ----------------------------------------------


def test_unknown_elements_and_kinds_are_tolerated():
    s = Stream()
    s.add('["e",1,"exit",null,0,{"x":[1,2]},7]\n')
    s.add('["z",3,{"frames":[]}]\n')
    assert s.read() == [EndRecord(t=t(1), how="exit"), UnknownRecord("z")]


@pytest.mark.parametrize(
    "line",
    [
        b'["o","1",2]',  # wrong type
        b'["o",1]',  # no description
        b'["r",1,0,null,5]',
        b'["s",1,[["f.py","12","main"]]]',  # a line that is no int
        b'["s",1,"f.py"]',
        b'["q",1,[1,"2"],"comm",0]',
        b'["d",1,{"op":"x","count":"4"}]',
        b"[5]",
        b'{"k":"op","id":1}',  # a version-1 record
        b"[]",
        b"garbage",
        b'["d",1,{"timeout":NaN}]',
        b"[" * 100_000,  # too deep
    ],
)
def test_malformed_lines_are_corrupt(line):
    with pytest.raises(CorruptRecord):
        decode_line(line)


def test_a_corrupt_line_mid_file_is_skipped_with_a_warning_and_a_last_one_is_a_note():
    s = Stream()
    s.op(1, 1, is_async=True)
    s.add("garbage\n")
    s.encoder.done(1, t(2))
    s.add('["x",5,0,"not a rank"]\n')
    reader = TraceReader("f")
    records = reader.feed(s.text())
    assert [r.kind for r in records] == ["op", "done"]
    ((line, note),) = reader.skipped
    assert line == 5 and note.startswith("f:5: corrupt record skipped")
    assert reader.truncated == "last record is corrupt (line 7)"
    # a reference to a stack or description the segment never defined is corrupt too
    reader = TraceReader("g")
    records = reader.feed(Stream.header_line(0).encode() + b'["o",1,3]\n["n",1,"x",9]\n[')
    assert records == [] and [w.split(" (")[0] for _, w in reader.skipped] == [
        "g:2: corrupt record skipped",
        "g:3: corrupt record skipped",
    ]


def test_report_frame_is_the_innermost_frame_of_the_users_own_code():
    lib = Frame("/venv/lib/python3.11/site-packages/x/y.py", 1, "f")
    dist = Frame("/usr/lib/python3/dist-packages/z.py", 2, "g")
    own = Frame("train.py", 3, "main")
    assert report_frame((lib, dist, own, Frame("outer.py", 4, "m"))) == own
    assert report_frame((lib, dist)) == lib
    assert report_frame(()) is None


def test_a_report_adds_the_programs_line_and_the_packages_line_around_the_named_one():
    helper = Frame("/proj/mylib/_comm.py", 6, "all_reduce_sum")
    metrics = Frame("/proj/mylib/metrics.py", 12, "compute")
    script = Frame("/proj/train.py", 24, "main")
    entry = Frame("/proj/train.py", 40, "<module>")
    package = Frame("/venv/lib/python3.11/site-packages/fakelib/cb.py", 6, "_reduce")
    # GIVEN a collective issued in a helper module the script calls through another
    # THEN the named line is the helper's, and the script's innermost line led to it
    stack = (helper, metrics, script, entry)
    assert report_frame(stack) == helper and caller_frame(stack) == script
    assert package_frame(stack) is None
    # GIVEN one issued inside an installed package the script calls
    # THEN the named line is the script's, and the package's line is the one inside
    stack = (package, script, entry)
    assert report_frame(stack) == script and package_frame(stack) == package
    assert caller_frame(stack) is None
    # AND a stack in one file, or with nothing of the user's, adds nothing
    assert caller_frame((script, entry)) is None and package_frame((script, entry)) is None
    assert caller_frame((package,)) is None and package_frame((package,)) is None
    assert caller_frame(()) is None and package_frame(()) is None
    # AND the code string a spawned process starts in (multiprocessing's "<string>") is
    # no program file: the script's line is named alone
    spawned = (Frame("/proj/test_jobs.py", 28, "_send_send"), Frame("<string>", 1, "<module>"))
    assert report_frame(spawned) == spawned[0] and caller_frame(spawned) is None


# -- any bytes: a clean error or a valid partial read -----------------------------------------

_INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_SMALL = st.integers(min_value=0, max_value=50)
_TEXT = st.text(max_size=20)
_JSON = st.recursive(
    st.none() | st.booleans() | _INT | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def _stream(draw: st.DrawFn) -> bytes:
    """A segment as some recorder could write it (any kind of record, ids in any
    order), with lines that look like records mixed in (known or unknown kinds,
    elements of any type)."""
    s = Stream(segment=draw(st.integers(0, 1)))
    if s.header.find('"segment":1') >= 0:
        s.encoder.checkpoint(T0)
    for _ in range(draw(st.integers(0, 8))):
        oid, us = draw(_SMALL), draw(_SMALL)
        sid = s.sid(draw(st.lists(st.tuples(_TEXT, _INT, _TEXT), max_size=2)))
        choice = draw(st.integers(0, 9))
        if choice <= 1:
            peer = draw(st.none() | _SMALL)
            fields = encode.peer_tag_fields(peer, 0)
            s.op(oid, us, "send", fields=fields, peer=peer, sid=sid, seq=draw(st.none() | _SMALL))
        elif choice == 2:
            done = draw(st.sampled_from([0, t(us + 3)]))
            src = draw(st.none() | _SMALL)
            s.blocked(oid, draw(_SMALL), t(us), draw(_INT), sid, returned=done, src=src)
        elif choice == 3:
            s.encoder.ret(oid, t(us), draw(st.none() | _TEXT), draw(st.none() | _INT))
        elif choice == 4:
            s.encoder.wait(oid, t(us), draw(_INT), draw(_SMALL), sid)
        elif choice == 5:
            s.encoder.state_record(t(us), draw(st.lists(_INT, max_size=3)), "poll", sid)
        elif choice == 6:
            s.encoder.checkpoint(t(us))
        elif choice == 7:
            s.encoder.done(oid, t(us), draw(st.none() | _INT))
        else:
            kind = draw(st.sampled_from(["o", "b", "r", "c", "s", "d", "future"]))
            fields = draw(st.lists(_JSON, max_size=4))
            s.add(json.dumps([kind, *fields]) + "\n")
    return s.text()


@st.composite
def _mangled(draw: st.DrawFn) -> bytes:
    """A segment, some lines cut short, bytes flipped, spliced or dropped."""
    data = bytearray(draw(_stream()))
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.integers(0, 2))
        if action == 0:
            data[at] = draw(st.integers(0, 255))
        elif action == 1:
            data[at:at] = draw(st.binary(max_size=4))
        else:
            del data[at:]
    return bytes(data)


_ANY_BYTES = st.binary(max_size=300) | _mangled()


@settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(_ANY_BYTES, st.lists(st.integers(0, 400), max_size=4))
def test_any_bytes_give_a_clean_error_or_a_valid_partial_read(data: bytes, cuts: list[int]):
    # WHEN the bytes are read at once, and fed in chunks as a live tailer would
    whole = TraceReader("f")
    try:
        records = whole.feed(data)
    except TraceFormatError as err:
        assert str(err).startswith("f: ")
        return
    # THEN what was read are typed records of complete lines, and reading resumes there
    assert all(isinstance(r, RECORD_TYPES) for r in records)
    consumed = whole.consumed
    assert 0 <= consumed <= len(data)
    assert consumed == 0 or data[consumed - 1 : consumed] == b"\n"
    note = whole.truncated
    assert note is None or note.startswith(("last record is", "truncated header"))
    assert all(note.startswith(f"f:{line}: corrupt record skipped") for line, note in whole.skipped)
    assert (note is None) == (consumed == len(data))
    assert all(w.startswith("f:") for w in whole.warnings)
    chunked = TraceReader("f")
    fed: list[Record] = []
    for cut in sorted(cuts):
        fed += chunked.feed(data[chunked.consumed : max(cut, chunked.consumed)])
    fed += chunked.feed(data[chunked.consumed :])
    assert fed == records and chunked.consumed == consumed


@settings(max_examples=100, deadline=None, database=None)
@given(_ANY_BYTES)
def test_any_header_line_gives_a_header_or_a_clean_error(line: bytes):
    try:
        header = parse_header(line, "f")
    except TraceFormatError as err:
        assert str(err).startswith("f: ")
        return
    assert isinstance(header, Header)


@pytest.mark.parametrize(
    ("ranks", "written"),
    [
        (list(range(8192)), '{"start":0,"stop":8192,"step":1}'),
        ([1, 3, 5, 7], '{"start":1,"stop":8,"step":2}'),
        ([0, 1, 2], "[0,1,2]"),
        ([0, 1, 3, 4], "[0,1,3,4]"),
        ([3, 2, 1, 0], "[3,2,1,0]"),
    ],
)
def test_a_group_of_evenly_spaced_ranks_is_written_as_a_range(ranks, written):
    s = Stream()
    s.op(1, 1, op="create_group", gid="7", fields=encode.ranks_field(ranks), ranks=ranks)
    s.encoder.newgroup(2, t(2), ranks, "7", s.sid())
    assert written in "".join(s.lines)
    op, newgroup = s.read()
    assert op.ranks == newgroup.ranks == tuple(ranks)
    # a checkpoint writes and reads them the same way
    cp = snapshot(track([op, RetRecord(id=1, t=t(1)), newgroup], 0, T0), t(3), 1)
    assert cp.groups == {"7": tuple(ranks)} and cp.newgroups[0].ranks == tuple(ranks)
