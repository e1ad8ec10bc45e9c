"""The trace file format: header checks, truncation, corruption, sessions, tailing."""

from __future__ import annotations

import json

import pytest

from dl2.errors import NoDataError
from dl2.errors import TraceFormatError
from dl2.live.tailer import TraceTailer
from dl2.trace.format import MAGIC
from dl2.trace.format import read_trace_file
from dl2.trace.format import trace_file_name
from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.encode import EMPTY_STACK
from dl2.trace.schema.encode import end_line
from dl2.trace.schema.encode import header_line
from dl2.trace.schema.encode import json_str
from dl2.trace.schema.encode import op_line
from dl2.trace.schema.encode import peer_tag_fields
from dl2.trace.schema.encode import ret_line
from dl2.trace.schema.encode import state_line
from dl2.trace.session import load_session


def header(rank=0, world=2):
    return header_line(rank=rank, world_size=world, pid=1, host="h", t0=0, wall=0, dl2="test")


def op(oid):
    """A send to rank 1, as the recorder writes it."""
    return op_line(oid, 1, 1, json_str("0"), 0, "send", None, peer_tag_fields(1, 0), False, "[]")


def write(path, *records, tail=b""):
    path.write_bytes("".join(records).encode() + tail)
    return path


def test_round_trip(tmp_path):
    path = write(tmp_path / trace_file_name(0, 1), header(), op(1))
    trace = read_trace_file(path)
    assert trace.rank == 0
    assert trace.records == (OpRecord(id=1, t=1, tid=1, op="send", seq=0, peer=1, tag=0),)
    assert trace.truncated is None


def test_truncated_last_record_is_detected_not_fatal(tmp_path):
    path = write(tmp_path / "r.dl2.jsonl", header(), op(1), tail=b'{"k":"op","id":2,"op"')
    trace = read_trace_file(path)
    assert len(trace.records) == 1
    assert "truncated" in trace.truncated


def test_a_corrupt_middle_line_is_skipped_and_named(tmp_path):
    path = tmp_path / "r.dl2.jsonl"
    path.write_bytes((header() + "garbage\n" + end_line(1, "exit")).encode())
    trace = read_trace_file(path)
    assert len(trace.records) == 1 and trace.truncated is None
    ((line, note),) = trace.skipped
    assert line == 2 and note.startswith(f"{path}:2: corrupt record skipped (")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty trace file"),
        (b"hello world\n", "not a dl2 trace file"),
        (b'{"magic": "dl2-trace"', "truncated header"),
        (
            json.dumps({"magic": MAGIC, "format": 999, "rank": 0, "world_size": 1}).encode()
            + b"\n",
            "version 999",
        ),
    ],
)
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "r.dl2.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        read_trace_file(path)


def test_load_session_errors(tmp_path):
    with pytest.raises(NoDataError, match="no such run directory"):
        load_session(tmp_path / "missing")
    with pytest.raises(NoDataError, match="no dl2 trace files"):
        load_session(tmp_path)


def test_load_session_skips_one_bad_rank_with_a_warning(tmp_path):
    write(tmp_path / trace_file_name(0, 1), header(0))
    (tmp_path / trace_file_name(1, 2)).write_bytes(b"junk\n")
    session = load_session(tmp_path)
    assert session.ranks == [0]
    assert any("not a dl2 trace" in w for w in session.warnings)
    assert session.missing_ranks() == [1]


def test_tailer_reads_appended_records_and_waits_for_partial_lines(tmp_path):
    path = tmp_path / trace_file_name(0, 1)
    write(path, header(), op(1), tail=ret_line(1, 2)[:10].encode())
    tailer = TraceTailer(tmp_path)
    assert tailer.refresh()
    assert tailer.progress() == {0: 1}
    with open(path, "ab") as handle:
        handle.write((ret_line(1, 2)[10:] + state_line(3, [], "python", EMPTY_STACK)).encode())
    assert tailer.refresh()
    # the watchdog's state record is not progress
    assert tailer.progress() == {0: 2}
    # the tailer hands what it reads to the model: op 1, its ret, the state
    timeline = tailer.model.graph().timelines[0]
    assert timeline.record_count == 3 and timeline.last_state is not None
    assert [(op.id, op.issued) for op in timeline.ops] == [(1, True)]
