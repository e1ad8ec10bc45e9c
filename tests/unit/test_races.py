"""Wildcard receives of different sizes that another arrival order pairs wrongly."""

from __future__ import annotations

import pytest

from dl2.analysis import analyze
from dl2.report import FindingKind
from dl2.report import Verdict
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session


def _job(acked: bool) -> list[RankBuilder]:
    """Rank 0 receives 4 floats from anyone, then 8 floats from anyone; rank 1 sends 4,
    rank 2 sends 8 (``acked``: only after rank 0 told it to, once the first arrived)."""
    r0, r1, r2 = ranks(3)
    first = r0.issue("recv", 19, peer=None, count=4)
    r0.wait(first, src=1)
    if acked:
        r0.call("send", 20, peer=2, count=1)
    second = r0.issue("recv", 21, peer=None, count=8)
    r0.wait(second, src=2)
    r1.call("send", 26, peer=0, count=4)
    if acked:
        r2.call("recv", 29, peer=0, count=1)
    r2.call("send", 30, peer=0, count=8)
    return [r.end() for r in (r0, r1, r2)]


@pytest.mark.parametrize("acked", [False, True])
def test_wildcards_of_two_sizes_race_unless_the_second_sender_waits_for_the_first(acked):
    report = analyze(session(_job(acked)))
    races = [f for f in report.findings if f.kind is FindingKind.POTENTIAL_MISMATCH]
    if acked:
        # THEN rank 2 sent only once rank 0 had its first message: no other order
        assert races == [] and report.verdict is Verdict.OK
        return
    # THEN the first wildcard can take rank 2's 8 floats: gloo aborts on the size
    assert report.verdict is Verdict.DEFECT
    (race,) = races
    assert {(o.rank, o.line) for o in race.ops} == {(0, 19), (2, 30)}
    assert "when that message arrives first" in race.message
    # and only as a hazard: --no-hazards leaves it out
    assert not any(
        f.kind is FindingKind.POTENTIAL_MISMATCH
        for f in analyze(session(_job(acked)), hazards=False).findings
    )


def _chain(relay: str) -> list[RankBuilder]:
    """Rank 0 receives 4 floats from anyone (rank 1's), then tells rank 1, which tells
    rank 2 (``relay``: by a send, by a barrier of a group of ranks 1 and 2, or not at all),
    which then sends the 8 floats rank 0's second wildcard takes."""
    r0, r1, r2 = ranks(3)
    if relay == "collective":
        for r in (r1, r2):
            r.create_group("12", [1, 2])
    first = r0.issue("recv", 19, peer=None, count=4)
    r0.wait(first, src=1)
    r0.call("send", 20, peer=1, count=1)
    second = r0.issue("recv", 21, peer=None, count=8)
    r0.wait(second, src=2)
    r1.call("send", 26, peer=0, count=4)
    r1.call("recv", 27, peer=0, count=1)
    if relay == "send":
        r1.call("send", 28, peer=2, count=1)
        r2.call("recv", 29, peer=1, count=1)
    elif relay == "collective":  # a group of ranks 1 and 2
        r1.call("barrier", 28, gid="12")
        r2.call("barrier", 29, gid="12")
    r2.call("send", 30, peer=0, count=8)
    return [r.end() for r in (r0, r1, r2)]


@pytest.mark.parametrize("relay", ["send", "collective", "none"])
def test_a_send_caused_through_a_third_rank_does_not_race(relay):
    # GIVEN rank 2 sends only once rank 1 heard that rank 0's first wildcard completed
    # (two hops), or, with no relay, whenever it likes
    report = analyze(session(_chain(relay)))
    races = [f for f in report.findings if f.kind is FindingKind.POTENTIAL_MISMATCH]
    # THEN only the unrelayed send can meet the first wildcard
    assert len(races) == (1 if relay == "none" else 0), report.findings
