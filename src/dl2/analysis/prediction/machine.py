"""The abstract machine: every rank's recorded op sequence executed under a Semantics.

The recorded file order of a rank's ops is its program.  A rank *posts* its ops in that
order and stops at each point where it waits on an op until the op completes: right after
a blocking op (``async`` false), and where the trace has the first ``wait`` record on an
async op (:attr:`dl2.model.ops.Op.waited_at`).  An async op never waited on blocks nothing.

An op is *active* once posted, except under ``fused_batches_atomic``, where a batch (ops
of one rank sharing a ``batch`` id) becomes active as one unit once all of its ops have
been posted and each can be matched by an op its peer has posted; and except when
``independent_groups`` is false, where a rank's units start one at a time, in issue order.
Active ops then complete:

* a collective, when every member has its op of the same slot (the i-th collective of the
  group, as matched by :mod:`dl2.model.execution_graph`) active;
* a send of at most ``eager_bytes`` bytes at once; a larger one when matched;
* a receive when matched.

Matching follows MPI's non-overtaking rule per (group, sender, receiver, tag): the oldest
active send of a channel meets the oldest active receive of the receiver that accepts it.
When that receive is a wildcard (``peer`` None), which sender it meets is a *choice*: the
machine never makes one by itself; the caller names it (wildcard op -> sender rank).
Every other step is forced, so :meth:`Machine.run` applies them all eagerly until
nothing moves; the result is the same in whatever order they are applied, because no
step disables another.  What is left are the open choices and, if there are none, either
a finished run or a deadlock.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from dl2.analysis.prediction.semantics import Semantics
from dl2.analysis.prediction.semantics import op_bytes
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.ops import Op

NOOP, COLL, SEND, RECV = range(4)
#: The source of a wildcard receive in a channel key.
WILD = -1

#: How far after a wildcard receive to look for the op that uses its source.
_PIN_LOOKAHEAD = 16

Channel = tuple[str, int, int, int]  # (group, sender, receiver, tag); sender WILD for any
RecvKey = tuple[str, int, int]  # (group, receiver, tag)


@dataclass(frozen=True)
class Program:
    """Every rank's recorded ops, flattened and indexed once per execution graph.

    Ops are numbered ``u`` 0..n-1 in rank order, then program order.

    Attributes:
        ops: u -> the recorded op.
        kind: u -> NOOP, COLL, SEND or RECV (ops that raised, new_group, and collectives
            without a slot are NOOPs: they complete as soon as they start).
        nbytes: u -> bytes a send carries (count × itemsize), None if unknown.
        channel: u -> (group, sender, receiver, tag) of a send or receive.
        position: u -> index of a send among the sends of its channel, of a receive among
            the receives of its channel (wildcards: among the wildcards of the receiver).
        slot: u -> collective slot id, or -1.
        slot_ops: slot id -> its ops; ``slot_need``: how many must be active for it to
            complete (-1: never, a member with a trace never issued it).
        slot_missing: slot id -> members that never issued it.
        batches: the batches, each a tuple of the ops of one rank sharing a batch id.
        pinned: wildcard receives whose rank's next send or receive names the sender
            recorded for it: the program most likely uses the matched source
            (``src = recv(); send(dst=src)``), so another match would change what the
            rank does next, which the recording cannot tell.  They keep their recorded
            sender.
        steps: rank -> its program: (is_wait, u) in order.
        closed: ranks whose trace ends with a clean ``end`` record (they will do nothing
            more); every other rank (still running, crashed, or without a trace) might.
        members: group -> member ranks.
        world: all ranks of the job.
    """

    ops: tuple[Op, ...]
    kind: tuple[int, ...]
    nbytes: tuple[int | None, ...]
    channel: tuple[Channel | None, ...]
    position: tuple[int, ...]
    slot: tuple[int, ...]
    slot_ops: tuple[tuple[int, ...], ...]
    slot_need: tuple[int, ...]
    slot_missing: tuple[tuple[int, ...], ...]
    batches: tuple[tuple[int, ...], ...]
    pinned: Mapping[int, int]
    steps: Mapping[int, tuple[tuple[bool, int], ...]]
    closed: frozenset[int]
    members: Mapping[str, tuple[int, ...]]
    world: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.ops)

    def send_sizes(self) -> tuple[int, ...]:
        """The distinct known byte sizes of sends, ascending."""
        return tuple(
            sorted({b for u, b in enumerate(self.nbytes) if self.kind[u] == SEND and b is not None})
        )

    def wildcards(self) -> tuple[int, ...]:
        """The wildcard receives."""
        return tuple(
            u
            for u, ch in enumerate(self.channel)
            if ch is not None and self.kind[u] == RECV and ch[1] == WILD
        )


def build_program(graph: ExecutionGraph) -> Program:
    """Index a graph's ops for the machine (see :class:`Program`)."""
    ops: list[Op] = []
    first: dict[int, int] = {}
    for rank in sorted(graph.timelines):
        first[rank] = len(ops)
        ops.extend(graph.timelines[rank].ops)
    n = len(ops)
    kind = [NOOP] * n
    nbytes: list[int | None] = [None] * n
    channel: list[Channel | None] = [None] * n
    position = [0] * n
    slot = [-1] * n
    counts: dict[tuple[object, ...], int] = defaultdict(int)
    slot_ids: dict[tuple[str, int], int] = {}
    slot_ops: list[list[int]] = []
    for u, op in enumerate(ops):
        tag = op.tag or 0
        if op.error is not None:
            continue
        if op.op == "send" and op.peer is not None:
            kind[u] = SEND
            ch: Channel = (op.gid, op.rank, op.peer, tag)
            channel[u] = ch
            nbytes[u] = op_bytes(op.dtype, op.count)
            position[u] = counts[("s", *ch)]
            counts[("s", *ch)] += 1
        elif op.op == "recv":
            kind[u] = RECV
            ch = (op.gid, op.peer if op.peer is not None else WILD, op.rank, tag)
            channel[u] = ch
            position[u] = counts[("r", *ch)]
            counts[("r", *ch)] += 1
        elif op.kind == "collective":
            where = graph.collective_slot.get((op.rank, op.id))
            if where is None:
                continue
            if where not in slot_ids:
                slot_ids[where] = len(slot_ops)
                slot_ops.append([])
            kind[u] = COLL
            slot[u] = slot_ids[where]
            slot_ops[slot[u]].append(u)
    slot_need: list[int] = []
    slot_missing: list[tuple[int, ...]] = []
    for (gid, index), sid in sorted(slot_ids.items(), key=lambda item: item[1]):
        missing = graph.slots[gid][index].missing
        slot_missing.append(tuple(missing))
        never = any(r in graph.timelines for r in missing)
        slot_need.append(-1 if never else len(slot_ops[sid]))

    batches: dict[tuple[int, int], list[int]] = defaultdict(list)
    for u, op in enumerate(ops):
        if op.batch is not None:
            batches[(op.rank, op.batch)].append(u)

    pinned: dict[int, int] = {}
    for u, op in enumerate(ops):
        if kind[u] != RECV or op.peer is not None or op.src is None:
            continue
        later = graph.timelines[op.rank].ops[op.index + 1 : op.index + 1 + _PIN_LOOKAHEAD]
        following = next((o for o in later if o.kind == "p2p" and o.error is None), None)
        if following is not None and following.peer == op.src:
            pinned[u] = op.src

    steps: dict[int, tuple[tuple[bool, int], ...]] = {}
    for rank, timeline in graph.timelines.items():
        base = first[rank]
        waits: dict[int, list[int]] = defaultdict(list)
        for op in timeline.ops:
            at = op.waited_at
            if at is None and not op.is_async:
                at = op.index + 1
            if at is not None:
                waits[max(at, op.index + 1)].append(base + op.index)
        program: list[tuple[bool, int]] = []
        for op in timeline.ops:
            program.extend((True, w) for w in waits.get(op.index, ()))
            program.append((False, base + op.index))
        program.extend((True, w) for w in waits.get(len(timeline.ops), ()))
        steps[rank] = tuple(program)

    groups = {gid: graph.group_members(gid) for gid in graph.groups}
    for op in ops:
        groups.setdefault(op.gid, graph.group_members(op.gid))
    world = tuple(range(max(graph.world_size, max(graph.timelines, default=-1) + 1)))
    return Program(
        ops=tuple(ops),
        kind=tuple(kind),
        nbytes=tuple(nbytes),
        channel=tuple(channel),
        position=tuple(position),
        slot=tuple(slot),
        slot_ops=tuple(tuple(s) for s in slot_ops),
        slot_need=tuple(slot_need),
        slot_missing=tuple(slot_missing),
        batches=tuple(tuple(b) for _, b in sorted(batches.items())),
        pinned=pinned,
        steps=steps,
        closed=frozenset(r for r, t in graph.timelines.items() if t.ended is not None),
        members=groups,
        world=world,
    )


@dataclass(frozen=True)
class Stuck:
    """A rank of a deadlock: the op it waits on, why that op cannot complete, on whom.

    ``state`` is one of "unmatched" (a send or receive nobody can match), "incomplete" (a
    collective some members never join), "not-launched" (an atomic batch that cannot
    start: some op of it has no posted partner), "queued" (behind an earlier op that
    cannot complete, works completing in issue order), "batch" (its own part is done but
    the rest of its batch is not).
    """

    rank: int
    op: int
    state: str
    waits_on: tuple[int, ...]
    note: str = ""
    queued: int = 0  # later ops of the rank that wait behind it (issue-order completion)


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
        self.senders: dict[RecvKey, set[int]] = defaultdict(set)
        self.recvs: dict[RecvKey, list[int]] = defaultdict(list)
        self.dirty: set[RecvKey] = set()
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
            stuck=self.stuck(options),
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
        if self.m.semantics.independent_groups:
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
                key = (channel[0], channel[2], channel[3])
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
        if not self.m.semantics.independent_groups:
            queue = self.stream[self.p.ops[u].rank]
            queue.popleft()
            if queue:
                self.starts.append(queue[0])

    # -- matching --------------------------------------------------------------------------

    def _recv_key(self, u: int) -> RecvKey:
        channel = self.p.channel[u]
        assert channel is not None
        return (channel[0], channel[2], channel[3])

    def _acceptor(self, key: RecvKey, sender: int) -> int | None:
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

    def _pair(self, key: RecvKey, sender: int, r: int) -> None:
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

    # -- deadlock ----------------------------------------------------------------------------

    def _peers(self, u: int) -> set[int]:
        """The ranks whose posting or progress the op needs."""
        p = self.p
        op = p.ops[u]
        kind = p.kind[u]
        if kind == COLL:
            sid = p.slot[u]
            waiting = {p.ops[v].rank for v in p.slot_ops[sid] if not self.active[v]}
            return (waiting | set(p.slot_missing[sid])) - {op.rank}
        if kind in (SEND, RECV):
            channel = p.channel[u]
            assert channel is not None
            other = channel[2] if kind == SEND else channel[1]
            if other == WILD:
                return set(p.members.get(op.gid, p.world)) - {op.rank}
            return {other}
        return set()

    def _waits(self, u: int) -> tuple[set[int], str]:
        p = self.p
        unit = self.m.unit_of[u]
        if not self.active[u]:
            if unit in self.pending:
                needs = [v for v in self.m.units[unit] if not self.launchable(v)]
                return set().union(*(self._peers(v) for v in needs)), "not-launched"
            queue = self.stream.get(p.ops[u].rank)
            if queue and queue[0] != unit:
                head = self.m.members_of(queue[0])
                found: set[int] = set()
                for v in head:
                    if not self.ok[v]:
                        found |= self._waits(v)[0]
                return found, "queued"
            return set(), "not-launched"
        if not self.ok[u]:
            return self._peers(u), "incomplete" if p.kind[u] == COLL else "unmatched"
        others: set[int] = set()
        for v in self.m.members_of(unit):
            if not self.ok[v]:
                others |= self._waits(v)[0]
        return others, "batch"

    def stuck(self, options: list[tuple[int, int]]) -> tuple[Stuck, ...]:
        """Blocked ranks that nothing can release: each waits only on ranks of the set or
        on ranks that have ended; ranks that may still act (running, or with an open
        choice) release those waiting on them."""
        if not self.blocked:
            return ()
        free = {r for r in self.p.world if r not in self.blocked and r not in self.p.closed}
        movable = {self.p.ops[w].rank for w, _ in options}
        waits = {rank: self._waits(u) for rank, u in self.blocked.items()}
        released = movable & set(waits)
        changed = True
        while changed:
            changed = False
            for rank, (targets, _) in waits.items():
                if rank not in released and targets & (free | movable | released):
                    released.add(rank)
                    changed = True
        return tuple(
            Stuck(
                rank,
                self.blocked[rank],
                waits[rank][1],
                tuple(sorted(waits[rank][0])),
                self._note(self.blocked[rank], waits[rank][1]),
                max(0, len(self.stream.get(rank, ())) - 1),
            )
            for rank in sorted(waits)
            if rank not in released
        )

    def _note(self, u: int, state: str) -> str:
        """A sentence on why a batch cannot start or finish."""
        unit = self.m.unit_of[u]
        if unit not in self.m.units:
            return ""
        members = self.m.units[unit]
        if state == "not-launched":
            ready = sum(1 for v in members if self.launchable(v))
            return (
                f"only {ready} of the {len(members)} ops of its batch have a partner posted, "
                "and the batch launches as one unit"
            )
        if state == "batch":
            done = sum(1 for v in members if self.ok[v])
            return f"{len(members) - done} of the {len(members)} ops of its batch cannot complete"
        return ""
