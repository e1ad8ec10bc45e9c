"""Gradient fusion that depends on each rank's ready order: the other fusions a run allows.

Frameworks fuse many small tensors into one collective.  Where each rank fuses the
tensors *in the order they become ready on that rank* (Horovod-style fusion without
negotiation, hand-written bucketing in a backward hook), two ranks whose timing differs
fuse different tensors into their i-th collective: the sizes differ (gloo aborts the
process, NCCL hangs or reads garbage), the number of collectives differs (the rank with
more hangs in the extra one), or, same size, the sums mix unrelated tensors.  A run in
which every rank happened to fuse identically shows none of it.

What the trace shows
    ``all_reduce_coalesced`` records the element count of each fused tensor (its
    ``splits``).  A *fusion window* is a maximal run of a rank's consecutive
    ``all_reduce_coalesced`` ops on one group (no other collective of the group in
    between) issued from one source line with one dtype and reduce op: the buckets of
    one fusion pass, or of several when a loop repeats them (a run of buckets that
    repeats the same tensors is cut into passes, :func:`split_passes`).  A fusion done
    by ``torch.cat`` + ``all_reduce`` shows only each
    bucket's total, so no other fusion of the same tensors can be derived from it (a
    known gap; use ``all_reduce_coalesced``, which gloo and NCCL fuse themselves).

The model (:func:`fusion_witnesses` with ``assume=True``, ``dl2 predict --fusion``)
    The tensors of a window may become ready in any order on each rank, and each rank
    fuses them greedily in its ready order into buckets of at most F tensors or B bytes
    (a larger tensor goes alone), F being the most tensors of a recorded bucket and B the
    most bytes of a recorded bucket of several tensors: limits the recording proves the
    policy allows.
    Greedy fusion of the recorded order under these limits gives back the recorded
    buckets (checked: a window it does not is left alone, as it does not follow the
    model).  Another order whose buckets hold other tensors is a witness.  Tensors are
    told apart by their size only, and buckets are compared as multisets (a bucket laid
    out in another order is not reported).

What is reported by default
    Only windows the run itself proves order-dependent: a rank whose windows over the
    same tensors (same line, same sizes) were fused differently at different steps,
    unless every rank fused exactly as the others at every pass there (the order was
    agreed, e.g. from all-reduced norms) or the shapes repeat a fixed cycle.
    Any other window is reported only under the model, because its trace is also that
    of static bucketing (fixed buckets in a fixed order, as DDP does), which never
    diverges: one clean run cannot tell the two apart.
"""

from __future__ import annotations

from collections import Counter
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from dl2.analysis.describe import op_ref
from dl2.analysis.describe import rank_list
from dl2.analysis.describe import where
from dl2.model.dtypes import dtype_itemsize
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.ops import Op
from dl2.report import Finding
from dl2.report import FindingKind

__all__ = [
    "FusionWindow",
    "FusionWitness",
    "alternative_fusion",
    "fuse",
    "fusion_findings",
    "fusion_windows",
    "fusion_witnesses",
    "split_passes",
]

Buckets = tuple[tuple[int, ...], ...]  # per bucket, the element count of each tensor

#: Windows with more tensors than this are not searched (the pair search is cubic).
MAX_TENSORS = 256

_HINT = (
    "Decide the fusion buckets once, identically on every rank (from the parameter order, "
    "or agreed with the other ranks as DDP and Horovod do), not from each rank's own ready order."
)


@dataclass(frozen=True)
class FusionWindow:
    """The buckets of one fusion pass of one rank.

    Attributes:
        rank: the rank; ``gid`` the group.
        ops: its all_reduce_coalesced ops, in order.
        buckets: each op's per-tensor element counts.
        itemsize: bytes per element.
    """

    rank: int
    gid: str
    ops: tuple[Op, ...]
    buckets: Buckets
    itemsize: int

    @property
    def site(self) -> tuple[str, int] | None:
        frame = self.ops[0].frame
        return (frame.file, frame.line) if frame is not None else None

    @property
    def tensors(self) -> tuple[int, ...]:
        return tuple(n for bucket in self.buckets for n in bucket)

    @property
    def limits(self) -> tuple[int, int]:
        """The tightest limits the recorded buckets prove: (most tensors of a bucket, most
        bytes of a bucket of several tensors).  A tensor alone in its bucket may exceed
        the byte limit (it goes alone), so single-tensor buckets say nothing of it."""
        shared = [sum(b) * self.itemsize for b in self.buckets if len(b) > 1]
        return (
            max(len(b) for b in self.buckets),
            max(shared) if shared else max(sum(b) * self.itemsize for b in self.buckets),
        )


@dataclass(frozen=True)
class FusionWitness:
    """Two fusions of one window's tensors that ranks may take.

    Attributes:
        window: the window as one rank recorded it.
        ranks: the ranks that share it (each may fuse either way).
        alternative: the other fusion (per bucket, per-tensor element counts).
        consequence: "size-mismatch" (the first differing collective has another size on
            each side), "extra-collective" (one side issues more collectives) or
            "wrong-sums" (same sizes, different tensors).
        bucket: the index in the window of the first collective that differs.
        observed: the run itself fused these tensors differently at different steps
            (proof of order dependence), rather than only under the model.
    """

    window: FusionWindow
    ranks: tuple[int, ...]
    alternative: Buckets
    consequence: str
    bucket: int
    observed: bool = False


def fuse(order: Sequence[int], itemsize: int, count_limit: int, byte_limit: int) -> Buckets:
    """Greedy fusion of tensors (element counts) ready in ``order``: at most
    ``count_limit`` tensors or ``byte_limit`` bytes per bucket, a larger tensor alone."""
    out: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0
    for n in order:
        if current and (len(current) >= count_limit or size + n * itemsize > byte_limit):
            out.append(tuple(current))
            current, size = [], 0
        current.append(n)
        size += n * itemsize
    if current:
        out.append(tuple(current))
    return tuple(out)


def _shape(buckets: Buckets) -> tuple[tuple[int, ...], ...]:
    """Buckets compared as multisets (their layout order does not matter)."""
    return tuple(tuple(sorted(b)) for b in buckets)


def alternative_fusion(window: FusionWindow) -> Buckets | None:
    """Another fusion of the window's tensors under the model, or None.

    None when the window has one bucket, when greedy fusion of the recorded order does
    not give back the recorded buckets (not this kind of fusion), or when no order that
    swaps two tensors of the recorded one (the closest first), nor the reversed order,
    fuses other tensors together.
    """
    tensors = list(window.tensors)
    if len(window.buckets) < 2 or len(tensors) > MAX_TENSORS:
        return None
    count_limit, byte_limit = window.limits
    itemsize = window.itemsize
    recorded = _shape(window.buckets)
    if _shape(fuse(tensors, itemsize, count_limit, byte_limit)) != recorded:
        return None
    candidates: list[list[int]] = []
    for distance in range(1, len(tensors)):  # the closest swaps first: the smallest change
        for i in range(len(tensors) - distance):
            j = i + distance
            if tensors[i] != tensors[j]:
                order = list(tensors)
                order[i], order[j] = order[j], order[i]
                candidates.append(order)
    candidates.append(tensors[::-1])
    for order in candidates:
        other = fuse(order, itemsize, count_limit, byte_limit)
        if _shape(other) != recorded:
            return other
    return None


def _consequence(recorded: Buckets, other: Buckets) -> tuple[str, int]:
    a, b = _shape(recorded), _shape(other)
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return ("size-mismatch" if sum(x) != sum(y) else "wrong-sums"), index
    return "extra-collective", min(len(a), len(b))


def fusion_windows(graph: ExecutionGraph) -> list[FusionWindow]:
    """Every rank's fusion windows, in rank and program order."""
    windows: list[FusionWindow] = []
    for rank in sorted(graph.timelines):
        if not graph.issued(rank, "all_reduce_coalesced"):
            continue  # no window (and no op built)
        runs: dict[str, list[Op]] = {}  # group -> the window being collected
        for op in graph.timelines[rank].ops:
            if op.kind != "collective":
                continue
            fusable = (
                op.op == "all_reduce_coalesced"
                and op.splits is not None
                and len(op.splits) == 1
                and op.error is None
            )
            current = runs.get(op.gid)
            if current and not (fusable and _same_pass(current[-1], op)):
                windows.extend(_windows(rank, op.gid, runs.pop(op.gid)))
            if fusable:
                runs.setdefault(op.gid, []).append(op)
        for gid, ops in sorted(runs.items()):
            windows.extend(_windows(rank, gid, ops))
    return windows


def _same_pass(a: Op, b: Op) -> bool:
    return (a.frame, a.dtype, a.redop) == (b.frame, b.dtype, b.redop)


def _windows(rank: int, gid: str, ops: list[Op]) -> list[FusionWindow]:
    """The passes of a run of consecutive fused collectives (see :func:`split_passes`)."""
    itemsize = dtype_itemsize(ops[0].dtype) or 1
    buckets = [tuple(op.splits[0]) if op.splits else () for op in ops]
    out = []
    start = 0
    for length in split_passes(buckets):
        out.append(
            FusionWindow(
                rank,
                gid,
                tuple(ops[start : start + length]),
                tuple(buckets[start : start + length]),
                itemsize,
            )
        )
        start += length
    return out


def split_passes(buckets: Sequence[tuple[int, ...]]) -> list[int]:
    """Cut consecutive buckets into fusion passes: the lengths of the passes.

    A training loop fuses the same tensors at every step, and nothing needs to separate
    two steps' collectives: the passes are the shortest prefix whose tensors (as a
    multiset) the rest of the buckets repeat, segment after segment; a single pass when
    there is no such prefix.
    """
    n = len(buckets)
    for period in range(1, n // 2 + 1):
        target = Counter(t for b in buckets[:period] for t in b)
        lengths: list[int] = []
        i = 0
        while i < n:
            seen: Counter[int] = Counter()
            j = i
            while j < n and seen != target:
                seen.update(buckets[j])
                j += 1
                if any(seen[t] > target[t] for t in seen):
                    break
            if seen != target:
                break
            lengths.append(j - i)
            i = j
        if i == n and len(lengths) >= 2:
            return lengths
    return [n] if n else []


#: (group, line) -> rank -> the shapes of its passes there, in order
SiteShapes = dict[tuple[str, object], dict[int, list[object]]]


def _site_shapes(windows: Sequence[FusionWindow]) -> SiteShapes:
    """(group, line) -> rank -> the shapes of its passes there, in order."""
    shapes: SiteShapes = defaultdict(lambda: defaultdict(list))
    for window in windows:
        shapes[(window.gid, window.site)][window.rank].append(_shape(window.buckets))
    return shapes


def _cyclic_sites(shapes: SiteShapes) -> set[tuple[int, str, object]]:
    """The (rank, group, line) fusion sites whose passes repeat one cycle of two or more
    shapes, seen at least twice through (``A B A B``): a fixed order of several passes."""
    found = set()
    for (gid, site), by_rank in shapes.items():
        for rank, seen in by_rank.items():
            period = smallest_period(seen)
            # a cycle of one shape is a cycle of two as well (A A A A): no variants there
            if len(seen) >= 2 * max(period, 2):
                found.add((rank, gid, site))
    return found


def _agreed_sites(shapes: SiteShapes) -> set[tuple[int, str, object]]:
    """The (rank, group, line) fusion sites at which every rank that fused there fused
    the same way as every other, pass after pass (two ranks or more): the order is
    agreed between ranks (computed from all-reduced values, or from the step's shared
    data), so a rank's passes fused two ways prove nothing of its own ready order."""
    found: set[tuple[int, str, object]] = set()
    for (gid, site), by_rank in shapes.items():
        sequences = list(by_rank.values())
        if len(sequences) >= 2 and all(seq == sequences[0] for seq in sequences[1:]):
            found.update((rank, gid, site) for rank in by_rank)
    return found


def smallest_period(seen: Sequence[object]) -> int:
    """The smallest p with ``seen[i] == seen[i - p]`` for every i >= p, in one pass (the
    prefix function of string matching: a history of 10^5 passes costs 10^5 steps)."""
    border = [0] * len(seen)  # longest proper prefix of seen[:i + 1] that is also a suffix
    for i in range(1, len(seen)):
        k = border[i - 1]
        while k and seen[i] != seen[k]:
            k = border[k - 1]
        if seen[i] == seen[k]:
            k += 1
        border[i] = k
    return len(seen) - border[-1] if seen else 0


def fusion_witnesses(graph: ExecutionGraph, *, assume: bool = False) -> list[FusionWitness]:
    """The fusion divergences of a run: those it proves (the same tensors fused differently
    at different steps of a rank), and with ``assume`` every window the model allows to
    fuse otherwise.  One witness per distinct window (line, group, buckets)."""
    windows = fusion_windows(graph)
    by_key: dict[tuple[object, ...], list[FusionWindow]] = defaultdict(list)
    for window in windows:
        by_key[(window.gid, window.site, _shape(window.buckets))].append(window)
    witnesses: list[FusionWitness] = []
    # Proof: one rank, one line, the same tensors, fused two ways; not in a fixed cycle
    # (two modules whose tensors have the same sizes, fused in their own fixed orders
    # at one line, alternate the same two shapes at every step, by no one's timing),
    # nor identically on every rank at every pass (an agreed order)
    shapes = _site_shapes(windows)
    unproven = _cyclic_sites(shapes) | _agreed_sites(shapes)
    variants: dict[tuple[object, ...], dict[tuple[object, ...], FusionWindow]] = defaultdict(dict)
    for window in windows:
        if (window.rank, window.gid, window.site) in unproven:
            continue
        tensors = tuple(sorted(window.tensors))
        variants[(window.rank, window.gid, window.site, tensors)].setdefault(
            _shape(window.buckets), window
        )
    proven: set[tuple[object, ...]] = set()
    for _, seen in sorted(variants.items(), key=lambda kv: str(kv[0])):
        if len(seen) < 2:
            continue
        first, second = list(seen.values())[:2]
        key: tuple[object, ...] = (first.gid, first.site, _shape(first.buckets))
        if key in proven:
            continue
        proven.update((first.gid, first.site, shape) for shape in seen)
        consequence, bucket = _consequence(first.buckets, second.buckets)
        ranks = tuple(sorted({w.rank for w in by_key[key]} | {first.rank}))
        witnesses.append(
            FusionWitness(
                first, _members(graph, first.gid, ranks), second.buckets, consequence, bucket, True
            )
        )
    if assume:
        for key, group in by_key.items():
            if key in proven:
                continue
            window = group[0]
            other = alternative_fusion(window)
            if other is None:
                continue
            consequence, bucket = _consequence(window.buckets, other)
            ranks = tuple(sorted({w.rank for w in group}))
            witnesses.append(
                FusionWitness(
                    window, _members(graph, window.gid, ranks), other, consequence, bucket
                )
            )
    return witnesses


def _members(graph: ExecutionGraph, gid: str, ranks: tuple[int, ...]) -> tuple[int, ...]:
    members = tuple(sorted(graph.group_members(gid)))
    return members if len(members) > 1 else ranks


def describe_buckets(buckets: Buckets, itemsize: int) -> str:
    """``[64+256] [1024+4096]`` (element counts of the fused tensors)."""
    return " ".join("[" + "+".join(str(n) for n in b) + "]" for b in buckets)


_CONSEQUENCES = {
    "size-mismatch": (
        "collective #{n} of the pass would differ in size between ranks ({a} vs {b} elements): "
        "gloo aborts the process, NCCL hangs or reads garbage"
    ),
    "extra-collective": (
        "one rank would issue {extra} more all_reduce_coalesced than another and hang in it"
    ),
    "wrong-sums": (
        "collective #{n} of the pass would have the same size on each rank but hold other "
        "tensors: the sums silently mix unrelated tensors"
    ),
}


def witness_sentence(witness: FusionWitness) -> str:
    window = witness.window
    recorded = describe_buckets(window.buckets, window.itemsize)
    other = describe_buckets(witness.alternative, window.itemsize)
    a = sum(window.buckets[witness.bucket]) if witness.bucket < len(window.buckets) else 0
    b = sum(witness.alternative[witness.bucket]) if witness.bucket < len(witness.alternative) else 0
    effect = _CONSEQUENCES[witness.consequence].format(
        n=witness.bucket,
        a=a,
        b=b,
        extra=abs(len(window.buckets) - len(witness.alternative)),
    )
    count_limit, byte_limit = window.limits
    how = (
        f"rank {window.rank} fused the same tensors both ways at different steps"
        if witness.observed
        else (
            f"the tensors may become ready in another order on another rank; buckets of at "
            f"most {count_limit} tensors or {byte_limit:,} bytes, as recorded"
        )
    )
    return (
        f"The fusion pass at {where(window.ops[0])} on group {window.gid} depends on each "
        f"rank's ready order: recorded {recorded}, but {other} is as possible ({how}); "
        f"if {rank_list(list(witness.ranks))} fuse differently, {effect}."
    )


def fusion_findings(graph: ExecutionGraph, *, assume: bool = False) -> list[Finding]:
    """One potential-deadlock finding per fusion witness."""
    findings = []
    for witness in fusion_witnesses(graph, assume=assume):
        window = witness.window
        findings.append(
            Finding(
                kind=FindingKind.POTENTIAL_DEADLOCK,
                ranks=witness.ranks,
                ops=tuple(op_ref(op) for op in window.ops),
                message=witness_sentence(witness),
                hint=_HINT,
                group=window.gid,
            )
        )
    return findings
