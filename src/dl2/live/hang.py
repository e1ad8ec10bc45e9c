"""Hangs the live monitor cannot prove: the hang timeout's stuck test and hang suspects.

A rank others wait on that is itself outside communication (computing, in I/O, on a
lock) is a *hang suspect*: reported once, with its stack, after ``suspect_after``
seconds; it never produces a verdict and never stops the job.  The hang timeout stops
a job only when every live rank has sat in communication with no progress for that
long and no deadlock could be proven (a hang dl2 cannot explain).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Set

from dl2.analysis.deadlock import hang_suspect_findings
from dl2.analysis.deadlock import suspect_stack
from dl2.live.proof import Snapshot
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.stuck import RankStatus
from dl2.report import Finding
from dl2.trace.session import ALIVE

#: stack frames printed with a hang suspect
SUSPECT_STACK_FRAMES = 8


def all_stuck(
    snapshot: Snapshot, states: Mapping[int, str], in_rendezvous: Set[int] = frozenset()
) -> bool:
    """True if every live traced rank is inside a recorded blocking call.

    For the hang timeout every such rank counts as stuck: blocked, spinning, or matched
    by the model but never returning (gloo may have paired it otherwise, e.g. groups
    created in different orders), unless a thread of the user's own code is alive outside
    communication (it may yet release the blocked one).  A rank known to be alive (dl2
    launched it) that has no trace yet is in its own code before ``init_process_group``
    (a slow start, a download): not stuck, unless it is ``in_rendezvous`` (it entered
    torch's rendezvous, where it waits for the others).  One that is not known (another
    launcher's) is left out.
    """
    timelines = snapshot.graph.timelines
    for rank, node in snapshot.wfg.nodes.items():
        state = states.get(rank)  # None: not known
        if state not in (None, ALIVE):
            continue  # ended
        if node.status is RankStatus.NO_TRACE:
            if state == ALIVE and rank not in in_rendezvous:
                return False
            continue
        timeline = timelines.get(rank)
        if timeline is None or timeline.blocked is None:
            return False
        if timeline.threads and _threads_inside(snapshot, rank) < 1 + timeline.threads:
            # a thread of the user's code outside communication (an uploader, an
            # evaluator) may release the blocked one, after any time: a hang suspect,
            # never stopped
            return False
    return True


def _threads_inside(snapshot: Snapshot, rank: int) -> int:
    """How many of the rank's threads are inside a communication call or wait."""
    return len({op.tid for op in snapshot.graph.open_ops(rank)})


class HangSuspects:
    """Prints each hang suspect once, until it progresses again.

    Args:
        notice: prints a one-line status message.
    """

    def __init__(self, notice: Callable[[str], None]) -> None:
        self.notice = notice
        self._reported: dict[int, int] = {}  # rank -> its progress count when reported

    def report(
        self,
        snapshot: Snapshot,
        quiet: Mapping[int, float],
        progress: Mapping[int, int],
        suspect_after: float,
    ) -> None:
        """Print the snapshot's suspects not printed yet (``quiet``: seconds per rank)."""
        findings = hang_suspect_findings(snapshot.graph, snapshot.wfg, quiet, suspect_after)
        for finding in findings:
            rank = finding.ranks[0]
            if rank in self._reported:
                continue
            self._reported[rank] = progress.get(rank, 0)
            self.notice(suspect_text(finding, snapshot.graph, rank))

    def forget(self, ranks: Iterable[int]) -> None:
        """Ranks that progressed: suspects again once quiet again."""
        for rank in ranks:
            self._reported.pop(rank, None)


def suspect_text(finding: Finding, graph: ExecutionGraph, rank: int) -> str:
    """The hang suspect notice: the finding's message and the rank's innermost frames."""
    lines = [f"hang suspect (not a deadlock): {finding.message}"]
    stack = suspect_stack(graph, rank)
    if stack:
        lines.append(f"  rank {rank}'s stack, innermost first:")
        for frame in stack[:SUSPECT_STACK_FRAMES]:
            lines.append(f"    {frame.file}:{frame.line} in {frame.function}")
    return "\n".join(lines)
