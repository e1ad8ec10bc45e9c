"""The Report: the verdict and findings handed to every renderer."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from enum import Enum

from dl2.model.ops import Frame
from dl2.model.ops import Op
from dl2.model.stuck import RankStatus


class Verdict(str, Enum):
    """The one-word outcome of a run, with the ``dl2 run`` exit status it maps to."""

    OK = "ok"  #: the job completed and no communication defect was found
    DEADLOCK = "deadlock"  #: ranks wait on each other (or on exited ranks) forever
    #: the job was ended (dl2's hang timeout, a signal, its launcher) while ranks were
    #: blocked in communication waiting on a rank outside communication
    HANG = "hang"
    DEFECT = "defect"  #: a communication defect that did not (or not yet) hang the job
    #: the user stopped dl2 (Ctrl-C, SIGTERM) while no rank was stuck: findings up to then
    INTERRUPTED = "interrupted"
    #: no finding, but ranks without a trace or with unreadable parts: never "ok"
    INCOMPLETE = "incomplete"
    JOB_FAILED = "job-failed"  #: a rank failed on its own, no communication finding explains it

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self.value]


_EXIT_CODES = {
    "ok": 0,
    "job-failed": 1,
    "deadlock": 3,
    "hang": 3,
    "defect": 4,
    "incomplete": 5,
    "interrupted": 130,
}


class FindingKind(str, Enum):
    """What a finding says; each member documents when it is reported."""

    #: a closed set of blocked ranks, each waiting only on members or on exited ranks
    DEADLOCK = "deadlock"
    #: a blocked rank waits on a rank that has exited: it can never be released
    ORPHANED_WAIT = "orphaned-wait"
    #: ranks stayed blocked until the job was ended from outside, waiting on a rank
    #: outside communication (see :mod:`dl2.analysis.ending`)
    HANG = "hang"
    #: the i-th collective of a group differs between members (op, root, reduce op,
    #: dtype or element count)
    COLLECTIVE_MISMATCH = "collective-mismatch"
    #: a member never issued the i-th collective of a group that others issued
    COLLECTIVE_MISSING = "collective-missing"
    #: a send or receive that no operation on the peer matches
    P2P_UNMATCHED = "p2p-unmatched"
    #: a matched send and receive disagree on dtype or element count
    P2P_MISMATCH = "p2p-mismatch"
    #: new_group called with different arguments, or by only some ranks
    GROUP_MISMATCH = "group-mismatch"
    #: a collective called on a group the rank is not a member of (torch skips it)
    NONMEMBER_CALL = "nonmember-call"
    #: a rank others wait on is itself outside communication (compute, I/O, a lock)
    HANG_SUSPECT = "hang-suspect"
    #: a rank spins polling is_completed() on works that will not complete that way
    BUSY_POLL = "busy-poll"
    #: no deadlock in this run, but one under another backend configuration (eager
    #: buffer size, fusion grouping, wildcard match, completion order)
    POTENTIAL_DEADLOCK = "potential-deadlock"
    #: no send/recv size mismatch in this run, but one when wildcard receives of
    #: different sizes take their messages in another order
    POTENTIAL_MISMATCH = "potential-mismatch"
    #: an isend/irecv whose Work was never waited on (dropped, or outstanding when its
    #: rank ended): on gloo the transfer may never happen
    UNWAITED_WORK = "unwaited-work"
    #: a communication call raised an error of its own on its rank (an argument torch or
    #: the backend rejects: a negative tag, the rank itself as peer...), and nothing
    #: else explains the job's failure
    FAILED_CALL = "failed-call"


@dataclass(frozen=True)
class OpRef:
    """One operation of one rank, as shown in a finding.

    Attributes:
        rank: global rank that issued it.
        op: operation name ("send", "all_reduce", ..., "store_get" / "store_wait" /
            "store_multi_get" for a c10d store call); ``api`` the user-level call.
        group: process group name; ``seq`` its index on that group (see trace format).
            For a store call, the store and the prefixes in front of its keys
            ("tcp:29500|default_pg/"), ``detail`` its keys.
        peer: global peer rank of a P2P op (None for a wildcard recv), or the root.
        detail: short signature, e.g. "float32[1024] sum".
        file, line, function: the user's source location.
        wait_file, wait_line: where the rank waited on it (``work.wait()``), when that is
            another line than the one that issued it.
        called_from: the program's line that led to ``file:line`` when that is in
            another file (a helper module, a library of the user's own).
        inside: the installed package's line that ``file:line`` called into, when
            the communication is issued there.
    """

    rank: int
    op: str
    group: str
    seq: int | None = None
    peer: int | None = None
    api: str | None = None
    detail: str = ""
    file: str | None = None
    line: int | None = None
    function: str | None = None
    wait_file: str | None = None
    wait_line: int | None = None
    called_from: Frame | None = None
    inside: Frame | None = None

    @property
    def location(self) -> str:
        if self.file is None:
            return "?"
        if self.line is None:
            return _short_path(self.file)
        return f"{_short_path(self.file)}:{self.line}"

    @property
    def path(self) -> str:
        """:attr:`location` with the lines around it, outermost first
        (``train.py:24 → metrics.py:6``, ``train.py:17 → callbacks.py:6``)."""
        return self._lines(functions=False)

    @property
    def call_path(self) -> str:
        """:attr:`path` with each line's function (``train.py:24 in main →
        metrics.py:6 in compute``)."""
        return self._lines(functions=True)

    def _lines(self, functions: bool) -> str:
        def text(location: str, function: str | None) -> str:
            return f"{location} in {function}" if functions and function is not None else location

        parts = [text(self.location, self.function)]
        if self.called_from is not None:
            parts.insert(0, text(frame_location(self.called_from), self.called_from.function))
        if self.inside is not None:
            parts.append(text(frame_location(self.inside), self.inside.function))
        return " → ".join(parts)

    @property
    def where(self) -> str:
        """:attr:`path`, and where the rank waited on it if that is another line
        (``train.py:12, waited at line 20``; ``..., waited at loop.py:20`` in another
        file)."""
        if self.wait_line is None:
            return self.path
        return f"{self.path}, waited at {self.wait_location}"

    @property
    def wait_location(self) -> str:
        """Where the rank waited on it (``line N`` in the file that issued it, else
        ``file:line``), or "" if not at another line."""
        if self.wait_line is None:
            return ""
        if self.wait_file is None or self.wait_file == self.file:
            return f"line {self.wait_line}"
        return f"{_short_path(self.wait_file)}:{self.wait_line}"


def store_call(op: str, keys: str) -> str:
    """How a store op reads in a report: ``store.get('ready')``, ``store.wait(['a', 'b'])``
    (``op`` is ``store_get``..., ``keys`` the op's detail, its keys quoted)."""
    name = op.removeprefix("store_")
    return f"store.{name}([{keys}])" if name in ("wait", "multi_get") else f"store.{name}({keys})"


def frame_location(frame: Frame) -> str:
    """``file:line`` of a frame, with the file's base name."""
    return f"{_short_path(frame.file)}:{frame.line}"


def _short_path(path: str) -> str:
    """The file's base name: what a person scans for; the JSON keeps the full path."""
    return path.replace("\\", "/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem.

    Attributes:
        kind: what it is.
        ranks: the ranks involved, sorted.
        ops: the operations involved (for a deadlock, the cycle in order).
        message: one sentence a person can read.
        hint: a one-line fix hint.
        cycle: for a deadlock, the ranks of its shortest wait cycle in order.
        group: the process group concerned, if one.
        summary: the finding in a headline's few words, when it can head a report.
    """

    kind: FindingKind
    ranks: tuple[int, ...]
    ops: tuple[OpRef, ...]
    message: str
    hint: str = ""
    cycle: tuple[int, ...] = ()
    group: str | None = None
    summary: str = ""


@dataclass(frozen=True)
class RankState:
    """Where a rank stands at the end of the trace.

    Attributes:
        rank: global rank.
        status: where it stands (blocked, spinning, running, exited, failed, no-trace).
        op: the operation it is blocked in, if blocked.
        waits_on: ranks it waits on; ``any_of`` True for a wildcard (OR) wait.
    """

    rank: int
    status: RankStatus
    op: OpRef | None = None
    waits_on: tuple[int, ...] = ()
    any_of: bool = False


@dataclass(frozen=True)
class Report:
    """The result of analysing a session: what renderers show, never recompute.

    Attributes:
        verdict: the outcome.
        findings: problems, most important first.
        ranks: each rank's final state, by rank.
        world_size: ranks in the job.
        warnings: trace problems met on the way (truncated records, missing ranks).
        job: facts about the run from the launcher (command, exit status), no times.
        gaps: what the analysis could not read (ranks without a trace, corrupt records
            skipped); also among the warnings.
    """

    verdict: Verdict
    findings: tuple[Finding, ...]
    ranks: tuple[RankState, ...]
    world_size: int
    warnings: tuple[str, ...] = ()
    job: dict[str, object] = field(default_factory=dict)
    gaps: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


def op_ref(op: Op) -> OpRef:
    """The report's view of a model op: who, what, where in the user's code."""
    frame = op.frame
    peer = op.peer if op.kind == "p2p" else op.root
    if op.op == "recv" and op.peer is None:
        peer = op.src
    waited = op.wait_frame
    if (
        waited is not None
        and frame is not None
        and (waited.file, waited.line) == (frame.file, frame.line)
    ):
        waited = None
    return OpRef(
        rank=op.rank,
        op=op.op,
        group=op.gid,
        seq=op.seq,
        peer=peer,
        api=op.api,
        detail=op.signature,
        file=frame.file if frame else None,
        line=frame.line if frame else None,
        function=frame.function if frame else None,
        wait_file=waited.file if waited else None,
        wait_line=waited.line if waited else None,
        called_from=op.caller_frame,
        inside=op.package_frame,
    )
