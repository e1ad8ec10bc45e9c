"""The command line: usage errors and bad input give one line and status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dl2.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["frobnicate"], "invalid choice"),
        (["run", "--no-such-flag", "-n", "2", "x.py"], "unrecognized arguments"),
        (["run"], "nothing to run"),
        (["run", "-n", "2", "does-not-exist.py"], "script not found: does-not-exist.py"),
        (["run", "--hang-timeout", "-3", "-n", "2", "x.py"], "must be a positive, finite"),
        (["run", "--hang-timeout", "nan", "-n", "2", "x.py"], "must be a positive, finite"),
        (["run", "--on-deadlock", "explode", "--", "true"], "invalid choice"),
        (["analyze", "no/such/dir"], "no such run directory"),
        (["dump", "no-such-file.dl2.jsonl"], "cannot read trace file"),
    ],
)
def test_bad_input_is_one_line_and_status_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err


def test_a_run_dir_that_holds_a_run_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("")
    used = tmp_path / "old-run"
    used.mkdir()
    (used / "rank00000.123.dl2.jsonl").write_text("")
    assert main(["run", "--run-dir", str(used), "-n", "1", "job.py"]) == 2
    err = capsys.readouterr().err.strip()
    assert "already holds a run's traces (rank00000.123.dl2.jsonl)" in err
    assert len(err.splitlines()) == 1
    assert sorted(p.name for p in used.iterdir()) == ["rank00000.123.dl2.jsonl"]


def test_n_and_a_command_together_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("")
    assert main(["run", "-n", "2", "--", "torchrun", "job.py"]) == 2
    assert "not both" in capsys.readouterr().err


def test_several_run_directories_are_refused_in_one_line(tmp_path, capsys):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank00000.1.dl2.jsonl").write_text("")
    assert main(["analyze", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "give one run directory at a time" in capsys.readouterr().err


def test_empty_run_dir(tmp_path, capsys):
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no dl2 trace files" in capsys.readouterr().err


def test_command_that_does_not_exist(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--", "no-such-command-dl2"]) == 2
    assert "command not found: no-such-command-dl2" in capsys.readouterr().err


def test_job_without_torch_distributed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "plain.py"
    script.write_text("print('hello')\n")
    assert main(["run", "-n", "2", str(script)]) == 2
    assert "never initialised torch.distributed" in capsys.readouterr().err
    script.write_text("raise SystemExit(5)\n")
    assert main(["run", "-n", "1", str(script)]) == 1


def test_entry_points():
    script = str(Path(sys.executable).parent / "dl2")
    for argv in ([script, "--version"], [sys.executable, "-m", "dl2", "--version"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0
        assert done.stdout.startswith("dl2 ")


def test_dump_names_a_corrupt_record_where_it_stands(tmp_path, capsys):
    from trace_builders import ranks
    from trace_builders import write_run_dir

    (r0,) = ranks(1)
    r0.call("all_reduce", 5, count=4)
    r0.end()
    path = next(write_run_dir([r0], tmp_path).glob("*.dl2.jsonl"))
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith('["o"'))
    lines.insert(at, '["o","bad"]\n')  # before the op record
    path.write_text("".join(lines))
    assert main(["dump", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(f"# {path}:{at + 1}: corrupt record skipped")
    kinds = [line.split('"k": "')[1].split('"')[0] for line in out if not line.startswith("#")]
    assert kinds == ["header", "op", "ret", "wait", "ret", "end"]


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path, capsys, monkeypatch):
    import os

    from trace_builders import ranks
    from trace_builders import write_run_dir

    (r0,) = ranks(1)
    for _ in range(50):
        r0.call("all_reduce", 5, count=4)
    r0.end()
    path = next(write_run_dir([r0], tmp_path).glob("*.dl2.jsonl"))
    read, write = os.pipe()
    os.close(read)  # `dl2 dump FILE | head -c 1`: head has exited
    out = open(write, "w")  # noqa: SIM115
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["dump", str(path)]) == 141
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("rank", "world", "why"),
    [(5, 2, "rank 5 of a world of 2"), (-1, 2, "rank -1"), (0, 1 << 40, "a world of")],
)
def test_a_header_with_impossible_numbers_is_skipped_in_one_line(
    rank, world, why, tmp_path, capsys
):
    from trace_builders import ranks
    from trace_builders import write_run_dir

    r0, r1 = ranks(2)
    r0.call("all_reduce", 5, count=4)
    r1.call("all_reduce", 5, count=4)
    run = write_run_dir([r0, r1], tmp_path)
    bad = sorted(run.glob("*.dl2.jsonl"))[1]
    head, rest = bad.read_text().split("\n", 1)
    head = head.replace('"rank":1,', f'"rank":{rank},').replace(
        '"world_size":2,', f'"world_size":{world},'
    )
    bad.write_text(head + "\n" + rest)
    code = main(["analyze", str(run)])
    err = capsys.readouterr()
    assert code in (3, 5), err
    assert "Traceback" not in err.err
    assert why in err.out + err.err


def test_an_undecodable_byte_in_a_file_name_does_not_make_the_trace_unreadable(tmp_path, capsys):
    from trace_builders import ranks
    from trace_builders import write_run_dir

    name = "/home/u/caf\udce9/train.py"  # a Latin-1 byte in a UTF-8 locale, as os reads it
    r0, r1 = ranks(2, file=name)
    r0.call("all_reduce", 7, count=4, complete=False)
    r1.call("broadcast", 9, count=4, root=0, complete=False)
    assert main(["analyze", str(write_run_dir([r0, r1], tmp_path)), "-r", "json"]) == 3
    out = capsys.readouterr()
    assert "skipped" not in out.err
    assert "caf\ufffd/train.py" in out.out


def test_analyze_reads_what_the_live_monitor_read_when_dl2_stopped_the_job(tmp_path, capsys):
    import json

    from trace_builders import ranks
    from trace_builders import write_run_dir

    # GIVEN a recv/recv deadlock, after which (while dl2 stopped the job) rank 1's recv
    # failed as rank 0 died first, and rank 1's exit hook wrote its end record
    r0, r1 = ranks(2)
    r0.call("recv", 10, peer=1, complete=False)
    recv = r1.call("recv", 12, peer=0, complete=False)
    r1.ret(recv + 1, err="RuntimeError: Connection closed by peer")
    r1.end()
    run = write_run_dir([r0, r1], tmp_path / "run")
    files = sorted(run.glob("*.dl2.jsonl"))
    read = {f.name: f.stat().st_size for f in files}
    lines = files[1].read_bytes().splitlines(keepends=True)
    read[files[1].name] -= len(lines[-1]) + len(lines[-2])  # the monitor stopped before these
    meta = {"reason": "deadlock", "ranks": {"0": {"state": "alive"}, "1": {"state": "alive"}}}
    (run / "run.json").write_text(json.dumps({**meta, "read_upto": read}))
    # THEN dl2 analyze gives the live verdict, as the monitor read the traces
    assert main(["analyze", str(run)]) == 3
    assert "DEADLOCK" in capsys.readouterr().out
    from dl2.trace.session import load_session  # the path of export, predict, replay

    kinds = [r.kind for r in load_session(run).traces[1].records]
    assert "end" not in kinds
    # (and the records written after the stop would have told another story)
    (run / "run.json").write_text(json.dumps(meta))
    assert main(["analyze", str(run)]) != 3


@pytest.mark.parametrize("meta", ['{"reason": "deadl', "[1, 2]", '{"ranks": {"0": 3, "x": {}}}'])
def test_a_damaged_run_json_leaves_the_traces_analysed(meta, tmp_path, capsys):
    from trace_builders import ranks
    from trace_builders import write_run_dir

    r0, r1 = ranks(2)
    r0.call("recv", 10, peer=1, complete=False)
    r1.call("recv", 12, peer=0, complete=False)
    run = write_run_dir([r0, r1], tmp_path / "run")
    (run / "run.json").write_text(meta)
    assert main(["analyze", str(run)]) == 3
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert "DEADLOCK" in out.out


def test_analyze_of_a_job_that_failed_says_so_as_dl2_run_did(tmp_path, capsys):
    import json

    from trace_builders import ranks
    from trace_builders import write_run_dir

    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.call("all_reduce", 5, count=4)
        r.end()
    run = write_run_dir([r0, r1], tmp_path / "run")
    assert main(["analyze", str(run)]) == 0
    # `dl2 run -- torchrun ...` whose ranks all ended with sys.exit(3): job-failed
    (run / "run.json").write_text(json.dumps({"reason": "finished", "job_exit_code": 3}))
    capsys.readouterr()
    assert main(["analyze", str(run), "-r", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "job-failed"
    assert report["job"] == {"ended": "finished", "exit_status": 3}


def test_traces_alone_that_stop_mid_call_are_read_as_a_job_killed_there(tmp_path, capsys):
    from trace_builders import ranks
    from trace_builders import write_run_dir

    # GIVEN the traces of a job its scheduler killed (no run.json, no end records): rank 0
    # in an all_reduce that rank 1, busy in its own Python code, never joined
    r0, r1 = ranks(2)
    r0.call("all_reduce", 10, complete=False)
    r1.state([], "python", stack=[["train.py", 33, "load"]])
    run = write_run_dir([r0, r1], tmp_path / "run")
    assert main(["analyze", str(run)]) == 3
    out = capsys.readouterr().out
    assert "HANG" in out
    assert "train.py:33" in out
    assert "nothing says how the job ended" in out


def test_predict_of_a_run_with_a_rank_missing_is_not_a_clean_bill(tmp_path, capsys):
    from trace_builders import ranks
    from trace_builders import write_run_dir

    r0, r1, r2 = ranks(3)
    for r in (r0, r1, r2):
        r.call("all_reduce", 5, count=4)
        r.end()
    run = write_run_dir([r0, r1, r2], tmp_path / "run")
    assert main(["predict", str(run)]) == 0
    sorted(run.glob("*.dl2.jsonl"))[2].unlink()
    capsys.readouterr()
    assert main(["predict", str(run)]) == 5
    assert "no trace from rank(s) 2" in capsys.readouterr().err


def test_predict_cut_short_by_its_bound_is_not_a_clean_bill(tmp_path, capsys):
    from trace_builders import two_sender_wildcards
    from trace_builders import write_run_dir

    # GIVEN many wildcard receives with two possible senders each, and no deadlock
    run = write_run_dir(two_sender_wildcards(), tmp_path / "run")
    # THEN a search that explored all of it is clean (0); one its bound cut is not (5)
    assert main(["predict", str(run)]) == 0
    assert main(["predict", "--max-states", "5", str(run)]) == 5
    assert "search stopped after 5 states" in capsys.readouterr().out


@pytest.mark.parametrize(
    "told",
    [{"child_of": 1000}, {"ppid": 1000}],  # started after its rank's trace opened, or before
    ids=["child_of", "ppid"],
)
def test_a_ranks_own_trace_is_preferred_to_a_helper_process_it_started(told, tmp_path, capsys):
    from dl2.trace.format import trace_file_name
    from trace_builders import ranks

    # GIVEN rank 0's trainer (stuck in an all_reduce rank 1 never joins) and a newer
    # helper process it started (async checkpointing) with a world of its own, same size
    r0, r1 = ranks(2)
    r0.call("all_reduce", 27, count=4, complete=False)
    r1.call("barrier", 29, complete=False)
    helper, _ = ranks(2)
    helper.call("all_gather", 90, count=4)
    run = tmp_path / "run"
    run.mkdir()
    (run / trace_file_name(0, 1000)).write_text(r0.text(pid=1000, wall=1))
    (run / trace_file_name(1, 1001)).write_text(r1.text(pid=1001, wall=1))
    (run / trace_file_name(0, 2000)).write_text(helper.text(pid=2000, wall=5, **told))
    assert main(["analyze", str(run)]) == 3
    out = capsys.readouterr().out
    assert "train.py:27" in out and "train.py:90" not in out
    assert "the rank's own process" in out


def test_an_async_op_is_named_with_the_line_that_waits_on_it(tmp_path, capsys):
    import json

    from trace_builders import ranks
    from trace_builders import write_run_dir

    # GIVEN rank 0 blocked in work.wait() (line 20) on an irecv it posted at line 12,
    # which rank 1, in a barrier, never sends
    r0, r1 = ranks(2)
    recv = r0.irecv(12, peer=1)
    r0.wait(recv, complete=False, line=20)
    r1.call("barrier", 22, complete=False)
    run = write_run_dir([r0, r1], tmp_path / "run")
    assert main(["analyze", str(run), "--json", str(tmp_path / "r.json")]) == 3
    assert "train.py:12, waited at line 20" in capsys.readouterr().out
    ops = [op for f in json.loads((tmp_path / "r.json").read_text())["findings"] for op in f["ops"]]
    mine = [op for op in ops if op["rank"] == 0]
    assert mine and all((op["line"], op.get("wait_line")) == (12, 20) for op in mine)


def test_a_collective_issued_in_another_file_names_the_programs_line_too(tmp_path, capsys):
    import json

    from trace_builders import ranks
    from trace_builders import write_run_dir

    # GIVEN rank 0 logging metrics through a helper module of its own (whose all_reduce
    # sits in another file than the script's call), rank 1 through an installed package's
    # callback, each where the other is in its training all_reduce
    helper = [("/p/mylib/_comm.py", 6, "all_reduce_sum"), ("/p/mylib/metrics.py", 12, "log")]
    script = [("/p/train.py", 24, "main"), ("/p/train.py", 40, "<module>")]
    package = [("/venv/lib/python3.11/site-packages/fakelib/cb.py", 7, "_stop")]
    r0, r1 = ranks(2)
    r0.call("all_reduce", 6, count=2, stack=[*helper, *script])
    r1.call("all_reduce", 17, count=6, stack=[*package, ("/p/train.py", 17, "main")])
    r0.end()
    r1.end()
    run = write_run_dir([r0, r1], tmp_path / "run")
    assert main(["analyze", str(run), "--json", str(tmp_path / "r.json")]) == 4
    out = capsys.readouterr().out
    # THEN each side reads from the program's line inwards
    assert "train.py:24 → _comm.py:6" in out and "train.py:17 → cb.py:7" in out
    # AND the JSON op carries the lines around the named one
    (finding,) = json.loads((tmp_path / "r.json").read_text())["findings"]
    by_rank = {op["rank"]: op for op in finding["ops"]}
    assert (by_rank[0]["file"], by_rank[0]["line"]) == ("/p/mylib/_comm.py", 6)
    assert by_rank[0]["called_from"] == {"file": "/p/train.py", "line": 24, "function": "main"}
    assert "inside" not in by_rank[0]
    assert (by_rank[1]["file"], by_rank[1]["line"]) == ("/p/train.py", 17)
    assert by_rank[1]["inside"]["line"] == 7 and "called_from" not in by_rank[1]
    # AND the hint knows this was the group's first collective
    assert "first collective" in finding["hint"] and "before this point" not in finding["hint"]


def test_a_trace_cut_short_is_incomplete_not_a_rank_that_never_issued(tmp_path, capsys):
    import json

    from trace_builders import ranks
    from trace_builders import write_run_dir

    # GIVEN rank 1's trace cut in a partial record (its disk filled) though its process
    # exited cleanly, after the first of the two all_reduces rank 0 issued
    r0, r1 = ranks(2)
    r0.call("all_reduce", 5)
    r0.call("all_reduce", 6)
    r0.end()
    r1.call("all_reduce", 5)
    run = write_run_dir([r0, r1], tmp_path / "run")
    cut = sorted(run.glob("*.dl2.jsonl"))[1]
    cut.write_text(cut.read_text() + '["o",20')
    states = {"0": {"state": "exited"}, "1": {"state": "exited"}}
    (run / "run.json").write_text(json.dumps({"reason": "finished", "ranks": states}))
    assert main(["analyze", str(run)]) == 5
    out = capsys.readouterr().out
    assert "never issued" not in out
    assert "the trace of rank(s) 1 stops before its end" in out


def test_a_trace_file_of_another_run_is_skipped_not_merged(tmp_path, capsys):
    from dl2.trace.format import trace_file_name
    from trace_builders import ranks

    # GIVEN a 2-rank run's recv/recv deadlock, and rank 2's file of a 3-rank run copied in
    r0, r1 = ranks(2)
    r0.call("recv", 10, peer=1, complete=False)
    r1.call("recv", 11, peer=0, complete=False)
    _, _, stray = ranks(3)
    stray.call("recv", 9, peer=1, complete=False)
    run = tmp_path / "run"
    run.mkdir()
    (run / trace_file_name(0, 100)).write_text(r0.text(pid=100, run_id="aaa"))
    (run / trace_file_name(1, 101)).write_text(r1.text(pid=101, run_id="aaa"))
    (run / trace_file_name(2, 900)).write_text(stray.text(pid=900, run_id="bbb"))
    assert main(["analyze", str(run), "-r", "json"]) == 3
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["world_size"] == 2
    assert any("from another run (run id bbb" in w for w in report["warnings"])


def test_a_run_directory_that_cannot_be_listed_is_one_line(tmp_path, capsys, monkeypatch):
    import os

    run = tmp_path / "run"
    run.mkdir()
    listing = os.scandir

    def refuse(path="."):  # root may list anything: the refusal is simulated
        if os.fspath(path) == os.fspath(run):
            raise PermissionError(13, "Permission denied")
        return listing(path)

    monkeypatch.setattr(os, "scandir", refuse)
    assert main(["analyze", str(run)]) == 2
    err = capsys.readouterr().err
    assert "cannot list the run directory: Permission denied" in err
    assert len(err.strip().splitlines()) == 1


def test_read_limits_that_name_no_trace_file_are_ignored(tmp_path, capsys):
    import json

    from trace_builders import ranks
    from trace_builders import write_run_dir

    r0, r1 = ranks(2)
    r0.call("recv", 10, peer=1, complete=False)
    r1.call("recv", 11, peer=0, complete=False)
    run = write_run_dir([r0, r1], tmp_path / "run")
    (run / "run.json").write_text(json.dumps({"reason": "deadlock", "read_upto": {"x": 3}}))
    assert main(["analyze", str(run)]) == 3


def test_ranks_started_with_different_world_sizes_are_told(tmp_path, capsys):
    from trace_builders import RankBuilder
    from trace_builders import write_run_dir

    # GIVEN rank 1 started with a stale world_size=3 in a 2-rank job
    r0, r1 = RankBuilder(0, 2), RankBuilder(1, 3)
    r0.call("all_reduce", 13, complete=False)
    r1.create_group("0", [0, 1, 2], line=11, complete=False)
    main(["analyze", str(write_run_dir([r0, r1], tmp_path / "run"))])
    out = capsys.readouterr().out
    assert "different world sizes (rank(s) 0: 2; rank(s) 1: 3)" in out
