"""`dl2 run`: launch a job with the recorder injected, watch it live, report."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from dl2.analysis.report import Verdict
from dl2.cli.output import emit
from dl2.errors import ConfigError
from dl2.errors import Dl2Error
from dl2.errors import LaunchError
from dl2.live.launcher import Job
from dl2.live.launcher import launch_command
from dl2.live.launcher import launch_ranks
from dl2.live.monitor import ON_DEADLOCK
from dl2.live.monitor import Monitor
from dl2.live.monitor import MonitorOptions
from dl2.live.monitor import Outcome
from dl2.render import get_renderer
from dl2.render import write_report
from dl2.trace.session import RUN_META

USAGE = """\
dl2 run [options] -n N SCRIPT.py [ARG ...]     start N ranks like torchrun --standalone
dl2 run [options] -- COMMAND [ARG ...]         run any launcher or script as is"""


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _new_run_dir(base: Path, label: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        candidate = base / (f"{stamp}-{label}" + (f"-{attempt}" if attempt else ""))
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            continue
        except OSError as err:
            raise ConfigError(f"cannot create run directory {candidate}: {err.strerror}") from None
    raise ConfigError(f"cannot create a new run directory under {base}")


class RunCommand:
    name = "run"
    help = "launch a distributed job, record it, and diagnose any deadlock"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.usage = USAGE
        parser.add_argument("-n", "--nproc", type=int, metavar="N", help="start N ranks of SCRIPT")
        parser.add_argument(
            "--run-dir", metavar="DIR", help="where traces go (default dl2-runs/<time>-<name>)"
        )
        parser.add_argument("--json", metavar="PATH", help="also write the JSON report here")
        parser.add_argument(
            "--hang-timeout",
            type=_positive,
            default=60.0,
            metavar="S",
            help="stop the job after S seconds without progress by any rank (default 60)",
        )
        parser.add_argument(
            "--suspect-after",
            type=_positive,
            default=60.0,
            metavar="S",
            help="report ranks others wait on that are quiet for S seconds (default 60)",
        )
        parser.add_argument(
            "--on-deadlock",
            choices=ON_DEADLOCK,
            default="abort",
            help="abort: report and stop the job (default); report: report, keep running; wait",
        )
        parser.add_argument(
            "--poll-interval", type=_positive, default=0.2, metavar="S", help=argparse.SUPPRESS
        )
        parser.add_argument(
            "target", nargs=argparse.REMAINDER, help="SCRIPT [ARG ...] or -- COMMAND [ARG ...]"
        )

    def run(self, args: argparse.Namespace) -> int:
        target = list(args.target)
        if target and target[0] == "--":
            target = target[1:]
        if not target:
            raise ConfigError("nothing to run: give -n N SCRIPT.py or -- COMMAND")
        if args.nproc is not None and not Path(target[0]).is_file():
            raise LaunchError(f"script not found: {target[0]}")
        label = Path(target[0] if args.nproc is not None else target[-1]).stem or "job"
        run_dir = Path(args.run_dir) if args.run_dir else _new_run_dir(Path("dl2-runs"), label)
        if args.run_dir:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise ConfigError(
                    f"cannot create run directory {run_dir}: {err.strerror}"
                ) from None
        options = MonitorOptions(
            poll_interval=args.poll_interval,
            hang_timeout=args.hang_timeout,
            suspect_after=args.suspect_after,
            on_deadlock=args.on_deadlock,
        )
        job = (
            launch_ranks(target[0], target[1:], args.nproc, run_dir)
            if args.nproc is not None
            else launch_command(target, run_dir)
        )
        previous = _stop_on_sigterm()
        try:
            monitor = Monitor(run_dir, job, options, on_report=lambda r: emit(r, None))
            outcome = monitor.run()
        finally:
            signal.signal(signal.SIGTERM, previous)
            if not job.finished():
                job.stop()
        return self._conclude(outcome, job, run_dir, args, target)

    def _conclude(
        self, outcome: Outcome, job: Job, run_dir: Path, args: argparse.Namespace, target: list[str]
    ) -> int:
        report = outcome.report
        _write_meta(run_dir, outcome, job, target, args.nproc)
        if report is None:
            if outcome.job_exit_code != 0 and outcome.reason != "hang-timeout":
                print(
                    f"dl2: the job failed (exit status {outcome.job_exit_code}) before "
                    "initialising torch.distributed; nothing was recorded",
                    file=sys.stderr,
                )
                return 1
            raise Dl2Error(
                "the job never initialised torch.distributed (no rank wrote a trace); "
                "is it a torch.distributed program?"
            )
        notes = {
            "hang-timeout": (
                f"dl2 stopped the job: no rank made progress for {args.hang_timeout:g} s"
            ),
            "rank-failed": "a rank failed, so dl2 stopped the others (as torchrun does)",
            "interrupted": "interrupted: dl2 stopped the job",
        }
        if outcome.reason in notes:
            report = replace(report, warnings=(*report.warnings, notes[outcome.reason]))
        failed = outcome.job_exit_code != 0 or outcome.reason != "finished"
        if report.verdict is Verdict.OK and failed:
            report = replace(report, verdict=Verdict.JOB_FAILED)
        emit(report, args.json)
        try:
            write_report(get_renderer("json"), report, str(run_dir / "report.json"))
        except Dl2Error:
            pass  # the run directory went away; the report was printed already
        print(f"dl2: traces in {run_dir}  (re-analyse: dl2 analyze {run_dir})", file=sys.stderr)
        if outcome.reason == "interrupted" and report.verdict is not Verdict.DEADLOCK:
            return 130
        return report.exit_code


def _write_meta(
    run_dir: Path, outcome: Outcome, job: Job, target: list[str], nproc: int | None
) -> None:
    """Record what the launcher saw, for a later `dl2 analyze` of this directory."""
    ranks: dict[str, Any] = {}
    if outcome.report is not None:
        for state in outcome.report.ranks:
            ranks[str(state.rank)] = {
                "state": {"exited": "exited", "failed": "failed"}.get(state.status, "alive")
            }
    meta = {
        "format": 1,
        "command": target,
        "nproc": nproc,
        "reason": outcome.reason,
        "job_exit_code": outcome.job_exit_code,
        "stopped_by_dl2": job.stopped_by_dl2,
        "verdict": outcome.report.verdict.value if outcome.report else None,
        "ranks": ranks,
    }
    try:
        (run_dir / RUN_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    except OSError:
        pass


def _stop_on_sigterm() -> Any:
    """Turn SIGTERM into KeyboardInterrupt so the job is stopped and reported."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)
