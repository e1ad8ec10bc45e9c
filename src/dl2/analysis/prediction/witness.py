"""The witness of a potential deadlock, and its JSON document.

A :class:`Witness` says under which configuration a deadlock happens, which wildcard
matches lead to it and where each of its ranks is stuck; :func:`witness_to_json` writes
it for ``dl2 replay --choices`` and :func:`witness_from_json` reads it back.
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import fields
from typing import Any

from dl2.analysis.prediction.semantics import Semantics
from dl2.documents import check_document
from dl2.errors import ConfigError
from dl2.report import OpRef

__all__ = [
    "WITNESS_FORMAT",
    "BlockedOp",
    "Choice",
    "Witness",
    "semantics_from_json",
    "semantics_to_json",
    "witness_from_json",
    "witness_to_json",
]

#: Version of the witness JSON document.
WITNESS_FORMAT = 1


@dataclass(frozen=True)
class Choice:
    """A wildcard receive matched to one sender.

    Attributes:
        rank: the receiving rank; ``op_id`` its receive's id in the trace.
        sender: the rank whose send it matched; ``send_op_id`` that send's id.
        recorded_sender: the sender it matched in the recorded run, if known.
        recv, send: the two ops as shown in reports.
    """

    rank: int
    op_id: int
    sender: int
    send_op_id: int | None
    recorded_sender: int | None
    recv: OpRef
    send: OpRef | None = None


@dataclass(frozen=True)
class BlockedOp:
    """A rank of a predicted deadlock and the op it waits on forever.

    Attributes:
        rank: the rank; ``op_id`` the op's id in its trace.
        state: why the op cannot complete (see :class:`dl2.analysis.prediction.blocking.Stuck`).
        waits_on: ranks that would have to act for it to complete.
        nbytes: bytes of the op's tensor, if known.
        ref: the op as shown in reports.
        note: for a batch, why it cannot start or finish.
        queued: posted ops of the rank that wait behind this one, when works complete
            in issue order.
    """

    rank: int
    op_id: int
    state: str
    waits_on: tuple[int, ...]
    nbytes: int | None
    ref: OpRef
    note: str = ""
    queued: int = 0


@dataclass(frozen=True)
class Witness:
    """One potential deadlock and how to reach it.

    Attributes:
        semantics: the configuration it happens under.
        choices: every wildcard match taken on the way, in order; ``deviations`` are
            those that differ from the recorded run (as few as the search could find).
        blocked: the deadlocked ranks, each with the op it waits on, by rank.
        cycle: the shortest wait cycle among them, starting at its lowest rank.
        threshold: for a buffer effect, the smallest eager buffer (bytes) at which the
            same execution no longer deadlocks: it deadlocks iff ``eager_bytes <
            threshold``.  None when no buffer size removes it.
    """

    semantics: Semantics
    choices: tuple[Choice, ...]
    blocked: tuple[BlockedOp, ...]
    cycle: tuple[int, ...] = ()
    threshold: int | None = None

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(b.rank for b in self.blocked)

    @property
    def deviations(self) -> tuple[Choice, ...]:
        """The choices that differ from the recorded run (or that it did not record)."""
        return tuple(c for c in self.choices if c.recorded_sender != c.sender)

    @property
    def signature(self) -> frozenset[tuple[int, int]]:
        """The deadlock's (rank, op id) pairs: equal for the same deadlock elsewhere."""
        return frozenset((b.rank, b.op_id) for b in self.blocked)

    @property
    def causes(self) -> tuple[str, ...]:
        """What the deadlock depends on: "wildcard" (a match other than recorded),
        "batch" (a fused batch cannot launch or finish), "order" (works complete in issue
        order), "buffer" (sends wait for their receives; with ``threshold``, a buffer that
        large avoids it)."""
        states = {b.state for b in self.blocked}
        causes = []
        if self.deviations:
            causes.append("wildcard")
        if "not-launched" in states or "batch" in states:
            causes.append("batch")
        if "queued" in states or any(b.queued for b in self.blocked):
            causes.append("order")
        sends_wait = any(b.ref.op == "send" and b.state == "unmatched" for b in self.blocked)
        if self.threshold is not None or (sends_wait and not causes):
            causes.append("buffer")
        return tuple(causes)


def _ref_to_json(ref: OpRef | None) -> dict[str, Any] | None:
    return asdict(ref) if ref is not None else None


def _ref_from_json(data: Any) -> OpRef | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError("not a dl2 witness: an op is not an object")
    names = {f.name for f in fields(OpRef)}
    return OpRef(**{k: v for k, v in data.items() if k in names})


def semantics_to_json(semantics: Semantics) -> dict[str, Any]:
    return {**asdict(semantics), "spec": semantics.spec}


def semantics_from_json(data: Any) -> Semantics:
    if not isinstance(data, dict):
        raise ConfigError("not a dl2 witness: no semantics")
    names = {f.name for f in fields(Semantics)}
    return Semantics(**{k: v for k, v in data.items() if k in names})


def witness_to_json(witness: Witness) -> dict[str, Any]:
    """A JSON-compatible document of a witness, for ``dl2 replay --choices``."""
    return {
        "format": WITNESS_FORMAT,
        "kind": "dl2-witness",
        "semantics": semantics_to_json(witness.semantics),
        "buffer_size": witness.semantics.eager_bytes,
        "choices": [
            {
                "rank": c.rank,
                "op": c.op_id,
                "sender": c.sender,
                "send_op": c.send_op_id,
                "recorded_sender": c.recorded_sender,
                "recv": _ref_to_json(c.recv),
                "send": _ref_to_json(c.send),
            }
            for c in witness.choices
        ],
        "blocked": [
            {
                "rank": b.rank,
                "op": b.op_id,
                "state": b.state,
                "waits_on": list(b.waits_on),
                "bytes": b.nbytes,
                "ref": _ref_to_json(b.ref),
                "note": b.note,
                "queued": b.queued,
            }
            for b in witness.blocked
        ],
        "cycle": list(witness.cycle),
        "threshold": witness.threshold,
        "causes": list(witness.causes),
    }


def witness_from_json(data: Any) -> Witness:
    """Read back :func:`witness_to_json`'s document.

    Raises:
        ConfigError: not a witness document, or of another format version.
    """
    data = check_document(data, "dl2-witness", WITNESS_FORMAT, "witness document")
    try:
        choices = tuple(
            Choice(
                rank=int(c["rank"]),
                op_id=int(c["op"]),
                sender=int(c["sender"]),
                send_op_id=c.get("send_op"),
                recorded_sender=c.get("recorded_sender"),
                recv=_ref_from_json(c["recv"]) or OpRef(int(c["rank"]), "recv", "0"),
                send=_ref_from_json(c.get("send")),
            )
            for c in data.get("choices", [])
        )
        blocked = tuple(
            BlockedOp(
                rank=int(b["rank"]),
                op_id=int(b["op"]),
                state=str(b["state"]),
                waits_on=tuple(int(r) for r in b.get("waits_on", [])),
                nbytes=b.get("bytes"),
                ref=_ref_from_json(b["ref"]) or OpRef(int(b["rank"]), "?", "0"),
                note=str(b.get("note", "")),
                queued=int(b.get("queued", 0)),
            )
            for b in data.get("blocked", [])
        )
        return Witness(
            semantics=semantics_from_json(data.get("semantics")),
            choices=choices,
            blocked=blocked,
            cycle=tuple(int(r) for r in data.get("cycle", [])),
            threshold=data.get("threshold"),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"not a dl2 witness document: {err}") from None
