"""The record schema: every kind encoded by the recorder's encoders decodes back equal,
and no input makes the parser fail other than with a clean TraceFormatError."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dl2.errors import TraceFormatError
from dl2.trace.format import parse_header
from dl2.trace.format import parse_records
from dl2.trace.schema import RECORD_KINDS
from dl2.trace.schema import encode
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
from dl2.trace.schema.decode import RetRecord
from dl2.trace.schema.decode import StateRecord
from dl2.trace.schema.decode import StoreRecord
from dl2.trace.schema.decode import UnknownRecord
from dl2.trace.schema.decode import WaitRecord
from dl2.trace.schema.decode import decode_header
from dl2.trace.schema.decode import decode_record
from dl2.trace.schema.decode import report_frame

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
    StoreRecord,
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


def decode(line: str) -> Record:
    """One encoded line back (it must end in exactly one newline)."""
    assert line.endswith("\n") and line.count("\n") == 1, line
    return decode_record(line[:-1].encode())


# -- round trips, kind by kind ------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch", "backend", "argv", "emulate"),
    [
        (None, None, None, None),
        ("2.13.0+cpu", "gloo", ["train.py", "--lr", 'ü "x" \\'], (65536, False)),
        ("2.13.0", "gloo", [], (0, True)),
    ],
)
def test_header_round_trip(torch, backend, argv, emulate):
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
    )
    assert line.endswith("\n") and line.count("\n") == 1
    assert decode_header(line[:-1].encode()) == Header(
        magic="dl2-trace",
        format=1,
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
    )


def test_collective_op_round_trip_with_every_field():
    fields = (
        encode.root_field(2)
        + encode.redop_field("max")
        + encode.tensor_fields("bfloat16", 1 << 40)
        + encode.splits_field([[1, 2, 3], [4, 5, 6]])
        + encode.ranks_field([0, 2, 5])
        + encode.timeout_field(1800.0)
    )
    stack = encode.stack_of(STACK)
    line = encode.op_line(
        7,
        10**18,
        140_000_000_000,
        encode.json_str('g"1'),
        3,
        "reduce",
        "reduce",
        fields,
        True,
        stack,
        encode.batch_field(5),
    )
    assert decode(line) == OpRecord(
        id=7,
        t=10**18,
        tid=140_000_000_000,
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


def test_op_with_optional_fields_absent():
    line = encode.op_line(1, 2, 3, encode.json_str("0"), None, "barrier", None, "", False, "[]")
    assert decode(line) == OpRecord(id=1, t=2, tid=3, gid="0", op="barrier")


@pytest.mark.parametrize("peer", [1, None])
@pytest.mark.parametrize(("eager", "deferred"), [(False, False), (True, False), (True, True)])
def test_p2p_op_round_trip(peer, eager, deferred):
    fields = encode.peer_tag_fields(peer, 9) + encode.tensor_fields("uint8", 16)
    after = encode.after_fields(batch=None, eager=eager, deferred=deferred)
    line = encode.op_line(
        4,
        5,
        6,
        encode.json_str("0"),
        0,
        "recv",
        "irecv",
        fields,
        True,
        encode.stack_of(STACK[:1]),
        after,
    )
    record = decode(line)
    assert record == OpRecord(
        id=4,
        t=5,
        tid=6,
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
    assert '"peer":null' in line if peer is None else '"peer":1' in line  # null, not absent


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
    field = encode.timeout_field(seconds)
    line = encode.op_line(1, 1, 1, '"0"', 0, "monitored_barrier", None, field, False, "[]")
    record = decode(line)
    assert isinstance(record, OpRecord) and record.timeout == seconds
    if seconds == 1800.0:
        assert field == ',"timeout":1800'  # as written before: {seconds:g}
    assert encode.timeout_field(float("inf")) == encode.timeout_field(float("nan")) == ""


@pytest.mark.parametrize(
    ("err", "src"), [(None, None), (None, 3), ('RuntimeError: "bad"\n\\ 💥', None)]
)
def test_ret_round_trip(err, src):
    assert decode(encode.ret_line(8, 9, err, src)) == RetRecord(id=8, t=9, err=err, src=src)


def test_wait_round_trip():
    line = encode.wait_line(10, 11, 12, 7, encode.stack_of(STACK))
    assert decode(line) == WaitRecord(id=10, t=11, tid=12, work=7, stack=FRAMES)
    line = encode.wait_line(10, 11, 12, 7, encode.EMPTY_STACK)
    assert decode(line) == WaitRecord(id=10, t=11, tid=12, work=7)


@pytest.mark.parametrize("src", [None, 0, 5])
def test_done_round_trip(src):
    assert decode(encode.done_line(3, 4, src)) == DoneRecord(id=3, t=4, src=src)


def test_drop_round_trip():
    assert decode(encode.drop_line(3, 4)) == DropRecord(id=3, t=4)


@pytest.mark.parametrize(("ranks", "gid"), [([0, 2], "1"), ([1, 3], None), (None, 'x"y')])
def test_newgroup_round_trip(ranks, gid):
    line = encode.newgroup_line(5, 6, ranks, gid, encode.stack_of(STACK))
    expected = tuple(ranks) if ranks is not None else None
    assert decode(line) == NewGroupRecord(id=5, t=6, ranks=expected, gid=gid, stack=FRAMES)


@pytest.mark.parametrize("api", ["all_reduce", 'odd "api"\\\n'])
def test_nonmember_round_trip(api):
    line = encode.nonmember_line(5, api, encode.stack_of(STACK))
    assert decode(line) == NonMemberRecord(t=5, api=api, stack=FRAMES)


@pytest.mark.parametrize(
    ("pending", "where"), [([], "python"), ([3, 1, 2], "backward"), ([4], "comm"), ([5], "poll")]
)
def test_state_round_trip(pending, where):
    line = encode.state_line(5, pending, where, encode.stack_of(STACK))
    assert decode(line) == StateRecord(t=5, pending=tuple(pending), where=where, stack=FRAMES)


@pytest.mark.parametrize("how", ["exit", "destroy"])
def test_end_round_trip(how):
    assert decode(encode.end_line(99, how)) == EndRecord(t=99, how=how)


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
    line = encode.store_line(
        3, 4, 5, op, store, prefix, keys, block, encode.stack_of(STACK), timeout
    )
    record = decode(line)
    assert record == StoreRecord(
        id=3,
        t=4,
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


# -- what readers tolerate, and what is corrupt ----------------------------------------------


def test_unknown_fields_and_kinds_are_tolerated():
    line = encode.end_line(1, "exit")[:-2] + ',"future":{"x":[1,2]}}'
    assert decode_record(line.encode()) == EndRecord(t=1, how="exit")
    assert decode_record(b'{"k":"stack","id":3,"frames":[]}') == UnknownRecord("stack")
    assert decode_record(b'{"k":"header","rank":0}') == UnknownRecord("header")
    assert decode_record(b'{"k":"end"}') == EndRecord()  # every field has its default


@pytest.mark.parametrize(
    "line",
    [
        b'{"k":"op","id":"1"}',  # wrong type
        b'{"k":"op"}',  # no id
        b'{"k":"ret","id":1,"err":5}',
        b'{"k":"op","id":1,"stack":[["f.py","12","main"]]}',  # a line that is no int
        b'{"k":"op","id":1,"stack":"f.py"}',
        b'{"k":"state","pending":[1,"2"]}',
        b'{"k":5}',
        b'{"id":1}',
        b"[1,2]",
        b"garbage",
        b'{"k":"op","id":1,"timeout":NaN}',
        b"[" * 100_000,  # too deep
    ],
)
def test_malformed_records_are_corrupt(line):
    with pytest.raises(CorruptRecord):
        decode_record(line)


def test_a_corrupt_record_mid_file_is_skipped_with_its_line_and_a_last_one_is_a_note():
    good = encode.end_line(1, "exit").encode()
    bad = b'{"k":"wait","id":1,"work":"x"}\n'
    parsed = parse_records(good + bad + good, "f", first_lineno=2)
    assert parsed.records == [EndRecord(t=1, how="exit")] * 2
    ((line, note),) = parsed.skipped
    assert line == 3 and note.startswith("f:3: corrupt record skipped")
    assert "work" in note and parsed.truncated is None and parsed.lines == 3
    parsed = parse_records(good + bad, "f", first_lineno=2)
    assert parsed.records == [EndRecord(t=1, how="exit")] and not parsed.skipped
    assert parsed.truncated == "last record is corrupt (line 3)"
    assert parsed.consumed == len(good) and parsed.lines == 1


def test_report_frame_is_the_innermost_frame_of_the_users_own_code():
    lib = Frame("/venv/lib/python3.11/site-packages/x/y.py", 1, "f")
    dist = Frame("/usr/lib/python3/dist-packages/z.py", 2, "g")
    own = Frame("train.py", 3, "main")
    assert report_frame((lib, dist, own, Frame("outer.py", 4, "m"))) == own
    assert report_frame((lib, dist)) == lib
    assert report_frame(()) is None


# -- any bytes: a clean error or a valid partial read -----------------------------------------

_INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_TEXT = st.text(max_size=20)
_JSON = st.recursive(
    st.none() | st.booleans() | _INT | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def _encoded_line(draw: st.DrawFn) -> bytes:
    """A record line as some recorder could write it, or a JSON object that looks like
    one (a known or unknown kind, fields of any type)."""
    stack = encode.stack_of(draw(st.lists(st.tuples(_TEXT, _INT, _TEXT), max_size=3)))
    i, t = draw(_INT), draw(_INT)
    choice = draw(st.integers(0, 5))
    if choice == 0:
        line = encode.op_line(
            i,
            t,
            1,
            encode.json_str(draw(_TEXT)),
            draw(_INT),
            "send",
            None,
            encode.peer_tag_fields(draw(_INT), 0),
            True,
            stack,
        )
    elif choice == 1:
        line = encode.ret_line(i, t, draw(st.none() | _TEXT), draw(st.none() | _INT))
    elif choice == 2:
        line = encode.wait_line(i, t, 1, draw(_INT), stack)
    elif choice == 3:
        line = encode.state_line(t, draw(st.lists(_INT, max_size=3)), "poll", stack)
    else:
        kind = draw(st.sampled_from([*sorted(RECORD_KINDS), "header", "future"]))
        fields = draw(st.dictionaries(_TEXT, _JSON, max_size=5))
        line = json.dumps({**fields, "k": kind}) + "\n"
    return line.encode()


@st.composite
def _mangled(draw: st.DrawFn) -> bytes:
    """Lines of records, some cut short, some with bytes flipped, spliced or dropped."""
    data = bytearray(b"".join(draw(st.lists(_encoded_line(), max_size=6))))
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
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(_ANY_BYTES)
def test_any_bytes_give_a_clean_error_or_a_valid_partial_read(data: bytes):
    parsed = parse_records(data, "f")
    records, note, consumed = parsed.records, parsed.truncated, parsed.consumed
    # THEN what was read are typed records of complete lines, the corrupt ones before the
    # last are skipped with their line, and reading resumes after the last complete line
    assert all(isinstance(r, RECORD_TYPES) for r in records)
    assert all(
        note.startswith(f"f:{line}: corrupt record skipped") for line, note in parsed.skipped
    )
    assert 0 <= consumed <= len(data)
    assert consumed == 0 or data[consumed - 1 : consumed] == b"\n"
    assert data[:consumed].count(b"\n") == len(records) + len(parsed.skipped) == parsed.lines
    assert note is None or note.startswith("last record is")
    assert (note is None) == (consumed == len(data))


@settings(max_examples=100, deadline=None, database=None)
@given(_ANY_BYTES)
def test_any_header_line_gives_a_header_or_a_clean_error(line: bytes):
    try:
        header = parse_header(line, "f")
    except TraceFormatError as err:
        assert str(err).startswith("f: ")
        return
    assert isinstance(header, Header)
