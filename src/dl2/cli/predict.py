"""`dl2 predict RUN_DIR`: deadlocks the recorded run could have under other configurations.

Prints a table of configuration -> verdict, then each potential deadlock's witness (the
blocked ranks with their ops and source lines, the wildcard matches taken, the buffer
threshold), writes each witness as JSON and prints the command that replays it; then the
fusion passes whose buckets may differ between ranks (:mod:`dl2.analysis.prediction.fusion`; with
``--fusion``, every pass that fuses in each rank's own ready order).  Exit status: 0 no
configuration deadlocks and no fusion diverges, 4 some can, 3 the recorded run itself
deadlocked, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from dl2.analysis.describe import where
from dl2.analysis.prediction.fusion import FusionWitness
from dl2.analysis.prediction.fusion import fusion_witnesses
from dl2.analysis.prediction.fusion import witness_sentence
from dl2.analysis.prediction.machine import build_program
from dl2.analysis.prediction.search import DEFAULT_MAX_DEVIATIONS
from dl2.analysis.prediction.search import DEFAULT_MAX_STATES
from dl2.analysis.prediction.search import DEFAULT_MAX_WITNESSES
from dl2.analysis.prediction.search import Prediction
from dl2.analysis.prediction.search import Predictor
from dl2.analysis.prediction.search import Witness
from dl2.analysis.prediction.search import recorded_semantics
from dl2.analysis.prediction.search import semantics_to_json
from dl2.analysis.prediction.search import witness_to_json
from dl2.analysis.prediction.semantics import Semantics
from dl2.analysis.prediction.semantics import format_size
from dl2.analysis.prediction.semantics import parse_semantics
from dl2.analysis.prediction.semantics import parse_size
from dl2.errors import ConfigError
from dl2.model.execution_graph import build_execution_graph
from dl2.model.wait_for import build_wait_for_graph
from dl2.report import Verdict
from dl2.trace.session import load_session

if TYPE_CHECKING:
    from rich.console import Console

#: Version of the ``--json`` document.
PREDICT_FORMAT = 1
_WIDTH = 100


class PredictCommand:
    name = "predict"
    help = "predict deadlocks of a recorded run under other backend configurations"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help="a run directory written by `dl2 run`")
        parser.add_argument(
            "--semantics",
            action="append",
            metavar="SPEC",
            help=(
                "a configuration: gloo, nccl, nccl:SIZE, eager:SIZE or rendezvous, with an "
                "optional +serial (repeatable; default gloo and nccl)"
            ),
        )
        parser.add_argument(
            "--buffer-sizes",
            metavar="SIZES",
            help="sweep the eager buffer of each configuration that has one, e.g. 0,1KiB,4MiB",
        )
        parser.add_argument("--json", metavar="PATH", help="also write the predictions here")
        parser.add_argument(
            "--witness-dir",
            metavar="DIR",
            help="where witness files go (default RUN_DIR/witnesses)",
        )
        parser.add_argument(
            "--fusion",
            action="store_true",
            help=(
                "also assume that consecutive all_reduce_coalesced calls from one line fuse "
                "tensors in each rank's own ready order, and report the other fusions that "
                "allows (without it, only fusions the run itself shows to vary)"
            ),
        )
        parser.add_argument(
            "--max-states",
            type=int,
            default=DEFAULT_MAX_STATES,
            metavar="N",
            help=f"states each configuration's search may run (default {DEFAULT_MAX_STATES})",
        )
        parser.add_argument(
            "--max-deviations",
            type=int,
            default=DEFAULT_MAX_DEVIATIONS,
            metavar="N",
            help=(
                "wildcard matches an explored execution may take differently from the "
                f"recorded run (default {DEFAULT_MAX_DEVIATIONS})"
            ),
        )

    def run(self, args: argparse.Namespace) -> int:
        configs = _configurations(args.semantics, args.buffer_sizes)
        if args.max_states < 1:
            raise ConfigError(f"--max-states must be positive: {args.max_states}")
        if args.max_deviations < 0:
            raise ConfigError(f"--max-deviations must not be negative: {args.max_deviations}")
        session = load_session(args.run_dir)
        graph = build_execution_graph(session)
        recorded_deadlock = bool(build_wait_for_graph(session, graph).deadlocked)
        recorded = recorded_semantics(session)
        predictor = Predictor(
            build_program(graph), args.max_states, DEFAULT_MAX_WITNESSES, args.max_deviations
        )
        predictions = (
            [] if recorded_deadlock else [predictor.predict(c, recorded=recorded) for c in configs]
        )

        witness_dir = Path(args.witness_dir or Path(args.run_dir) / "witnesses")
        files = _write_witnesses(predictions, witness_dir)
        console = _console()
        ops = sum(len(t.ops) for t in graph.timelines.values())
        console.print(f"dl2 predict: {args.run_dir} ({len(graph.timelines)} ranks, {ops:,} ops)")
        fusion = [] if recorded_deadlock else fusion_witnesses(graph, assume=args.fusion)
        if recorded_deadlock:
            analyze = shlex.join(["dl2", "analyze", args.run_dir])
            console.print(f"The recorded run itself deadlocked: see `{analyze}`.")
        else:
            _print_predictions(console, predictions, files, args.run_dir)
            _print_fusion(console, fusion, args.fusion)
        if args.json:
            _write_json(
                Path(args.json), args.run_dir, recorded_deadlock, predictions, files, fusion
            )
        if recorded_deadlock:
            return Verdict.DEADLOCK.exit_code
        if any(p.deadlock_possible for p in predictions) or fusion:
            return Verdict.DEFECT.exit_code
        return 0


def _configurations(specs: list[str] | None, sizes_text: str | None) -> list[Semantics]:
    base = [parse_semantics(s) for s in (specs or ["gloo", "nccl"])]
    sizes = None
    if sizes_text is not None:
        sizes = [parse_size(part) for part in sizes_text.split(",") if part.strip()]
        if not sizes:
            raise ConfigError("--buffer-sizes needs at least one size, e.g. 0,64KiB,4MiB")
    configs: list[Semantics] = []
    for semantics in base:
        for variant in (
            [semantics.with_buffer(b) for b in sizes]
            if sizes and semantics.buffered
            else [semantics]
        ):
            if variant not in configs:
                configs.append(variant)
    return configs


def _console() -> Console:
    from rich.console import Console

    return Console(
        file=sys.stdout,
        width=_WIDTH,
        color_system=None,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=True,
    )


def _witness_name(witness: Witness, number: int) -> str:
    semantics = witness.semantics
    serial = "" if semantics.independent_groups else "-serial"
    return f"witness-{semantics.name}-{semantics.eager_bytes}{serial}-{number}.json"


def _write_witnesses(predictions: list[Prediction], directory: Path) -> dict[int, Path]:
    """Write every witness; returns id(witness) -> its file."""
    files: dict[int, Path] = {}
    witnesses = [w for p in predictions for w in p.witnesses]
    if not witnesses:
        return files
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for prediction in predictions:
            for number, witness in enumerate(prediction.witnesses, 1):
                path = directory / _witness_name(witness, number)
                text = json.dumps(witness_to_json(witness), indent=2, sort_keys=True)
                path.write_text(text + "\n")
                files[id(witness)] = path
    except OSError as err:
        raise ConfigError(f"cannot write witness files to {directory}: {err.strerror}") from None
    return files


def _verdict_text(prediction: Prediction) -> str:
    if prediction.deadlock_possible:
        count = len(prediction.witnesses)
        return f"deadlock ({count} way{'s' if count > 1 else ''})"
    if prediction.note and prediction.states == 0:
        return "not predicted"
    if not prediction.exhaustive:
        return "none found (search cut)"
    return "ok"


def _print_predictions(
    console: Console,
    predictions: list[Prediction],
    files: dict[int, Path],
    run_dir: str,
) -> None:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("configuration", "model", "verdict", "states"):
        table.add_column(column, justify="right" if column == "states" else "left")
    for p in predictions:
        table.add_row(
            p.semantics.label,
            p.semantics.summary,
            _verdict_text(p),
            str(p.states),
        )
    console.print(table)
    if predictions:
        deviations = max(p.max_deviations for p in predictions)
        fixed = sorted({p.semantics.name for p in predictions if not p.semantics.any_source})
        console.print(
            "Explored per configuration: every execution whose wildcard receives match "
            f"other senders than recorded in up to {deviations} place(s)"
            + (f" ({', '.join(fixed)}: none, no wildcard receive)." if fixed else ".")
        )
    notes = {p.note for p in predictions if p.note}
    for note in sorted(notes):
        console.print(f"note: {note}")
    number = 0
    for p in predictions:
        for witness in p.witnesses:
            number += 1
            console.print()
            _print_witness(console, number, witness, files.get(id(witness)), run_dir)


def _print_witness(
    console: Console, number: int, witness: Witness, path: Path | None, run_dir: str
) -> None:
    ranks = ", ".join(str(r) for r in witness.ranks)
    label = witness.semantics.label
    console.print(f"potential deadlock {number} under {label}: ranks {ranks}")
    if witness.causes:
        console.print(f"  cause: {', '.join(witness.causes)}")
    if witness.threshold is not None:
        t = witness.threshold
        size = format_size(t)
        exact = f"{t:,} bytes" + ("" if size.endswith("bytes") else f" ({size})")
        console.print(
            f"  threshold: deadlocks while the eager buffer is below {exact}; "
            "a larger buffer avoids it"
        )
    for choice in witness.deviations:
        recorded = (
            f" (recorded: rank {choice.recorded_sender})"
            if choice.recorded_sender is not None
            else ""
        )
        console.print(
            f"  choice: rank {choice.rank}'s recv from any rank (op {choice.op_id}, "
            f"{choice.recv.location}) matched rank {choice.sender}{recorded}"
        )
    same = len(witness.choices) - len(witness.deviations)
    if same:
        console.print(f"  ({same} other wildcard match(es) as recorded)")
    if witness.cycle and len(witness.cycle) > 1:
        cycle = " -> ".join(str(r) for r in (*witness.cycle, witness.cycle[0]))
        console.print(f"  cycle: {cycle}")
    for blocked in witness.blocked:
        ref = blocked.ref
        peer = "" if ref.peer is None else f" {'to' if ref.op == 'send' else 'from'} {ref.peer}"
        if ref.op not in ("send", "recv"):
            peer = f" on group {ref.group}"
        elif ref.op == "recv" and ref.peer is None:
            peer = " from any"
        size = f", {blocked.nbytes:,} bytes" if blocked.nbytes is not None else ""
        waits = ", ".join(str(r) for r in blocked.waits_on) or "-"
        queued = f"; {blocked.queued} later op(s) queued behind it" if blocked.queued else ""
        console.print(
            f"  rank {blocked.rank}: {ref.api or ref.op}{peer} (op {blocked.op_id}) at "
            f"{ref.location}{size}: {blocked.state}, waits on {waits}{queued}"
        )
        if blocked.note:
            console.print(f"    {blocked.note}")
    if path is not None:
        console.print(f"  witness: {path}")
        command = [
            "dl2",
            "replay",
            run_dir,
            "--buffer-size",
            str(witness.semantics.eager_bytes),
            "--choices",
            os.fspath(path),
        ]
        console.print(f"  replay:  {shlex.join(command)}")


def _print_fusion(console: Console, witnesses: list[FusionWitness], assumed: bool) -> None:
    windows = "fusion passes: " + (
        "each rank fuses in its own ready order (--fusion)"
        if assumed
        else "only those the run shows to vary (--fusion: assume ready-order fusion)"
    )
    if not witnesses:
        console.print(f"{windows}; no divergent fusion.")
        return
    console.print(f"{windows}; {len(witnesses)} divergent fusion(s):")
    for number, witness in enumerate(witnesses, 1):
        console.print()
        console.print(f"potential fusion divergence {number}: {witness.consequence}")
        console.print(f"  {witness_sentence(witness)}")


def _fusion_to_json(witness: FusionWitness) -> dict[str, Any]:
    window = witness.window
    count_limit, byte_limit = window.limits
    return {
        "rank": window.rank,
        "group": window.gid,
        "ranks": list(witness.ranks),
        "ops": [op.id for op in window.ops],
        "location": where(window.ops[0]),
        "recorded": [list(b) for b in window.buckets],
        "alternative": [list(b) for b in witness.alternative],
        "limits": {"tensors": count_limit, "bytes": byte_limit},
        "consequence": witness.consequence,
        "bucket": witness.bucket,
        "observed": witness.observed,
        "message": witness_sentence(witness),
    }


def _write_json(
    path: Path,
    run_dir: str,
    recorded_deadlock: bool,
    predictions: list[Prediction],
    files: dict[int, Path],
    fusion: list[FusionWitness] | None = None,
) -> None:
    document: dict[str, Any] = {
        "format": PREDICT_FORMAT,
        "run_dir": run_dir,
        "recorded_deadlock": recorded_deadlock,
        "configurations": [
            {
                "semantics": semantics_to_json(p.semantics),
                "deadlock": p.deadlock_possible,
                "states": p.states,
                "exhaustive": p.exhaustive,
                "max_deviations": p.max_deviations,
                "note": p.note,
                "witnesses": [
                    {
                        **witness_to_json(w),
                        "file": os.fspath(files[id(w)]) if id(w) in files else None,
                    }
                    for w in p.witnesses
                ],
            }
            for p in predictions
        ],
        "fusion": [_fusion_to_json(w) for w in fusion or []],
    }
    try:
        if path.parent != Path():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror}") from None
