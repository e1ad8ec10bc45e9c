"""What ``dl2 predict`` shows: its console text and its ``--json`` document.

:class:`PredictionRun` holds what the command found; :func:`prediction_text` lays it out
for a person (a table of configuration -> verdict, each potential deadlock's witness with
the command that replays it, the fusion passes that may diverge) and
:func:`prediction_document` as the versioned JSON document.  ``rich`` and the analysis
helpers the output needs are imported when rendering, so that importing this module
stays light.
"""

from __future__ import annotations

import io
import os
import shlex
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from dl2.render.console import text_console
from dl2.units import format_size

if TYPE_CHECKING:
    from rich.console import Console

    from dl2.analysis.prediction.fusion import FusionWitness
    from dl2.analysis.prediction.search import Prediction
    from dl2.analysis.prediction.witness import Witness

__all__ = ["PREDICT_FORMAT", "PredictionRun", "prediction_document", "prediction_text"]

#: Version of the ``--json`` document.
PREDICT_FORMAT = 1
_WIDTH = 100


@dataclass(frozen=True)
class PredictionRun:
    """What ``dl2 predict`` found for one run directory.

    Attributes:
        run_dir: the run directory, as given.
        ranks, ops: how many ranks have a trace, and their ops.
        recorded_deadlock: the recorded run itself deadlocked (nothing was predicted).
        predictions: one per configuration, in the order asked.
        witness_files: (prediction index, witness index) -> the file the witness was
            written to.
        fusion: the fusion passes whose buckets may differ between ranks.
        fusion_assumed: ``--fusion``: every pass was assumed to fuse in ready order.
    """

    run_dir: str
    ranks: int
    ops: int
    recorded_deadlock: bool
    predictions: Sequence[Prediction]
    witness_files: Mapping[tuple[int, int], Path]
    fusion: Sequence[FusionWitness]
    fusion_assumed: bool


# -- the console text ------------------------------------------------------------------------


def prediction_text(run: PredictionRun) -> str:
    """The console report of ``dl2 predict``: 100 columns, no colours."""
    buffer = io.StringIO()
    console = text_console(buffer, width=_WIDTH, soft_wrap=True)
    console.print(f"dl2 predict: {run.run_dir} ({run.ranks} ranks, {run.ops:,} ops)")
    if run.recorded_deadlock:
        analyze = shlex.join(["dl2", "analyze", run.run_dir])
        console.print(f"The recorded run itself deadlocked: see `{analyze}`.")
    else:
        _print_predictions(console, run)
        _print_fusion(console, run.fusion, run.fusion_assumed)
    return buffer.getvalue()


def _verdict_text(prediction: Prediction) -> str:
    if prediction.deadlock_possible:
        count = len(prediction.witnesses)
        return f"deadlock ({count} way{'s' if count > 1 else ''})"
    if prediction.note and prediction.states == 0:
        return "not predicted"
    if not prediction.exhaustive:
        return "none found (search cut)"
    return "ok"


def _print_predictions(console: Console, run: PredictionRun) -> None:
    from rich import box
    from rich.table import Table

    predictions = run.predictions
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
    for i, p in enumerate(predictions):
        for j, witness in enumerate(p.witnesses):
            number += 1
            console.print()
            path = run.witness_files.get((i, j))
            _print_witness(console, number, witness, path, run.run_dir)


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


def _print_fusion(console: Console, witnesses: Sequence[FusionWitness], assumed: bool) -> None:
    from dl2.analysis.prediction.fusion import witness_sentence

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


# -- the JSON document -----------------------------------------------------------------------


def prediction_document(run: PredictionRun) -> dict[str, Any]:
    """The ``--json`` document: plain data (dicts, lists, str, int, bool, None)."""
    from dl2.analysis.prediction.witness import semantics_to_json
    from dl2.analysis.prediction.witness import witness_to_json

    files = run.witness_files
    return {
        "format": PREDICT_FORMAT,
        "run_dir": run.run_dir,
        "recorded_deadlock": run.recorded_deadlock,
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
                        "file": os.fspath(files[(i, j)]) if (i, j) in files else None,
                    }
                    for j, w in enumerate(p.witnesses)
                ],
            }
            for i, p in enumerate(run.predictions)
        ],
        "fusion": [_fusion_to_json(w) for w in run.fusion],
    }


def _fusion_to_json(witness: FusionWitness) -> dict[str, Any]:
    from dl2.analysis.describe import where
    from dl2.analysis.prediction.fusion import witness_sentence

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
