"""The trace file format: header checks, truncation, corruption, sessions, tailing."""

from __future__ import annotations

import json

import pytest

from dl2.cli import main
from dl2.errors import NoDataError
from dl2.errors import TraceFormatError
from dl2.live.tailer import TraceTailer
from dl2.trace.format import MAGIC
from dl2.trace.format import read_trace_file
from dl2.trace.format import trace_file_name
from dl2.trace.schema.decode import OpRecord
from dl2.trace.session import load_session
from trace_builders import RankBuilder
from trace_builders import write_run_dir


def rank0(world: int = 2) -> RankBuilder:
    """Rank 0 with a blocking send to rank 1 entered."""
    builder = RankBuilder(0, world)
    builder.issue("send", 3, peer=1, returned=False, dtype=None, count=None, api=None)
    return builder


def test_round_trip(tmp_path):
    path = tmp_path / trace_file_name(0, 1)
    path.write_text(rank0().text())
    trace = read_trace_file(path)
    assert trace.rank == 0
    (op,) = trace.records
    assert isinstance(op, OpRecord)
    assert (op.id, op.t, op.tid, op.op, op.seq, op.peer, op.tag) == (1, 1000, 1, "send", 0, 1, 0)
    assert trace.truncated is None and trace.warnings == ()


def test_truncated_last_record_is_detected_not_fatal(tmp_path):
    builder = rank0()
    builder.ret(1)
    path = tmp_path / "r.dl2.jsonl"
    path.write_bytes(builder.text().encode()[:-3])
    trace = read_trace_file(path)
    assert len(trace.records) == 1
    assert "truncated" in trace.truncated


def test_a_corrupt_middle_line_is_skipped_with_a_warning(tmp_path):
    # GIVEN a trace with garbage in the middle (a disk that lost a block)
    builder = rank0()
    builder.records.insert(1, "\x00\x00garbage\x00\n")
    builder.ret(1).end()
    write_run_dir([RankBuilder(1, 2).end()], tmp_path)
    path = tmp_path / trace_file_name(0, 1000)
    path.write_text(builder.text())
    # WHEN read
    trace = read_trace_file(path)
    # THEN the rest is read, and the warning names the file and the line
    assert [r.kind for r in trace.records] == ["op", "ret", "end"]
    ((line, note),) = trace.skipped
    assert line == 5 and note == (f"{path}:5: corrupt record skipped (JSON is malformed: "
                                  "invalid character (byte 0))")  # fmt: skip
    session = load_session(tmp_path)
    assert session.ranks == [0, 1] and note in session.warnings
    assert session.corrupt_records() == 1


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
        (
            json.dumps({"magic": MAGIC, "format": 1, "rank": 0, "world_size": 1}).encode()
            + b'\n{"k":"end","t":1,"how":"exit"}\n',
            "trace format version 1, this dl2 reads version 2",
        ),
    ],
)
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "r.dl2.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        read_trace_file(path)


def test_analyze_of_a_version_1_trace_is_one_line_naming_the_version(tmp_path, capsys):
    header = {"k": "header", "magic": MAGIC, "format": 1, "rank": 0, "world_size": 1}
    (tmp_path / trace_file_name(0, 1)).write_text(
        json.dumps(header) + '\n{"k":"end","t":1,"how":"exit"}\n'
    )
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "trace format version 1, this dl2 reads version 2" in err


def test_load_session_errors(tmp_path):
    with pytest.raises(NoDataError, match="no such run directory"):
        load_session(tmp_path / "missing")
    with pytest.raises(NoDataError, match="no dl2 trace files"):
        load_session(tmp_path)


def test_load_session_skips_one_bad_rank_with_a_warning(tmp_path):
    (tmp_path / trace_file_name(0, 1)).write_text(RankBuilder(0, 2).text())
    (tmp_path / trace_file_name(1, 2)).write_bytes(b"junk\n")
    session = load_session(tmp_path)
    assert session.ranks == [0]
    assert any("not a dl2 trace" in w for w in session.warnings)
    assert session.missing_ranks() == [1]


def test_tailer_reads_appended_records_and_waits_for_partial_lines(tmp_path):
    builder = rank0()
    path = tmp_path / trace_file_name(0, 1)
    builder.ret(1)
    ret = builder.records.pop().encode()
    path.write_bytes(builder.text().encode() + ret[:3])
    tailer = TraceTailer(tmp_path)
    assert tailer.refresh()
    assert tailer.progress() == {0: 1}
    builder.records.append(ret.decode())
    builder.state([], "python")
    with open(path, "ab") as handle:
        handle.write(ret[3:] + builder.records[-1].encode())
    assert tailer.refresh()
    # the watchdog's state record is not progress
    assert tailer.progress() == {0: 2}
    # the tailer hands what it reads to the model: op 1, its ret, the state
    timeline = tailer.model.graph().timelines[0]
    assert timeline.record_count == 3 and timeline.last_state is not None
    assert [(op.id, op.issued) for op in timeline.ops] == [(1, True)]


def test_a_multi_node_leaders_directory_reads_the_traces_it_mirrored(tmp_path):
    # GIVEN rank 0's node's run directory: its own trace, rank 1's as the other node's
    # monitor sent it (mirrored/), and a stale copy of its own trace there too (a run
    # directory the nodes share)
    (tmp_path / "tmp").mkdir()
    write_run_dir([rank0()], tmp_path)
    write_run_dir([RankBuilder(1, 2).end()], tmp_path / "tmp")
    mirrored = tmp_path / "mirrored"
    mirrored.mkdir()
    (tmp_path / "tmp" / trace_file_name(1, 1001)).rename(mirrored / trace_file_name(1, 1001))
    (mirrored / trace_file_name(0, 1000)).write_text("not read")
    # WHEN loaded THEN both ranks are read, rank 0's from its own file
    session = load_session(tmp_path)
    assert sorted(session.traces) == [0, 1]
    assert session.traces[0].path == str(tmp_path / trace_file_name(0, 1000))
    assert session.traces[1].path == str(mirrored / trace_file_name(1, 1001))
    assert not session.warnings


def test_a_follower_nodes_directory_points_at_the_leaders(tmp_path):
    # GIVEN a node's run directory whose run.json says rank 0's node made the report
    write_run_dir([RankBuilder(1, 2).end()], tmp_path)
    leader = {"node": 2, "host": "node-a", "run_dir": "/shared/run/node0"}
    (tmp_path / "run.json").write_text(json.dumps({"reported_by": leader}))
    # THEN its analysis says where every node's traces are
    (warning,) = [w for w in load_session(tmp_path).warnings if "multi-node" in w]
    assert "/shared/run/node0 on node-a holds every node's traces" in warning
