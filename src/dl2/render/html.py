"""The HTML report: one self-contained page a person can open, keep and show.

:func:`render_html` is a pure function from a :class:`~dl2.report.Report` (and, when
there is one, the run's :class:`~dl2.model.execution_graph.ExecutionGraph`, for each
rank's recent operations) to the text of one HTML file: inline CSS, a few lines of
inline script that only open a folded row when a node is clicked, no network access.

Top to bottom: the verdict headline; the wait-for graph (ranks as nodes, each wait an
edge labelled with its op, group, sequence number and source line, the deadlock cycle
in red); the first divergence side by side; a per-rank timeline of communication ops
with the stuck ops marked; the findings with their source lines and fix hints; the
warnings.  Ranks in the same state fold into one node or row (``ranks 2-1023``) that a
``<details>`` element unfolds.

The page is drawn by a Jinja2 template (``templates/report.html.j2``) with autoescape
on: every string from a trace (file, function and group names, the command line) is
escaped there, never pasted into markup here.  The graph layout comes from networkx
(a spring layout with the cycle's ranks pinned on a circle); this module only turns the
computed positions into SVG coordinates.  Both live in the ``html`` extra and are
imported when a page is rendered, so ``import dl2.render`` stays light.
"""

from __future__ import annotations

import importlib.util as importlib_util
import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import ClassVar

from dl2.errors import ConfigError
from dl2.model.stuck import RankStatus
from dl2.ranks import rank_runs
from dl2.ranks import ranks_phrase
from dl2.render.base import Renderer
from dl2.render.console import RECV_OPS
from dl2.render.console import SEND_OPS
from dl2.render.console import cycle_line
from dl2.render.console import headline
from dl2.render.console import merged_ops
from dl2.render.console import op_label
from dl2.render.console import peer_label
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.report import OpRef
from dl2.report import RankState
from dl2.report import Report
from dl2.report import Verdict
from dl2.report import op_ref

if TYPE_CHECKING:
    from dl2.model.execution_graph import CollectiveSlot
    from dl2.model.execution_graph import ExecutionGraph
    from dl2.model.ops import Op

#: the packages the page needs (the ``html`` extra)
EXTRA_MODULES = ("jinja2", "networkx", "numpy")
EXTRA_HINT = "pip install 'dl2[html]'"

# Caps that keep a large job's page small and readable; what is left out is counted.
MAX_NODES = 40  # graph nodes after folding
MAX_CYCLE_NODES = 16  # cycle ranks drawn one by one
MAX_ROWS = 48  # timeline rows after folding
MAX_OPS = 12  # ops per timeline row (the latest)
MAX_MEMBERS = 256  # ranks listed when a folded node unfolds
MAX_COLUMNS = 16  # columns of the divergence table
MAX_FINDINGS = 50
MAX_FINDING_OPS = 16
MAX_WARNINGS = 200
MAX_LABELLED = 12  # edges all labelled up to this many
MAX_LABEL = 28  # characters of a group or file name drawn in the graph

# Node geometry (SVG user units, about CSS pixels).
_NODE_H = 46.0
_CHAR_W = 7.2
_GAP = 70.0
_MARGIN = 40.0


def html_available() -> str | None:
    """None when the ``html`` extra is installed, else the one-line reason it is not."""
    missing = [m for m in EXTRA_MODULES if importlib_util.find_spec(m) is None]
    if not missing:
        return None
    return f"the HTML report needs the 'html' extra ({', '.join(missing)} missing): {EXTRA_HINT}"


def render_html(report: Report, graph: ExecutionGraph | None = None) -> str:
    """The whole page for ``report``, as text.

    Args:
        report: what to show (the renderer never recomputes a verdict or a finding).
        graph: the run's execution graph, for each rank's latest ops and the first
            collective where ranks diverge; without it the timeline shows where each
            rank stopped.

    Raises:
        ConfigError: the ``html`` extra is not installed.
    """
    missing = html_available()
    if missing is not None:
        raise ConfigError(missing)
    page = build_page(report, graph)
    text: str = _template().render(page=page)
    return text


class HtmlRenderer(Renderer):
    """:func:`render_html` as a renderer, for :func:`~dl2.render.base.write_report`.

    Args:
        graph: the run's execution graph (see :func:`render_html`), if at hand.
    """

    name: ClassVar[str] = "html"
    output_file_extension: ClassVar[str] = "html"

    def __init__(self, *, graph: ExecutionGraph | None = None) -> None:
        self.graph = graph

    def render(self, report: Report) -> str:
        return render_html(report, self.graph)


# -- the page's data ---------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One rank of a folded node, as its unfolded row shows it."""

    rank: int
    status: str
    op: str
    waits_on: str
    location: str


@dataclass
class Node:
    """A node of the wait-for graph: one rank, or ranks in the same state."""

    id: str
    ranks: tuple[int, ...]
    title: str  # "rank 0", "ranks 2-1023"
    state: str  # "send→1", "exited"
    summary: str  # "ranks 2-1023: blocked in barrier(group 0 #41) at train.py:80"
    css: str  # cycle | deadlock | blocked | spinning | running | exited | failed | no-trace
    members: tuple[Member, ...]
    more_members: int
    op: OpRef | None
    any_of: bool
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = _NODE_H


@dataclass(frozen=True)
class Edge:
    """A wait drawn from the waiting node to the node it waits on."""

    path: str
    css: str  # cycle | deadlock | wait, plus " any" for an any-of wait
    label: tuple[str, ...]
    title: str
    lx: float
    ly: float
    half_w: float = 0.0  # half the label's box
    half_h: float = 0.0


@dataclass(frozen=True)
class Chip:
    """One op in a timeline row."""

    label: str
    css: str
    title: str


@dataclass(frozen=True)
class Row:
    """A timeline row: one rank, or ranks whose latest ops read the same."""

    title: str
    ranks_text: str
    earlier: int  # ops before the first shown
    chips: tuple[Chip, ...]
    end: str  # the rank's state at the end
    css: str
    folded: bool


@dataclass(frozen=True)
class Column:
    """One side of the divergence: the ranks that issued the same op there."""

    title: str
    op: str
    detail: str
    location: str
    css: str


@dataclass(frozen=True)
class Divergence:
    """Where the ranks' programs part, side by side."""

    title: str
    note: str
    columns: tuple[Column, ...]
    more: int


@dataclass(frozen=True)
class OpRow:
    ranks: str
    call: str
    detail: str
    location: str


@dataclass(frozen=True)
class FindingView:
    kind: str
    css: str
    title: str
    message: str
    ranks: str
    cycle: str
    hint: str
    ops: tuple[OpRow, ...]
    more_ops: int


@dataclass
class Page:
    """Everything the template draws; every string still unescaped."""

    verdict: str
    verdict_css: str
    headline: str
    world_size: int
    job: tuple[tuple[str, str], ...]
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0
    graph_note: str = ""
    divergence: Divergence | None = None
    rows: list[Row] = field(default_factory=list)
    more_rows: int = 0
    timeline_title: str = ""
    timeline_note: str = ""
    findings: list[FindingView] = field(default_factory=list)
    more_findings: int = 0
    warnings: tuple[str, ...] = ()
    more_warnings: int = 0
    legend: tuple[tuple[str, str], ...] = ()

    @property
    def cycle_edges(self) -> bool:
        return any(e.css.startswith("cycle") for e in self.edges)

    @property
    def any_edges(self) -> bool:
        return any(e.css.endswith(" any") for e in self.edges)


def build_page(report: Report, graph: ExecutionGraph | None = None) -> Page:
    """The page's data: what each section shows, laid out, still unescaped."""
    page = Page(
        verdict=report.verdict.value,
        verdict_css=_VERDICT_CSS[report.verdict],
        headline=headline(report),
        world_size=report.world_size,
        job=_job_items(report.job),
    )
    _wait_for_graph(page, report)
    page.divergence = _divergence(report, graph)
    _timeline(page, report, graph)
    page.findings = [_finding_view(f, report) for f in report.findings[:MAX_FINDINGS]]
    page.more_findings = max(0, len(report.findings) - MAX_FINDINGS)
    page.warnings = report.warnings[:MAX_WARNINGS]
    page.more_warnings = max(0, len(report.warnings) - MAX_WARNINGS)
    shown = {n.css for n in page.nodes}
    page.legend = tuple((css, text) for css, text in _LEGEND if css in shown)
    return page


_VERDICT_CSS = {
    Verdict.OK: "ok",
    Verdict.DEADLOCK: "bad",
    Verdict.HANG: "bad",
    Verdict.DEFECT: "warn",
    Verdict.INCOMPLETE: "warn",
    Verdict.INTERRUPTED: "note",
    Verdict.JOB_FAILED: "note",
}

_LEGEND = (
    ("cycle", "deadlock cycle"),
    ("deadlock", "deadlocked (waits on the cycle)"),
    ("blocked", "blocked, may still be released"),
    ("running", "running / spinning"),
    ("exited", "exited"),
    ("failed", "failed"),
    ("killed", "killed by a signal"),
    ("no-trace", "no trace"),
)


def _job_items(job: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    items = []
    for key in sorted(job, key=str):
        value = job[key]
        if isinstance(value, list | tuple):
            value = " ".join(str(v) for v in value)
        items.append((str(key), str(value)))
    return tuple(items)


# -- the wait-for graph ------------------------------------------------------------------


def _deadlock_sets(report: Report) -> tuple[tuple[int, ...], frozenset[int]]:
    """The first deadlock finding's cycle (in order) and every deadlocked rank."""
    cycle: tuple[int, ...] = ()
    stuck: set[int] = set()
    for f in report.findings:
        if f.kind is FindingKind.DEADLOCK:
            stuck.update(f.ranks)
            if f.cycle and not cycle:
                cycle = f.cycle
    return cycle, frozenset(stuck)


def _state_text(state: RankState) -> str:
    if state.op is None:
        return state.status.value
    return op_label(state.op)


def _where(op: OpRef | None) -> str:
    if op is None or op.location == "?":
        return ""
    return op.call_path


def _waits_text(state: RankState) -> str:
    if not state.waits_on:
        return ""
    ranks = ",".join(rank_runs(state.waits_on))
    return f"any of {ranks}" if state.any_of and len(state.waits_on) > 1 else ranks


def _node_css(state: RankState, cycle: frozenset[int], deadlocked: frozenset[int]) -> str:
    if state.rank in cycle:
        return "cycle"
    if state.rank in deadlocked:
        return "deadlock"
    if state.status is RankStatus.SPINNING:
        return "running"
    return state.status.value


def _fold_keys(
    states: Sequence[RankState], cycle: tuple[int, ...], deadlocked: frozenset[int]
) -> dict[int, tuple[object, ...]]:
    """rank -> the key of its node: the finest folding that keeps the graph small."""
    in_cycle = frozenset(cycle)
    solo = len(cycle) <= MAX_CYCLE_NODES

    def level1(s: RankState) -> tuple[object, ...]:
        op = s.op
        return (
            s.rank if s.rank in in_cycle else None,
            s.status,
            s.rank in deadlocked,
            op_label(op) if op else None,
            _where(op),
            s.any_of,
        )

    def level2(s: RankState) -> tuple[object, ...]:
        op = s.op
        return (
            s.rank if s.rank in in_cycle and solo else None,
            s.status,
            s.rank in deadlocked,
            s.rank in in_cycle,
            (op.op, op.group, op.seq, _where(op)) if op else None,
        )

    def level3(s: RankState) -> tuple[object, ...]:
        return (s.status, s.rank in deadlocked, s.rank in in_cycle)

    keys: dict[int, tuple[object, ...]] = {}
    for level in (level1, level2, level3):
        keys = {s.rank: level(s) for s in states}
        if len(set(keys.values())) <= MAX_NODES:
            break
    return keys


def _wait_for_graph(page: Page, report: Report) -> None:
    states = sorted(report.ranks, key=lambda s: s.rank)
    if not states:
        page.graph_note = "No rank left a trace: there is no graph to draw."
        return
    cycle, deadlocked = _deadlock_sets(report)
    in_cycle = frozenset(cycle)
    keys = _fold_keys(states, cycle, deadlocked)
    groups: dict[tuple[object, ...], list[RankState]] = {}
    for s in states:
        groups.setdefault(keys[s.rank], []).append(s)
    nodes: list[Node] = []
    node_of: dict[int, Node] = {}
    for members in sorted(groups.values(), key=lambda m: m[0].rank):
        node = _node(len(nodes), members, in_cycle, deadlocked)
        nodes.append(node)
        for s in members:
            node_of[s.rank] = node
    # edges: node -> node, one per pair, from the waiting ranks' states
    waits: dict[tuple[str, str], list[RankState]] = {}
    for s in states:
        for target in s.waits_on:
            if target in node_of:
                waits.setdefault((node_of[s.rank].id, node_of[target].id), []).append(s)
    by_id = {n.id: n for n in nodes}
    cycle_pairs = {(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))}
    _layout(nodes, list(waits), [node_of[r].id for r in cycle if r in node_of], bool(waits))
    styled = []
    for (src_id, dst_id), sources in waits.items():
        src, dst = by_id[src_id], by_id[dst_id]
        on_cycle = any((s.rank, t) in cycle_pairs for s in sources for t in dst.ranks)
        css = "cycle" if on_cycle else "deadlock" if src.css in ("cycle", "deadlock") else "wait"
        if all(s.any_of for s in sources):
            css += " any"
        styled.append((src, dst, sources[0], css))
    # every edge is labelled in a small graph; in a busy one, the cycle's edges and one
    # edge of each other waiting node (the others say it on hover)
    labelled: set[int] = set()
    seen: set[str] = set()
    for i, (src, _, _, css) in enumerate(styled):
        if len(styled) <= MAX_LABELLED or css.startswith("cycle") or src.id not in seen:
            labelled.add(i)
            seen.add(src.id)
    if len(labelled) < len(styled):
        page.graph_note = (page.graph_note + " Hover an unlabelled arrow for its op.").strip()

    def draw() -> list[Edge]:
        return [
            _edge(src, dst, state, css, i in labelled)
            for i, (src, dst, state, css) in enumerate(styled)
        ]

    edges = draw()
    # shift everything so that the labels outside the nodes stay on the canvas
    left = min([n.x - n.w / 2 for n in nodes] + [e.lx - e.half_w for e in edges])
    top = min([n.y - n.h / 2 for n in nodes] + [e.ly - e.half_h for e in edges])
    for node in nodes:
        node.x += _MARGIN - left
        node.y += _MARGIN - top
    edges = draw()
    # cycle edges last, so that they are drawn on top
    edges.sort(key=lambda e: e.css.startswith("cycle"))
    page.nodes, page.edges = nodes, edges
    right = max([n.x + n.w / 2 for n in nodes] + [e.lx + e.half_w for e in edges])
    bottom = max([n.y + n.h / 2 for n in nodes] + [e.ly + e.half_h for e in edges])
    page.width, page.height = right + _MARGIN, bottom + _MARGIN
    folded = len(nodes) < len(states)
    if folded:
        folding = (
            f"{len(states)} ranks in {len(nodes)} nodes: ranks in the same state share one; "
            "click a node (or its row below) to list its ranks."
        )
        page.graph_note = f"{folding} {page.graph_note}".strip()


def _node(
    index: int, members: list[RankState], cycle: frozenset[int], dead: frozenset[int]
) -> Node:
    first = members[0]
    ranks = tuple(s.rank for s in members)
    runs = ",".join(rank_runs(ranks))
    if len(runs) > MAX_LABEL:
        runs = runs[: MAX_LABEL - 1] + "…"
    title = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {runs} ({len(ranks)})"
    same_op = all(_state_text(s) == _state_text(first) for s in members)
    state = _state_text(first) if same_op else "various"
    where = _where(first.op) if same_op else ""
    status = first.status.value
    summary = f"{ranks_phrase(ranks)}: {status}"
    if first.op is not None and same_op:
        summary += f" in {op_label(first.op)}"
    if where:
        summary += f" at {where}"
    shown = members[:MAX_MEMBERS]
    rows = tuple(
        Member(s.rank, s.status.value, _state_text(s) if s.op else "", _waits_text(s), _where(s.op))
        for s in shown
    )
    text = max(len(title), len(_clip(state)))
    return Node(
        id=f"n{index}",
        ranks=ranks,
        title=title,
        state=_clip(state),
        summary=summary,
        css=_node_css(first, cycle, dead),
        members=rows,
        more_members=len(members) - len(shown),
        op=first.op if same_op else None,
        any_of=first.any_of,
        w=max(84.0, text * _CHAR_W + 24),
    )


def _clip(text: str, limit: int = MAX_LABEL) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _layout(
    nodes: list[Node], pairs: list[tuple[str, str]], cycle: list[str], labelled: bool
) -> None:
    """Place the nodes: those with waits by a spring layout (networkx), the cycle's
    nodes pinned on a circle first; nodes without any wait in rows below.  With
    ``labelled`` edges, nodes keep room for a label between them."""
    import networkx as nx  # type: ignore[import-untyped]

    linked = {a for pair in pairs for a in pair}
    graph = nx.DiGraph()
    graph.add_nodes_from(n.id for n in nodes if n.id in linked)
    graph.add_edges_from(pairs)
    pos: dict[str, tuple[float, float]] = {}
    if len(graph):
        ring = list(dict.fromkeys(cycle))
        if len(ring) >= 2:
            circle = nx.circular_layout(ring)
            # mirrored, so that the cycle reads from the left, clockwise
            start = {k: (-float(v[0]), float(v[1])) for k, v in circle.items()}
            if len(graph) > len(ring):
                placed = nx.spring_layout(graph, pos=start, fixed=ring, seed=7, k=1.2)
            else:
                placed = start
        elif len(graph) == 1:
            placed = {next(iter(graph)): (0.0, 0.0)}
        else:
            placed = nx.spring_layout(graph, seed=7)
        pos = {k: (float(v[0]), float(v[1])) for k, v in placed.items()}
    by_id = {n.id: n for n in nodes}
    scale = _scale(pos, by_id, labelled)
    scaled = {k: (x * scale, -y * scale) for k, (x, y) in pos.items()}
    left = min([x - by_id[k].w / 2 for k, (x, _) in scaled.items()] or [0.0])
    top = min([y - _NODE_H / 2 for y in (y for _, y in scaled.values())] or [0.0])
    for key, (x, y) in scaled.items():
        node = by_id[key]
        node.x = x - left + _MARGIN
        node.y = y - top + _MARGIN + 50  # room for a self-loop above the top node
    # the others, in rows below
    bottom = max([n.y + n.h / 2 for n in nodes if n.id in pos] or [0.0]) + _GAP
    width = max([n.x + n.w / 2 for n in nodes if n.id in pos] or [0.0])
    width = max(width, 640.0)
    x = _MARGIN
    y = bottom if pos else _MARGIN + _NODE_H / 2
    for node in nodes:
        if node.id in pos:
            continue
        if x + node.w > width and x > _MARGIN:
            x = _MARGIN
            y += _NODE_H + 24
        node.x, node.y = x + node.w / 2, y
        x += node.w + 24


def _scale(
    pos: Mapping[str, tuple[float, float]], nodes: Mapping[str, Node], labelled: bool
) -> float:
    """The factor from layout units to SVG units that keeps every pair of nodes apart."""
    items = list(pos.items())
    scale = 160.0
    gap_x = _GAP + (120.0 if labelled else 0.0)
    gap_y = _GAP + (30.0 if labelled else 0.0)
    for i, (a, (ax, ay)) in enumerate(items):
        for b, (bx, by) in items[i + 1 :]:
            need_x = (nodes[a].w + nodes[b].w) / 2 + gap_x
            need_y = _NODE_H + gap_y
            dx, dy = abs(ax - bx), abs(ay - by)
            fits = min(
                need_x / dx if dx > 1e-6 else math.inf, need_y / dy if dy > 1e-6 else math.inf
            )
            scale = max(scale, min(fits, 900.0))
    return scale


def _edge_label(op: OpRef | None) -> tuple[str, ...]:
    """Two short lines: the op with its group and sequence number, and its source line."""
    if op is None:
        return ("various ops",)
    name = op.op
    if op.op in SEND_OPS:
        name += f"→{peer_label(op.peer)}"
    elif op.op in RECV_OPS:
        name += f"←{peer_label(op.peer)}"
    if op.op.startswith("store_"):
        first = _clip(op_label(op))
    else:
        seq = "" if op.seq is None else f" #{op.seq}"
        first = f"{name}{seq} · group {_clip(op.group, 16)}"
    lines = [first]
    if op.location != "?":
        lines.append(_clip(op.location))
    return tuple(lines)


def _edge(src: Node, dst: Node, state: RankState, css: str, labelled: bool = True) -> Edge:
    label = _edge_label(state.op if src.op is not None or len(src.ranks) == 1 else None)
    title = f"{src.title} waits on {dst.title}"
    if state.op is not None:
        title += f": {op_label(state.op)}"
        if state.op.detail:
            title += f" {state.op.detail}"
        where = _where(state.op)
        if where:
            title += f" at {where}"
    if not labelled:
        label = ()
    half_h = 7.0 * len(label) + 3 if label else 0.0
    half_w = 3.3 * max((len(line) for line in label), default=0) + 4 if label else 0.0
    if src is dst:
        x, y = src.x, src.y - src.h / 2
        path = (
            f"M{x - 14:.1f},{y:.1f} C{x - 44:.1f},{y - 58:.1f} "
            f"{x + 44:.1f},{y - 58:.1f} {x + 14:.1f},{y:.1f}"
        )
        return Edge(path, css, label, title, x, y - 52 - half_h, half_w, half_h)
    ax, ay, bx, by = src.x, src.y, dst.x, dst.y
    dx, dy = bx - ax, by - ay
    length = math.hypot(dx, dy) or 1.0
    # bend to the right of the direction: the two edges of a 2-cycle part, and a cycle
    # drawn clockwise bulges outwards, its labels outside the ring
    nx_, ny_ = dy / length, -dx / length
    bend = min(60.0, 0.18 * length)
    cx, cy = (ax + bx) / 2 + nx_ * bend, (ay + by) / 2 + ny_ * bend
    sx, sy = _border(src, cx, cy)
    ex, ey = _border(dst, cx, cy, pad=5.0)
    path = f"M{sx:.1f},{sy:.1f} Q{cx:.1f},{cy:.1f} {ex:.1f},{ey:.1f}"
    # the label sits just outside the curve's middle, on the side it bends to
    mx, my = 0.25 * sx + 0.5 * cx + 0.25 * ex, 0.25 * sy + 0.5 * cy + 0.25 * ey
    away = abs(nx_) * half_w + abs(ny_) * half_h + 2
    return Edge(path, css, label, title, mx + nx_ * away, my + ny_ * away, half_w, half_h)


def _border(node: Node, tx: float, ty: float, pad: float = 0.0) -> tuple[float, float]:
    """Where the segment from the node's centre towards (tx, ty) leaves its box."""
    dx, dy = tx - node.x, ty - node.y
    if abs(dx) < 1e-9 and abs(dy) < 1e-9:
        return node.x, node.y
    hw, hh = node.w / 2 + pad, node.h / 2 + pad
    t = min(hw / abs(dx) if dx else math.inf, hh / abs(dy) if dy else math.inf)
    return node.x + dx * t, node.y + dy * t


# -- the first divergence ----------------------------------------------------------------


def _divergence(report: Report, graph: ExecutionGraph | None) -> Divergence | None:
    slot = _first_divergent_slot(graph) if graph is not None else None
    if slot is not None:
        return _slot_divergence(slot, {s.rank: s for s in report.ranks})
    states = {s.rank: s for s in report.ranks}
    for f in report.findings:
        if f.kind is FindingKind.DEADLOCK and f.cycle:
            ops = {op.rank: op for op in f.ops}
            refs = [(r, ops.get(r) or (states[r].op if r in states else None)) for r in f.cycle]
            return _columns(
                "Where the cycle's ranks stopped",
                "Each rank of the cycle is blocked in the op below, waiting on the next one.",
                refs,
                "cycle",
            )
    for f in report.findings:
        if len({op.rank for op in f.ops}) >= 2:
            refs = [(op.rank, op) for op in f.ops]
            return _columns(
                f"The ops of the first finding ({f.kind.value})", f.message, refs, "diverge"
            )
    return None


def _first_divergent_slot(graph: ExecutionGraph) -> CollectiveSlot | None:
    """The mismatched (or incomplete) collective slot issued earliest in program order."""
    best: tuple[int, CollectiveSlot] | None = None
    for slots in graph.divergent_slots().values():
        for slot in slots:
            if not slot.mismatched and not slot.missing:
                continue
            if not slot.ops:
                continue
            first = min(op.index for op in slot.ops.values())
            if best is None or first < best[0]:
                best = (first, slot)
    return best[1] if best is not None else None


def _slot_divergence(slot: CollectiveSlot, states: Mapping[int, RankState]) -> Divergence:
    refs: list[tuple[int, OpRef | None]] = [(r, op_ref(op)) for r, op in sorted(slot.ops.items())]
    refs.extend((r, None) for r in slot.missing)
    refs.sort(key=lambda item: item[0])
    what = f"collective #{slot.index} of group {slot.gid}"
    if slot.differing:
        note = f"The members disagree on {', '.join(slot.differing)}."
    else:
        note = f"{ranks_phrase(slot.missing)} never issued it."
    return _columns(f"First divergence: {what}", note, refs, "diverge", states)


def _columns(
    title: str,
    note: str,
    refs: Sequence[tuple[int, OpRef | None]],
    css: str,
    states: Mapping[int, RankState] | None = None,
) -> Divergence:
    """Columns of the ranks' ops (None: not issued, with where the rank is instead)."""
    states = states or {}
    groups: dict[tuple[object, ...], list[int]] = {}
    ops: dict[tuple[object, ...], OpRef | None] = {}
    for rank, op in refs:
        if op is not None:
            key: tuple[object, ...] = (op_label(op), op.detail, _where(op), op.api)
        else:
            state = states.get(rank)
            instead = state.op if state is not None else None
            status = state.status.value if state is not None else ""
            key = ("(not issued)", status, op_label(instead) if instead else "", _where(instead))
        groups.setdefault(key, []).append(rank)
        ops.setdefault(key, op)
    columns = []
    for key, ranks in sorted(groups.items(), key=lambda kv: min(kv[1])):
        op = ops[key]
        if op is not None:
            column = Column(ranks_phrase(ranks), op_label(op), op.detail, _where(op), css)
        else:
            status, instead_op, where = (str(part) for part in key[1:])
            detail = f"instead: {status} in {instead_op}" if instead_op else f"instead: {status}"
            column = Column(ranks_phrase(ranks), "not issued", detail, where, "missing")
        columns.append(column)
    return Divergence(title, note, tuple(columns[:MAX_COLUMNS]), max(0, len(columns) - MAX_COLUMNS))


# -- the timeline ------------------------------------------------------------------------


def _timeline(page: Page, report: Report, graph: ExecutionGraph | None) -> None:
    cycle, deadlocked = _deadlock_sets(report)
    involved = {r for f in report.findings for r in f.ranks}
    states = {s.rank: s for s in report.ranks}
    diverge: set[tuple[int, int]] = set()
    slot = _first_divergent_slot(graph) if graph is not None else None
    if slot is not None:
        diverge = {(op.rank, op.id) for op in slot.ops.values()}
    rows: dict[tuple[object, ...], tuple[list[int], Row]] = {}
    if graph is not None and graph.traced:
        page.timeline_title = "Per-rank timeline"
        page.timeline_note = (
            f"Each rank's latest communication ops (up to {MAX_OPS}), oldest first; "
            "the op a rank is stuck in is marked. Ranks whose ops read the same share a row."
        )
        for rank in graph.traced:
            timeline = graph.timelines[rank]
            ops = timeline.ops[-MAX_OPS:]
            # a rank that ended (failed, exited) is not stuck, whatever call it ended in
            state = states.get(rank)
            ended = state is not None and state.status.gone
            blocked = timeline.blocked if not ended else None
            stuck = {(o.rank, o.id) for o in blocked.ops} if blocked else set()
            chips = tuple(_chip(op, stuck, diverge) for op in ops)
            earlier = ops[0].index if ops else 0
            end = _end_text(states.get(rank))
            css = _node_css(states[rank], frozenset(cycle), deadlocked) if rank in states else ""
            key: tuple[object, ...] = (
                tuple((c.label, c.css, c.title.split(" · ", 1)[-1]) for c in chips),
                end,
                css,
                earlier,
            )
            _add_row(rows, key, rank, chips, earlier, end, css)
    else:
        page.timeline_title = "Where each rank stopped"
        page.timeline_note = "The op each rank was in at the end of its trace."
        for s in sorted(report.ranks, key=lambda s: s.rank):
            chips = ()
            if s.op is not None:
                chips = (_ref_chip(s.op, "stuck" if s.status is RankStatus.BLOCKED else "done"),)
            css = _node_css(s, frozenset(cycle), deadlocked)
            key = (
                tuple((c.label, c.css, c.title.split(" · ", 1)[-1]) for c in chips),
                s.status,
                css,
            )
            _add_row(rows, key, s.rank, chips, 0, _end_text(s), css)
    ordered = sorted(rows.values(), key=lambda item: (not (set(item[0]) & involved), item[0][0]))
    kept = sorted(ordered[:MAX_ROWS], key=lambda item: item[0][0])
    page.rows = [row for _, row in kept]
    page.more_rows = sum(len(ranks) for ranks, _ in ordered[MAX_ROWS:])


def _add_row(
    rows: dict[tuple[object, ...], tuple[list[int], Row]],
    key: tuple[object, ...],
    rank: int,
    chips: tuple[Chip, ...],
    earlier: int,
    end: str,
    css: str,
) -> None:
    if key in rows:
        ranks, _ = rows[key]
        ranks.append(rank)
        text = ",".join(rank_runs(ranks))
        title = f"ranks {_clip(text, 40)}"
        rows[key] = (ranks, Row(title, ranks_phrase(ranks), earlier, chips, end, css, True))
    else:
        rows[key] = ([rank], Row(f"rank {rank}", f"rank {rank}", earlier, chips, end, css, False))


def _end_text(state: RankState | None) -> str:
    if state is None:
        return ""
    if state.status is RankStatus.BLOCKED and state.waits_on:
        return f"blocked, waits on {_waits_text(state)}"
    return state.status.value


def _chip(op: Op, stuck: set[tuple[int, int]], diverge: set[tuple[int, int]]) -> Chip:
    key = (op.rank, op.id)
    if op.error is not None:
        state = "failed"
    elif key in stuck:
        state = "stuck"
    elif op.completed or op.eager:
        state = "done"
    else:
        state = "pending"
    chip = _ref_chip(op_ref(op), state)
    if key in diverge:
        return Chip(chip.label, chip.css + " diverge", chip.title + " · first divergence")
    return chip


def _ref_chip(ref: OpRef, state: str) -> Chip:
    kind = (
        "p2p"
        if ref.op in SEND_OPS | RECV_OPS
        else "store"
        if ref.op.startswith("store_")
        else "group"
        if ref.op == "create_group"
        else "coll"
    )
    label = _short_label(ref)
    parts = [f"rank {ref.rank}", op_label(ref)]
    if ref.detail:
        parts.append(ref.detail)
    where = _where(ref)
    if where:
        parts.append(where)
    parts.append(state)
    return Chip(label, f"{kind} {state}", " · ".join(parts))


def _short_label(ref: OpRef) -> str:
    if ref.op == "create_group":
        return _clip(f"new_group {ref.group}", 22)
    if ref.op.startswith("store_"):
        return _clip(op_label(ref), 22)
    if ref.op in SEND_OPS:
        return f"{ref.op}→{peer_label(ref.peer)}"
    if ref.op in RECV_OPS:
        return f"{ref.op}←{peer_label(ref.peer)}"
    seq = "" if ref.seq is None else f" #{ref.seq}"
    return _clip(f"{ref.op}{seq}", 22)


# -- findings ----------------------------------------------------------------------------


_FINDING_CSS = {
    FindingKind.DEADLOCK: "bad",
    FindingKind.ORPHANED_WAIT: "bad",
    FindingKind.HANG: "bad",
    FindingKind.HANG_SUSPECT: "note",
    FindingKind.BUSY_POLL: "note",
}


def _finding_view(finding: Finding, report: Report) -> FindingView:
    ordered = sorted(merged_ops(finding.ops), key=lambda item: min(item[0]))
    op_rows = tuple(
        OpRow(
            ranks=",".join(rank_runs(ranks)),
            call=_call_text(op),
            detail=op.detail,
            location=_where(op) or "?",
        )
        for ranks, op in ordered[:MAX_FINDING_OPS]
    )
    return FindingView(
        kind=finding.kind.value,
        css=_FINDING_CSS.get(finding.kind, "warn"),
        title=finding.summary or finding.kind.value.replace("-", " "),
        message=finding.message,
        ranks=ranks_phrase(finding.ranks) if finding.ranks else "",
        cycle=cycle_line(finding, report.ranks) if finding.cycle else "",
        hint=finding.hint,
        ops=op_rows,
        more_ops=max(0, len(ordered) - MAX_FINDING_OPS),
    )


def _call_text(op: OpRef) -> str:
    label = op_label(op)
    if op.api in (None, op.op) or op.op.startswith("store_"):
        return label
    return f"{label} via {op.api}"


# -- the template ------------------------------------------------------------------------

_TEMPLATE: Any = None


def _template() -> Any:
    """The page template, loaded once (Jinja2, autoescape on, undefined names fail)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        import jinja2

        env = jinja2.Environment(
            loader=jinja2.PackageLoader("dl2.render", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        _TEMPLATE = env.get_template("report.html.j2")
    return _TEMPLATE
