"""dl2._speedups, the recorder's optional C steps, against the Python code they stand for.

Both steps must give exactly what the Python code gives: the stack walk the same (api,
stack id) for any stack, the encoder's ``op_hot`` the same bytes and the same state as
``StreamEncoder.op`` for any sequence of calls (it writes only the steady state and
leaves everything else, untouched, to ``op``).
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from dl2 import speedups
from dl2.record import stack
from dl2.trace.schema import stream as stream_mod
from dl2.trace.schema.encode import StackTable
from dl2.trace.schema.stream import StreamEncoder

fast = speedups.module()
needs_c = pytest.mark.skipif(fast is None, reason="DL2_PURE_PYTHON is set")


def test_the_c_part_was_built_unless_turned_off() -> None:
    import os

    if os.environ.get("DL2_PURE_PYTHON"):
        assert not speedups.active() and stack.capture is stack.capture_py
        assert StreamEncoder.__mro__[1] is stream_mod._PythonCore
        return
    assert speedups.active(), "dl2._speedups was not built (no C compiler at install?)"
    assert stack.capture is not stack.capture_py
    assert StreamEncoder.__mro__[1].__name__ == "EncoderCore"


# -- the stack walk ------------------------------------------------------------------------


def _code_in(filename: str, source: str) -> dict[str, Any]:
    """Functions defined in ``source`` as if they lived in ``filename``."""
    space: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), space)
    return space


API_FILE = sorted(stack._API_FILES)[0]
THIRD_FILE = "/opt/env/lib/python3.11/site-packages/somelib/run.py"
LIB_FILE = stack._TORCH_DIRS[0] + "nn/fake.py"

_api = _code_in(API_FILE, "def all_reduce(probe):\n    return probe()\n")
_lib = _code_in(LIB_FILE, "def wrapper(fn, probe):\n    return fn(probe)\n")
_third = _code_in(
    THIRD_FILE,
    "def deep(n, probe):\n"
    "    if n:\n"
    "        return deep(n - 1, probe)\n"
    "    return probe()\n"
    "def lib_call(then, probe):\n"
    "    return then(probe)\n",
)


class _CountingFallback:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, frame: Any) -> tuple[str | None, int]:
        self.calls += 1
        return stack.capture_py(frame)


@pytest.fixture
def counted() -> Any:
    """The C walk with a fallback that counts its calls (restored after)."""
    assert fast is not None
    fallback = _CountingFallback()
    args = (stack._kinds, stack._cache, stack._ids)
    limits = (stack.USER, stack.THIRD, stack.API, stack.MAX_FRAMES, stack.MAX_WALK)
    fast.setup(*args, fallback, *limits)
    yield fallback
    fast.setup(*args, stack.capture_py, *limits)


def _both(counted: _CountingFallback) -> Callable[[], tuple[Any, Any]]:
    """A probe that captures from its caller with both walks: the C one twice (the first
    may fill the caches through the fallback; the second must not need it)."""

    def probe() -> tuple[Any, Any]:
        frame = sys._getframe(1)
        assert fast is not None
        fast.capture(frame)
        before = counted.calls
        c = fast.capture(frame)
        assert counted.calls == before, "a stack seen before still took the Python walk"
        return c, stack.capture_py(frame)

    return probe


def _recurse(n: int, probe: Callable[[], Any]) -> Any:
    if n:
        return _recurse(n - 1, probe)
    return probe()


def _chain(depth: int, probe: Callable[[], Any]) -> Any:
    # distinct lines per level: a stack of many different user frames
    if depth == 0:
        return probe()
    if depth % 3 == 0:
        return _chain(depth - 1, probe)
    if depth % 3 == 1:
        return _chain(depth - 1, probe)
    return _chain(depth - 1, probe)


@needs_c
@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda p: p(), id="user"),
        pytest.param(lambda p: _api["all_reduce"](p), id="api"),
        pytest.param(lambda p: _lib["wrapper"](_api["all_reduce"], p), id="lib-then-api"),
        pytest.param(lambda p: _recurse(30, p), id="recursion"),
        pytest.param(lambda p: _chain(20, p), id="deeper-than-kept"),
        pytest.param(lambda p: _third["deep"](12, p), id="installed-package"),
        pytest.param(lambda p: _third["lib_call"](lambda q: _api["all_reduce"](q), p), id="mixed"),
        pytest.param(lambda p: _chain(5, lambda: _third["deep"](3, p)), id="user-in-package"),
    ],
)
def test_the_c_walk_names_every_stack_as_the_python_walk(counted: Any, call: Any) -> None:
    c, py = call(_both(counted))
    assert c == py
    assert isinstance(c[1], int) and c[1] > 0


@needs_c
def test_the_c_walk_of_a_thread_and_of_no_frame(counted: Any) -> None:
    assert fast is not None
    assert fast.capture(None) == stack.capture_py(None)
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(_chain(4, _both(counted))))
    thread.start()
    thread.join(timeout=30)
    ((c, py),) = out
    assert c == py


# -- the encoder ---------------------------------------------------------------------------

_NOT_COPIED = {"__dict__", "__weakref__"}
# StreamEncoder with the pure-Python base: op_hot always declines, op does all
PythonEncoder = type(
    "PythonEncoder",
    (stream_mod._PythonCore,),
    {k: v for k, v in StreamEncoder.__dict__.items() if k not in _NOT_COPIED},
)

_STATE = ("next_id", "ops_before", "seqs", "channels", "groups", "open", "issued", "waits")


class _Driver:
    """Calls an encoder as the recorder's collective override does, and keeps what it
    writes (one entry per write)."""

    def __init__(self, cls: type, room: int) -> None:
        self.writes: list[bytes] = []
        self.stacks = StackTable()
        self.clock = 10_000_000_000
        self.rolls = 0

        def roll(segment: int, prologue: str) -> tuple[Any, int]:
            self.rolls += 1
            self.writes.append(f"<segment {segment}>".encode() + prologue.encode())
            return self.writes.append, room

        self.enc = cls(
            3, 10_000_000_000, self.stacks, self.writes.append, room=room, roll=roll,
            clock=lambda: self.clock,
        )  # fmt: skip
        self.hot = self.hot_after_async = 0
        self.ids = iter(range(1, 10**9))
        self.async_share = 0.15

    def now(self, step: int) -> int:
        self.clock += step
        return self.clock

    def collective(self, rng: random.Random, gid: str, op: str, fields: str, tid: int) -> None:
        enc = self.enc
        sid = self.stacks.intern(f'[["train.py",{rng.choice((10, 11))},"main"]]')
        oid = next(self.ids)
        t = self.now(rng.randrange(500, 50_000))
        is_async = rng.random() < self.async_share
        seq = None if rng.random() < 0.97 else rng.randrange(0, 3)
        gid_json = f'"{gid}"'
        key = (gid_json, op, "all_reduce", fields, is_async, tid, sid, False, False)
        after_async = len(enc.tail) == 1  # the previous op's issue ret, held
        if enc.op_hot(oid, t, tid, key, seq, is_async, sid):
            self.hot += 1
            self.hot_after_async += after_async
        else:
            enc.op(oid, t, tid, gid, gid_json, seq, op, "all_reduce", fields, is_async, sid)
        if is_async:  # issued: its ret held, as the override's
            enc.tail.append((oid, self.now(rng.randrange(10, 900)), None))
            if rng.random() < 0.3:
                enc.hold_done(oid, self.now(rng.randrange(10, 9_000)))
            return
        wid = next(self.ids)
        enc.tail.append((oid, wid, self.now(rng.randrange(10, 900)), tid, sid))
        roll = rng.random()
        if roll < 0.03:
            enc.flush()  # a watchdog flush while the thread waits
        if roll < 0.01:
            return  # the wait never returns before the next op (another thread's)
        src = None if rng.random() < 0.98 else 1
        enc.tail.append((wid, self.now(rng.randrange(0, 90_000)), src))

    def other(self, rng: random.Random) -> None:
        """Records that are not collectives, between them."""
        enc = self.enc
        choice = rng.random()
        if choice < 0.3:
            enc.ret(next(self.ids), self.now(100))
        elif choice < 0.6:
            enc.threads(self.now(100), rng.randrange(0, 3))
        else:
            enc.flush()

    def state(self) -> dict[str, Any]:
        return {name: getattr(self.enc, name) for name in _STATE} | {
            "last": self.enc._last,
            "us": self.enc._us,
            "due": self.enc._due,
            "segment": self.enc.segment,
        }


def _run(cls: type, seed: int, room: int) -> _Driver:
    rng = random.Random(seed)
    driver = _Driver(cls, room)
    groups = [("0", "all_reduce", '"sum","float32",8'), ("1", "broadcast", '0,"float32",4')]
    for step in range(3000):
        # phases of mostly blocking calls, and of DDP's buckets (async, one after another)
        driver.async_share = 0.15 if step // 500 % 2 == 0 else 0.9
        roll = rng.random()
        if roll < 0.9:
            gid, op, fields = groups[0] if rng.random() < 0.85 else groups[1]
            tid = 7 if rng.random() < 0.95 else 8
            driver.collective(rng, gid, op, fields, tid)
        else:
            driver.other(rng)
    driver.enc.flush()
    return driver


@needs_c
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("room", [1 << 62, 4096], ids=["one-segment", "rotated"])
def test_op_hot_writes_what_op_writes(seed: int, room: int) -> None:
    c = _run(StreamEncoder, seed, room)
    py = _run(PythonEncoder, seed, room)
    assert py.hot == 0
    assert c.hot > 1000, "the steady state was not written by op_hot"
    assert c.hot_after_async > 200, "nor DDP's buckets, one after another"
    assert b"".join(c.writes) == b"".join(py.writes)
    assert c.writes == py.writes  # write for write: a record never split differently
    assert c.state() == py.state()
    assert c.rolls == py.rolls and (room > 1 << 20 or c.rolls > 3)


@needs_c
def test_op_hot_declines_without_changing_anything() -> None:
    driver = _Driver(StreamEncoder, 1 << 62)
    enc = driver.enc
    sid = driver.stacks.intern('[["train.py",1,"main"]]')
    key = ('"0"', "all_reduce", "all_reduce", "f", False, 7, sid, False, False)
    before = driver.state()
    # no description yet: op must define it
    assert not enc.op_hot(1, 10_000_001_000, 7, key, None, False, sid)
    assert driver.state() == before and driver.writes == []
    enc.op(1, 10_000_001_000, 7, "0", '"0"', None, "all_reduce", "all_reduce", "f", False, sid)
    enc.tail.append((1, 2, 10_000_002_000, 7, sid))
    enc.tail.append((2, 10_000_003_000, None))
    snapshot = (driver.state(), list(enc.tail), list(driver.writes))
    for args in (
        (4, 10_000_004_000, 7, key, None, False, sid),  # an id skipped
        (3, 10_000_004_000, 7, key, 5, False, sid),  # a seq other than expected
        (3, 10_000_004_000, 7, (*key[:5], 8, *key[6:]), None, False, sid),  # undefined
        ("3", 10_000_004_000, 7, key, None, False, sid),  # not an int
    ):
        assert not enc.op_hot(*args)
        assert (driver.state(), list(enc.tail), list(driver.writes)) == snapshot
    assert enc.op_hot(3, 10_000_004_000, 7, key, None, False, sid)
    assert driver.writes[-1] == b'["k",1,1]\n["o",1,1]\n'


@needs_c
def test_op_hot_after_an_async_op_declines_what_is_not_a_plain_issue() -> None:
    driver = _Driver(StreamEncoder, 1 << 62)
    enc = driver.enc
    sid = driver.stacks.intern('[["train.py",1,"main"]]')
    key = ('"0"', "all_reduce", None, "f", True, 7, sid, False, False)
    eager_key = ('"0"', "all_reduce", None, "f", True, 7, sid, True, False)
    for oid, k in ((1, key), (2, eager_key)):
        enc.op(oid, 10_000_000_000 + oid * 1000, 7, "0", '"0"', None, "all_reduce", None,
               "f", True, sid, eager=k[7])  # fmt: skip
        enc.flush()
    for held, why in (
        ((3, 10_000_004_000, 1), "a wildcard's sender with it"),
        ((2, 10_000_004_000, None), "not the last op"),
    ):
        enc.op(3, 10_000_003_000, 7, "0", '"0"', None, "all_reduce", None, "f", True, sid)
        enc.tail.append(held)
        snapshot = (driver.state(), list(enc.tail), list(driver.writes))
        assert not enc.op_hot(4, 10_000_005_000, 7, key, None, True, sid), why
        assert (driver.state(), list(enc.tail), list(driver.writes)) == snapshot
        enc.tail.clear()
        enc._last = 2
    # the eager one's ret (it leaves the open ops, as StreamEncoder._ret does)
    enc._last = 2
    enc.tail.append((2, 10_000_004_000, None))
    snapshot = (driver.state(), list(enc.tail), list(driver.writes))
    assert not enc.op_hot(3, 10_000_005_000, 7, key, None, True, sid)
    assert (driver.state(), list(enc.tail), list(driver.writes)) == snapshot
    # a wait (id 9) on op 1 is pending: a ret of id 9 is that wait's, not an issue
    enc.tail.clear()
    enc.wait(9, 10_000_006_000, 7, 1, sid)
    enc.tail.append((9, 10_000_007_000, None))
    snapshot = (driver.state(), list(enc.tail), list(driver.writes))
    assert not enc.op_hot(10, 10_000_008_000, 7, key, None, True, sid)
    assert (driver.state(), list(enc.tail), list(driver.writes)) == snapshot
    # and the plain issue of the last op is written in C: its ret, then the op
    enc.tail.clear()
    enc.op(10, 10_000_009_000, 7, "0", '"0"', None, "all_reduce", None, "f", True, sid)
    enc.tail.append((10, 10_000_010_000, None))
    assert enc.op_hot(11, 10_000_012_000, 7, key, None, True, sid)
    assert driver.writes[-1] == b'["r",1]\n["o",2,1]\n'
    assert 10 in enc.issued and 11 in enc.open


@needs_c
def test_a_failing_write_stops_both_encoders_alike() -> None:
    def run(cls: type) -> tuple[list[bytes], list[str], bool]:
        writes: list[bytes] = []
        errors: list[str] = []

        def sink(data: bytes) -> None:
            if len(writes) == 40:
                raise OSError(28, "No space left on device")
            writes.append(data)

        enc = cls(0, 0, StackTable(), sink, on_error=lambda err: errors.append(str(err)))
        sid = enc.stacks.intern('[["train.py",1,"main"]]')
        key = ('"0"', "all_reduce", "all_reduce", "f", False, 7, sid, False, False)
        hot = False
        for i in range(100):
            oid, t = 2 * i + 1, 1_000_000 * (i + 1)
            if enc.op_hot(oid, t, 7, key, None, False, sid):
                hot = True
            else:
                enc.op(oid, t, 7, "0", '"0"', None, "all_reduce", "all_reduce", "f", False, sid)
            enc.tail.append((oid, oid + 1, t + 1000, 7, sid))
            enc.tail.append((oid + 1, t + 2000, None))
        return writes, errors, hot

    c_writes, c_errors, c_hot = run(StreamEncoder)
    py_writes, py_errors, py_hot = run(PythonEncoder)
    assert c_hot and not py_hot
    assert c_writes == py_writes and len(c_writes) == 40
    assert c_errors == py_errors == ["[Errno 28] No space left on device"]
