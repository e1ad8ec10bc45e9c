"""`dl2 replay RUN_DIR`: re-execute a recorded run's communication under chosen semantics.

Builds the replay plan of the recorded run (:mod:`dl2.replay.plan`), forces its wildcard
receives (to a witness's choices with ``--choices``, else as recorded), and runs it as a
real gloo job of the generic worker with the eager-send buffer (``--buffer-size``, else
the witness's, else the recorded run's) and, for a witness of a backend that launches
batches as one unit (NCCL), the fused-batch emulation.  The job is watched and analysed
exactly as by ``dl2 run``; exit status likewise (3 when the replay deadlocks).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dl2.analysis.prediction.semantics import recorded_semantics
from dl2.analysis.prediction.witness import Witness
from dl2.analysis.prediction.witness import witness_from_json
from dl2.cli.options import add_buffer_size
from dl2.cli.options import add_json
from dl2.cli.options import add_monitoring
from dl2.cli.options import add_run_dir
from dl2.cli.output import conclude
from dl2.cli.output import emit
from dl2.cli.output import exit_status
from dl2.errors import ConfigError
from dl2.live.launcher import prepare_run_dir
from dl2.live.monitor import MonitorOptions
from dl2.live.monitor import Outcome
from dl2.model.execution_graph import build_execution_graph
from dl2.notice import notice
from dl2.replay.plan import ReplayPlan
from dl2.replay.plan import build_replay_plan
from dl2.replay.runner import ReplayConfig
from dl2.replay.runner import run_plan
from dl2.report import Verdict
from dl2.trace.session import Session
from dl2.trace.session import load_session
from dl2.units import format_size


class ReplayCommand:
    name = "replay"
    help = (
        "re-execute a recorded run's communication under a chosen buffer size and wildcard choices"
    )

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        add_buffer_size(
            parser,
            "emulate eager sends up to BYTES (e.g. 0, 4095, 64KiB); default: the witness's "
            "buffer, else the recorded run's",
        )
        parser.add_argument(
            "--choices",
            metavar="WITNESS.json",
            help="a witness written by `dl2 predict`: force its wildcard matches and semantics",
        )
        add_json(parser)
        add_monitoring(
            parser,
            "stop the replay after S seconds without progress and without proof (default 60)",
        )
        parser.add_argument(
            "--run-dir",
            dest="replay_dir",
            metavar="DIR",
            help="where the replay's traces go (default dl2-runs/<time>-replay-<name>)",
        )

    def run(self, args: argparse.Namespace) -> int:
        session = load_session(args.run_dir)
        session.require_whole_history("dl2 replay")
        graph = build_execution_graph(session)
        witness = _read_witness(args.choices) if args.choices else None
        config, notes = _config(args.buffer_size, witness, session)
        plan = build_replay_plan(graph, witness)
        label = "replay-" + (Path(args.run_dir).resolve().name or "run")
        replay_dir = prepare_run_dir(args.replay_dir, label)
        _print_forced(args.run_dir, replay_dir, plan, config, witness, notes)
        options = MonitorOptions(
            poll_interval=args.poll_interval,
            hang_timeout=args.hang_timeout,
            suspect_after=args.hang_timeout,
            on_deadlock="abort",
            # a replay is judged under the configuration it emulates, nothing else
            hazards=False,
        )
        outcome = run_plan(
            plan, config, replay_dir, options, on_report=lambda r: emit(r, None), notice=notice
        )
        return _conclude(outcome, replay_dir, args, witness)


def _read_witness(path: str) -> Witness:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    except ValueError as err:
        raise ConfigError(f"{path}: not JSON: {err}") from None
    return witness_from_json(data)


def _config(
    buffer_size: int | None, witness: Witness | None, session: Session
) -> tuple[ReplayConfig, list[str]]:
    """The emulated semantics: --buffer-size, else the witness's, else the recording's."""
    notes: list[str] = []
    recorded = recorded_semantics(session)
    fused = False
    if witness is not None:
        semantics = witness.semantics
        fused = semantics.fused_batches_atomic
        buffer: int | None = semantics.eager_bytes if buffer_size is None else buffer_size
        if not semantics.independent_groups:
            notes.append(
                f"the witness assumes works complete in issue order ({semantics.label}); "
                "gloo completes them independently and dl2 does not emulate that order"
            )
    else:
        buffer = buffer_size
        if buffer is None and recorded is not None and recorded.eager_bytes:
            buffer = recorded.eager_bytes
        fused = recorded.fused_batches_atomic if recorded is not None else False
    return ReplayConfig(buffer_size=buffer, fused_batches=fused), notes


def _print_forced(
    run_dir: str,
    replay_dir: Path,
    plan: ReplayPlan,
    config: ReplayConfig,
    witness: Witness | None,
    notes: list[str],
) -> None:
    lines = [
        f"dl2 replay: {run_dir} -> {replay_dir} ({plan.world_size} ranks, {plan.op_count:,} ops)"
    ]
    if config.buffer_size:
        size = format_size(config.buffer_size)
        lines.append(
            f"  forced sends: eager up to {size} ({config.buffer_size:,} bytes): a send that "
            "fits returns without waiting for its receive (emulated)"
        )
    else:
        lines.append("  forced sends: rendezvous (buffer 0): every send waits for its receive")
    lines.append(
        "  forced batches: "
        + (
            "each batch_isend_irecv launches as one unit once all its ops can be matched "
            "(emulated NCCL group)"
            if config.fused_batches
            else "issued op by op (gloo)"
        )
    )
    if witness is not None:
        lines.append(
            f"  witness: {witness.semantics.label}, ranks {', '.join(map(str, witness.ranks))}"
        )
    for choice in plan.choices:
        recorded = (
            f"recorded: rank {choice.recorded}"
            if choice.recorded is not None
            else "unmatched when recorded"
        )
        origin = "witness" if choice.source == "witness" else "as recorded"
        lines.append(
            f"  forced wildcard: rank {choice.rank}'s recv from any rank (op {choice.op_id}, "
            f"{choice.location}) <- rank {choice.sender} ({origin}; {recorded})"
        )
    if not plan.choices:
        lines.append("  forced wildcard: none (no wildcard receive)")
    lines.append(
        "  each op is issued from its recorded source line; every rank ends with a barrier"
    )
    for note in [*plan.notes, *notes]:
        lines.append(f"  note: {note}")
    print("\n".join(lines), flush=True)


def _conclude(
    outcome: Outcome, replay_dir: Path, args: argparse.Namespace, witness: Witness | None
) -> int:
    report = outcome.report
    if report is None:
        print(
            f"dl2: the replay failed (exit status {outcome.job_exit_code}) before "
            "initialising torch.distributed",
            file=sys.stderr,
        )
        return 1
    stop_notes = {
        "hang-timeout": f"dl2 stopped the replay: no progress for {args.hang_timeout:g} s",
        "rank-failed": "a replayed rank failed, so dl2 stopped the others",
        "interrupted": "interrupted: dl2 stopped the replay",
    }
    report = conclude(outcome, report, replay_dir, args.json, stop_notes)
    verdict = report.verdict.value
    reproduced = ""
    if witness is not None:
        reproduced = (
            ": the witness's deadlock reproduces"
            if report.verdict is Verdict.DEADLOCK
            else ": the witness's deadlock did not reproduce"
        )
    print(
        f"dl2 replay: verdict {verdict} (exit {report.exit_code}){reproduced}; "
        f"traces in {replay_dir}",
        flush=True,
    )
    return exit_status(outcome, report)
