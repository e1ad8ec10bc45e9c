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
        (["run", "--hang-timeout", "-3", "-n", "2", "x.py"], "must be positive"),
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
