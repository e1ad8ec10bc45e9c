"""Bounded traces: segments rotated by the recorder, checkpoints, and reading them back
(one rank's segments as one trace, rotated history, missing and corrupt segments, the
live tailer, the analysis of rotated runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dl2.analysis import analyze
from dl2.cli import main
from dl2.errors import Dl2Error
from dl2.live.tailer import TraceTailer
from dl2.report import FindingKind
from dl2.report import Verdict
from dl2.trace.format import read_trace_stream
from dl2.trace.format import stream_of
from dl2.trace.format import trace_file_name
from dl2.trace.rotated import snapshot
from dl2.trace.rotated import track
from dl2.trace.schema import stream as stream_mod
from dl2.trace.schema.decode import CheckpointRecord
from dl2.trace.schema.decode import OpRecord
from dl2.trace.session import load_session
from segment_jobs import FakeRank
from segment_jobs import disk_bytes
from segment_jobs import ranks_of
from segment_jobs import segment_files
from segment_jobs import steps

BIG = 1 << 30


def one_rank(run_dir: Path, monkeypatch: pytest.MonkeyPatch, size: int, keep: int | str) -> Path:
    """One rank alone: 400 steps, then a blocking all_reduce it stays in."""
    (rank,) = ranks_of(run_dir, 1, monkeypatch, size, keep)
    steps([rank], 400)
    rank.all_reduce(complete=False)
    rank.close()
    return run_dir


def test_file_names_of_segments():
    assert trace_file_name(3, 77) == "rank00003.77.dl2.jsonl"
    assert trace_file_name(3, 77, 12) == "rank00003.77.s000012.dl2.jsonl"
    assert stream_of(trace_file_name(3, 77, 12)) == ("rank00003.77", 12)
    assert stream_of(trace_file_name(3, 77)) == ("rank00003.77", 0)
    assert stream_of("other.dl2.jsonl") == ("other.dl2.jsonl", 0)


def test_rotation_keeps_the_newest_segments_and_bounds_the_disk(tmp_path, monkeypatch):
    run_dir = one_rank(tmp_path, monkeypatch, 2048, 3)
    files = segment_files(run_dir)
    numbers = [stream_of(f.name)[1] for f in files]
    assert len(files) == 3 and numbers == list(range(numbers[0], numbers[0] + 3))
    assert numbers[0] > 3  # it rotated a few times
    # each segment holds at most its size plus one write (the record that filled it)
    assert all(f.stat().st_size <= 2048 + 512 for f in files)
    assert disk_bytes(run_dir) <= 3 * (2048 + 512)


def test_a_rotated_trace_reads_back_as_the_unrotated_one_from_its_checkpoint_on(
    tmp_path, monkeypatch
):
    # GIVEN the same program recorded whole, and in 2 KiB segments keeping 2
    full = read_trace_stream(segment_files(one_rank(tmp_path / "a", monkeypatch, BIG, "all")))
    rotated = read_trace_stream(segment_files(one_rank(tmp_path / "b", monkeypatch, 2048, 2)))
    # THEN the rotated trace starts at a checkpoint, and from there on is the same trace
    assert not full.rotated and rotated.rotated and rotated.warnings == ()
    assert len(rotated.segments) == 2
    cp, *rest = rotated.records
    assert isinstance(cp, CheckpointRecord) and cp.segment == rotated.header.segment
    cut = len(full.records) - len(rest)
    assert rest == list(full.records[cut:])
    # AND its checkpoint is what the records before it say
    assert cp == snapshot(track(full.records[:cut], 0, full.header.t0), cp.t, cp.segment)
    assert cp.ops_before == sum(isinstance(r, OpRecord) for r in full.records[:cut])
    assert cp.collectives == {"0": next(r.seq for r in rest if isinstance(r, OpRecord))}
    assert cp.groups == {"0": (0,)}


def test_keep_all_reads_every_segment_back_as_one_trace(tmp_path, monkeypatch):
    full = read_trace_stream(segment_files(one_rank(tmp_path / "a", monkeypatch, BIG, "all")))
    files = segment_files(one_rank(tmp_path / "b", monkeypatch, 2048, "all"))
    assert len(files) > 5 and stream_of(files[0].name)[1] == 0
    joined = read_trace_stream(files)
    assert joined.records == full.records and not joined.rotated
    # a missing segment in the middle: the trace restarts at the next one's checkpoint
    files[3].unlink()
    gap = read_trace_stream(segment_files(tmp_path / "b"))
    assert gap.warnings == (f"{files[4]}: segment(s) 3..3 missing; reading from this "
                            "segment's checkpoint",)  # fmt: skip
    cp, *rest = gap.records
    assert isinstance(cp, CheckpointRecord) and cp.segment == 4
    assert rest == list(full.records[len(full.records) - len(rest) :])


def test_a_corrupt_segment_is_read_around_with_a_warning(tmp_path, monkeypatch):
    # GIVEN a rank whose middle segment has garbage in the middle
    (r0, r1) = ranks_of(tmp_path, 2, monkeypatch, 2048, "all")
    steps([r0, r1], 200)
    for rank in (r0, r1):
        rank.end()
        rank.close()
    victim = segment_files(tmp_path)[2]
    lines = victim.read_bytes().split(b"\n")
    middle = len(lines) // 2
    lines.insert(middle, b'["o",\x00\x00\x00 garbage')
    victim.write_bytes(b"\n".join(lines))
    # WHEN the run is analysed
    session = load_session(tmp_path)
    report = analyze(session)
    # THEN the warning names the file and line, and the rest of the rank is analysed
    (warning,) = [w for w in session.warnings if "corrupt" in w]
    assert warning.startswith(f"{victim}:{middle + 1}: corrupt record skipped")
    assert session.ranks == [0, 1]
    assert report.verdict is Verdict.INCOMPLETE, report.findings
    assert report.gaps == ("1 corrupt record skipped",) and not report.findings


def test_checkpoints_within_a_segment_resynchronise_after_a_corrupt_line(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_mod, "SYNC_BYTES", 512)
    full = read_trace_stream(segment_files(one_rank(tmp_path / "a", monkeypatch, BIG, "all")))
    (path,) = segment_files(one_rank(tmp_path / "b", monkeypatch, BIG, "all"))
    text = path.read_bytes()
    assert text.count(b'["c",') > 10
    same = read_trace_stream([path])
    assert same.records == full.records  # checkpoints within a segment are not records
    # WHEN an op line is lost (its id and seq are implied by the next ones)
    lines = text.split(b"\n")
    lost = next(i for i in range(len(lines) // 2, len(lines)) if lines[i].startswith(b'["o"'))
    lines[lost] = b"\x00" * 8
    path.write_bytes(b"\n".join(lines))
    damaged = read_trace_stream([path])
    # THEN the reader says records were lost, and is right again after the next checkpoint
    assert any("lost records" in w for w in damaged.warnings), damaged.warnings
    tail = next(i for i in range(lost, len(lines)) if lines[i].startswith(b'["c",'))
    after = sum(line.startswith(b'["o"') for line in lines[tail:])
    assert [r for r in damaged.records if isinstance(r, OpRecord)][-after:] == [
        r for r in full.records if isinstance(r, OpRecord)
    ][-after:]


# -- the analysis of rotated runs ------------------------------------------------------------------


def analysed(run_dir: Path):
    session = load_session(run_dir)
    return session, analyze(session)


@pytest.mark.parametrize("sizes", [[3000, 3000], [2048, 5000], [2048, BIG]])
def test_a_clean_rotated_run_is_ok(tmp_path, monkeypatch, sizes):
    ranks = list(ranks_of(tmp_path, 2, monkeypatch, sizes, 2))
    steps(ranks, 200)
    for rank in ranks:
        rank.end()
        rank.close()
    session, report = analysed(tmp_path)
    assert session.rotated_ranks() == [r for r, s in enumerate(sizes) if s != BIG]
    assert report.verdict is Verdict.OK, report.findings
    assert any("rotated away" in w and "--keep all" in w for w in session.warnings)


def test_a_deadlock_after_rotation_is_found(tmp_path, monkeypatch):
    # GIVEN two ranks that rotated many times, then both block in a send to the other
    r0, r1 = ranks_of(tmp_path, 2, monkeypatch, [2048, 3000], 2)
    steps([r0, r1], 200)
    r0.p2p("send", 1, blocking=True, complete=False)
    r1.p2p("send", 0, blocking=True, complete=False)
    # WHEN analysed
    session, report = analysed(tmp_path)
    # THEN it is the send/send deadlock, on the ranks' own lines
    assert session.rotated_ranks() == [0, 1]
    assert report.verdict is Verdict.DEADLOCK
    (finding,) = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert finding.ranks == (0, 1)
    assert [(o.op, o.line) for o in finding.ops] == [("send", 10), ("send", 11)]


def test_an_op_open_across_rotations_still_makes_its_deadlock(tmp_path, monkeypatch):
    # GIVEN rank 0 posted an irecv from rank 1 on a group of theirs long ago (open in
    # every checkpoint since), then both ranks rotate; at the end rank 0 waits on it,
    # rank 1 blocks in a recv from rank 0 (before the send rank 0 needs)
    r0, r1 = ranks_of(tmp_path, 2, monkeypatch, 2048, 2)
    for rank in (r0, r1):
        rank.create_group("1", [0, 1])
    irecv = r0.p2p("recv", 1, complete=False, gid="1")
    steps([r0, r1], 200)
    r0.wait(irecv, complete=False)
    r1.p2p("recv", 0, blocking=True, complete=False)
    session, report = analysed(tmp_path)
    cp = session.traces[0].records[0]
    assert isinstance(cp, CheckpointRecord) and irecv in [op.id for op in cp.open]
    assert irecv in cp.pending
    assert report.verdict is Verdict.DEADLOCK
    (finding,) = [f for f in report.findings if f.kind is FindingKind.DEADLOCK]
    assert finding.ranks == (0, 1)


def test_predict_and_replay_refuse_a_rotated_run(tmp_path, monkeypatch, capsys):
    one_rank(tmp_path, monkeypatch, 2048, 2)
    for command in ("predict", "replay"):
        assert main([command, str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "rotated" in err and "--keep all" in err


# -- the live tailer -----------------------------------------------------------------------------


def test_the_tailer_follows_rotation_and_drops_deleted_segments(tmp_path, monkeypatch):
    r0, r1 = ranks_of(tmp_path, 2, monkeypatch, 2048, 2)
    tailer = TraceTailer(tmp_path)
    progress = 0
    for _ in range(30):
        steps([r0, r1], 5)
        assert tailer.refresh()
        now = tailer.progress()[0]
        assert now > progress
        progress = now
    # the tailer holds only the segments still on disk, and starts at a checkpoint
    assert {Path(p).name for t in tailer.traces() for p in t.segments} == {
        p.name for p in tmp_path.iterdir()
    }
    assert all(Path(t.path).name.split(".")[2].startswith("s") for t in tailer.traces())
    assert tailer.model.resumed() == frozenset()  # read from the start: never a gap
    for rank in (r0, r1):
        rank.rec.flush()  # the watchdog writes a held-back ret within 0.2 s
    tailer.refresh()
    assert not tailer.possibly_blocked()
    r0.p2p("send", 1, blocking=True, complete=False)
    r1.p2p("send", 0, blocking=True, complete=False)
    tailer.refresh()
    assert tailer.possibly_blocked() == {0, 1}


# -- any damage to a set of segments: a clean error or a read --------------------------------


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 10_000), st.binary(max_size=6)),
        max_size=4,
    ),
    st.sets(st.integers(0, 40), max_size=3),
)
def test_damaged_segment_sets_read_or_fail_cleanly(tmp_path_factory, edits, dropped):
    monkeypatch = pytest.MonkeyPatch()
    run_dir = tmp_path_factory.mktemp("run")
    try:
        (r0, r1) = ranks_of(run_dir, 2, monkeypatch, 1024, "all")
        steps([r0, r1], 30)
        r0.close()
        r1.close()
    finally:
        monkeypatch.undo()
    files = sorted(run_dir.iterdir())
    for index, at, data in edits:
        path = files[index % len(files)]
        if path.exists():
            content = path.read_bytes()
            cut = at % (len(content) + 1)
            path.write_bytes(content[:cut] + data + content[cut + len(data) :])
    for index in dropped:
        files[index % len(files)].unlink(missing_ok=True)
    try:
        session = load_session(run_dir)
        analyze(session)
    except Dl2Error:
        return


def test_a_blocking_op_costs_one_write_and_a_blocked_one_is_flushed(tmp_path, monkeypatch):
    (rank,) = ranks_of(tmp_path, 1, monkeypatch, BIG, "all")
    writes: list[bytes] = []
    enc = rank.rec.enc
    assert enc is not None
    write = enc._sink

    def counted(data: bytes) -> object:
        writes.append(data)
        return write(data)

    monkeypatch.setattr(enc, "_sink", counted)
    for _ in range(100):
        rank.all_reduce()
    # each op's write carries the previous op's issue, wait and return ("k")
    assert len(writes) == 100
    assert all(w.startswith(b'["k",') and w.count(b"\n") == 2 for w in writes[1:])
    # a rank that stays in its wait has the issue + wait written by the watchdog's flush
    rank.all_reduce(complete=False)
    (path,) = segment_files(tmp_path)
    assert path.read_bytes().endswith(b"]\n") and not path.read_bytes().endswith(b'["b",1]\n')
    rank.rec.flush()
    assert path.read_bytes().endswith(b'["b",1]\n')
    kinds = [r.kind for r in read_trace_stream([path]).records[-3:]]
    assert kinds == ["op", "ret", "wait"]


def test_fake_ranks_write_what_they_are_told(tmp_path, monkeypatch):
    (rank,) = ranks_of(tmp_path, 1, monkeypatch, BIG, "all")
    assert isinstance(rank, FakeRank)
    rank.all_reduce()
    rank.close()
    records = read_trace_stream(segment_files(tmp_path)).records
    assert [r.kind for r in records] == ["op", "ret", "op", "ret", "wait", "ret"]


@pytest.mark.parametrize("how", ["wait", "done"])
def test_a_matched_wildcard_receive_counts_on_its_senders_channel(how):
    # GIVEN rank 2 received from any source (rank 1 matched), then from rank 1 by name
    from checkpoints import checkpoint_of
    from checkpoints import model_view
    from checkpoints import recorder_checkpoint
    from trace_builders import RankBuilder

    r2 = RankBuilder(2, 3)
    wild = r2.irecv(5, None)
    if how == "wait":
        r2.wait(wild, src=1)
    else:
        r2.done(wild, src=1)
    named = r2.irecv(6, 1)
    records = r2.trace().records
    # WHEN the recorder writes a checkpoint after them
    written = recorder_checkpoint(records, 2, 0)
    # THEN the wildcard counts on rank 1's channel, as the model reads a checkpoint
    assert (("0", 1, 2, 0, 2)) in written.channels
    assert model_view(written) == model_view(checkpoint_of(records, 2))
    assert [op.id for op in written.open] == [named]
