"""Reports of typical runs, built in code: the inputs of the renderer goldens.

Each function returns one :class:`~dl2.report.Report` as the analysis would
hand it over; ``SAMPLES`` names them (the golden files are ``tests/gold/<name>.<ext>``).
"""

from __future__ import annotations

from collections.abc import Callable

from builders import finding
from builders import op_ref
from builders import rank_state
from builders import report
from dl2.report import FindingKind
from dl2.report import Report
from dl2.report import Verdict

JOB = {"command": ["torchrun", "--nproc-per-node=2", "train.py"], "exit_status": -9}

SEND_HINT = "Let one rank receive first, or use isend/irecv (batch_isend_irecv) on both."


def empty() -> Report:
    """No rank left a trace."""
    return report()


def single_rank() -> Report:
    """A one-rank job that finished."""
    return report(ranks=[rank_state(0, "exited")])


def ok() -> Report:
    """Four ranks that finished cleanly."""
    job = {"command": ["torchrun", "--nproc-per-node=4", "train.py"], "exit_status": 0}
    return report(ranks=[rank_state(r, "exited") for r in range(4)], job=job)


def sendsend_deadlock() -> Report:
    """Two ranks that both send first: gloo sends block until the peer receives."""
    send0 = op_ref(0, "send", peer=1, seq=0, detail="float32[1024] tag 0", line=42)
    send1 = op_ref(1, "send", peer=0, seq=0, detail="float32[1024] tag 0", line=57)
    return report(
        finding(
            FindingKind.DEADLOCK,
            send0,
            send1,
            cycle=(0, 1),
            message="Ranks 0 and 1 both send to each other first; each send waits for a "
            "receive the other rank never reaches.",
            hint=SEND_HINT,
        ),
        ranks=[rank_state(0, op=send0, waits_on=[1]), rank_state(1, op=send1, waits_on=[0])],
        job=JOB,
    )


def three_rank_cycle() -> Report:
    """A ring in which every rank receives from its left neighbour before sending."""
    recvs = [
        op_ref(r, "recv", peer=(r - 1) % 3, seq=0, detail="float32[256]", line=31 + 4 * r)
        for r in range(3)
    ]
    return report(
        finding(
            FindingKind.DEADLOCK,
            recvs[0],
            recvs[2],
            recvs[1],
            cycle=(0, 2, 1),
            message="Every rank of the ring receives before it sends, so no message is ever sent.",
            hint="Break the ring: let even ranks send first and odd ranks receive first.",
        ),
        ranks=[rank_state(op.rank, op=op, waits_on=[op.peer or 0]) for op in recvs],
    )


def orphaned_wait() -> Report:
    """Rank 0 waits for a message from rank 1, which has already exited."""
    recv = op_ref(0, "recv", peer=1, seq=4, detail="int64[8] tag 7", line=88, function="evaluate")
    return report(
        finding(
            FindingKind.ORPHANED_WAIT,
            recv,
            message="Rank 0 waits in recv from rank 1, which exited without sending.",
            hint="Make rank 1 send the message before it returns, or skip the recv on rank 0.",
        ),
        ranks=[rank_state(0, op=recv, waits_on=[1]), rank_state(1, "exited")],
    )


def collective_mismatch() -> Report:
    """Rank 3 reduces float16 where the others reduce float32 of the same byte size."""
    ops = [
        op_ref(r, "all_reduce", seq=3, detail="float32[1024] sum", line=42, function="step")
        for r in range(3)
    ]
    ops.append(
        op_ref(3, "all_reduce", seq=3, detail="float16[2048] sum", line=61, function="step_amp")
    )
    return report(
        finding(
            FindingKind.COLLECTIVE_MISMATCH,
            *ops,
            group="0",
            message="The 4th collective of group 0 differs: rank 3 reduces float16[2048], "
            "ranks 0-2 float32[1024]. Same byte size, so gloo sums garbage silently.",
            hint="Cast to one dtype on every rank before the collective.",
        ),
        ranks=[rank_state(r, "exited") for r in range(4)],
    )


def wildcard_wait() -> Report:
    """Rank 0 receives from any rank while ranks 1 and 2 both wait to receive from it."""
    any_recv = op_ref(0, "recv", peer=None, detail="float32[16] tag 0", line=12, function="server")
    recv1 = op_ref(1, "recv", peer=0, seq=0, detail="float32[16] tag 0", line=20)
    recv2 = op_ref(2, "recv", peer=0, seq=0, detail="float32[16] tag 0", line=20)
    return report(
        finding(
            FindingKind.DEADLOCK,
            any_recv,
            recv1,
            ranks=(0, 1, 2),
            cycle=(0, 1),
            message="Rank 0 waits for a message from any of ranks 1 and 2, and both wait "
            "for a message from rank 0.",
            hint="Send the request from ranks 1 and 2 before they wait for the reply.",
        ),
        ranks=[
            rank_state(0, op=any_recv, waits_on=[1, 2], any_of=True),
            rank_state(1, op=recv1, waits_on=[0]),
            rank_state(2, op=recv2, waits_on=[0]),
        ],
    )


def job_failed() -> Report:
    """Rank 1 crashed outside communication; no communication defect."""
    return report(
        verdict=Verdict.JOB_FAILED,
        ranks=[rank_state(0, "exited"), rank_state(1, "failed")],
        warnings=["rank 1: the last record is truncated (the process died while writing it)"],
        job={"command": ["python", "train.py"], "exit_status": 1},
    )


def large() -> Report:
    """Eight ranks: an 8-rank send ring, 19 other findings and 15 warnings."""
    sends = [
        op_ref(r, "send", peer=(r + 1) % 8, seq=2, detail="bfloat16[4096] tag 0", line=140)
        for r in range(8)
    ]
    findings = [
        finding(
            FindingKind.DEADLOCK,
            *sends,
            cycle=range(8),
            message="All 8 ranks send to their right neighbour before anyone receives.",
            hint=SEND_HINT,
        )
    ]
    for seq in range(12):
        ops = [
            op_ref(r, "all_gather", seq=10 + seq, detail=f"float32[{64 << seq}]", line=200)
            for r in range(7)
        ]
        ops.append(op_ref(7, "all_gather", seq=10 + seq, detail="float32[1]", line=230))
        findings.append(
            finding(
                FindingKind.COLLECTIVE_MISMATCH,
                *ops,
                group="0",
                message=f"Collective #{10 + seq} of group 0 differs on rank 7.",
                hint="Give every rank the same tensor shape.",
            )
        )
    for r in range(4):
        findings.append(
            finding(
                FindingKind.P2P_UNMATCHED,
                op_ref(r, "isend", api="isend", peer=r + 4, seq=9, detail="int64[2]", line=300),
                message=f"isend from rank {r} to rank {r + 4} is never received.",
                hint="Post the matching irecv on the peer.",
            )
        )
    for r in (5, 6):
        findings.append(
            finding(
                FindingKind.NONMEMBER_CALL,
                op_ref(r, "barrier", group="evens", line=410),
                group="evens",
                message=f"Rank {r} calls barrier on group 'evens', which it is not in; "
                "torch skips the call.",
            )
        )
    findings.append(
        finding(
            FindingKind.GROUP_MISMATCH,
            ranks=range(8),
            message="new_group was called with [0, 2, 4, 6] on ranks 0-5 and [0, 2] on ranks 6-7.",
            hint="Call new_group with the same ranks, in the same order, on every rank.",
        )
    )
    return report(
        *findings,
        ranks=[rank_state(op.rank, op=op, waits_on=[op.peer or 0]) for op in sends],
        warnings=[f"rank {r % 8}: record {100 + r} truncated" for r in range(15)],
        job={"command": ["torchrun", "--nproc-per-node=8", "train.py"], "exit_status": -9},
    )


SAMPLES: dict[str, Callable[[], Report]] = {
    "empty": empty,
    "single_rank": single_rank,
    "ok": ok,
    "sendsend_deadlock": sendsend_deadlock,
    "three_rank_cycle": three_rank_cycle,
    "orphaned_wait": orphaned_wait,
    "collective_mismatch": collective_mismatch,
    "wildcard_wait": wildcard_wait,
    "job_failed": job_failed,
    "large": large,
}
