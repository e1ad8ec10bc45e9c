"""`dl2 run`: launch a job with the recorder injected, watch it live, report."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from dl2.cli.options import add_buffer_size
from dl2.cli.options import add_hazards
from dl2.cli.options import add_json
from dl2.cli.options import add_monitoring
from dl2.cli.options import add_retention
from dl2.cli.options import positive
from dl2.cli.output import REPORT_HTML
from dl2.cli.output import conclude
from dl2.cli.output import emit
from dl2.cli.output import ended_verdict
from dl2.cli.output import exit_status
from dl2.errors import ConfigError
from dl2.errors import Dl2Error
from dl2.errors import LaunchError
from dl2.live.launcher import Job
from dl2.live.launcher import launch_command
from dl2.live.launcher import launch_ranks
from dl2.live.launcher import prepare_run_dir
from dl2.live.launcher import run_id
from dl2.live.monitor import ON_DEADLOCK
from dl2.live.monitor import Monitor
from dl2.live.monitor import MonitorOptions
from dl2.live.monitor import Outcome
from dl2.live.multinode import pointer_line
from dl2.live.multinode import report_json_dict
from dl2.live.shared import SharedState
from dl2.live.shared import StoreAddress
from dl2.live.shared import parse_store
from dl2.live.shared import store_from_command
from dl2.live.watch import stop_signals
from dl2.live.watch import watch_job
from dl2.notice import notice
from dl2.record.emulate import ENV_BUFFER_SIZE
from dl2.record.writer import ENV_KEEP
from dl2.record.writer import ENV_SEGMENT_BYTES
from dl2.render import get_renderer
from dl2.trace.session import ALIVE
from dl2.trace.session import RUN_META

USAGE = """\
dl2 run [options] -n N SCRIPT.py [ARG ...]     start N ranks like torchrun --standalone
dl2 run [options] -- COMMAND [ARG ...]         run any launcher or script as is"""


class RunCommand:
    name = "run"
    help = "launch a distributed job, record it, and diagnose any deadlock"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.usage = USAGE
        parser.add_argument("-n", "--nproc", type=int, metavar="N", help="start N ranks of SCRIPT")
        parser.add_argument(
            "--run-dir", metavar="DIR", help="where traces go (default dl2-runs/<time>-<name>)"
        )
        add_json(parser)
        add_monitoring(
            parser,
            "stop the job after S seconds in which every live rank sat in communication "
            "with no progress and no deadlock could be proven (default 60); ranks outside "
            "communication are hang suspects and never stopped",
        )
        parser.add_argument(
            "--suspect-after",
            type=positive,
            default=60.0,
            metavar="S",
            help=(
                "print a hang suspect (a rank others wait on, itself outside communication) "
                "with its stack once it is quiet for S seconds (default 60); never a verdict"
            ),
        )
        parser.add_argument(
            "--on-deadlock",
            choices=ON_DEADLOCK,
            default="abort",
            help=(
                "abort: report, stop the job, exit 3 (default); report: report once, keep "
                "running; wait: neither, report when the job ends or at the hang timeout"
            ),
        )
        parser.add_argument(
            "--store",
            metavar="HOST:PORT",
            help=(
                "multi-node: share live state with the other nodes' dl2 monitors through the "
                "job's c10d TCPStore there (default: torchrun's --rdzv-endpoint when --nnodes > 1)"
            ),
        )
        add_buffer_size(
            parser,
            "emulate a backend that buffers sends: a send of at most BYTES (e.g. 64KiB) "
            "returns without waiting for its receive, as NCCL's or MPI's eager sends do "
            "(default: gloo's, every send waits for its receive)",
        )
        add_hazards(parser)
        add_retention(parser)
        parser.add_argument(
            "target", nargs=argparse.REMAINDER, help="SCRIPT [ARG ...] or -- COMMAND [ARG ...]"
        )

    def run(self, args: argparse.Namespace) -> int:
        target = list(args.target)
        if target and target[0] == "--":
            if args.nproc is not None:
                raise ConfigError(
                    "give either -n N SCRIPT.py (dl2 starts the ranks) or -- COMMAND "
                    "(a launcher starts them), not both"
                )
            target = target[1:]
        if not target:
            raise ConfigError("nothing to run: give -n N SCRIPT.py or -- COMMAND")
        if args.nproc is not None and not Path(target[0]).is_file():
            raise LaunchError(f"script not found: {target[0]}")
        if args.json and args.json != "-" and Path(args.json).is_dir():
            raise ConfigError(f"--json {args.json}: is a directory; give a file name")
        label = Path(target[0] if args.nproc is not None else target[-1]).stem or "job"
        run_dir = prepare_run_dir(args.run_dir, label)
        options = MonitorOptions(
            poll_interval=args.poll_interval,
            hang_timeout=args.hang_timeout,
            suspect_after=args.suspect_after,
            on_deadlock=args.on_deadlock,
            hazards=args.hazards,
        )
        address = _store_address(args, target)
        if address is not None:  # every node's dl2 run gives its ranks the same run id
            run_id(run_dir, f"{address.host}:{address.port}/{address.run_id}")
        shared = SharedState(address, str(run_dir.resolve())) if address is not None else None
        env = {} if args.buffer_size is None else {ENV_BUFFER_SIZE: str(args.buffer_size)}
        if args.keep is not None:
            env[ENV_KEEP] = str(args.keep or "all")
        if args.segment_size is not None:
            env[ENV_SEGMENT_BYTES] = str(args.segment_size)
        job = (
            launch_ranks(target[0], target[1:], args.nproc, run_dir, env)
            if args.nproc is not None
            else launch_command(target, run_dir, env)
        )
        monitor = Monitor(
            run_dir,
            job,
            options,
            on_report=lambda r: emit(r, None),
            notice=notice,
            shared=shared,
            render_json=get_renderer("json").render,
        )
        # the report and the page are written whatever comes in (and dl2 exits with its
        # status after an interrupt, however many more come)
        with stop_signals(last=True):
            outcome = watch_job(monitor)
            return self._conclude(outcome, job, run_dir, args, target)

    def _conclude(
        self, outcome: Outcome, job: Job, run_dir: Path, args: argparse.Namespace, target: list[str]
    ) -> int:
        report = outcome.report
        _write_meta(run_dir, outcome, job, target, args.nproc)
        if outcome.remote is not None:
            return _conclude_remote(outcome, run_dir, args)
        if report is None:
            if outcome.reason == "interrupted":
                print(
                    "dl2: interrupted before the job initialised torch.distributed; "
                    "nothing was recorded",
                    file=sys.stderr,
                )
                return 130
            if outcome.job_exit_code != 0 and outcome.reason != "hang-timeout":
                print(
                    f"dl2: the job failed (exit status {outcome.job_exit_code}) before "
                    "initialising torch.distributed; nothing was recorded",
                    file=sys.stderr,
                )
                return 1
            raise Dl2Error(
                "the job never initialised torch.distributed (no rank wrote a trace); "
                "is it a torch.distributed program? (dl2 loads its recorder through "
                "PYTHONPATH and DL2_RUN_DIR: a launcher that gives its ranks a fresh "
                "environment must pass both on)"
            )
        stop_notes = {
            "hang-timeout": (
                f"dl2 stopped the job: no rank made progress for {args.hang_timeout:g} s, "
                "every live rank in communication"
            ),
            "rank-failed": "a rank failed, so dl2 stopped the others (as torchrun does)",
            "interrupted": (
                "interrupted by the user (SIGINT, SIGTERM, SIGHUP or SIGQUIT): dl2 stopped the job"
            ),
        }
        report = conclude(outcome, report, run_dir, args.json, stop_notes, target)
        quoted = shlex.quote(str(run_dir))
        print(f"dl2: traces in {run_dir}  (re-analyse: dl2 analyze {quoted})", file=sys.stderr)
        page = Path(run_dir) / REPORT_HTML
        if page.exists():
            print(f"dl2: report drawn in {page}", file=sys.stderr)
        return exit_status(outcome, report)


def _write_meta(
    run_dir: Path, outcome: Outcome, job: Job, target: list[str], nproc: int | None
) -> None:
    """Record what the launcher saw, for a later `dl2 analyze` of this directory."""
    ranks: dict[str, Any] = {}
    if outcome.report is not None:
        for state in outcome.report.ranks:
            ranks[str(state.rank)] = {"state": state.status.value if state.status.gone else ALIVE}
    for rank, process in (outcome.states or {}).items():
        ranks.setdefault(str(rank), {})["state"] = str(process)
    for rank, quiet in (outcome.quiet or {}).items():
        ranks.setdefault(str(rank), {})["quiet_s"] = round(quiet, 3)
    meta = {
        "format": 1,
        "command": target,
        "nproc": nproc,
        "reason": outcome.reason,
        "job_exit_code": outcome.job_exit_code,
        "stopped_by_dl2": job.stopped_by_dl2,
        "verdict": (
            ended_verdict(outcome.report, outcome.reason, outcome.job_exit_code).verdict.value
            if outcome.report
            else None
        ),
        "ranks": ranks,
        "detected_after": outcome.detected_after,
        "verdict_wall_time": outcome.verdict_wall_time,
        "deadlock_ranks": list(outcome.deadlocked),
        "notes": list(outcome.notes),
        "run_id": run_id(run_dir),
    }
    if outcome.read_upto is not None:  # a later analysis reads what this one read
        meta["read_upto"] = dict(outcome.read_upto)
    if outcome.remote is not None:
        meta["verdict"] = outcome.remote.get("verdict")
        meta["reported_by"] = {
            k: outcome.remote.get(k) for k in ("node", "host", "run_dir", "reason", "ranks")
        }
    try:
        (run_dir / RUN_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    except OSError:
        pass


def _conclude_remote(outcome: Outcome, run_dir: Path, args: argparse.Namespace) -> int:
    """Another node's monitor reported: point at it, keep a copy of its report."""
    verdict = outcome.remote or {}
    print(f"dl2: {pointer_line(verdict)}", file=sys.stderr, flush=True)
    text = outcome.remote_report
    if report_json_dict(text) is not None and text is not None:
        for path in [args.json, str(run_dir / "report.json")]:
            if path:
                try:
                    Path(path).write_text(text)
                except OSError:
                    pass
    code = verdict.get("exit_code")
    return int(code) if isinstance(code, int) else 1


def _store_address(args: argparse.Namespace, target: list[str]) -> StoreAddress | None:
    """The job's store for multi-node sharing, or None (single node)."""
    if args.store:
        try:
            return parse_store(args.store)
        except ValueError as err:
            raise ConfigError(f"--store: {err}") from None
    if args.nproc is not None:
        return None
    try:
        return store_from_command(target)
    except ValueError as err:
        notice(f"{err}: cannot share state with the other nodes; local-only analysis")
        return None
