"""The recorder's parts, in-process: trace writer, stack capture, backend translation,
import hygiene, the bootstrap, and install/uninstall around a one-rank gloo group."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import pytest

from dl2.record import stack
from dl2.record.writer import TraceWriter
from dl2.trace.format import FORMAT_VERSION
from dl2.trace.format import read_trace_file
from dl2.trace.schema.stream import StackTable
from dl2.trace.schema.stream import StreamEncoder
from trace_builders import read_raw_trace


def _op(oid: int, t0: int = 0) -> str:
    """An all_reduce record line (with its description)."""
    lines: list[bytes] = []
    enc = StreamEncoder(0, t0, StackTable(), lines.append)
    enc.op(oid, t0 + 1000, 1, "0", '"0"', 0, "all_reduce", None, "", False, 0)
    enc.ret(oid, t0 + 5000)
    return b"".join(lines).decode()


pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "src" / "dl2" / "_bootstrap"


# -- the writer ---------------------------------------------------------------------------


def test_writer_header_and_records_read_back(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path / "run"), rank=3, world_size=4, torch_version="x")
    assert writer.enabled
    writer.write_line(_op(1, writer.t0))
    writer.close()
    (path,) = (tmp_path / "run").iterdir()
    assert path.name == f"rank00003.{os.getpid()}.dl2.jsonl"
    trace = read_trace_file(path)
    assert trace.header.format == FORMAT_VERSION
    assert (trace.header.rank, trace.header.world_size) == (3, 4)
    assert trace.header.backend == "gloo"
    assert trace.header.pid == os.getpid()
    assert trace.header.t0 > 0 and trace.header.wall > 0
    assert [r.kind for r in trace.records] == ["op", "ret"]
    assert trace.truncated is None


def test_unwritable_dir_disables_with_one_notice(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    err = io.StringIO()
    with redirect_stderr(err):
        writer = TraceWriter(str(blocker / "run"), rank=1, world_size=2)
        writer.write_line(_op(1))
        writer.write_bytes(b"{}\n")
    assert not writer.enabled
    assert err.getvalue() == (
        f"dl2: recording disabled on rank 1: {blocker / 'run'}: Not a directory; "
        "the job continues\n"
    )


def test_a_process_a_rank_started_says_whose_child_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dl2.record.writer import ENV_RANK_PID

    monkeypatch.delenv(ENV_RANK_PID, raising=False)
    rank = TraceWriter(str(tmp_path / "a"), rank=0, world_size=2)
    rank.close()
    assert read_trace_file(rank.path or "").header.child_of is None
    assert os.environ[ENV_RANK_PID] == str(os.getpid())  # what its children inherit
    monkeypatch.setenv(ENV_RANK_PID, "1")  # as if the parent rank's pid were 1
    helper = TraceWriter(str(tmp_path / "b"), rank=0, world_size=2)
    helper.close()
    assert read_trace_file(helper.path or "").header.child_of == 1


def test_write_error_disables_without_raising(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path), rank=0, world_size=2)
    os.close(writer.fd)  # the descriptor goes bad under the writer
    err = io.StringIO()
    with redirect_stderr(err):
        writer.write_line(_op(1))
        writer.write_line(_op(2))
    assert not writer.enabled
    lines = err.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("dl2: recording disabled on rank 0: ")
    assert lines[0].endswith("; the job continues")


# -- stacks -------------------------------------------------------------------------------


def _api_functions(filename: str, source: str) -> dict[str, Any]:
    """Functions whose code claims to live in ``filename`` (e.g. torch's c10d module)."""
    namespace: dict[str, Any] = {}
    exec(compile(textwrap.dedent(source), filename, "exec"), namespace)
    return namespace


def _api_function(name: str, filename: str) -> Any:
    return _api_functions(filename, f"def {name}(callback):\n    return callback()\n")[name]


def _c10d_file() -> str:
    torch_dir = stack._TORCH_DIRS[0]
    return os.path.join(torch_dir, "distributed", "distributed_c10d.py")


def test_classify_file() -> None:
    torch_dir = stack._TORCH_DIRS[0]
    assert stack.classify_file(_c10d_file()) == stack.API
    assert stack.classify_file(torch_dir + "nn/modules/module.py") == stack.LIB
    assert stack.classify_file(stack.__file__) == stack.LIB
    assert stack.classify_file(os.__file__) == stack.LIB
    assert stack.classify_file("<frozen importlib._bootstrap>") == stack.LIB
    assert stack.classify_file(__file__) == stack.USER
    assert stack.classify_file("/home/me/train.py") == stack.USER
    assert stack.classify_file("/venv/lib/python3.11/site-packages/transformers/x.py") == (
        stack.THIRD
    )


def test_deep_library_stack_still_keeps_the_users_own_frame() -> None:
    # GIVEN a call made 12 frames deep inside an installed package (a chain of functions
    # compiled under a site-packages file name), called from this test
    chain = (
        "\n".join(f"def f{i}(capture):\n    return f{i + 1}(capture)\n" for i in range(12))
        + "def f12(capture):\n    return capture()\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(chain, "/venv/lib/python3.11/site-packages/lib/deep.py", "exec"), namespace)
    import json

    # WHEN the stack is captured at the innermost function
    frames = json.loads(namespace["f0"](lambda: stack.user_stack(sys._getframe(1))))
    # THEN it keeps MAX_FRAMES frames, the innermost of the package first, and the last
    # one is this test's own line
    assert len(frames) == stack.MAX_FRAMES
    assert frames[0][0].endswith("site-packages/lib/deep.py") and frames[0][2] == "f12"
    assert frames[-1][0] == __file__
    assert frames[-1][2].endswith("test_deep_library_stack_still_keeps_the_users_own_frame")


def test_user_stack_is_innermost_first_with_lines() -> None:
    def inner() -> str:
        return stack.user_stack(sys._getframe())  # line A

    def outer() -> str:
        return inner()  # line B

    import json

    frames = json.loads(outer())
    line_a = inner.__code__.co_firstlineno + 1
    line_b = outer.__code__.co_firstlineno + 1
    assert frames[0] == [__file__, line_a, inner.__qualname__]
    assert frames[1] == [__file__, line_b, outer.__qualname__]
    # Cached per instruction: a second capture from the same place is identical.
    assert json.loads(outer())[:2] == frames[:2]


def test_user_stack_keeps_at_most_eight_frames() -> None:
    import json

    def ping(n: int) -> str:
        return stack.user_stack(sys._getframe()) if n == 0 else pong(n - 1)

    def pong(n: int) -> str:
        return ping(n - 1)

    frames = json.loads(ping(20))
    assert len(frames) == stack.MAX_FRAMES
    assert all(f[2].endswith(("ping", "pong")) for f in frames)


def test_an_exception_is_named_at_the_line_that_raised_not_where_finally_left_it() -> None:
    import json

    def inner() -> None:
        try:
            raise ValueError("missing key")  # the line that raised
        finally:
            cleanup = 1
            cleanup += 1  # the frame's last line once the exception left it

    def outer() -> None:
        inner()  # the caller's line

    try:
        outer()
    except ValueError as err:
        frames = json.loads(stack.STACKS.text(stack.raised_at(err)))
    assert frames[0][1] == inner.__code__.co_firstlineno + 2
    assert frames[1][1] == outer.__code__.co_firstlineno + 1


def _pending_work_future(tmp_path: Path) -> tuple[Any, Any]:
    """A pending op's future (torch's) and the one dl2 hands the user for it."""
    import torch

    from dl2.record.recorder import Recorder
    from dl2.record.works import watched_future

    real: Any = torch.futures.Future()
    return real, watched_future(real, Recorder(str(tmp_path)))


def test_a_thread_waiting_on_an_executor_task_that_waits_on_a_work_waits_in_comm(
    tmp_path: Path,
) -> None:
    import concurrent.futures

    from dl2.record.watchdog import _waited_elsewhere

    real, future = _pending_work_future(tmp_path)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    task = pool.submit(future.wait)  # the task waits on the pending work's future
    waiting = threading.Thread(target=task.result, daemon=True)  # the rank's main thread
    waiting.start()
    spin = threading.Event()
    spinner = threading.Thread(target=lambda: [0 for _ in iter(spin.is_set, True)], daemon=True)
    last: dict[int, int] = {}

    def look() -> Any:
        frames = sys._current_frames()
        ident = waiting.ident or 0
        return _waited_elsewhere(frames.get(ident), frames, {}, ident, last)

    try:
        deadline = time.monotonic() + 10
        found = None
        while time.monotonic() < deadline and found is None:
            found = look()  # the first look sees the other threads for the first time
            time.sleep(0.2)
        # THEN the waiting thread waits where the task does: in communication
        assert found is not None and stack.where(found) == "comm"
        # AND not while another thread runs (it may yet release the wait)
        spinner.start()
        time.sleep(0.2)
        look()  # the spinner seen for the first time
        time.sleep(0.2)
        assert look() is None
        del found
    finally:
        spin.set()
        real.set_result([1])
        waiting.join(5)
        spinner.join(5)
        pool.shutdown(wait=True)


def test_a_long_exception_message_keeps_its_start_and_its_end() -> None:
    from dl2.record.recorder import _describe

    wrapped = RuntimeError(
        "CheckpointException ranks:[1]\n" + "Traceback line\n" * 60 + "Missing key"
    )
    text = _describe(wrapped)
    assert len(text) <= 500
    assert text.startswith("RuntimeError: CheckpointException") and text.endswith("Missing key")
    assert _describe(ValueError("short")) == "ValueError: short"


def test_a_recursions_repeated_frame_is_kept_once() -> None:
    import json

    def deep(n: int) -> str:
        if n == 0:
            return stack.user_stack(sys._getframe())
        return deep(n - 1)  # the recursion's line

    def caller() -> str:
        return deep(40)  # the line that started it

    frames = json.loads(caller())
    names = [f[2].rsplit(".", 1)[-1] for f in frames]
    # THEN the innermost, the recursion's line once, and the frame that started it
    assert names[:3] == ["deep", "deep", "caller"]
    assert frames[2][1] == caller.__code__.co_firstlineno + 1


def test_capture_names_the_outermost_api_function() -> None:
    import json

    c10d = _api_functions(
        _c10d_file(),
        """
        def all_gather(hook):
            return hook(1)

        def all_gather_object(hook):
            return all_gather(hook)
        """,
    )

    def hook(depth: int) -> tuple[str | None, int]:  # a process-group method's body
        return stack.capture(sys._getframe(depth))

    def user_line() -> tuple[str | None, int]:
        return c10d["all_gather_object"](hook)

    api, stack_id = user_line()
    assert api == "all_gather_object"
    assert json.loads(stack.STACKS.text(stack_id))[0][2].endswith("user_line")


def test_capture_from_no_api_frame_is_null() -> None:
    api, _ = stack.capture(sys._getframe())
    assert api is None


def test_where() -> None:
    assert stack.where(sys._getframe()) == "python"
    comm = _api_function("all_reduce", _c10d_file())
    assert comm(lambda: stack.where(sys._getframe(1), in_call=True)) == "comm"
    graph = os.path.join(stack._TORCH_DIRS[0], "autograd", "graph.py")
    backward = _api_function("_engine_run_backward", graph)
    inside = lambda: stack.where(sys._getframe(1), still_s=stack.STILL_S)  # noqa: E731
    assert backward(inside) == "backward"
    # a backward that computes (not still) waits on nothing
    assert backward(lambda: stack.where(sys._getframe(1))) == "python"
    # nor does Python code the engine runs (a custom backward waiting on a queue)
    assert backward(lambda: stack.where(sys._getframe(), still_s=stack.STILL_S)) == "python"
    assert stack.where(None) == "python"


# -- backend translation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "becomes"),
    [
        ("gloo", "dl2"),
        ("GLOO", "dl2"),
        (None, "dl2"),
        ("undefined", "dl2"),
        ("cpu:gloo", "dl2"),
        ("cpu:gloo,cuda:gloo", "dl2"),
        ("mpi", None),
        ("dl2", None),
    ],
)
def test_translate_backend(asked: str | None, becomes: str | None) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and asked in (None, "undefined"):
        pytest.skip("an accelerator is present: the default backend is not gloo-only")
    from dl2.record.install import translate_backend

    assert translate_backend(asked) == becomes


# -- imports and the bootstrap ------------------------------------------------------------


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2_")}
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP), str(tmp_path), str(REPO / "src")])
    env.update(extra)
    return env


def test_import_dl2_record_is_light(tmp_path: Path) -> None:
    code = (
        "import sys, dl2.record, dl2.record.watchdog; "
        "print(sorted(m for m in ('torch', 'rich', 'networkx', 'msgspec') if m in sys.modules))"
    )
    result = _python(code, _env(tmp_path))
    assert result.stdout.strip() == "[]", result.stderr


def test_recording_modules_never_load_the_analysis_side(tmp_path: Path) -> None:
    # GIVEN every module of the recorder, those that need torch included
    code = (
        "import sys, dl2.record.pg, dl2.record.install, dl2.record.watchdog; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'networkx', "
        "'msgspec') or m.startswith(('dl2.analysis', 'dl2.model', 'dl2.trace.schema.decode'))))"
    )
    result = _python(code, _env(tmp_path))
    # THEN none of the analysis side (or its dependencies) came along
    assert result.stdout.strip() == "[]", result.stderr


def test_bootstrap_hooks_without_importing_torch_and_chains(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.dl2_test_chained = True\n")
    code = textwrap.dedent(
        """
        import sys
        hooked = any(type(f).__name__ == "_Finder" for f in sys.meta_path)
        print(hooked, "torch" in sys.modules, getattr(sys, "dl2_test_chained", False))
        """
    )
    on = _python(code, _env(tmp_path, DL2_RUN_DIR=str(tmp_path / "run")))
    assert on.stdout.split() == ["True", "False", "True"], on.stderr
    off = _python(code, _env(tmp_path, DL2_RUN_DIR=str(tmp_path / "run"), DL2_DISABLE="1"))
    assert off.stdout.split() == ["False", "False", "True"], off.stderr
    unset = _python(code, _env(tmp_path))
    assert unset.stdout.split() == ["False", "False", "True"], unset.stderr


def test_disabled_install_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dl2.record import install
    from dl2.record import is_installed

    monkeypatch.setenv("DL2_DISABLE", "1")
    assert install(str(tmp_path)) is False
    assert not is_installed()
    monkeypatch.delenv("DL2_DISABLE")
    monkeypatch.delenv("DL2_RUN_DIR", raising=False)
    assert install() is False  # no run directory


# -- install / uninstall around a one-rank group ------------------------------------------


def test_install_records_a_one_rank_group_and_uninstall_restores(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from dl2.record import install
    from dl2.record import is_installed
    from dl2.record import uninstall
    from dl2.record.install import recorder

    c10d = dist.distributed_c10d
    originals = (
        c10d._new_process_group_helper,
        c10d.destroy_process_group,
        c10d.batch_isend_irecv,
        c10d._warn_not_in_group,
    )
    assert install(str(tmp_path)) and install(str(tmp_path))  # idempotent
    try:
        assert c10d._new_process_group_helper is not originals[0]
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        assert dist.get_backend() == "gloo"
        assert type(dist.group.WORLD).__name__ == "RecordingProcessGroup"
        assert dist.group.WORLD.name() == "gloo"
        # an error message that names the group reads as without dl2
        assert repr(dist.group.WORLD).startswith(
            "<torch.distributed.distributed_c10d.ProcessGroup object at 0x"
        )
        # a peer that is no rank of the group is recorded as none, never as a rank
        # (-1 once read as the last rank) nor as "any" (a rank past the group)
        from dl2.trace.schema import NO_RANK

        world = dist.group.WORLD
        assert [world._dl2_global(r) for r in (0, -1, 1, "x")] == [0, NO_RANK, NO_RANK, None]
        t = torch.ones(3)
        work = dist.all_reduce(t, async_op=True)
        assert work.get_future().wait()[0].tolist() == [1.0, 1.0, 1.0]
        assert work.wait() is True
        assert work.is_completed() and work.is_success()
        assert work.exception() is None
        late = dist.all_reduce(t, async_op=True)  # never waited: the watchdog sees it done
        late.get_future().wait()
        rec = recorder()
        assert rec is not None and rec.watchdog is not None
        rec.ret_later(999_999, None)  # a held-back line the child must not write
        pid = os.fork()
        if pid == 0:  # a forked child (a DataLoader worker) records nothing of its own
            os._exit(0 if rec.fd == -1 and not rec.tail and rec.writer is None else 1)
        assert os.waitpid(pid, 0)[1] == 0
        rec.watchdog._quiet_ns = 0
        ticker = threading.Thread(target=rec.watchdog.tick)  # looks at this (main) thread
        ticker.start()
        ticker.join()
        dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        uninstall()
        uninstall()  # idempotent
    assert not is_installed()
    assert (
        c10d._new_process_group_helper,
        c10d.destroy_process_group,
        c10d.batch_isend_irecv,
        c10d._warn_not_in_group,
    ) == originals
    assert dist.destroy_process_group is originals[1]
    assert dist.batch_isend_irecv is originals[2]

    (path,) = tmp_path.iterdir()
    records = read_raw_trace(path).records
    kinds = [r["k"] for r in records]
    assert kinds[:2] == ["op", "ret"]  # create_group
    first, second = (r for r in records if r["k"] == "op" and r["op"] == "all_reduce")
    assert first["async"] is True and first["api"] == "all_reduce"
    assert [r["work"] for r in records if r["k"] == "wait"] == [first["id"]]
    assert {"k": "done", "id": second["id"]}.items() <= next(
        r for r in records if r["k"] == "done"
    ).items()
    state = next(r for r in records if r["k"] == "state")
    assert state["pending"] == [] and state["where"] == "python"
    assert records[-1]["k"] == "end" and records[-1]["how"] == "destroy"
    assert [r["id"] for r in records if r["k"] == "ret"].count(999_999) == 1


def test_frame_without_a_current_line_still_encodes_valid_json():
    # GIVEN a frame whose f_lineno is None (CPython reports that for some instructions
    # when another thread's frame is sampled): a stand-in with the real code object
    import json
    import types

    def user_function() -> int:
        return 1

    code = user_function.__code__
    frame = types.SimpleNamespace(f_lineno=None, f_lasti=0)
    # WHEN encoded
    text = stack._frame_json(code, frame, {})  # type: ignore[arg-type]
    # THEN it is valid JSON with a line of the function
    file, line, name = json.loads(text)
    assert file == code.co_filename
    assert code.co_firstlineno <= line <= code.co_firstlineno + 2
    assert name.endswith("user_function")


class _FakeRecorder:
    """What the watchdog reads of a recorder: a quiet trace with pending work 7."""

    def __init__(self) -> None:
        self.active = True
        self.writer = self
        self.polled: dict[int, int] = {}
        self.blocking: dict[int, int] = {}
        self.last_tid = 0
        self.lines: list[dict[str, Any]] = []

    def size(self) -> int:
        return 100

    def flush(self) -> None:
        pass

    def poll_pending(self) -> list[int]:
        return [7]

    def state(self, t: int, pending: list[int], where: str, stack: int) -> None:
        self.lines.append({"pending": list(pending), "where": where, "stack": stack})


def test_watchdog_reports_a_rank_spinning_on_polls_only_after_ticks_in_a_row() -> None:
    import json

    from dl2.record.watchdog import POLL_TICKS
    from dl2.record.watchdog import Watchdog

    rec = _FakeRecorder()
    # the watched thread: a user thread waiting in Python (not in communication)
    release = threading.Event()
    user = threading.Thread(target=release.wait, daemon=True)
    user.start()
    rec.last_tid = user.ident or 0
    dog = Watchdog(rec, quiet_ns=0)
    poll_stack = stack.STACKS.intern('[["train.py",22,"main"]]')
    # WHEN the user polls work 7 before every tick but the last of POLL_TICKS
    for _ in range(POLL_TICKS - 1):
        rec.polled = {7: poll_stack}
        dog.tick()
    states = rec.lines
    # THEN the rank is not yet spinning; once POLL_TICKS ticks in a row saw polls, it is
    assert states and all(s["where"] != "poll" for s in states)
    rec.polled = {7: poll_stack}
    dog.tick()
    last = rec.lines[-1]
    assert (last["where"], last["pending"], json.loads(stack.STACKS.text(last["stack"]))) == (
        "poll",
        [7],
        [["train.py", 22, "main"]],
    )
    # AND a tick without polls ends it
    dog.tick()
    assert rec.lines[-1]["where"] == "python"
    release.set()
    user.join()


def test_the_watchdog_watches_the_main_thread_if_ops_came_from_a_thread_python_never_made() -> None:
    import _thread
    import json

    from dl2.record.watchdog import Watchdog

    # GIVEN the last op issued by a thread threading does not know (as gloo's thread
    # that runs a future's callback: PowerSGD's hook issues its all_reduces there)
    rec = _FakeRecorder()
    release, started = threading.Event(), threading.Event()
    idents: list[int] = []

    def foreign() -> None:
        idents.append(_thread.get_ident())
        started.set()
        release.wait()

    _thread.start_new_thread(foreign, ())
    assert started.wait(10)
    assert idents[0] not in threading._active  # type: ignore[attr-defined]
    rec.last_tid = idents[0]
    # WHEN the watchdog looks
    Watchdog(rec, quiet_ns=0).tick()
    # THEN it watched the main thread (here: this test, in tick), not the foreign one
    frames = json.loads(stack.STACKS.text(rec.lines[-1]["stack"]))
    release.set()
    assert frames and frames[0][2] == (
        "test_the_watchdog_watches_the_main_thread_if_ops_came_from_a_thread_python_never_made"
    )


@pytest.mark.parametrize("name", ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"])
@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce_describer_fast_path_matches_the_generic_one(name: str, async_op: bool) -> None:
    # GIVEN an all_reduce's (tensors, opts), as torch passes them to a process group
    import torch
    import torch.distributed as dist

    from dl2.record import describe
    from dl2.trace.schema import encode

    opts = dist.AllreduceOptions()
    opts.reduceOp = getattr(dist.ReduceOp, name)
    opts.asyncOp = async_op
    t = torch.ones(3, dtype=torch.float64)
    # WHEN described by the hot path (reduce op named by its hash) and the generic one
    fast = describe._d_allreduce(None, ([t], opts), {})  # type: ignore[arg-type]
    generic = describe._d_allreduce(None, ([t],), {"opts": opts})  # type: ignore[arg-type]
    # THEN both write the same fields
    assert describe._BY_HASH  # torch's ReduceOp hashes as its op's int
    assert fast == generic == (encode.reduce_fields(name.lower(), "float64", 3), async_op)


# -- threads of the user's code ---------------------------------------------------------


def _user_target() -> None:
    pass


def _user_target_of(value: int) -> int:
    return value


class _UserThread(threading.Thread):
    def run(self) -> None:
        pass


def test_only_threads_of_the_users_own_code_are_counted():
    import functools

    from dl2.record.install import is_user_callable
    from dl2.record.install import runs_user_code

    assert runs_user_code(threading.Thread(target=_user_target))
    assert runs_user_code(threading.Thread(target=functools.partial(_user_target)))
    assert runs_user_code(threading.Thread(target=lambda: None))
    assert runs_user_code(_UserThread())
    # the standard library's, torch's, an installed package's and bare threads are not
    assert runs_user_code(threading.Timer(1.0, _user_target))  # it calls the user's function
    assert not runs_user_code(threading.Timer(1.0, print))  # a builtin: no user code
    import torch.distributed as dist

    assert runs_user_code(threading.Timer(1.0, dist.send))  # torch's API issues comm too
    assert runs_user_code(threading.Thread(target=dist.all_reduce))
    import contextvars

    # asyncio.to_thread(fn) submits partial(context.run, fn) to the loop's pool
    assert is_user_callable(functools.partial(contextvars.copy_context().run, _user_target))
    assert is_user_callable(functools.partial(contextvars.copy_context().run, dist.send))
    assert not is_user_callable(functools.partial(contextvars.copy_context().run, print))
    assert not runs_user_code(threading.Thread())
    # a context's run: the function it runs decides
    context = contextvars.copy_context()
    assert runs_user_code(threading.Thread(target=context.run, args=(_user_target,)))
    assert not runs_user_code(threading.Thread(target=context.run, args=(print,)))
    import torch.utils.data._utils.pin_memory as pin_memory

    assert not runs_user_code(threading.Thread(target=pin_memory._pin_memory_loop))
    import msgspec

    assert not runs_user_code(threading.Thread(target=msgspec.json.encode))  # no code


@contextlib.contextmanager
def _pools_patched(tmp_path: Path) -> Iterator[Any]:
    """A recorder with the thread pools patched to count the user's functions (the
    patches undone after, and checked undone)."""
    from concurrent.futures import ThreadPoolExecutor
    from multiprocessing.pool import ThreadPool

    from dl2.record.install import _Installed
    from dl2.record.install import _patch_pools
    from dl2.record.install import _undo
    from dl2.record.recorder import Recorder

    rec = Recorder(str(tmp_path))
    state = _Installed(rec)
    plain = (ThreadPoolExecutor.submit, ThreadPool.apply_async)
    _patch_pools(state)
    try:
        yield rec
    finally:
        _undo(state)
    assert (ThreadPoolExecutor.submit, ThreadPool.apply_async) == plain


def test_a_users_function_in_a_thread_pool_counts_from_submission_to_its_end(tmp_path: Path):
    from concurrent.futures import ThreadPoolExecutor

    with _pools_patched(tmp_path) as rec:
        gate = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            pool.submit(gate.wait, 10)  # the standard library's: not counted
            pool.submit(_user_target)  # queued behind it: counted already
            assert rec.user_threads == 1
            gate.set()
        assert rec.user_threads == 0  # done (the pool's exit waited for it)


def test_a_users_function_given_to_a_thread_pool_counts_until_its_result(tmp_path: Path):
    from multiprocessing.pool import ThreadPool

    with _pools_patched(tmp_path) as rec:
        gate = threading.Event()
        results: list[Any] = []
        pool = ThreadPool(1)
        try:
            pool.apply_async(gate.wait, (10,))  # the standard library's: not counted
            # queued behind it: counted already, until its result is delivered
            pool.apply_async(_user_target, callback=results.append)
            pool.map_async(_user_target_of, [1, 2], None, results.append)
            assert rec.user_threads == 2
            gate.set()
            pool.close()
            pool.join()
        finally:
            pool.terminate()
        # THEN each counted until its callback ran (the user's callbacks still ran)
        assert rec.user_threads == 0
        assert len(results) == 2


def test_counting_a_thread_never_raises_into_it(tmp_path: Path):
    from dl2.record.recorder import Recorder

    class Broken:
        def threads(self, t: int, live: int) -> None:
            raise OSError("disk full")

    rec = Recorder(str(tmp_path))
    rec.enc, rec.fd = Broken(), 3  # type: ignore[assignment]
    rec.thread_started()  # a failed write costs the record, never the thread
    rec.thread_ended()
    assert rec.user_threads == 0


def test_a_wildcards_sender_carries_its_op_through_peer_arithmetic():
    from dl2.record.source import SourceRank
    from dl2.record.source import via_of

    # GIVEN the sender a wildcard recv (op 7) returned
    first = SourceRank(1, 7)
    # THEN the peers a program derives from it remember op 7, others do not
    for peer in (first, 3 - first, (first + 1) % 3, first * 2 - 1, -first, abs(first)):
        assert via_of(peer) == 7, peer
    assert via_of(1) is None and via_of(int(first)) is None and via_of([0, 1][first]) is None
    # AND it is the plain int everywhere the user can see it
    assert first == 1 and hash(first) == hash(1) and f"{first}/{first!r}/{first:02d}" == "1/1/01"
    import copy
    import json
    import pickle

    assert json.dumps([first]) == "[1]"
    for clone in (pickle.loads(pickle.dumps(first)), copy.copy(first), copy.deepcopy(first)):
        assert type(clone) is int and clone == 1


def test_the_exception_handled_when_the_program_exits_with_a_failure_is_kept(tmp_path: Path):
    import importlib

    from dl2.record.install import _Installed
    from dl2.record.install import _patch_exit
    from dl2.record.install import _undo
    from dl2.record.recorder import Recorder

    install_module = importlib.import_module("dl2.record.install")
    state = _Installed(Recorder(str(tmp_path)))
    plain = sys.exit
    _patch_exit(state)
    try:
        with pytest.raises(SystemExit):
            sys.exit(0)  # a clean exit keeps nothing
        assert install_module._EXIT_HANDLING is None
        # GIVEN main()'s `except Exception: log...; sys.exit(1)`
        with pytest.raises(SystemExit) as exited:
            try:
                {}["x"]
            except KeyError:
                sys.exit(1)
        # THEN the exit still happens, and the KeyError is the cause kept
        assert exited.value.code == 1
        assert isinstance(install_module._EXIT_HANDLING, KeyError)
    finally:
        _undo(state)
        install_module._EXIT_HANDLING = None
    assert sys.exit is plain


def test_a_list_reduce_scatter_records_each_ranks_shard_size():
    import torch
    import torch.distributed as dist

    from dl2.record.describe import COLLECTIVES

    describe = COLLECTIVES["reduce_scatter"][1]
    opts = dist.ReduceScatterOptions()
    shards = [torch.ones(2), torch.ones(3)]
    fields, _ = describe(None, ([torch.empty(2)], [shards], opts), {})  # type: ignore[arg-type]
    assert '"splits":[[2,3]]' in fields and '"count":5' in fields
    flat, _ = COLLECTIVES["reduce_scatter_single"][1](
        None,  # type: ignore[arg-type]
        (torch.empty(2), torch.ones(4), opts),
        {},
    )
    assert "splits" not in flat


def test_where_a_thread_waits_on_a_future_is_communication() -> None:
    import time

    import torch

    # GIVEN a thread blocked in torch.futures.wait_all on a work's future (as dl2 wraps
    # it for the user: no dl2 frame is on that stack)
    future: Any = torch.futures.Future()
    future._dl2_work = True
    thread = threading.Thread(target=torch.futures.wait_all, args=([future],), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        seen = "python"
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(thread.ident or 0)
            if frame is not None and "futures" in frame.f_code.co_filename:
                seen = stack.where(frame)
                break
            time.sleep(0.01)
        # THEN the watchdog reads it as waiting in communication, not running Python
        assert seen == "comm"
    finally:
        future.set_result(None)
        thread.join(10)


def test_where_a_wait_on_futures_already_complete_is_not_communication() -> None:
    import torch

    # GIVEN frames of torch.futures' wait and wait_all (a checkpoint writer waits on the
    # future write_data hands back, complete from the start; the watchdog gets the GIL
    # as that wait releases it)
    futures_file = os.path.join(stack._TORCH_DIRS[0], "futures", "__init__.py")
    source = """
    def wait(self, callback):
        return callback()
    def wait_all(futures, callback):
        return callback()
    """
    waits = _api_functions(futures_file, source)
    done: Any = torch.futures.Future()
    done.set_result(None)
    pending: Any = torch.futures.Future()
    pending._dl2_work = True  # a work's future, as dl2 hands it to the user
    chained = torch.futures.Future().then(lambda f: f.value())  # one torch made
    own: Any = torch.futures.Future()  # the user's own, completed by a thread of theirs
    look = lambda: stack.where(sys._getframe(1))  # noqa: E731
    # THEN a wait on futures all complete returns at once: not a wait in communication
    assert waits["wait"](done, look) == "python"
    assert waits["wait_all"]([done, done], look) == "python"
    # AND one on a work's future not complete is, or on a future torch chained
    assert waits["wait"](pending, look) == "comm"
    assert waits["wait_all"]([done, pending], look) == "comm"
    assert waits["wait_all"]([chained], look) == "comm"
    # AND one on the user's own future is not (a timer or a thread of theirs sets it)
    assert waits["wait"](own, look) == "python"
    assert waits["wait_all"]([done, own], look) == "python"
    pending.set_result(None)
    # AND a query on a work in dl2's hooks (is_completed(), polled by a rank that
    # computes; the future dl2 wraps for the user) is not, where its wait is
    works_file = os.path.join(os.path.dirname(stack.__file__), "works.py")
    hooks = _api_functions(works_file, source.replace("wait_all", "is_completed"))
    assert hooks["is_completed"]([pending], look) == "python"
    assert hooks["wait"](pending, look) == "comm"
    wrap = _api_functions(works_file, source.replace("wait_all", "watched_future"))
    assert wrap["watched_future"]([pending], look) == "python"
    # AND a future built, chained or completed (a user's own pipeline of futures)
    # returns at once, whatever its futures
    for name in ("then", "set_result", "collect_all", "add_done_callback", "__init__"):
        chained = _api_functions(futures_file, source.replace("def wait(", f"def {name}("))
        assert chained[name](pending, look) == "python", name


def test_where_plain_python_in_torch_distributed_is_communication_only_once_still() -> None:
    # GIVEN a frame of torch.distributed outside its API functions (a utility that walks
    # a batch, a checkpoint writer): plain Python, or a C call that waits
    utils = os.path.join(stack._TORCH_DIRS[0], "distributed", "utils.py")
    helper = _api_function("_recursive_to", utils)
    # THEN it is communication only once the thread stayed there, not running, a while
    assert helper(lambda: stack.where(sys._getframe(1))) == "python"
    assert helper(lambda: stack.where(sys._getframe(1), still_s=stack.STILL_S)) == "comm"
    # AND an API function's frame is communication at once in a blocking op the
    # recorder saw issued; outside one (get_rank() called by a rank that computes with
    # an op pending), only once still
    comm = _api_function("all_reduce", _c10d_file())
    assert comm(lambda: stack.where(sys._getframe(1), in_call=True)) == "comm"
    query = _api_function("get_rank", _c10d_file())
    assert query(lambda: stack.where(sys._getframe(1))) == "python"
    assert query(lambda: stack.where(sys._getframe(1), still_s=stack.STILL_S)) == "comm"


def test_the_watchdog_tells_a_waiting_thread_from_a_running_one() -> None:
    import time
    from unittest import mock

    from dl2.record.watchdog import Watchdog

    dog = Watchdog(mock.Mock())
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    waiter = threading.Thread(target=stop.wait, daemon=True)
    spinner = threading.Thread(target=spin, daemon=True)
    waiter.start()
    spinner.start()
    try:
        stills = {}
        for name, thread in (("waiting", waiter), ("running", spinner)):
            dog._spot = None
            dog._spot_cpu = -1
            seen = 0.0
            for _ in range(4):  # four looks, 0.2 s apart
                frame = sys._current_frames().get(thread.ident or 0)
                seen = dog._still_s(frame, thread.ident or 0, time.monotonic_ns())
                time.sleep(0.2)
            stills[name] = seen
        # THEN only the thread blocked in a C call (Event.wait) counts as still
        assert stills["waiting"] >= 0.3
        assert stills["running"] == 0.0
    finally:
        stop.set()
        waiter.join(5)
        spinner.join(5)


def test_a_thread_starved_of_cpu_or_in_disk_io_is_not_waiting_in_communication() -> None:
    import time
    from unittest import mock

    from dl2.record import watchdog

    # GIVEN a thread that stays at one instruction (a checkpoint's fsync, or plain
    # Python on a host too busy to schedule it) while the watchdog looks four times
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()

    def still_after(samples: list[tuple[int, str]]) -> float:
        dog = watchdog.Watchdog(mock.Mock())
        frame = sys._current_frames()[thread.ident or 0]
        now = time.monotonic_ns()
        seen = 0.0
        with mock.patch.object(watchdog, "_thread_times", side_effect=samples):
            for look in range(len(samples)):
                seen = dog._still_s(frame, thread.ident or 0, now + look * 200_000_000)
        return seen

    try:
        # WHEN it sleeps (state S) and neither runs nor waits for a CPU: a wait
        assert still_after([(1_000, "S")] * 4) == pytest.approx(0.6)
        # WHEN it sleeps on a clock (time.sleep in a poll loop): no wait on anyone
        assert still_after([(1_000, "C")] * 4) == 0.0
        # WHEN it waits on the run queue (CPU time plus run-queue time move by half the
        # time between looks): starved, not waiting on anything
        starved = [(1_000 + look * 100_000_000, "R") for look in range(4)]
        assert still_after(starved) == 0.0
        assert still_after([(1_000 + look * 100_000_000, "S") for look in range(4)]) == 0.0
        # WHEN it sleeps in disk I/O (state D) without moving: not communication
        assert still_after([(1_000, "D")] * 4) == 0.0
    finally:
        stop.set()
        thread.join(5)


def test_a_callback_on_a_works_future_counts_as_a_thread_until_it_ran(tmp_path: Path):
    import torch

    from dl2.record.recorder import Recorder
    from dl2.record.works import watched_future

    rec = Recorder(str(tmp_path))
    # GIVEN the future of a pending op, as the user's code gets it
    real: Any = torch.futures.Future()
    future = watched_future(real, rec)
    seen: list[Any] = []
    # WHEN a callback is chained on it (it may communicate once the op completes)
    chained = future.then(lambda f: seen.append((f.value(), rec.user_threads)))
    # THEN the rank counts one more thread of its own until the callback ran
    assert rec.user_threads == 1
    real.set_result([7])
    assert chained.wait() is None and seen == [([7], 1)]
    assert future.wait() == [7] and rec.user_threads == 0
    # AND an error reaches the user's future as it would gloo's
    failing: Any = torch.futures.Future()
    other = watched_future(failing, rec)
    failing.set_exception(RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="Connection closed"):
        other.wait()
    assert rec.user_threads == 0


class _Future:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def done(self) -> bool:
        return True

    def value(self) -> Any:
        if self.error is not None:
            raise self.error
        return []


class _Work:
    """A completed work: a collective's (with a future) or gloo's P2P one (without)."""

    def __init__(self, error: BaseException | None, has_future: bool) -> None:
        self.error, self.has_future, self.asked = error, has_future, 0

    def get_future(self) -> _Future:
        if not self.has_future:
            raise RuntimeError("Work::getFuture not implemented.")
        return _Future(self.error)

    def exception(self) -> BaseException | None:
        self.asked += 1  # torch prints a deprecation warning into the job's output
        return self.error


@pytest.mark.parametrize("has_future", [True, False])
@pytest.mark.parametrize("error", [None, RuntimeError("Connection closed by peer")])
def test_work_failed_asks_the_future_before_the_deprecated_exception(
    has_future: bool, error: BaseException | None
) -> None:
    from dl2.record.recorder import work_failed

    work = _Work(error, has_future)
    assert work_failed(work) is (error is not None)
    assert work.asked == (0 if has_future else 1)


def test_recording_prints_no_torch_deprecation_warning(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = textwrap.dedent(
        """
        import dl2.record, sys
        assert dl2.record.install(sys.argv[1])
        import torch, torch.distributed as dist
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        works = [dist.all_reduce(torch.ones(2), async_op=True) for _ in range(80)]
        works[-1].wait()
        assert works[0].is_completed()
        dist.destroy_process_group()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "deprecated" not in done.stderr, done.stderr


def test_a_ddp_comm_hooks_failure_reads_as_without_dl2(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # GIVEN a DDP comm hook whose future fails (its callback raises), as an op that
    # fails does: DDP reads the hook's future in C++
    script = textwrap.dedent(
        """
        import sys
        if sys.argv[1] != "-":
            import dl2.record
            assert dl2.record.install(sys.argv[1])
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

        def failing(state, bucket):
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            return work.get_future().then(lambda f: f.value()[0] / state["no such key"])

        def passing(state, bucket):
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            return work.get_future().then(lambda f: f.value()[0])

        good = DDP(torch.nn.Linear(2, 1))
        good.register_comm_hook({}, passing)
        good(torch.ones(1, 2)).sum().backward()
        bad = DDP(torch.nn.Linear(2, 1))
        bad.register_comm_hook({}, failing)
        try:
            bad(torch.ones(1, 2)).sum().backward()
        except RuntimeError as err:
            print("ERROR", str(err).splitlines()[0])
        """
    )
    seen = []
    for run_dir in ("-", str(tmp_path)):
        done = subprocess.run(
            [sys.executable, "-c", script, run_dir],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr
        seen.append(done.stdout.strip())
    # THEN backward fails with the hook's error under dl2 as without it (not "Unable to
    # cast ... to Tensor": dl2's Python future held the error as a value)
    assert seen[0].startswith("ERROR Got the following error when running the callback")
    assert seen[1] == seen[0]


def test_a_wildcard_senders_mark_survives_torchs_subgroup_translations(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from dl2.record import install
    from dl2.record import uninstall
    from dl2.record.source import SourceRank
    from dl2.record.source import via_of

    c10d = dist.distributed_c10d
    originals = (c10d.get_global_rank, c10d.get_group_rank)
    assert install(str(tmp_path))
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        sub = dist.new_group([0])
        # recv(src=None, group=sub) translates the sender's group rank to a global rank,
        # send(dst=src, group=sub) the global rank back: the mark stays
        assert via_of(c10d.get_global_rank(sub, SourceRank(0, 7))) == 7
        assert via_of(dist.get_group_rank(sub, SourceRank(0, 9))) == 9
        assert type(c10d.get_global_rank(sub, 0)) is int  # an unmarked rank stays plain
        dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        uninstall()
    assert (c10d.get_global_rank, c10d.get_group_rank) == originals
    assert dist.get_global_rank is originals[0]


def test_the_exits_a_launcher_notes_read_back_and_bad_lines_are_skipped(tmp_path: Path) -> None:
    from dl2.record.writer import note_exit
    from dl2.record.writer import read_exits

    # GIVEN a launcher that noted two ranks it reaped, then a line torn by a crash
    note_exit(str(tmp_path), 4321, -9)
    note_exit(str(tmp_path), 4322, 1)
    (noted,) = tmp_path.glob(".exits.*")
    with noted.open("a") as handle:
        handle.write("43\n\x00junk -x\n")
    note_exit(str(tmp_path), 4321, -15)  # noted again later: the first ending counts
    # THEN each rank's first noted status comes back, the rest is skipped
    assert read_exits(str(tmp_path)) == {4321: -9, 4322: 1}
    assert read_exits(str(tmp_path / "missing")) == {}


def test_a_thread_in_time_sleep_is_told_from_one_waiting_on_an_event() -> None:
    import time

    from dl2.record import watchdog

    # GIVEN a thread in time.sleep and one waiting on an event (a futex, as gloo waits)
    event = threading.Event()
    sleeper = threading.Thread(target=time.sleep, args=(3,), daemon=True)
    waiter = threading.Thread(target=event.wait, daemon=True)
    sleeper.start()
    waiter.start()
    try:
        time.sleep(0.3)
        slept, waited = (watchdog._thread_times(t.ident or 0) for t in (sleeper, waiter))
        # THEN the first sleeps on a clock, the second waits
        if not watchdog._SLEEPS:
            pytest.skip(f"no sleep system calls known for {os.uname().machine}")
        assert slept is not None and slept[1] == "C"
        assert waited is not None and waited[1] == "S"
    finally:
        event.set()
        waiter.join(5)


def test_done_asked_of_a_works_future_is_a_poll_of_the_op(tmp_path: Path) -> None:
    import torch

    from dl2.record.recorder import Recorder
    from dl2.record.works import watched_future

    rec = Recorder(str(tmp_path))
    # GIVEN the future of pending op 7, as the user's code gets it
    real: Any = torch.futures.Future()
    rec.pending[7] = object()
    future = watched_future(real, rec, 7)
    # WHEN the user asks done() while it is pending (a loop that spins on it)
    assert future.done() is False
    # THEN it counts as a poll of op 7, from the user's line, as is_completed() does
    assert 7 in rec.polled
    # AND once complete, done() says so
    real.set_result([1])
    assert future.done() is True


def test_a_future_chained_on_a_works_future_is_marked_as_waiting_on_the_op(tmp_path: Path):
    import torch

    from dl2.record.recorder import Recorder
    from dl2.record.works import marked_future
    from dl2.record.works import watched_future

    rec = Recorder(str(tmp_path))
    real: Any = torch.futures.Future()
    future = watched_future(real, rec, 3)
    # GIVEN a then() chained on a work's future, and a collect_all of it (torch makes
    # both in C++: a wait on them runs under the user's own line)
    chained = future.then(lambda f: f.value()[0] * 2)
    combined = marked_future(torch.futures.collect_all([future]))
    # THEN they come back as Python futures marked as a work's, waited on in
    # torch.futures where the watchdog sees the wait, with the values torch's give
    assert getattr(chained, "_dl2_work", False) and getattr(combined, "_dl2_work", False)
    real.set_result([5])
    assert chained.wait() == 10
    assert [f.value() for f in combined.wait()] == [[5]]
    # AND an error reaches them as it would torch's own
    failing: Any = torch.futures.Future()
    failed = watched_future(failing, rec, 4).then(lambda f: f.value())
    failing.set_exception(RuntimeError("peer gone"))
    with pytest.raises(RuntimeError, match="peer gone"):
        failed.wait()


def test_a_thread_joining_a_helper_that_waits_on_a_work_waits_in_communication(
    tmp_path: Path,
) -> None:
    from dl2.record.watchdog import _joined_wait

    # GIVEN a helper thread waiting on a pending work's future, another on a plain event
    real, future = _pending_work_future(tmp_path)
    stop = threading.Event()
    on_work = threading.Thread(target=future.wait, daemon=True)
    on_event = threading.Thread(target=stop.wait, daemon=True)
    # AND two threads joining them (the rank's main thread, as the watchdog sees it)
    joiners = [threading.Thread(target=t.join, daemon=True) for t in (on_work, on_event)]
    for thread in (on_work, on_event, *joiners):
        thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            frames = sys._current_frames()
            found = [_joined_wait(frames.get(j.ident or 0), frames, {}) for j in joiners]
            if found[0] is not None:
                break
            time.sleep(0.05)
        # THEN the join of the helper that waits on the work is a wait in communication,
        # at the helper's frame; the join of the other is not
        assert found[0] is not None and found[0] is frames[on_work.ident or 0]
        assert stack.where(found[0]) == "comm"
        assert found[1] is None
        # AND a thread not joining anyone is not followed anywhere
        assert _joined_wait(frames.get(on_event.ident or 0), frames, {}) is None
        del frames, found
    finally:
        real.set_result([1])
        stop.set()
        for thread in (on_work, on_event, *joiners):
            thread.join(5)


def _call_with_no_python_frame(fn: Any, *args: Any) -> None:
    """Call ``fn(*args)`` from a thread started in C, so that no Python frame lies below
    ``fn``'s own (as when C++ calls into a group: DDP's reducer on a CUDA autograd
    thread); return once it returned."""
    import _thread
    import collections
    import functools
    import operator

    returned = threading.Event()
    # deque consumes the map in C: fn(*args), then (if it returned) returned.set()
    calls = map(operator.call, [functools.partial(fn, *args), returned.set])
    _thread.start_new_thread(collections.deque, (calls, 0))
    assert returned.wait(10), "the call raised or did not return in 10 s"


def test_calls_from_a_thread_with_no_python_frame_are_recorded(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from dl2.record import install
    from dl2.record import uninstall

    install(str(tmp_path))
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        group = dist.group.WORLD
        t = torch.ones(3)
        opts = dist.AllreduceOptions()
        # GIVEN a recording group called with no Python frame below the call
        # WHEN it issues a collective there, and a work made here is waited on there
        _call_with_no_python_frame(type(group).allreduce, group, [t], opts)
        work = dist.all_reduce(t, async_op=True)
        _call_with_no_python_frame(type(work).wait, work)
        # WHEN it sends there (one rank has no peer: gloo's part is a completed work)
        inner = group._dl2_inner
        done = inner.allreduce([t])
        done.wait()

        class Sent:
            def send(self, *args: Any) -> Any:
                return done

        group._dl2_inner = Sent()
        try:
            _call_with_no_python_frame(type(group).send, group, [t], 0, 7)
        finally:
            group._dl2_inner = inner
        dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        uninstall()
    # THEN both ops, and the wait, are in the trace: the first with no API and no frames
    (path,) = tmp_path.iterdir()
    records = read_raw_trace(path).records
    first, second = (r for r in records if r["k"] == "op" and r["op"] == "all_reduce")
    assert first["api"] is None and first["stack"] == []
    assert second["api"] == "all_reduce"
    (wait,) = (r for r in records if r["k"] == "wait" and r["work"] == second["id"])
    assert wait["stack"] == []
    (send,) = (r for r in records if r["k"] == "op" and r["op"] == "send")
    assert send["tag"] == 7 and send["stack"] == []
