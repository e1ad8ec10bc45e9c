"""The live monitor's side of a multi-node job: what it pushes, pulls and follows.

:class:`NodeLink` drives :class:`dl2.live.shared.SharedState` from the monitor's poll:
it connects in the background, mirrors this node's records and rank states, pulls the
other nodes', tells whether this monitor reports (the one of rank 0's node does) and
follows the verdict another node's monitor published.  Without a store (one node)
every method is a no-op and this monitor reports.  A lost store means local-only
analysis: the other nodes' ranks are dropped, with a note for the report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Set
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from dl2.live.proof import ranks_text
from dl2.live.shared import CONNECT_DEADLINE_S
from dl2.live.shared import SharedState
from dl2.live.tailer import TraceTailer
from dl2.report import Report
from dl2.trace.session import ALIVE


@dataclass
class RemoteState:
    """What the other nodes' monitors last pushed.

    Attributes:
        states: rank -> process state, for the other nodes' ranks.
        seen: node -> the ``req`` value it read before its last push.
        nodes: rank -> the node whose monitor mirrors it.
    """

    states: dict[int, str] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)
    nodes: dict[int, int] = field(default_factory=dict)


class NodeLink:
    """One monitor's link to the other nodes' monitors.

    Args:
        shared: the job's store as shared state, or None (a single-node job).
        tailer: this monitor's traces (mirrored files are added to and dropped from it).
        notice: prints a one-line status message.
        notes: the monitor's notes for the report (appended to).
        on_drop: called with the other nodes' ranks when they are dropped.
        render_json: renders a report as JSON, to publish it with a verdict.
        ack_timeout: seconds to wait for the other monitors to see an abort verdict.
    """

    def __init__(
        self,
        shared: SharedState | None,
        tailer: TraceTailer,
        notice: Callable[[str], None],
        notes: list[str],
        on_drop: Callable[[set[int]], None],
        render_json: Callable[[Report], str] | None = None,
        ack_timeout: float = 5.0,
    ) -> None:
        self.shared = shared
        self.tailer = tailer
        self.notice = notice
        self.notes = notes
        self.on_drop = on_drop
        self.render_json = render_json
        self.ack_timeout = ack_timeout
        self.remote = RemoteState()
        #: the store went away (or was never reached): local-only analysis
        self.store_gone = False
        self._started = False
        self._ranks_seen_at: float | None = None

    @property
    def sharing(self) -> bool:
        """Connected to the job's store and not lost."""
        return self.shared is not None and self.shared.ready

    def reporting(self) -> bool:
        """True if this monitor analyses and reports (False: another node's does)."""
        shared = self.shared
        if shared is None or shared.lost is not None:
            return True
        if not shared.ready:
            return False  # connecting: wait, rather than report twice
        return 0 in self.tailer.local_ranks()

    # -- each poll ----------------------------------------------------------------------

    def sync(self, local: Mapping[int, str]) -> None:
        """Push this node's records and states, pull the others' (``local``: taken
        before the tailer read its files)."""
        shared = self.shared
        if shared is None:
            return
        if not self._started:
            shared.start()  # importing torch takes seconds: start at once
            self._started = True
        if not shared.ready and shared.lost is None and self.tailer.local_ranks():
            if self._ranks_seen_at is None:
                self._ranks_seen_at = time.monotonic()
            elif time.monotonic() - self._ranks_seen_at > CONNECT_DEADLINE_S:
                failed = shared.give_up()
                self.store_gone = True
                self._drop(f"cannot reach the job's store at {shared.address} ({failed})")
                self.notice(
                    f"cannot reach the job's store at {shared.address} ({failed}); "
                    "local-only analysis of this node's ranks"
                )
        if shared.lost is None:
            pulled = shared.sync(self.tailer, local, read_files=0 in self.tailer.local_ranks())
            if pulled is not None:
                self.remote = RemoteState(
                    dict(pulled.states), dict(pulled.seen), dict(pulled.rank_nodes)
                )
                return
        if shared.lost is not None and not self.store_gone:
            self.store_gone = True
            mine = self.tailer.local_ranks()
            if mine and mine <= self.tailer.ended() | {r for r, s in local.items() if s != ALIVE}:
                return  # this node's ranks are done: the store went with the job
            self._drop(f"the job's store at {shared.address} was lost ({shared.lost})")
            self.notice(
                f"lost the job's store at {shared.address} ({shared.lost}); continuing with "
                "local-only analysis of this node's ranks"
            )

    def _drop(self, why: str) -> None:
        names = self.shared.remote_names() if self.shared is not None else set()
        if names or self.remote.states:
            self.tailer.forget(names)
            mine = self.tailer.local_ranks()
            self.on_drop({rank for rank in self.remote.states if rank not in mine})
            self.remote = RemoteState()
        note = f"{why}: local-only analysis of this node's ranks"
        if note not in self.notes:
            self.notes.append(note)

    # -- the proof and the verdict ------------------------------------------------------

    def bump(self) -> int:
        """Mark the end of a snapshot for the other nodes; the store's ``req`` (0: none)."""
        return self.shared.bump() if self.shared is not None and self.shared.ready else 0

    def fresh(self, deadlocked: Set[int], req: int) -> bool:
        """True if every member on another node was read after the snapshot ``req``."""
        if not self.sharing:
            return True
        local = self.tailer.local_ranks()
        for rank in deadlocked:
            if rank in local:
                continue
            node = self.remote.nodes.get(rank)
            if node is None or self.remote.seen.get(node, -1) < req:
                return False
        return True

    def publish(self, verdict: dict[str, Any], report: Report | None = None) -> None:
        """Tell the other monitors; for an abort, wait (bounded) until they saw it."""
        shared = self.shared
        if shared is None or not shared.ready:
            return
        render = self.render_json
        text = render(report) if report is not None and render is not None else None
        shared.publish_verdict(verdict, text)
        if verdict.get("action") == "abort":
            shared.wait_for_acks(self.ack_timeout)

    def remote_verdict(self) -> tuple[dict[str, Any], str | None] | None:
        """An abort verdict of rank 0's node's monitor, with its JSON report, or None.

        A verdict that only reports (``--on-deadlock report``) is printed as a notice.
        """
        shared = self.shared
        if shared is None or not shared.ready or 0 in self.tailer.local_ranks():
            return None
        verdict = shared.verdict()
        if verdict is None:
            return None
        report_json = shared.report_json()
        shared.ack()
        if verdict.get("action") != "abort":
            self.notice(pointer_line(verdict, stopped=False))
            return None
        return verdict, report_json

    # -- the end ------------------------------------------------------------------------

    def finish(self) -> None:
        """Before the final analysis of a finished job: leave out what is incomplete,
        and say which monitor reports on the whole job."""
        shared = self.shared
        if shared is None:
            return
        self._drop_incomplete(shared)
        if not self.store_gone and not self.reporting():
            self.notes.append(
                "multi-node: this report covers this node's ranks; the monitor of rank 0's "
                "node reports on the whole job"
            )

    def _drop_incomplete(self, shared: SharedState) -> None:
        """Leave out other nodes' ranks whose mirrored trace stops short of their end.

        The store closes with the job, possibly before another node's monitor pushed
        the last records: such a rank would look blocked in an op it in fact completed.
        """
        ended = self.tailer.ended()
        mine = self.tailer.local_ranks()
        partial = {
            rank
            for rank, state in self.remote.states.items()
            if rank not in mine and rank not in ended and state == ALIVE
        }
        names = {name for name in shared.remote_names() if self.tailer.rank_of(name) in partial}
        if partial:
            self.tailer.forget(names)
            for rank in partial:
                self.remote.states.pop(rank, None)
            self.notes.append(
                f"{ranks_text(partial)} on other nodes: mirrored trace incomplete when the "
                "job's store closed; left out of the analysis"
            )


def pointer_line(verdict: Mapping[str, Any], stopped: bool = True) -> str:
    """The one line a non-reporting node prints about another node's verdict."""
    where = f"{verdict.get('host')}, run dir {verdict.get('run_dir')}"
    ranks = ranks_text(verdict.get("ranks") or ())
    what = {
        "deadlock": f"a deadlock among {ranks}",
        "hang-timeout": f"a hang of {ranks} (hang timeout)",
    }.get(str(verdict.get("reason")), str(verdict.get("reason")))
    tail = "; dl2 stopped this node's ranks" if stopped else ""
    return f"the dl2 monitor of rank 0's node ({where}) found {what}: see its report{tail}"


def report_json_dict(text: str | None) -> dict[str, Any] | None:
    """A published JSON report parsed back, or None."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
