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
import sys
from pathlib import Path

from dl2.analysis.prediction.fusion import fusion_witnesses
from dl2.analysis.prediction.program import build_program
from dl2.analysis.prediction.search import DEFAULT_MAX_DEVIATIONS
from dl2.analysis.prediction.search import DEFAULT_MAX_STATES
from dl2.analysis.prediction.search import DEFAULT_MAX_WITNESSES
from dl2.analysis.prediction.search import Prediction
from dl2.analysis.prediction.search import Predictor
from dl2.analysis.prediction.semantics import Semantics
from dl2.analysis.prediction.semantics import parse_semantics
from dl2.analysis.prediction.semantics import recorded_semantics
from dl2.analysis.prediction.witness import Witness
from dl2.analysis.prediction.witness import witness_to_json
from dl2.errors import ConfigError
from dl2.model.execution_graph import build_execution_graph
from dl2.model.wait_for import build_wait_for_graph
from dl2.render.prediction import PredictionRun
from dl2.render.prediction import prediction_document
from dl2.render.prediction import prediction_text
from dl2.report import Verdict
from dl2.trace.session import load_session
from dl2.units import parse_size


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
        session.require_whole_history("dl2 predict")
        # what the prediction cannot see: a rank without a trace, a trace cut short
        gaps = [*session.warnings]
        missing = session.missing_ranks()
        if missing:
            gaps.append(
                f"no trace from rank(s) {', '.join(map(str, missing))}: the prediction "
                "covers only the ranks with traces"
            )
        for warning in gaps:
            print(f"dl2: warning: {warning}", file=sys.stderr)
        partial = bool(missing) or any(t.truncated for t in session.traces.values())
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
        run = PredictionRun(
            run_dir=args.run_dir,
            ranks=len(graph.timelines),
            ops=sum(len(t.ops) for t in graph.timelines.values()),
            recorded_deadlock=recorded_deadlock,
            predictions=predictions,
            witness_files=_write_witnesses(predictions, witness_dir),
            fusion=[] if recorded_deadlock else fusion_witnesses(graph, assume=args.fusion),
            fusion_assumed=args.fusion,
        )
        sys.stdout.write(prediction_text(run))
        sys.stdout.flush()
        if args.json:
            _write_json(Path(args.json), prediction_document(run))
        if recorded_deadlock:
            return Verdict.DEADLOCK.exit_code
        if any(p.deadlock_possible for p in predictions) or run.fusion:
            return Verdict.DEFECT.exit_code
        if partial or not all(p.exhaustive for p in predictions):
            # nothing found in what was there, or in what the search could explore before
            # its bound cut it: not a clean bill
            return Verdict.INCOMPLETE.exit_code
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


def _witness_name(witness: Witness, number: int) -> str:
    semantics = witness.semantics
    serial = "" if semantics.independent_groups else "-serial"
    return f"witness-{semantics.name}-{semantics.eager_bytes}{serial}-{number}.json"


def _write_witnesses(predictions: list[Prediction], directory: Path) -> dict[tuple[int, int], Path]:
    """Write every witness; returns (prediction index, witness index) -> its file."""
    files: dict[tuple[int, int], Path] = {}
    if not any(p.witnesses for p in predictions):
        return files
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for i, prediction in enumerate(predictions):
            for j, witness in enumerate(prediction.witnesses):
                path = directory / _witness_name(witness, j + 1)
                text = json.dumps(witness_to_json(witness), indent=2, sort_keys=True)
                path.write_text(text + "\n")
                files[(i, j)] = path
    except OSError as err:
        raise ConfigError(f"cannot write witness files to {directory}: {err.strerror}") from None
    return files


def _write_json(path: Path, document: dict[str, object]) -> None:
    try:
        if path.parent != Path():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror}") from None
