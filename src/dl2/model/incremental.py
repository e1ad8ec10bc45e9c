"""The incremental model: every rank's trace fed as it is read, the graphs on demand.

A :class:`Model` is fed the typed records of each trace file (in file order, any number
at a time, files interleaved in any way) and keeps, per rank, its ops and calls
(:mod:`dl2.model.rank_state`) and, across ranks, the collective slots and P2P channels
(:mod:`dl2.model.matcher`).  Feeding costs what the new records cost; :meth:`Model.graph`
returns the :class:`~dl2.model.execution_graph.ExecutionGraph` of this moment, a view
that builds only what is read of it: the wait-for graph of a few blocked ranks costs
nothing in the length of the history or the size of the world.

**The window.** While the model keeps at most ``window`` ops (default
:data:`DEFAULT_WINDOW`, the bound of the deadlock prediction), it keeps every op, and
every analysis sees exactly what a build from the whole trace sees.  Past it, the
oldest finished history (complete, matched collective slots and P2P pairs) is folded
into counters, and from then on the model keeps at most ``tail`` ops of finished
history (:data:`DEFAULT_TAIL`); mismatched, unmatched, failed and pending ops are never
folded.  The graph says so (``folded_ops``), and the analyses that need the whole
history say in the report that they were skipped.

When a rank has several trace files (it was restarted), the newest (its header's
``wall``; the later one read on a tie) is the rank's; the others are ignored.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from dl2.model.checkpoint import ModelRecord
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import OpKey
from dl2.model.matcher import Matcher
from dl2.model.ops import Timeline
from dl2.model.rank_state import OpState
from dl2.model.rank_state import RankModel
from dl2.trace.format import RankTrace
from dl2.trace.schema.decode import Header
from dl2.trace.schema.decode import OpRecord
from dl2.trace.session import Session
from dl2.trace.session import preference
from dl2.trace.stream import CHUNK_BYTES
from dl2.trace.stream import stream_session

#: ops kept before finished history is folded (the deadlock prediction's bound)
DEFAULT_WINDOW = 200_000
#: ops kept once finished history was folded: the analyses that need the whole history
#: are skipped from then on, and the windowed ones (cross-group orders, wildcard sizes)
#: look this far back; a model that kept its whole window ran 1.4x slower on a long
#: history (200,000 live ops scattered over the heap, against 50,000)
DEFAULT_TAIL = 50_000


@dataclass(slots=True)
class _File:
    """A trace file fed to the model: its header, and its rank model if it is the rank's."""

    header: Header
    rank_model: RankModel | None
    truncated: bool = False


class Model:
    """Every rank's state and the matches across ranks, fed record by record.

    Args:
        window: ops kept before finished history is folded; None keeps every op.
        tail: ops kept once some history was folded (at most ``window``; None:
            :data:`DEFAULT_TAIL`).

    Attributes:
        version: changes with every feed: a graph belongs to one version.
        waiting: the ranks that may be blocked (inside a call, or stalled).
    """

    def __init__(self, window: int | None = DEFAULT_WINDOW, tail: int | None = None) -> None:
        self.window = window
        self.tail = None if window is None else min(window, DEFAULT_TAIL if tail is None else tail)
        self.version = 0
        self._kept: dict[int, dict[int, OpState]] = {}  # rank -> its model's ops
        self.matcher = Matcher(self._kept)
        self.waiting: set[int] = set()
        self._files: dict[str, _File] = {}
        self._ranks: dict[int, str] = {}  # rank -> the key of its file
        self.world_size = 0  # the largest world size of the ranks' headers
        self._models: dict[int, RankModel] = {}  # rank -> the model of its file
        self._traced: set[tuple[str, int]] = set()  # (host, pid) of every file's process

    # -- feeding -----------------------------------------------------------------------

    def feed(
        self,
        key: str,
        header: Header,
        records: Sequence[ModelRecord],
        truncated: str | None = None,
    ) -> None:
        """Records that follow the ones fed so far of the file ``key``.

        Args:
            header: the file's header (read once, when the file is new).
            truncated: the reader's note when the file ends in a partial record.
        """
        entry = self._files.get(key)
        if entry is None:
            entry = self._open(key, header)
        entry.truncated = truncated is not None
        rank_model = entry.rank_model
        if rank_model is not None and records:
            rank_model.feed(records)
            self._settle(rank_model)
        self.version += 1

    def _settle(self, rank_model: RankModel) -> None:
        """After a rank's new records: whether it may wait, and fold past the window."""
        # may_wait(), its commonest answers first: inside a call, or neither inside one
        # nor seen by its watchdog
        if rank_model.ended is None and (
            rank_model.open_calls or (rank_model.last_state is not None and rank_model.may_wait())
        ):
            self.waiting.add(rank_model.rank)
        else:
            self.waiting.discard(rank_model.rank)
        matcher = self.matcher
        limit = self.tail if matcher.folded else self.window
        if limit is not None and matcher.retained > limit:
            matcher.fold(limit)

    def feed_calls(
        self,
        key: str,
        header: Header,
        ops: Sequence[OpRecord],
        wait_ids: Sequence[int] | None = None,
    ) -> None:
        """Blocking calls that follow the records fed so far of the file ``key``: one
        call per op instead of its four records (for a reader that recognises them).

        ``ops[k]`` and ``wait_ids[k]`` stand for four consecutive records of the file: the
        op record ``ops[k]``; a ``ret`` of it without ``err``; a ``wait`` with id
        ``wait_ids[k]`` (None: each op's id + 1) whose ``work`` is the op's id; and a
        ``ret`` of that wait with neither ``err`` nor ``src``. The outcome is that of
        :meth:`feed` of those four records, times, threads and stacks aside, which the model
        does not read of a ``ret`` or a ``wait`` (an op that is not a plain blocking call,
        an eager send say, is taken record by record). Calls and other records may be fed in
        any alternation, in file order; ``truncated`` stays as the last :meth:`feed` set it.
        """
        entry = self._files.get(key)
        if entry is None:
            entry = self._open(key, header)
        rank_model = entry.rank_model
        if rank_model is not None and ops:
            rank_model.feed_calls(ops, wait_ids)
            self._settle(rank_model)
        self.version += 1

    def _open(self, key: str, header: Header) -> _File:
        rank = header.rank
        current = self._ranks.get(rank)
        entry = _File(header, None)
        self._files[key] = entry
        traced = self._traced
        traced.add((header.host, header.pid))
        if current is None or preference(self._files[current].header, traced) <= preference(
            header, traced
        ):
            if current is not None:
                self._leave(current)
            entry.rank_model = self._models[rank] = RankModel(rank, self.matcher)
            self._kept[rank] = entry.rank_model.ops
            self._ranks[rank] = key
            if current is not None or header.world_size > self.world_size:
                self._sizes()
        return entry

    def forget(self, key: str) -> None:
        """Drop a file and what it told (its source went away)."""
        if key in self._files:
            if self._ranks.get(self._files[key].header.rank) == key:
                self._leave(key)
                del self._ranks[self._files[key].header.rank]
                self._sizes()
            gone = self._files.pop(key).header
            if not any(
                (f.header.host, f.header.pid) == (gone.host, gone.pid) for f in self._files.values()
            ):
                self._traced.discard((gone.host, gone.pid))
            self.version += 1

    def _leave(self, key: str) -> None:
        """The file ``key`` stops being its rank's: forget its ops."""
        entry = self._files[key]
        if entry.rank_model is not None:
            rank = entry.rank_model.rank
            self.matcher.remove_rank(rank, entry.rank_model.ops.values())
            self.waiting.discard(rank)
            entry.rank_model = None
            del self._models[rank]
            del self._kept[rank]

    def _sizes(self) -> None:
        heads = (self._files[k].header.world_size for k in self._ranks.values())
        self.world_size = max(heads, default=0)
        self.matcher.set_world(self.world_size)

    # -- reading -----------------------------------------------------------------------

    def ranks(self) -> list[int]:
        """The ranks with a trace."""
        return list(self._ranks)

    def rank_model(self, rank: int) -> RankModel | None:
        return self._models.get(rank)

    def truncated(self, rank: int) -> bool:
        key = self._ranks.get(rank)
        return key is not None and self._files[key].truncated

    def op_state(self, key: OpKey) -> OpState | None:
        rank_model = self.rank_model(key[0])
        return rank_model.ops.get(key[1]) if rank_model is not None else None

    def op_count(self) -> int:
        """Every op the traces hold: kept, folded, or before a checkpoint."""
        total = 0
        for key in self._ranks.values():
            rank_model = self._files[key].rank_model
            total += rank_model.n_ops if rank_model is not None else 0
        return total

    def follows_peers(self) -> bool:
        """Whether every rank's trace marks the peers that came from a wildcard's
        sender (``Header.follows``, written by recorders that write ``via``)."""
        files = self._files
        return all(files[key].header.follows for key in self._ranks.values())

    def follows_group_peers(self) -> bool:
        """Whether they do so for wildcards on subgroups too (``Header.follows_groups``)."""
        files = self._files
        return all(files[key].header.follows_groups for key in self._ranks.values())

    def resumed(self) -> frozenset[int]:
        """The ranks whose trace starts at a checkpoint."""
        return frozenset(r for r in self._ranks if (m := self.rank_model(r)) and m.resumed)

    def graph(self) -> ExecutionGraph:
        """The execution graph of what was fed so far (valid until the next feed)."""
        return ExecutionGraph(self)


def build_timeline(trace: RankTrace) -> Timeline:
    """One rank's timeline from its whole trace, without matching it to any other."""
    model = Model(window=None)
    model.feed(trace.path, trace.header, trace.records, trace.truncated)
    return model.graph().timelines[trace.rank]


def stream_run(
    run_dir: str | os.PathLike[str],
    window: int | None = DEFAULT_WINDOW,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[Session, ExecutionGraph]:
    """Read a run directory through a model, chunk by chunk (post-mortem analysis):
    its session (headers, process states, warnings) and execution graph.

    Raises:
        NoDataError, TraceFormatError: as :func:`dl2.trace.session.load_session`.
    """
    model = Model(window=window)
    session = stream_session(run_dir, model.feed, model.forget, chunk_bytes, model.feed_calls)
    return session, model.graph()
