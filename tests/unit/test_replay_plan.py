"""The replay plan (pure) and the worker's source-line indirection."""

from __future__ import annotations

import json
import sys
from types import FrameType

import pytest

from dl2.analysis.prediction.semantics import GLOO
from dl2.analysis.prediction.witness import Choice
from dl2.analysis.prediction.witness import Witness
from dl2.errors import ConfigError
from dl2.record.stack import USER
from dl2.record.stack import classify_file
from dl2.replay.plan import build_replay_plan
from dl2.replay.plan import plan_from_json
from dl2.replay.worker import from_stack
from dl2.report import OpRef
from trace_builders import RankBuilder
from trace_builders import ranks
from trace_builders import session


def wildcard_race() -> list[RankBuilder]:
    """Rank 0: recv(any) (matched rank 1) then recv(from 2); ranks 1 and 2 send once."""
    r0, r1, r2 = ranks(3)
    wildcard = r0.issue("recv", 10, peer=None)
    r0.wait(wildcard, src=1)
    r0.call("recv", 11, peer=2)
    r1.call("send", 20, peer=0)
    r2.call("send", 30, peer=0)
    for r in (r0, r1, r2):
        r.end()
    return [r0, r1, r2]


def test_wildcards_are_forced_to_their_recorded_sender() -> None:
    plan = build_replay_plan(session(wildcard_race()))
    rank0 = plan.rank_plan(0)
    assert [(op.op, op.peer, op.forced) for op in rank0.ops] == [
        ("recv", 1, "recorded"),
        ("recv", 2, None),
    ]
    (choice,) = plan.choices
    assert (choice.rank, choice.sender, choice.recorded, choice.source) == (0, 1, 1, "recorded")
    assert choice.location == "train.py:10"


def test_a_witness_forces_its_choice() -> None:
    builders = wildcard_race()
    op_id = 1  # rank 0's wildcard
    ref = OpRef(0, "recv", "0")
    witness = Witness(GLOO, (Choice(0, op_id, 2, None, 1, ref),), ())
    plan = build_replay_plan(session(builders), witness)
    assert plan.rank_plan(0).ops[0].peer == 2
    assert plan.choices[0].source == "witness"
    # a mapping works the same
    assert build_replay_plan(session(builders), {(0, op_id): 2}).rank_plan(0).ops[0].peer == 2


def test_a_choice_for_no_wildcard_is_refused() -> None:
    with pytest.raises(ConfigError, match="no wildcard receive"):
        build_replay_plan(session(wildcard_race()), {(1, 1): 0})


def test_async_ops_wait_where_the_trace_waits() -> None:
    # GIVEN rank 0 posts irecv then isend, then waits on both; rank 1 the mirror image
    r0, r1 = ranks(2)
    for r in (r0, r1):
        recv = r.irecv(10, peer=1 - r.rank)
        send = r.isend(11, peer=1 - r.rank)
        r.wait(recv)
        r.wait(send)
    plan = build_replay_plan(session([r0, r1]))
    assert plan.rank_plan(0).steps == (("op", 0), ("op", 1), ("wait", 0), ("wait", 1))
    assert all(op.is_async for op in plan.rank_plan(0).ops)


def test_groups_in_recorded_order_and_failed_ops_left_out() -> None:
    r0, r1 = ranks(2)
    for r in (r0, r1):
        r.create_group("5", [0, 1])
        r.call("all_reduce", 10, gid="5", redop="max")
    failed = r0.issue("broadcast", 12, root=0)
    r0.ret(failed, err="RuntimeError: boom")
    plan = build_replay_plan(session([r0, r1]))
    assert [(g.gid, g.ranks) for g in plan.groups] == [("5", (0, 1))]
    ops = plan.rank_plan(0).ops
    assert [(op.op, op.gid, op.redop) for op in ops] == [("all_reduce", "5", "max")]
    assert any("raised when recorded" in note for note in plan.notes)


def test_unsupported_ops_are_refused() -> None:
    r0, _ = ranks(2)
    r0.call("mystery", 10)
    with pytest.raises(ConfigError, match="cannot be replayed"):
        build_replay_plan(session([r0]))


def test_plan_json_round_trip() -> None:
    r0, r1 = ranks(2)
    r0.batch([("send", 1, 10), ("send", 1, 10)])
    r1.call("all_to_all_single", 20, splits=[[1, 3], [2, 2]])
    plan = build_replay_plan(session([r0, r1]))
    text = json.dumps(plan.to_json())
    assert plan_from_json(json.loads(text)) == plan
    with pytest.raises(ConfigError):
        plan_from_json({"kind": "something else"})


def test_ops_run_under_their_recorded_frames() -> None:
    # GIVEN a recorded stack, innermost first
    stack = (("/home/user/train.py", 42, "step"), ("/home/user/train.py", 7, "<module>"))
    seen: list[tuple[str, int, str]] = []

    def probe() -> None:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and len(seen) < 2:
            code = frame.f_code
            if code.co_filename.startswith("/home/user"):
                seen.append((code.co_filename, frame.f_lineno, code.co_qualname))
            frame = frame.f_back

    from_stack(stack, probe)()
    # THEN the frames above the call read as the recorded ones, and dl2 counts them as user code
    assert tuple(seen) == stack
    assert classify_file(stack[0][0]) == USER
