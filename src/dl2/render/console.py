"""The console report: what a person reads first, in about ten seconds.

Top to bottom: the verdict; for a deadlock, its wait cycle on one line; a table of
where each rank stands; the other findings, grouped by kind; one fix hint per kind of
problem; then warnings.  Long reports stay short: runs of idle ranks are folded
("4-7  exited"), identical operations of several ranks share a row, and each list is
capped with "... and N more".

``rich`` is imported lazily, here only, so that ``import dl2.render`` stays light.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import ClassVar

from dl2.errors import ConfigError
from dl2.model.stuck import RankStatus
from dl2.ranks import rank_runs
from dl2.render.base import Renderer
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.report import OpRef
from dl2.report import RankState
from dl2.report import Report
from dl2.report import Verdict
from dl2.report import store_call
from dl2.trace.schema import NO_RANK

if TYPE_CHECKING:
    from rich.console import Console
    from rich.console import RenderableType

DEFAULT_WIDTH = 100

# Caps that keep a large job's report readable; what is left out is counted.
MAX_RANK_ROWS = 32
MAX_FINDINGS_PER_KIND = 5
MAX_OP_ROWS = 8
MAX_WARNINGS = 10

SEND_OPS = frozenset({"send", "isend"})
RECV_OPS = frozenset({"recv", "irecv"})
_COLLECTIVE_KINDS = frozenset({FindingKind.COLLECTIVE_MISMATCH, FindingKind.COLLECTIVE_MISSING})

_VERDICT_STYLE = {
    Verdict.OK: "bold green",
    Verdict.DEADLOCK: "bold red",
    Verdict.DEFECT: "bold yellow",
    Verdict.JOB_FAILED: "bold magenta",
    Verdict.HANG: "bold red",
    Verdict.INTERRUPTED: "bold magenta",
    Verdict.INCOMPLETE: "bold yellow",
}
_STATUS_STYLE = {
    RankStatus.BLOCKED: "red",
    RankStatus.FAILED: "red",
    RankStatus.KILLED: "red",
    RankStatus.NO_TRACE: "yellow",
    RankStatus.RUNNING: "green",
}

# A (text, style) pair; sequences of them build a styled line without importing rich.
Segment = tuple[str, str]


class ConsoleRenderer(Renderer):
    """The human-readable report, drawn with rich.

    Args:
        color: True always colours, False never does, None (the default) colours only
            when :func:`~dl2.render.base.write_report` writes to a terminal.
        width: columns to lay the report out in; None means 100, or the terminal's
            width when writing to a terminal.
    """

    name: ClassVar[str] = "text"
    output_file_extension: ClassVar[str] = "txt"

    def __init__(self, *, color: bool | None = None, width: int | None = None) -> None:
        self.color = color
        self.width = width

    def render(self, report: Report) -> str:
        return _render(report, width=self.width or DEFAULT_WIDTH, color=bool(self.color))

    def render_for(self, report: Report, *, tty: bool) -> str:
        color = tty if self.color is None else self.color
        width = self.width
        if width is None:
            width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns if tty else DEFAULT_WIDTH
        return _render(report, width=width, color=color)


# -- plain-text pieces (no rich), shared with other renderers and tests -------------------


def op_label(op: OpRef) -> str:
    """A short name for an operation: ``send→1``, ``recv←any``, ``all_reduce(group 0 #3)``.

    P2P operations point at their peer (``any`` for a wildcard receive); collectives
    name their group, their index on it, and their root if they have one.
    """
    if op.op.startswith("store_"):
        return store_call(op.op, op.detail)
    # (a P2P op on another group than the default one names it: a send and a receive
    # on two groups never match, which "send→1 ⇢ recv←0" alone would hide)
    on = f" (group {op.group})" if op.group not in ("0", "-", None) else ""
    if op.op in SEND_OPS:
        return f"{op.op}→{peer_label(op.peer)}{on}"
    if op.op in RECV_OPS:
        return f"{op.op}←{peer_label(op.peer)}{on}"
    where = f"group {op.group}" if op.seq is None else f"group {op.group} #{op.seq}"
    if op.peer is not None:
        where += f", root {peer_label(op.peer)}"
    return f"{op.op}({where})"


def cycle_line(finding: Finding, states: Iterable[RankState] = ()) -> str:
    """A deadlock's wait cycle on one line.

    ``rank 0 send→1 (train.py:42) ⇢ rank 1 send→0 (train.py:57) ⇢ rank 0``.  Each
    rank's operation comes from the finding's ops, else from its state in ``states``.
    Returns "" when the finding has no cycle.
    """
    return "".join(text for text, _ in _cycle_segments(finding, _by_rank(states)))


def rank_list(ranks: Iterable[int]) -> str:
    """Sorted ranks, runs of three or more folded: ``0-3,5,7``."""
    return ",".join(rank_runs(ranks))


def headline(report: Report) -> str:
    """The verdict as one sentence, e.g. ``DEADLOCK: 2 ranks wait on each other forever``."""
    findings = report.findings
    if report.verdict is Verdict.OK:
        if report.world_size == 0:
            return "OK: no communication defect found (no ranks traced)"
        return f"OK: no communication defect found in {_count(report.world_size, 'rank')}"
    if report.verdict is Verdict.DEFECT:
        if not findings:
            return "DEFECT: a communication defect was found; the job did not hang"
        failed = {s.rank for s in report.ranks if s.status in _FAILED}
        after = _after_effects(findings, failed)
        causes = [f for f in findings if f not in after]
        kinds = ", ".join(dict.fromkeys(f.kind.value for f in causes))
        text = f"DEFECT: {_count(len(causes), 'communication defect')}, no deadlock ({kinds})"
        if after:
            follow = ", ".join(dict.fromkeys(f.kind.value for f in after))
            verb = "follows" if len(after) == 1 else "follow"
            them = "it" if len(causes) == 1 else "them"
            text += f"; {_count(len(after), 'finding')} {verb} from {them} ({follow})"
        return text
    if report.verdict is Verdict.JOB_FAILED:
        killed = [s.rank for s in report.ranks if s.status is RankStatus.KILLED]
        # the ranks whose failing op the findings trace to a rank that is gone, and those
        # a finding shows waiting on a killed rank (its launcher ended them after it:
        # mp.spawn and torchrun stop the other ranks once one is gone)
        orphaned = {f.ops[0].rank for f in findings if f.kind is FindingKind.ORPHANED_WAIT}
        gone = set(killed)
        orphaned |= {op.rank for f in findings if gone.intersection(f.ranks) for op in f.ops}
        on_their_own = [
            s.rank for s in report.ranks if s.status is RankStatus.FAILED and s.rank not in orphaned
        ]
        if killed and not on_their_own:
            who = ", ".join(rank_runs(killed))
            verb = "was" if len(killed) == 1 else "were"
            return (
                f"JOB FAILED: rank{'s' if len(killed) > 1 else ''} {who} {verb} killed by a "
                "signal (the OOM killer, a scheduler, a kill, or the rank's own code); the "
                "others failed because of it"
            )
        left = _left_before(findings, on_their_own)
        if left:
            return f"JOB FAILED: {left}; the others failed because of it"
        return "JOB FAILED: the job failed for a reason other than communication"
    if report.verdict is Verdict.HANG:
        hang = next((f for f in findings if f.kind is FindingKind.HANG), None)
        if hang is None or not hang.summary:
            kinds = ", ".join(dict.fromkeys(f.kind.value for f in findings))
            cause = f" ({kinds})" if kinds else ""
            return f"HANG: ranks stayed blocked in communication until the job was ended{cause}"
        return f"HANG: {hang.summary}"
    if report.verdict is Verdict.INTERRUPTED:
        found = f"; {_count(len(findings), 'finding')} up to then" if findings else ""
        return (
            "INTERRUPTED: the job was stopped from outside (the user, a signal, its "
            f"launcher) while no rank was stuck{found}"
        )
    if report.verdict is Verdict.INCOMPLETE:
        missing = "; ".join(report.gaps) or "part of the traces could not be read"
        return f"INCOMPLETE: no defect found in what was read, but {missing}"
    return "DEADLOCK: " + _deadlock_summary(findings)


#: findings that a collective mismatch brings about later on its group: gloo aborts
#: the mismatched ranks, and the others wait on them or miss their later collectives
_AFTER_MISMATCH = (FindingKind.ORPHANED_WAIT, FindingKind.COLLECTIVE_MISSING)


_FAILED = (RankStatus.FAILED, RankStatus.KILLED)


def _after_effects(findings: Sequence[Finding], failed: Collection[int] = ()) -> list[Finding]:
    """The findings that follow from a mismatch: of a collective mismatch, those on its
    group, at a later position, among its ranks; of a send/receive size mismatch (gloo
    aborts the receiver) or a collective mismatch whose ranks failed (``failed``), those
    where a rank of it is the one gone or missing, on any group."""
    mismatches = [
        (f.group, f.ops[0].seq, set(f.ranks))
        for f in findings
        if f.kind is FindingKind.COLLECTIVE_MISMATCH and f.ops and f.ops[0].seq is not None
    ]
    aborted = {r for f in findings if f.kind is FindingKind.P2P_MISMATCH for r in f.ranks}
    aborted |= {
        r for f in findings if f.kind is FindingKind.COLLECTIVE_MISMATCH for r in f.ranks
    } & set(failed)
    after = []
    for finding in findings:
        if finding.kind not in _AFTER_MISMATCH or not finding.ops:
            continue
        seqs = [op.seq for op in finding.ops]
        absent = set(finding.ranks) - {op.rank for op in finding.ops}
        if any(
            finding.group == group
            and all(seq is not None and seq > at for seq in seqs)
            and set(finding.ranks) <= ranks
            for group, at, ranks in mismatches
        ) or (absent and absent <= aborted):
            after.append(finding)
    return after


def _left_before(findings: Sequence[Finding], failed: Sequence[int]) -> str:
    """``rank 1 ended before all_reduce #4 of group 0 that ranks 0,2 issued (a.py:14)``:
    ranks that failed on their own (a crash, a kill dl2 could not see, ``os._exit``)
    before a collective the others issued; "" when no such finding names them."""
    for finding in findings:
        if finding.kind is not FindingKind.COLLECTIVE_MISSING or not finding.ops:
            continue
        issued = {o.rank for o in finding.ops}
        culprits = [r for r in failed if r in finding.ranks and r not in issued]
        if not culprits:
            continue
        op = finding.ops[0]
        who = rank_list(culprits)
        seq = f" #{op.seq}" if op.seq is not None else ""
        at = f" at {op.location}" if op.file else ""
        issuers = rank_list(issued)
        return (
            f"rank{'s' if len(culprits) > 1 else ''} {who} ended before {op.op}{seq} of "
            f"group {op.group}, which rank{'s' if len(issued) > 1 else ''} {issuers} "
            f"issued{at}"
        )
    return ""


def _deadlock_summary(findings: Sequence[Finding]) -> str:
    deadlocks = [f for f in findings if f.kind is FindingKind.DEADLOCK]
    stuck = sorted({r for f in deadlocks for r in f.ranks})
    if any(f.cycle for f in deadlocks):
        if len(stuck) == 1:
            return f"rank {stuck[0]} waits on itself forever"
        return f"{len(stuck)} ranks wait on each other forever"
    orphans = {r for f in findings if f.kind is FindingKind.ORPHANED_WAIT for r in f.ranks}
    if not orphans and stuck:  # no cycle and no rank that left: e.g. a peer that is no rank
        if len(stuck) == 1:
            return f"rank {stuck[0]} can never be released"
        return f"{len(stuck)} ranks can never be released"
    orphaned = sorted(stuck or orphans)
    if len(orphaned) == 1:
        return f"rank {orphaned[0]} waits forever on a rank that exited"
    if orphaned:
        return f"{len(orphaned)} ranks wait forever on ranks that exited"
    return "ranks wait on each other forever"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def peer_label(peer: int | None) -> str:
    """A P2P op's peer as its arrow shows it: ``any`` for a wildcard receive, ``(no
    rank)`` for a peer outside its group (``NO_RANK``), else the global rank."""
    if peer is None:
        return "any"
    return "(no rank)" if peer == NO_RANK else str(peer)


def _by_rank(states: Iterable[RankState]) -> dict[int, RankState]:
    return {s.rank: s for s in states}


def _cycle_segments(finding: Finding, states: Mapping[int, RankState]) -> list[Segment]:
    if not finding.cycle:
        return []
    ops: dict[int, OpRef] = {}
    for first in finding.ops:
        ops.setdefault(first.rank, first)
    segments: list[Segment] = []
    for rank in finding.cycle:
        op = ops.get(rank)
        if op is None and rank in states:
            op = states[rank].op
        segments.append((f"rank {rank}", "bold"))
        if op is not None:
            segments.append((" " + op_label(op), "cyan"))
            if op.location != "?":
                segments.append((f" ({op.where})", "dim"))
        segments.append((" ⇢ ", "red"))
    segments.append((f"rank {finding.cycle[0]}", "bold"))
    return segments


def _waits_text(state: RankState) -> str:
    if not state.waits_on:
        return ""
    ranks = rank_list(state.waits_on)
    return f"any of {ranks}" if state.any_of and len(state.waits_on) > 1 else ranks


def _call_text(op: OpRef) -> str:
    label = op_label(op)
    if op.api in (None, op.op) or op.op.startswith("store_"):
        return label
    return f"{label} via {op.api}"


def _source_cell(op: OpRef) -> str:
    """The rank table's source: the call's path, and on a line of its own where the
    rank waited on it."""
    if op.wait_line is None:
        return op.path
    return f"{op.path}\nwaited at {op.wait_location}"


def _where_text(op: OpRef) -> str:
    text = op.call_path
    if op.wait_line is not None:
        text += f", waited at {op.wait_location}"
    return text


def _job_text(job: Mapping[str, object], verdict: Verdict) -> str:
    parts = []
    for key in sorted(job, key=str):
        value = job[key]
        if isinstance(value, (list, tuple)):
            value = " ".join(str(v) for v in value)
        if key == "ended" and value == "deadlock" and verdict is not Verdict.DEADLOCK:
            # dl2 stopped the job on ranks stuck for good, on ranks that had failed (the
            # verdict says which): no "deadlock" under a headline that says none
            value = "stopped by dl2 (ranks blocked for good)"
        parts.append(f"{key}: {value}")
    return "; ".join(parts)


def _rank_rows(states: Sequence[RankState]) -> list[tuple[list[int], RankState]]:
    """Rows of the rank table: consecutive idle ranks of one status share a row."""
    rows: list[tuple[list[int], RankState]] = []
    for state in sorted(states, key=lambda s: s.rank):
        idle = state.op is None and not state.waits_on
        if rows and idle:
            ranks, first = rows[-1]
            if (
                first.op is None
                and not first.waits_on
                and first.status == state.status
                and ranks[-1] == state.rank - 1
            ):
                ranks.append(state.rank)
                continue
        rows.append(([state.rank], state))
    return rows


def merged_ops(ops: Sequence[OpRef]) -> list[tuple[list[int], OpRef]]:
    """Operations that are the same but for their rank merged into one (ranks, op) row,
    in order of first appearance (the console's and the HTML page's rows)."""
    rows: dict[tuple[object, ...], tuple[list[int], OpRef]] = {}
    for op in ops:
        key = (
            op.op,
            op.api,
            op.group,
            op.seq,
            op.peer,
            op.detail,
            op.file,
            op.line,
            op.function,
            op.wait_line,
            op.called_from,
            op.inside,
        )
        if key in rows:
            rows[key][0].append(op.rank)
        else:
            rows[key] = ([op.rank], op)
    return list(rows.values())


def _op_rows(finding: Finding) -> list[tuple[list[int], OpRef | None]]:
    """A finding's operations, identical ones of several ranks merged, in rank order.

    For a collective finding, a member with no operation gets a row of its own (None).
    """
    out: list[tuple[list[int], OpRef | None]] = list(merged_ops(finding.ops))
    if finding.kind in _COLLECTIVE_KINDS:
        issued = {op.rank for op in finding.ops}
        out.extend(([r], None) for r in finding.ranks if r not in issued)
    return sorted(out, key=lambda row: min(row[0]))


# -- drawing with rich -------------------------------------------------------------------


def text_console(
    buffer: io.StringIO, *, width: int, color: bool = False, soft_wrap: bool = False
) -> Console:
    """A rich Console that draws into ``buffer``: ``width`` columns, text printed as is
    (no markup, emoji or highlighting), ANSI colours only if ``color``."""
    try:
        from rich.console import Console
    except ImportError as err:  # pragma: no cover - rich is a dependency of dl2
        raise ConfigError("the text report needs the 'rich' package: pip install rich") from err

    return Console(
        file=buffer,
        width=width,
        force_terminal=color,
        force_jupyter=False,
        force_interactive=False,
        color_system="standard" if color else None,
        no_color=not color,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
        soft_wrap=soft_wrap,
    )


def _render(report: Report, *, width: int, color: bool) -> str:
    buffer = io.StringIO()
    console = text_console(buffer, width=width, color=color)
    _draw(console, report)
    # Table cells are padded to their column; trailing blanks only make goldens fragile.
    lines = buffer.getvalue().splitlines()
    return "".join(line.rstrip(" ") + "\n" for line in lines)


def _draw(console: Console, report: Report) -> None:
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text

    style = _VERDICT_STYLE[report.verdict]
    console.print(Panel(Text(headline(report), style=style), expand=False, border_style=style))
    if report.job:
        console.print(Text(_job_text(report.job, report.verdict), style="dim"))

    states = _by_rank(report.ranks)
    cycles = [f for f in report.findings if f.kind is FindingKind.DEADLOCK and f.cycle]
    for finding in cycles[:MAX_FINDINGS_PER_KIND]:
        console.print()
        _draw_cycle(console, finding, states)
    if len(cycles) > MAX_FINDINGS_PER_KIND:
        console.print(_more(len(cycles) - MAX_FINDINGS_PER_KIND, "deadlock"))

    if report.ranks:
        console.print()
        console.print(_rank_table(report.ranks))

    others = [f for f in report.findings if not (f.kind is FindingKind.DEADLOCK and f.cycle)]
    if others:
        console.print()
        console.print(Text("Findings", style="bold"))
        for kind, group in _by_kind(others).items():
            _draw_kind(console, kind, group)

    hints = _hints(report.findings)
    if hints:
        console.print()
        console.print(Text("Fix", style="bold"))
        for kind, hint, n in hints:
            scope = kind.value if n == 1 else f"{kind.value} ({_count(n, 'finding')})"
            _print_item(console, "•", Text.assemble((scope, "bold"), ": ", hint))

    if report.warnings:
        console.print()
        console.print(Text("Warnings", style="bold dim"))
        for warning in report.warnings[:MAX_WARNINGS]:
            _print_item(console, "!", Text(warning, style="dim"))
        if len(report.warnings) > MAX_WARNINGS:
            more = _more(len(report.warnings) - MAX_WARNINGS, "warning")
            console.print(Padding(more, (0, 0, 0, 4)))


def _draw_cycle(console: Console, finding: Finding, states: Mapping[int, RankState]) -> None:
    from rich.padding import Padding
    from rich.text import Text

    # soft_wrap: the cycle stays on one line however long, so it can be copied and grepped.
    console.print(Text.assemble(*_cycle_segments(finding, states)), soft_wrap=True)
    if finding.message:
        console.print(Padding(Text(finding.message), (0, 0, 0, 2)))
    behind = sorted(set(finding.ranks) - set(finding.cycle))
    if behind:
        noun = "rank" if len(behind) == 1 else "ranks"
        text = Text(f"also stuck behind it: {noun} {rank_list(behind)}", style="dim")
        console.print(Padding(text, (0, 0, 0, 2)))


def _rank_table(states: Sequence[RankState]) -> RenderableType:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    rows = _rank_rows(states)
    cells: list[list[Text]] = []
    for ranks, state in rows[:MAX_RANK_ROWS]:
        op = state.op
        cells.append(
            [
                Text(rank_list(ranks), style="bold"),
                Text(str(state.status), style=_STATUS_STYLE.get(state.status, "dim")),
                Text("" if op is None else _call_text(op), style="cyan", overflow="fold"),
                Text("" if op is None else op.detail, overflow="fold"),
                # folded, not cut: the line number at its end must show
                Text("" if op is None else _source_cell(op), style="dim", overflow="fold"),
                Text(_waits_text(state)),
            ]
        )
    headers = ["rank", "status", "stuck in", "signature", "source", "waits on"]
    # Columns with nothing in them (an OK run has no "stuck in") are left out.
    keep = [i for i in range(len(headers)) if i < 2 or any(row[i].plain for row in cells)]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    # "waits on" keeps its ranks on one line, the source its file:line (when up to 40
    # characters; a longer one folds): the other columns wrap first
    short = all(len(line) <= 40 for row in cells for line in row[4].plain.splitlines())
    # a longer source wraps between its parts ("train.py:14 → p2p.py:5"), each whole
    word = min(40, max((len(w) for row in cells for w in row[4].plain.split()), default=0))
    for i in keep:
        table.add_column(
            headers[i],
            no_wrap=i < 2 or i == 5 or (i == 4 and short),
            min_width=word if i == 4 and not short else None,
        )
    for row in cells:
        table.add_row(*(row[i] for i in keep))
    if len(rows) > MAX_RANK_ROWS:
        rest = [s for _, s in rows[MAX_RANK_ROWS:]]
        n = sum(len(ranks) for ranks, _ in rows[MAX_RANK_ROWS:])
        blocked = sum(1 for s in rest if s.status == RankStatus.BLOCKED)
        note = f" ({blocked} blocked)" if blocked else ""
        table.add_row(Text(f"... and {_count(n, 'more rank')}{note}", style="dim"))
    return table


def _by_kind(findings: Sequence[Finding]) -> dict[FindingKind, list[Finding]]:
    groups: dict[FindingKind, list[Finding]] = {}
    for finding in findings:
        groups.setdefault(finding.kind, []).append(finding)
    return groups


def _draw_kind(console: Console, kind: FindingKind, findings: Sequence[Finding]) -> None:
    from rich.padding import Padding
    from rich.text import Text

    title = kind.value if len(findings) == 1 else f"{kind.value} ({len(findings)})"
    console.print(Padding(Text(title, style="bold yellow"), (0, 0, 0, 2)))
    for finding in findings[:MAX_FINDINGS_PER_KIND]:
        _draw_finding(console, finding)
    if len(findings) > MAX_FINDINGS_PER_KIND:
        more = _more(len(findings) - MAX_FINDINGS_PER_KIND, f"{kind.value} finding")
        console.print(Padding(more, (0, 0, 0, 4)))


def _draw_finding(console: Console, finding: Finding) -> None:
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text

    scope = []
    if finding.ranks:
        scope.append(f"{'rank' if len(finding.ranks) == 1 else 'ranks'} {rank_list(finding.ranks)}")
    if finding.group is not None:
        scope.append(f"group {finding.group}")
    body: list[RenderableType] = []
    message = Text(finding.message)
    if scope:
        message = Text.assemble(("[" + ", ".join(scope) + "] ", "dim"), message)
    body.append(message)

    rows = _op_rows(finding)
    if rows:
        if finding.kind in _COLLECTIVE_KINDS:
            body.append(Text("first divergence:", style="dim"))
        body.append(Padding(_op_grid(rows), (0, 0, 0, 2)))
    _print_item(console, "•", Group(*body), indent=4)


def _op_grid(rows: Sequence[tuple[list[int], OpRef | None]]) -> RenderableType:
    """Operations in aligned columns: who, call, signature, where."""
    from rich.table import Table
    from rich.text import Text

    cells: list[list[Text]] = []
    for ranks, op in rows[:MAX_OP_ROWS]:
        who = Text(f"{'rank' if len(ranks) == 1 else 'ranks'} {rank_list(ranks)}", "bold")
        if op is None:
            cells.append([who, Text("(never called)", "red"), Text(""), Text("")])
        else:
            # folded, never cut with "…": a long file name keeps its line number
            call = Text(_call_text(op), "cyan", overflow="fold")
            where = Text(_where_text(op), "dim", overflow="fold")
            cells.append([who, call, Text(op.detail, overflow="fold"), where])
    keep = [i for i in range(4) if any(row[i].plain for row in cells)]
    grid = Table.grid(padding=(0, 2))
    for _ in keep:
        grid.add_column()
    for row in cells:
        grid.add_row(*(row[i] for i in keep))
    if len(rows) > MAX_OP_ROWS:
        grid.add_row(_more(len(rows) - MAX_OP_ROWS, "operation"))
    return grid


def _hints(findings: Sequence[Finding]) -> list[tuple[FindingKind, str, int]]:
    """Each distinct (kind, hint) once, in the order first met, with how many share it."""
    counts: dict[tuple[FindingKind, str], int] = {}
    for finding in findings:
        if finding.hint:
            key = (finding.kind, finding.hint)
            counts[key] = counts.get(key, 0) + 1
    return [(kind, hint, n) for (kind, hint), n in counts.items()]


def _print_item(console: Console, bullet: str, body: RenderableType, indent: int = 2) -> None:
    """A bulleted item whose wrapped lines stay indented under its first."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1, 0, 0), pad_edge=False)
    grid.add_column(width=indent + len(bullet), justify="right", no_wrap=True)
    grid.add_column()
    grid.add_row(bullet, body)
    console.print(grid)


def _more(n: int, noun: str) -> RenderableType:
    from rich.text import Text

    return Text(f"... and {n} more {noun}{'' if n == 1 else 's'}", style="dim")
