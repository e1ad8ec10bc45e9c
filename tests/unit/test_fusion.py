"""Fusion that depends on each rank's ready order, over traces built in code."""

from __future__ import annotations

import pytest

from dl2.analysis import analyze
from dl2.analysis.prediction.fusion import FusionWindow
from dl2.analysis.prediction.fusion import alternative_fusion
from dl2.analysis.prediction.fusion import fuse
from dl2.analysis.prediction.fusion import fusion_findings
from dl2.analysis.prediction.fusion import fusion_windows
from dl2.analysis.prediction.fusion import fusion_witnesses
from dl2.analysis.prediction.fusion import smallest_period
from dl2.analysis.prediction.fusion import split_passes
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import build_execution_graph
from dl2.report import FindingKind
from dl2.report import Verdict
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session

SIZES = (64, 256, 1024, 4096)  # float32 elements


def fused_run(
    *passes: list[list[int]], per_rank: list[list[list[int]]] | None = None
) -> list[RankBuilder]:
    """Two ranks issuing one all_reduce_coalesced per bucket (line 50), ``passes`` in turn,
    with a barrier after each pass when ``per_rank`` is None."""
    builders = ranks(2)
    for r in builders:
        plan = per_rank[r.rank] if per_rank is not None else [b for p in passes for b in p]
        for bucket in plan:
            r.call(
                "all_reduce_coalesced",
                50,
                redop="sum",
                count=sum(bucket),
                splits=[list(bucket)],
            )
        r.end()
    return builders


def graph_of(builders: list[RankBuilder]) -> ExecutionGraph:
    return build_execution_graph(session(builders))


def test_greedy_fusion_by_count_and_bytes() -> None:
    assert fuse([64, 256, 1024, 4096], 4, 2, 1 << 30) == ((64, 256), (1024, 4096))
    # a tensor larger than the byte limit goes alone
    assert fuse([64, 4096, 256], 4, 8, 2048) == ((64,), (4096,), (256,))
    assert fuse([64, 256], 4, 8, 0) == ((64,), (256,))


def test_loops_are_cut_into_passes() -> None:
    step = [(64, 256), (1024, 4096)]
    assert split_passes(step * 3) == [2, 2, 2]
    # a step fused differently still covers the same tensors
    assert split_passes([*step, (64, 1024), (256, 4096)]) == [2, 2]
    assert split_passes([(1,), (2,), (3,)]) == [3]


def test_one_bucket_has_no_other_fusion() -> None:
    builders = fused_run([list(SIZES)], [list(SIZES)])
    (window, _) = fusion_windows(graph_of(builders))[:2]
    assert alternative_fusion(window) is None
    assert fusion_witnesses(graph_of(builders), assume=True) == []


def test_the_limits_ignore_a_tensor_alone() -> None:
    # buckets of at most 64 KiB: the 1 MiB tensor went alone
    window = FusionWindow(0, "0", (), ((64, 256), (262144,), (1024,)), 4)
    assert window.limits == (2, 1280)


def test_ready_order_fusion_is_flagged_under_the_model_only() -> None:
    # GIVEN both ranks fused pairs identically at both steps
    passes = [[64, 256], [1024, 4096]]
    graph = graph_of(fused_run(passes, passes))
    # THEN nothing in the run proves order dependence ...
    assert fusion_witnesses(graph) == []
    assert analyze(session(fused_run(passes, passes))).verdict is Verdict.OK
    # ... but under the model another order fuses other tensors together
    (witness,) = fusion_witnesses(graph, assume=True)
    assert witness.ranks == (0, 1)
    assert witness.consequence == "size-mismatch"
    assert {tuple(sorted(b)) for b in witness.alternative} != {(64, 256), (1024, 4096)}
    (finding,) = fusion_findings(graph, assume=True)
    assert finding.kind is FindingKind.POTENTIAL_DEADLOCK
    assert "train.py:50" in finding.message


def test_a_run_that_fused_differently_at_two_steps_proves_it() -> None:
    # GIVEN rank 0 fused the same tensors two ways at two steps, rank 1 one way
    one, other = [[64, 256], [1024, 4096]], [[64, 1024], [256, 4096]]
    builders = fused_run(per_rank=[one + other, one + one])
    report = analyze(session(builders))
    # THEN the default analysis reports it without any assumption
    kinds = [f.kind for f in report.findings]
    assert FindingKind.POTENTIAL_DEADLOCK in kinds
    assert report.verdict is Verdict.DEFECT
    (witness,) = fusion_witnesses(graph_of(builders))
    assert witness.observed
    assert any("rank 0 fused the same tensors both ways" in f.message for f in report.findings)


def test_an_order_agreed_between_ranks_is_no_proof() -> None:
    # GIVEN every rank fused the same tensors two ways at two steps, each step alike on
    # every rank (the order comes from all-reduced norms: agreed, not each rank's own)
    builders = fused_run([[64, 256], [1024, 4096]], [[64, 1024], [256, 4096]])
    graph = graph_of(builders)
    # THEN the run proves no ready-order fusion: nothing by default
    assert fusion_witnesses(graph) == []
    assert analyze(session(builders)).verdict is Verdict.OK
    # AND the model (dl2 predict --fusion) still shows what other orders would do
    assert fusion_witnesses(graph, assume=True)


def test_passes_in_a_fixed_cycle_are_static_buckets_not_a_proof() -> None:
    # GIVEN two modules with tensors of the same sizes, each fused in its own fixed order
    # at one line (5+5|6, then 6|5+5), at each of two steps
    encoder, decoder = [[5, 5], [6]], [[6], [5, 5]]
    builders = fused_run(encoder, decoder, encoder, decoder)
    # THEN "the same tensors fused two ways" is their sizes alike, not a ready order
    assert fusion_witnesses(graph_of(builders)) == []
    assert analyze(session(builders)).verdict is Verdict.OK
    # AND the same two shapes in no cycle (A B B A) on a rank still prove it, where the
    # other rank fused otherwise (not an order agreed between ranks)
    rank0, rank1 = encoder + decoder + decoder + encoder, encoder + decoder + encoder + decoder
    assert fusion_witnesses(graph_of(fused_run(per_rank=[rank0, rank1])))


@pytest.mark.parametrize(
    ("seen", "period"),
    [
        ("", 0),
        ("a", 1),
        ("aaaa", 1),
        ("abab", 2),
        ("ababa", 2),
        ("abcab", 3),
        ("abba", 3),
        ("aaab", 4),
        ("a" * 99_999 + "b", 100_000),
    ],
)
def test_thesmallest_period_of_a_sites_passes(seen: str, period: int) -> None:
    assert smallest_period(list(seen)) == period


def test_ranks_that_fused_other_tensors_of_the_same_total_mismatch() -> None:
    # GIVEN rank 0 fused [64+1024] while rank 1 fused [256+832]: same total, other tensors
    builders = fused_run(per_rank=[[[64, 1024]], [[256, 832]]])
    report = analyze(session(builders))
    (finding,) = [f for f in report.findings if f.kind is FindingKind.COLLECTIVE_MISMATCH]
    assert "splits" in finding.message
    assert report.verdict is Verdict.DEFECT
