"""Synthetic ranks driven through the real recorder (no torch): bounded traces in tests.

A :class:`FakeRank` calls a :class:`~dl2.record.recorder.Recorder` the way the
recording process group does for a loop of blocking all_reduce, async all_reduce seen
done, and isend/irecv pairs with a peer; its clock is fake, so two runs of the same
program write the same records whatever their segment sizes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dl2.record import recorder as recorder_mod
from dl2.record import writer as writer_mod
from dl2.record.recorder import Recorder
from dl2.record.stack import STACKS
from dl2.trace.schema import encode

T0 = 1_000_000_000
TID = 140_000_000_000_001
REDUCE = encode.reduce_fields("sum", "float32", 8)


class _NoWatchdog:
    def stop(self) -> None:
        pass


class FakeRank:
    """One rank of a synthetic job, recording into ``run_dir``.

    Args:
        segment_bytes, keep: the retention (``DL2_SEGMENT_BYTES``, ``DL2_KEEP``).
    """

    active: FakeRank  # the rank whose clock the recorders read (the last to move)

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        world: int,
        segment_bytes: int,
        keep: int | str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        self.rank = rank
        self.world = world
        self.clock = itertools.count(T0 + 1000, 1000)
        self.current = T0
        # the recorder's clock reads the time the test last advanced to
        monkeypatch.setattr(recorder_mod, "_now", lambda: FakeRank.active.current)
        monkeypatch.setattr(
            writer_mod, "time", SimpleNamespace(monotonic_ns=lambda: T0, time_ns=lambda: 7)
        )
        monkeypatch.setenv("DL2_SEGMENT_BYTES", str(segment_bytes))
        monkeypatch.setenv("DL2_KEEP", str(keep))
        self.now()
        self.rec = Recorder(str(run_dir))
        self.rec.watchdog = _NoWatchdog()  # no thread: records come from the test only
        self.rec.open(rank, world, "test")
        self.seq = 0
        self.p2p_seq: dict[tuple[str, int, str], int] = {}
        self.sid = STACKS.intern(encode.stack_of([("train.py", 10 + rank, "main")]))
        self.create_group("0", list(range(world)))

    def now(self) -> int:
        """Advance this rank's clock (and make it the recorder's)."""
        FakeRank.active = self
        self.current = next(self.clock)
        return self.current

    def _op(self, op: str, fields: str, is_async: bool, gid: str = "0", **kw: Any) -> int:
        oid = next(self.rec.ids)
        gid_json = encode.json_str(gid)
        self.rec.op(oid, self.now(), TID, gid, gid_json, kw.pop("seq", None), op, op, fields,
                    is_async, self.sid, **kw)  # fmt: skip
        return oid

    def create_group(self, gid: str, ranks: list[int]) -> None:
        oid = next(self.rec.ids)
        fields = encode.ranks_field(ranks)
        self.rec.op(oid, self.now(), TID, gid, encode.json_str(gid), None, "create_group",
                    "new_group", fields, False, self.sid, ranks=ranks)  # fmt: skip
        self.rec.ret(oid)

    def all_reduce(self, complete: bool = True) -> int:
        """A blocking all_reduce (``complete=False``: the rank stays in its wait)."""
        oid = self._op("all_reduce", REDUCE, False, seq=self._next())
        wid = next(self.rec.ids)
        self.rec.issued_wait(oid, wid, self.now(), TID, self.sid)
        if complete:
            self.rec.ret_later(wid, None)
        return oid

    def all_reduce_async(self) -> int:
        """An async all_reduce, issued (DDP's bucket); :meth:`done` completes it."""
        oid = self._op("all_reduce", REDUCE, True, seq=self._next())
        self.rec.ret(oid)
        return oid

    def done(self, oid: int) -> None:
        self.now()
        self.rec.done(oid)

    def p2p(
        self, op: str, peer: int, blocking: bool = False, complete: bool = True, gid: str = "0"
    ) -> int:
        """An isend/irecv with ``peer`` (waited on at once unless ``complete=False``);
        ``blocking``: a send/recv."""
        seq = self.p2p_seq.get((gid, peer, op), 0)
        self.p2p_seq[(gid, peer, op)] = seq + 1
        fields = encode.peer_tag_fields(peer, 0) + encode.tensor_fields("float32", 4)
        oid = self._op(op, fields, not blocking, gid, seq=seq, peer=peer)
        if blocking:
            wid = next(self.rec.ids)
            self.rec.issued_wait(oid, wid, self.now(), TID, self.sid)
            if complete:
                self.rec.ret_later(wid, None)
            return oid
        self.rec.ret(oid)
        if complete:
            self.wait(oid)
        return oid

    def wait(self, oid: int, complete: bool = True) -> None:
        wid = next(self.rec.ids)
        self.rec.wait(wid, self.now(), TID, oid, self.sid)
        if complete:
            self.rec.ret_later(wid, None)

    def end(self) -> None:
        self.now()
        self.rec.end("exit")

    def close(self) -> None:
        self.now()
        self.rec.close()

    def _next(self) -> int:
        self.seq += 1
        return self.seq - 1


def steps(ranks: list[FakeRank], n: int) -> None:
    """``n`` training-like steps on every rank: a blocking all_reduce, every 3rd step an
    async one seen done, every 4th an isend/irecv exchange with the next rank."""
    for i in range(n):
        for rank in ranks:
            rank.all_reduce()
        if i % 3 == 0:
            pending = [rank.all_reduce_async() for rank in ranks]
            for rank, oid in zip(ranks, pending, strict=True):
                rank.done(oid)
        if i % 4 == 0 and len(ranks) > 1:
            for rank in ranks:
                rank.p2p("send", (rank.rank + 1) % rank.world)
                rank.p2p("recv", (rank.rank - 1) % rank.world)


def segment_files(run_dir: Path, rank: int = 0) -> list[Path]:
    return sorted(run_dir.glob(f"rank{rank:05d}.*"))


def disk_bytes(run_dir: Path) -> int:
    return sum(os.path.getsize(p) for p in run_dir.iterdir())


def ranks_of(
    run_dir: Path,
    world: int,
    monkeypatch: pytest.MonkeyPatch,
    segment_bytes: int | list[int],
    keep: int | str,
) -> Iterator[FakeRank]:
    sizes = segment_bytes if isinstance(segment_bytes, list) else [segment_bytes] * world
    for r in range(world):
        yield FakeRank(run_dir, r, world, sizes[r], keep, monkeypatch)
