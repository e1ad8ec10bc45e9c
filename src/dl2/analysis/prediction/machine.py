"""The abstract machine: every rank's recorded op sequence executed under a Semantics.

The recorded file order of a rank's ops is its program.  A rank *posts* its ops in that
order and stops at each point where it waits on an op until the op completes: right after
a blocking op (``async`` false), and where the trace has the first ``wait`` record on an
async op (:func:`dl2.model.program.wait_position`).  An async op never waited on blocks
nothing.

An op is *active* once posted, except under ``fused_batches_atomic``, where a batch (ops
of one rank sharing a ``batch`` id) becomes active as one unit once all of its ops have
been posted and each can be matched by an op its peer has posted; and except when
``independent_groups`` is false, where a rank's units start one at a time, in issue order;
under ``serial_batches`` a rank's batches (only) start one at a time, in issue order.
Active ops then complete:

* a collective, when every member has its op of the same slot (the i-th collective of the
  group, as matched by :mod:`dl2.model.execution_graph`) active;
* a send of at most ``eager_bytes`` bytes at once; a larger one when matched;
* a receive when matched.

Matching follows MPI's non-overtaking rule per channel (group, sender, receiver, tag:
:func:`dl2.model.program.channel_of`): the oldest active send of a channel meets the
oldest active receive of the receiver that accepts it.  When that receive is a wildcard
(``peer`` None), which sender it meets is a *choice*: the machine never makes one by
itself; the caller names it (wildcard op -> sender rank).
Every other step is forced, so :meth:`Machine.run` applies them all eagerly until
nothing moves; the result is the same in whatever order they are applied, because no
step disables another.  What is left are the open choices and, if there are none, either
a finished run or a deadlock (:mod:`.blocking`).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from dl2.analysis.prediction.blocking import Stuck
from dl2.analysis.prediction.blocking import stuck_ranks
from dl2.analysis.prediction.program import COLL
from dl2.analysis.prediction.program import NOOP
from dl2.analysis.prediction.program import RECV
from dl2.analysis.prediction.program import SEND
from dl2.analysis.prediction.program import Program
from dl2.analysis.prediction.semantics import Semantics
from dl2.model.program import WILD
from dl2.model.program import Channel
from dl2.model.program import Mailbox
from dl2.model.program import mailbox


@dataclass(frozen=True)
class Outcome:
    """Where the machine stopped.

    Attributes:
        options: open choices (wildcard receive u, sender rank), in a stable order.
        matched: the choices applied, in order: (wildcard receive u, send u).
        blocked: rank -> the op it waits on, for every rank that has not finished.
        stuck: the deadlocked ranks (none can ever move, whatever is chosen next), by rank.
        unmet: wildcard receives whose chosen sender never became available.
    """

    options: tuple[tuple[int, int], ...]
    matched: tuple[tuple[int, int], ...]
    blocked: Mapping[int, int]
    stuck: tuple[Stuck, ...]
    unmet: tuple[int, ...]

    @property
    def finished(self) -> bool:
        return not self.blocked and not self.options


class Machine:
    """A program under one semantics; :meth:`run` executes it for a set of choices."""

    def __init__(self, program: Program, semantics: Semantics) -> None:
        self.program = program
        self.semantics = semantics
        n = len(program)
        limit = semantics.eager_bytes
        self.eager = tuple(
            program.kind[u] == SEND and (b := program.nbytes[u]) is not None and b <= limit
            for u in range(n)
        )
        unit_of = list(range(n))
        units: dict[int, tuple[int, ...]] = {}
        if semantics.fused_batches_atomic:
            for batch in program.batches:
                for u in batch:
                    unit_of[u] = batch[0]
                units[batch[0]] = batch
        self.unit_of = tuple(unit_of)
        #: u -> the sender rank a receive accepts (WILD for any); -2 for other ops
        self.source = tuple(ch[1] if ch is not None else -2 for ch in program.channel)
        self.units = units  # atomic units of more than their own op; others are (u,)
        #: u -> whether the unit it heads starts only after the rank's earlier such units
        #: completed (one stream per rank)
        self.serial = tuple(
            not semantics.independent_groups or (semantics.serial_batches and u in units)
            for u in range(n)
        )

    def members_of(self, unit: int) -> tuple[int, ...]:
        return self.units.get(unit, (unit,))

    def run(self, choices: Mapping[int, int], *, pick_first: bool = False) -> Outcome:
        """Execute every forced step and the given choices until nothing moves.

        Args:
            choices: wildcard receive u -> the sender rank it is to match.
            pick_first: take the first open choice whenever one is left (a single path,
                for replaying a recorded run).
        """
        state = self.start(choices)
        while pick_first:
            options = state.options()
            if not options:
                break
            state.choose(*options[0])
            state.settle()
        return state.outcome()

    def start(self, choices: Mapping[int, int]) -> State:
        """The settled state from the beginning with these choices."""
        state = State(self, dict(choices))
        state.settle()
        return state

    def extend(self, state: State, choices: Mapping[int, int]) -> State:
        """A copy of a settled state with more choices, settled again."""
        child = state.clone()
        for wildcard, sender in choices.items():
            child.choose(wildcard, sender)
        child.settle()
        return child


class State:
    """The state of one execution: copied (:meth:`clone`) to branch on a choice.

    Per-op flags are byte arrays so that a copy of a large run stays cheap.
    """

    def __init__(self, machine: Machine, choices: dict[int, int]) -> None:
        self.m = machine
        self.p = machine.program
        self.choices = choices
        n = len(self.p)
        self.active = bytearray(n)
        self.ok = bytearray(n)  # its own condition holds (a batch may still be pending)
        self.done = bytearray(n)
        self.consumed = bytearray(n)  # a send matched by a receive
        self.pc = dict.fromkeys(self.p.steps, 0)
        self.blocked: dict[int, int] = {}
        self.ready: deque[int] = deque(sorted(self.p.steps))
        self.unit_posted = array("I", bytes(4 * n))  # by unit id (its first op)
        self.unit_ok = array("I", bytes(4 * n))
        self.slot_active = [0] * len(self.p.slot_ops)
        self.slot_posted = [0] * len(self.p.slot_ops)
        self.posted_count: dict[tuple[object, ...], int] = defaultdict(int)
        self.sendq: dict[Channel, deque[int]] = defaultdict(deque)
        self.senders: dict[Mailbox, set[int]] = defaultdict(set)
        self.recvs: dict[Mailbox, list[int]] = defaultdict(list)
        self.dirty: set[Mailbox] = set()
        self.pending: list[int] = []  # atomic units posted whose launch condition fails
        self.recheck = False
        self.stream: dict[int, deque[int]] = defaultdict(deque)
        self.starts: deque[int] = deque()  # stream heads to start (no deep recursion)
        self.log: list[tuple[int, int]] = []

    # -- driving ----------------------------------------------------------------------

    def clone(self) -> State:
        """An independent copy (the state must be settled: no work in flight)."""
        copy = State.__new__(State)
        copy.m, copy.p = self.m, self.p
        copy.choices = dict(self.choices)
        copy.active, copy.ok = bytearray(self.active), bytearray(self.ok)
        copy.done, copy.consumed = bytearray(self.done), bytearray(self.consumed)
        copy.pc = dict(self.pc)
        copy.blocked = dict(self.blocked)
        copy.ready, copy.starts = deque(), deque()
        copy.unit_posted, copy.unit_ok = array("I", self.unit_posted), array("I", self.unit_ok)
        copy.slot_active, copy.slot_posted = list(self.slot_active), list(self.slot_posted)
        copy.posted_count = defaultdict(int, self.posted_count)
        copy.sendq = defaultdict(deque, {k: deque(q) for k, q in self.sendq.items() if q})
        copy.senders = defaultdict(set, {k: set(v) for k, v in self.senders.items() if v})
        copy.recvs = defaultdict(list, {k: list(v) for k, v in self.recvs.items() if v})
        copy.dirty = set()
        copy.pending = list(self.pending)
        copy.recheck = False
        copy.stream = defaultdict(deque, {k: deque(q) for k, q in self.stream.items() if q})
        copy.log = list(self.log)
        return copy

    def choose(self, wildcard: int, sender: int) -> None:
        """Commit a wildcard receive to a sender (applied by the next :meth:`settle`)."""
        self.choices[wildcard] = sender
        self.dirty.add(self._recv_key(wildcard))

    def fingerprint(self) -> int:
        """Equal for states with the same future, whatever choices led to them."""
        committed = frozenset((w, s) for w, s in self.choices.items() if not self.ok[w])
        return hash((tuple(self.pc.values()), bytes(self.ok), bytes(self.consumed), committed))

    def outcome(self) -> Outcome:
        options = self.options()
        return Outcome(
            options=tuple(options),
            matched=tuple(self.log),
            blocked=dict(sorted(self.blocked.items())),
            stuck=stuck_ranks(self, options),
            unmet=tuple(sorted(w for w in self.choices if not self.ok[w] and self.active[w])),
        )

    def settle(self) -> None:
        while True:
            while self.ready or self.starts:
                while self.starts:
                    self.start_or_hold(self.starts.popleft())
                while self.ready:
                    self.advance(self.ready.popleft())
            if self.recheck:
                self.recheck = False
                self.try_pending()
            if self.dirty:
                self.match()
            if not (self.ready or self.starts or self.recheck or self.dirty):
                return

    def advance(self, rank: int) -> None:
        steps = self.p.steps[rank]
        pc = self.pc[rank]
        while pc < len(steps):
            is_wait, u = steps[pc]
            if is_wait:
                if not self.done[u]:
                    self.blocked[rank] = u
                    break
            else:
                self.post(u)
            pc += 1
        else:
            self.blocked.pop(rank, None)
        self.pc[rank] = pc

    # -- posting and starting ------------------------------------------------------------

    def post(self, u: int) -> None:
        p = self.p
        kind = p.kind[u]
        if kind in (SEND, RECV):
            channel = p.channel[u]
            assert channel is not None
            self.posted_count[(kind, *channel)] += 1
            if kind == SEND:
                self.posted_count[(SEND, channel[0], WILD, channel[2], channel[3])] += 1
        elif kind == COLL:
            self.slot_posted[p.slot[u]] += 1
        if self.pending:
            self.recheck = True
        unit = self.m.unit_of[u]
        self.unit_posted[unit] += 1
        if self.unit_posted[unit] < len(self.m.members_of(unit)):
            return  # the rest of its batch is still to be posted
        if not self.m.serial[unit]:
            self.start_or_hold(unit)
        else:
            queue = self.stream[p.ops[u].rank]
            queue.append(unit)
            if len(queue) == 1:
                self.start_or_hold(unit)

    def start_or_hold(self, unit: int) -> None:
        if unit in self.m.units and not all(self.launchable(v) for v in self.m.units[unit]):
            self.pending.append(unit)
        else:
            self.start(unit)

    def launchable(self, u: int) -> bool:
        """Whether a batch op can be matched by what its peers have posted so far."""
        p = self.p
        kind = p.kind[u]
        if kind == COLL:
            need = p.slot_need[p.slot[u]]
            return need >= 0 and self.slot_posted[p.slot[u]] >= need
        if kind == NOOP:
            return True
        channel = p.channel[u]
        assert channel is not None
        gid, src, dst, tag = channel
        if kind == SEND:
            partners = self.posted_count[(RECV, *channel)]
            partners += self.posted_count[(RECV, gid, WILD, dst, tag)]
            return partners > p.position[u]
        if src == WILD:
            return self.posted_count[(SEND, gid, WILD, dst, tag)] > p.position[u]
        return self.posted_count[(SEND, *channel)] > p.position[u]

    def try_pending(self) -> None:
        held = self.pending
        self.pending = []
        for unit in held:
            if all(self.launchable(v) for v in self.m.units[unit]):
                self.start(unit)
            else:
                self.pending.append(unit)

    def start(self, unit: int) -> None:
        p = self.p
        for u in self.m.members_of(unit):
            self.active[u] = 1
            kind = p.kind[u]
            if kind == NOOP:
                self.mark_ok(u)
            elif kind == COLL:
                sid = p.slot[u]
                self.slot_active[sid] += 1
                if self.slot_active[sid] == p.slot_need[sid]:
                    for v in p.slot_ops[sid]:
                        self.mark_ok(v)
            elif kind == SEND:
                channel = p.channel[u]
                assert channel is not None
                self.sendq[channel].append(u)
                key = mailbox(channel)
                self.senders[key].add(channel[1])
                self.dirty.add(key)
                if self.m.eager[u]:
                    self.mark_ok(u)
            else:
                key = self._recv_key(u)
                self.recvs[key].append(u)
                self.dirty.add(key)

    # -- completing -----------------------------------------------------------------------

    def mark_ok(self, u: int) -> None:
        if self.ok[u]:
            return
        self.ok[u] = 1
        unit = self.m.unit_of[u]
        self.unit_ok[unit] += 1
        members = self.m.members_of(unit)
        if self.unit_ok[unit] < len(members):
            return
        for v in members:
            self.done[v] = 1
            rank = self.p.ops[v].rank
            if self.blocked.get(rank) == v:
                del self.blocked[rank]
                self.ready.append(rank)
        if self.m.serial[unit]:
            queue = self.stream[self.p.ops[u].rank]
            queue.popleft()
            if queue:
                self.starts.append(queue[0])

    # -- matching --------------------------------------------------------------------------

    def _recv_key(self, u: int) -> Mailbox:
        channel = self.p.channel[u]
        assert channel is not None
        return mailbox(channel)

    def _acceptor(self, key: Mailbox, sender: int) -> int | None:
        """The oldest active unmatched receive of ``key`` that accepts ``sender``."""
        source = self.m.source
        for r in self.recvs[key]:
            if source[r] in (sender, WILD):
                return r
        return None

    def match(self) -> None:
        while self.dirty:
            key = self.dirty.pop()
            while self.recvs.get(key) and self.senders.get(key):
                pair: tuple[int, int] | None = None
                for sender in sorted(self.senders[key]):
                    r = self._acceptor(key, sender)
                    if r is None:
                        continue
                    if self.m.source[r] == sender or self.choices.get(r) == sender:
                        pair = (sender, r)
                        break
                if pair is None:
                    break
                self._pair(key, *pair)

    def _pair(self, key: Mailbox, sender: int, r: int) -> None:
        channel = (key[0], sender, key[1], key[2])
        queue = self.sendq[channel]
        s = queue.popleft()
        self.consumed[s] = 1
        if not queue:
            self.senders[key].discard(sender)
        self.recvs[key].remove(r)
        if self.m.source[r] == WILD:
            self.log.append((r, s))
        self.mark_ok(r)
        self.mark_ok(s)

    def options(self) -> list[tuple[int, int]]:
        found: list[tuple[int, int]] = []
        for key in sorted(self.recvs):
            if not self.recvs[key] or not self.senders.get(key):
                continue
            for sender in sorted(self.senders[key]):
                r = self._acceptor(key, sender)
                if r is not None and r not in self.choices:
                    found.append((r, sender))
        return sorted(found)
