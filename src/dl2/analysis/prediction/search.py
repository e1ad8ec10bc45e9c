"""Deadlocks the recorded run did not have, but another backend configuration could.

:func:`predict` runs the recorded per-rank op sequences on the abstract machine of
:mod:`.machine` under a :class:`~.semantics.Semantics`, and searches the choices the
backend may make differently from the recorded run.

The search
    Every forced step (posting, collective and P2P completion, eager sends, batch
    launches) is applied eagerly (:meth:`~dl2.analysis.prediction.machine.State.settle`); the only
    branching is on *real* choices: which sender a wildcard receive matches.  Eager
    versus blocking sends are not choices: they follow from ``eager_bytes``, which
    :func:`sweep` and each witness's ``threshold`` vary.  Async completion order needs
    no branching: completing never disables another step, so every order reaches the
    same state (with ``independent_groups`` false the order is fixed).

    From the recorded path (each wildcard takes its recorded sender when that message is
    there) the search branches on each other open match, a *deviation*, and explores
    paths by how many deviations they take, up to ``max_deviations``: the first deadlock
    found differs least from the recorded run (a minimal witness).  Branching copies a
    settled state (per-op flags are byte arrays); states are memoised by a fingerprint of
    their future (program counters, completed ops, consumed messages), so matches taken
    in another order that lead to the same state are explored once.  The search stops
    after ``max_states`` states, or when the states it holds would take too much memory
    (``exhaustive`` false, ``note`` says so).

Soundness
    Every reported deadlock is reached by a legal execution of the model, and the model
    is checked against the recording first: replayed with the recorded wildcard matches
    (under the recorded backend's semantics, or a buffer every send fits in when that is
    unknown), the recorded run must not deadlock, or nothing is predicted (``note`` says
    why).  A program that does not depend on send buffering, on batch boundaries or on
    which sender a wildcard receive meets therefore stays clean under every
    configuration.  A wildcard whose returned sender the program used as a later peer
    (the recorder follows it through integer arithmetic: ``Op.via``), or, in older
    traces, whose rank next sends to or receives from the recorded sender, is kept at
    its recorded match (``Program.pinned``): the program follows the matched source
    (``src = recv(); send(dst=src)``), which a replay of the recorded op sequence
    cannot.  So is every wildcard issued where such a receive was (same rank, same
    stack): a server that replies to updates and only counts a "done" follows the
    sender at that call site only for some messages, and what it would have done after
    another match is not in the recording.

Known gaps
    The op sequence of each rank is assumed not to depend on the configuration: a program
    that branches on received data (at a call site where it never follows the sender),
    or on the matched source in a way the pinning above does not catch (a sender
    looked up in a table, ``peers[src]``, or cast, ``int(src)``; a subgroup's sender
    translated by the program's own table rather than torch's ``get_global_rank`` /
    ``get_group_rank``, which keep the mark; an ``irecv`` whose work's sender the
    program never asks), is replayed as recorded.
    Ops of several threads of one rank are taken in file order.  Several outstanding
    eager sends to one peer do not share one buffer.  NCCL's stream order inside a
    communicator and the separate communicators of batched and single P2P ops are not
    modelled: these would add deadlocks, never remove one.  Only executions within
    ``max_deviations`` wildcard deviations of the recorded run are explored; under a
    backend without wildcard receives (``any_source`` false: NCCL) none.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass

from dl2.analysis.describe import op_ref
from dl2.analysis.prediction.machine import Machine
from dl2.analysis.prediction.machine import Outcome
from dl2.analysis.prediction.machine import State
from dl2.analysis.prediction.program import SEND
from dl2.analysis.prediction.program import Program
from dl2.analysis.prediction.program import build_program
from dl2.analysis.prediction.semantics import GLOO
from dl2.analysis.prediction.semantics import NCCL
from dl2.analysis.prediction.semantics import Semantics
from dl2.analysis.prediction.witness import BlockedOp
from dl2.analysis.prediction.witness import Choice
from dl2.analysis.prediction.witness import Witness
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.stuck import shortest_cycle

__all__ = [
    "DEFAULT_BUFFER_SIZES",
    "DEFAULT_MAX_DEVIATIONS",
    "DEFAULT_MAX_STATES",
    "DEFAULT_MAX_WITNESSES",
    "Prediction",
    "Predictor",
    "predict",
    "sweep",
]

#: States (sets of choices) one prediction explores at most.
DEFAULT_MAX_STATES = 2000
#: Wildcard matches that may differ from the recorded run along one explored execution.
DEFAULT_MAX_DEVIATIONS = 3
#: Distinct deadlocks one prediction reports at most.
DEFAULT_MAX_WITNESSES = 4
#: Buffer sizes :func:`sweep` tries by default: rendezvous, 1 KiB, 64 KiB, NCCL's 4 MiB.
DEFAULT_BUFFER_SIZES = (0, 1024, 65536, 4 << 20)
#: Memory the states a search holds for later may take, in bytes (about).
_HELD_BYTES = 256 << 20
#: A buffer every recorded send fits in: the most permissive replay of the recording.
_UNBOUNDED = 1 << 62

Key = frozenset[tuple[int, int]]  # {(wildcard receive u, sender rank)}


@dataclass(frozen=True)
class Prediction:
    """The verdict for one configuration.

    Attributes:
        semantics: the configuration.
        witnesses: the distinct potential deadlocks found (none: no deadlock found).
        states: how many states the search ran.
        exhaustive: whether every execution within ``max_deviations`` was explored
            (else the search hit its bound on states or memory).
        note: why nothing could be predicted, or why the search stopped.
        max_deviations: how many wildcard matches an explored execution could take
            differently from the recorded run.
    """

    semantics: Semantics
    witnesses: tuple[Witness, ...]
    states: int
    exhaustive: bool
    note: str | None = None
    max_deviations: int = DEFAULT_MAX_DEVIATIONS

    @property
    def deadlock_possible(self) -> bool:
        return bool(self.witnesses)


def predict(
    graph: ExecutionGraph,
    semantics: Semantics = GLOO,
    *,
    max_states: int = DEFAULT_MAX_STATES,
    max_witnesses: int = DEFAULT_MAX_WITNESSES,
    max_deviations: int = DEFAULT_MAX_DEVIATIONS,
    recorded: Semantics | None = None,
    thresholds: bool = True,
) -> Prediction:
    """Search the executions of the recorded op sequences under ``semantics`` for deadlocks.

    Args:
        graph: the recorded run.
        semantics: the configuration to predict for.
        max_states: the most states (sets of wildcard choices) to run.
        max_witnesses: the most distinct deadlocks to report.
        max_deviations: the most wildcard matches an explored execution may take
            differently from the recorded run.
        recorded: the semantics the run was recorded under, to check that the model
            replays it (None: unknown, checked with a buffer every send fits in).
        thresholds: compute each witness's buffer threshold (a few more runs).
    """
    predictor = Predictor(build_program(graph), max_states, max_witnesses, max_deviations)
    return predictor.predict(semantics, recorded=recorded, thresholds=thresholds)


def sweep(
    graph: ExecutionGraph,
    buffer_sizes: Iterable[int] = DEFAULT_BUFFER_SIZES,
    semantics: Semantics = NCCL,
    *,
    max_states: int = DEFAULT_MAX_STATES,
    max_deviations: int = DEFAULT_MAX_DEVIATIONS,
    recorded: Semantics | None = None,
) -> tuple[Prediction, ...]:
    """:func:`predict` for ``semantics`` with each eager buffer size in turn."""
    predictor = Predictor(build_program(graph), max_states, DEFAULT_MAX_WITNESSES, max_deviations)
    return tuple(
        predictor.predict(semantics.with_buffer(size), recorded=recorded) for size in buffer_sizes
    )


class Predictor:
    """Predictions over one program, sharing its index and the replay check."""

    def __init__(
        self,
        program: Program,
        max_states: int = DEFAULT_MAX_STATES,
        max_witnesses: int = DEFAULT_MAX_WITNESSES,
        max_deviations: int = DEFAULT_MAX_DEVIATIONS,
    ) -> None:
        self.program = program
        self.max_states = max_states
        self.max_witnesses = max_witnesses
        self.max_deviations = max_deviations
        #: states a search may hold for later at once (their per-op flags take memory)
        self.max_held = max(16, _HELD_BYTES // (12 * len(program) + 4096))
        self._machines: dict[Semantics, Machine] = {}
        self._misfit: dict[Semantics | None, str | None] = {}

    def machine(self, semantics: Semantics) -> Machine:
        if semantics not in self._machines:
            self._machines[semantics] = Machine(self.program, semantics)
        return self._machines[semantics]

    def misfit(self, recorded: Semantics | None) -> str | None:
        """Why the model cannot replay the recorded run, or None if it can."""
        if recorded not in self._misfit:
            self._misfit[recorded] = self._replay(recorded)
        return self._misfit[recorded]

    def _replay(self, recorded: Semantics | None) -> str | None:
        semantics = recorded or Semantics("recorded", eager_bytes=_UNBOUNDED)
        program = self.program
        choices = {u: src for u in program.wildcards() if (src := program.ops[u].src) is not None}
        outcome = self.machine(semantics).run(choices, pick_first=True)
        if outcome.unmet:
            op = program.ops[outcome.unmet[0]]
            return (
                f"the model cannot replay the recorded run: rank {op.rank}'s wildcard receive "
                f"(op {op.id}) cannot match rank {op.src} as recorded"
            )
        if outcome.stuck:
            stuck = ", ".join(
                f"rank {s.rank} in op {program.ops[s.op].id}" for s in outcome.stuck[:4]
            )
            return (
                "the recorded run does not complete under the model (deadlocked, or its "
                f"trace is incomplete): {stuck}"
            )
        return None

    def predict(
        self,
        semantics: Semantics,
        *,
        recorded: Semantics | None = None,
        thresholds: bool = True,
    ) -> Prediction:
        misfit = self.misfit(recorded)
        if misfit is not None:
            return Prediction(semantics, (), 0, False, misfit, self.max_deviations)
        found, states, exhaustive = self.search(semantics, frozenset())
        witnesses = tuple(
            self.witness(semantics, key, outcome, thresholds) for key, outcome in found
        )
        note = None if exhaustive else f"search stopped after {states} states"
        deviations = self.max_deviations if semantics.any_source else 0
        return Prediction(semantics, witnesses, states, exhaustive, note, deviations)

    def search(
        self, semantics: Semantics, start: Key, limit: int | None = None
    ) -> tuple[list[tuple[Key, Outcome]], int, bool]:
        """Search the executions that differ from the recorded run in few wildcard matches.

        From a settled state the search follows the *recorded* path: every wildcard
        receive takes its recorded sender as soon as that send is there (or, where none
        is, the lowest sender there).  Every other open match is a *deviation*, tried
        from the state where it is open as a new path that deviates once more.  Paths
        are explored by how many deviations they take (at most ``max_deviations``), so
        the first deadlock found deviates least.  Each step copies a settled state and
        applies one set of choices; a state whose future was already explored (same
        fingerprint, whatever choices led to it) is not explored again.

        Returns the deadlocks found (choices, outcome), the states run, and whether the
        search covered every path within the deviation bound (or found as many deadlocks
        as it may report).
        """
        machine = self.machine(semantics)
        limit = self.max_states if limit is None else limit
        deviations = self.max_deviations if semantics.any_source else 0
        root = machine.start({**self.program.pinned, **dict(start)})
        seen = {root.fingerprint()}
        levels: list[list[tuple[Key, State]]] = [[(start, root)]]
        levels.extend([] for _ in range(deviations))
        found: list[tuple[Key, Outcome]] = []
        signatures: list[frozenset[tuple[int, int]]] = []
        states = 1
        held = 0
        for cost, level in enumerate(levels):
            held -= len(level)
            for key, state in level:
                while True:
                    outcome = state.outcome()
                    if outcome.stuck:
                        signature = frozenset((s.rank, s.op) for s in outcome.stuck)
                        if not any(signature >= old for old in signatures):
                            signatures.append(signature)
                            found.append((key, outcome))
                            if len(found) >= self.max_witnesses:
                                return found, states, True  # enough to report
                        break  # whatever is chosen next, these ranks stay stuck
                    if not outcome.options:
                        break
                    usual, others = self.split(outcome.options)
                    for option in others if cost < deviations else ():
                        if states >= limit or held >= self.max_held:
                            return found, states, False
                        child = machine.extend(state, dict([option]))
                        states += 1
                        if child.fingerprint() not in seen:
                            seen.add(child.fingerprint())
                            levels[cost + 1].append((key | {option}, child))
                            held += 1
                    if states >= limit:
                        return found, states, False
                    state = machine.extend(state, dict(usual))
                    states += 1
                    key = key | set(usual)
                    if state.fingerprint() in seen:
                        break  # explored from here already
                    seen.add(state.fingerprint())
        return found, states, True

    def split(
        self, options: Sequence[tuple[int, int]]
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The matches the recorded path takes now, and the deviations open now."""
        ops = self.program.ops
        usual = [(w, s) for w, s in options if ops[w].src == s]
        if not usual:
            first: dict[int, int] = {}
            for w, s in options:
                first.setdefault(w, s)
            usual = sorted(first.items())
        return usual, [option for option in options if option not in usual]

    # -- witnesses ------------------------------------------------------------------------

    def witness(
        self, semantics: Semantics, key: Key, outcome: Outcome, thresholds: bool
    ) -> Witness:
        program = self.program
        ops = program.ops
        choices = []
        for w, s in outcome.matched:
            recv, send = ops[w], ops[s]
            choices.append(
                Choice(
                    rank=recv.rank,
                    op_id=recv.id,
                    sender=send.rank,
                    send_op_id=send.id,
                    recorded_sender=recv.src,
                    recv=op_ref(recv),
                    send=op_ref(send),
                )
            )
        blocked = tuple(
            BlockedOp(
                rank=s.rank,
                op_id=ops[s.op].id,
                state=s.state,
                waits_on=s.waits_on,
                nbytes=program.nbytes[s.op] if program.kind[s.op] == SEND else None,
                ref=op_ref(ops[s.op]),
                note=s.note,
                queued=s.queued,
            )
            for s in outcome.stuck
        )
        threshold = self.threshold(semantics, key) if thresholds else None
        return Witness(
            semantics=semantics,
            choices=tuple(choices),
            blocked=blocked,
            cycle=shortest_cycle({b.rank: b.waits_on for b in blocked}),
            threshold=threshold,
        )

    def deadlocks(self, semantics: Semantics, key: Key) -> bool:
        """Whether the execution with these choices deadlocks under ``semantics``."""
        outcome = self.machine(semantics).run({**self.program.pinned, **dict(key)})
        if not outcome.unmet:
            if outcome.stuck:
                return True
            if not outcome.options:
                return False
        # the choices lead elsewhere under this buffer: search what can follow
        start = key if not outcome.unmet else frozenset()
        found, _, _ = self.search(semantics, start, limit=max(8, self.max_states // 8))
        return bool(found)

    def threshold(self, semantics: Semantics, key: Key) -> int | None:
        """The smallest eager buffer, above the current one, that removes the deadlock.

        Only the buffer sizes of recorded sends matter (between two of them every send
        is treated the same); assuming a larger buffer never adds this deadlock back,
        binary search over them.
        """
        if not semantics.buffered:
            return None
        sizes = [b for b in self.program.send_sizes() if b > semantics.eager_bytes]
        if not sizes or self.deadlocks(semantics.with_buffer(sizes[-1]), key):
            return None
        low, high = 0, len(sizes) - 1  # sizes[high] is clean
        while low < high:
            middle = (low + high) // 2
            if self.deadlocks(semantics.with_buffer(sizes[middle]), key):
                low = middle + 1
            else:
                high = middle
        return sizes[high]
