"""The device hold (dl2.record.device): records after a wait that returned before its op
completed are written, in order, only once that op is seen complete."""

from __future__ import annotations

from typing import Any

from dl2.record.device import DeviceHold


class _Work:
    def __init__(self) -> None:
        self.done = False

    def is_completed(self) -> bool:
        return self.done


class _Encoder:
    """Logs the calls the hold replays (the real encoder's interface, as used)."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.tail = self  # tail.append goes to the log too

    def append(self, record: tuple[Any, ...]) -> None:
        self.log.append(("tail", record))

    def op(self, oid: int) -> None:
        self.log.append(("op", oid))

    def hold_ret(self, rid: int, t: int, src: int | None = None) -> None:
        self.log.append(("ret", rid))

    def end(self, t: int, how: str) -> None:
        self.log.append(("end", how))

    def flush(self) -> None:
        self.log.append(("flush",))


class _Recorder:
    def __init__(self, enc: Any) -> None:
        self.enc = enc
        self.waits: list[int] = []

    def device_wait(self, wid: int, work: Any) -> None:
        self.waits.append(wid)


def _written(enc: _Encoder) -> list[tuple[Any, ...]]:
    return [entry for entry in enc.log if entry[0] != "flush"]


def test_records_wait_for_the_held_op_then_go_out_in_order() -> None:
    enc = _Encoder()
    rec = _Recorder(enc)
    first = _Work()
    hold = DeviceHold(rec, enc, 10, first)
    rec.enc = hold
    hold.op(11)
    hold.tail.append((11, 5, None))
    assert _written(enc) == []  # nothing while the op runs
    assert hold.release() is False and rec.enc is hold
    first.done = True
    assert hold.release() is True
    assert rec.enc is enc
    assert _written(enc) == [("ret", 10), ("op", 11), ("tail", (11, 5, None))]
    hold.op(12)  # a thread that took the hold before it ended writes straight through
    assert _written(enc)[-1] == ("op", 12)


def test_release_stops_at_the_next_incomplete_device_wait() -> None:
    enc = _Encoder()
    rec = _Recorder(enc)
    first, second = _Work(), _Work()
    hold = DeviceHold(rec, enc, 10, first)
    rec.enc = hold
    hold.op(11)
    hold.device_wait(12, second)
    hold.op(13)
    first.done = True
    assert hold.release() is False
    assert _written(enc) == [("ret", 10), ("op", 11)]
    second.done = True
    hold.op(14)  # a record made after the op completed releases the hold itself
    assert rec.enc is enc
    assert _written(enc) == [("ret", 10), ("op", 11), ("ret", 12), ("op", 13), ("op", 14)]


def test_force_writes_everything_and_leaves_incomplete_waits_open() -> None:
    enc = _Encoder()
    rec = _Recorder(enc)
    hold = DeviceHold(rec, enc, 10, _Work())
    rec.enc = hold
    hold.op(11)
    hold.end(0, "exit")
    assert hold.release(force=True) is True
    assert _written(enc) == [("op", 11), ("end", "exit")]  # no ret: wait 10 never returned


def test_a_work_that_cannot_say_holds_nothing() -> None:
    class Broken:
        def is_completed(self) -> bool:
            raise RuntimeError("gone")

    enc = _Encoder()
    rec = _Recorder(enc)
    hold = DeviceHold(rec, enc, 10, Broken())
    rec.enc = hold
    hold.op(11)
    assert rec.enc is enc
    assert _written(enc) == [("ret", 10), ("op", 11)]


def test_a_hold_past_its_limit_writes_everything_and_stops_holding(monkeypatch: Any) -> None:
    from dl2.record import device

    monkeypatch.setattr(device, "HOLD_LIMIT", 3)
    enc = _Encoder()
    rec = _Recorder(enc)
    rec.device_holds = True  # type: ignore[attr-defined]
    hold = DeviceHold(rec, enc, 10, _Work())
    rec.enc = hold
    for oid in range(11, 15):
        hold.op(oid)
    assert rec.enc is enc
    assert rec.device_holds is False  # type: ignore[attr-defined]
    assert _written(enc) == [("op", 11), ("op", 12), ("op", 13), ("op", 14)]


def test_a_held_encoder_declines_the_hot_path_and_queues_the_op() -> None:
    # GIVEN a hold (the recorder's collective override tries op_hot first, then op)
    enc = _Encoder()
    rec = _Recorder(enc)
    hold = DeviceHold(rec, enc, 10, _Work())
    # THEN op_hot is declined without reaching the real encoder, and op is queued
    assert hold.op_hot(11, 0, 1, (), None, False, 0) is False
    hold.op(11)
    assert _written(enc) == []
    hold.release(force=True)
    assert _written(enc) == [("op", 11)]  # (the incomplete wait stays open)
