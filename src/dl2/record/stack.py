"""The user's call stack at a communication call, captured cheaply, as an interned id.

A walk up ``sys._getframe()`` that classifies each code object once (user code, a
library dl2 and torch skip, or a torch.distributed API function) and keeps that verdict,
plus each frame's encoded ``[file, line, function]`` per instruction offset, in a cache
keyed by the code object: no ``linecache``, no ``json.dumps``.  The kept frames' cached
texts (whose hashes are cached too) are the key of the stack: a stack seen before is
found in one dict lookup, with no joining; only a new one is encoded (a JSON array,
innermost first) and interned in :data:`STACKS`, the process's table of stacks, whose
ids the trace refers to (each segment defines the ones it uses).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable
from types import CodeType
from types import FrameType
from typing import Any

from dl2 import speedups
from dl2.trace.schema.encode import StackTable
from dl2.trace.schema.encode import frame_json
from dl2.trace.schema.encode import stack_json

#: The process's stacks: id -> encoded stack (the trace's stack ids).
STACKS = StackTable()

# Frame kinds.
USER = 0  # the user's code (or any library that is not torch, dl2 or a wrapper)
LIB = 1  # torch (outside its API modules), dl2, the standard library: skipped
API = 2  # a function of torch.distributed.distributed_c10d: names the API called
THIRD = 3  # another installed package (site-packages): kept, but not the user's own line
_RECORDED = frozenset({USER, THIRD})

#: user frames kept per stack; past it the walk goes on (up to MAX_WALK frames) only
#: until it has kept one frame of the user's own code, so that a collective issued deep
#: inside an installed library (transformers, accelerate) still names the script's line.
MAX_FRAMES = 8
MAX_WALK = 200


def _package_dir(name: str) -> str | None:
    """The directory of an importable package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "")


def _real(path: str | None) -> str | None:
    return os.path.join(os.path.realpath(path), "") if path else None


_TORCH_DIRS = tuple({d for d in (_package_dir("torch"), _real(_package_dir("torch"))) if d})
_DL2_DIRS = tuple(
    {
        d
        for d in (
            os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ""),
            _real(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        )
        if d
    }
)
# The functional collectives reach the group from C++ (through the trampoline, as the
# coalesced variants in torch 2.13); their Python entry point still names the API.
_API_FILES = frozenset(
    os.path.join(d, "distributed", name)
    for d in _TORCH_DIRS
    for name in ("distributed_c10d.py", "_functional_collectives.py")
)
# The standard library (decorators, context managers, importlib, threading) is skipped,
# like typing_extensions (whose ``deprecated`` wraps some torch.distributed functions).
_STDLIB_DIRS = tuple(
    {
        os.path.join(d, "")
        for key in ("stdlib", "platstdlib")
        for d in (sysconfig.get_paths().get(key), _real(sysconfig.get_paths().get(key)))
        if d
    }
)

# id(code) -> (code, kind, {f_lasti: '["file",line,"function"]'}).
# Keyed by id: hashing a code object hashes its constants, nested code objects included,
# which for a module's top-level code (in every script's stack) costs microseconds.  The
# entry holds the code object, so its id cannot be reused while the entry exists.
# A frame's line number costs a line-table scan; its last instruction offset is a plain
# field, so the encoded frame is cached per offset.
_Entry = tuple[CodeType, int, dict[int, str]]
_cache: dict[int, _Entry] = {}
_CACHE_LIMIT = 50_000
# The encoded frames of a stack -> its id in STACKS.
_ids: dict[tuple[str, ...], int] = {}


def classify_file(filename: str) -> int:
    """The kind of a frame from its code's file name."""
    if filename.startswith(_TORCH_DIRS):
        return API if filename in _API_FILES else LIB
    if filename.startswith(_DL2_DIRS) or filename.startswith("<frozen"):
        return LIB
    if filename.endswith("typing_extensions.py"):
        return LIB
    if "site-packages" in filename or "dist-packages" in filename:
        return THIRD
    return LIB if filename.startswith(_STDLIB_DIRS) else USER


def _entry(code: CodeType) -> _Entry:
    entry = _cache.get(id(code))
    if entry is None:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        entry = _cache[id(code)] = (code, file_kind(code.co_filename), {})
    return entry


# co_filename -> kind: the walk classifies a frame by its file alone, with no id() call
# and no entry (code objects of one module share their file name string).
_kinds: dict[str, int] = {}


def file_kind(filename: str) -> int:
    """The kind of a frame from its code's file name, as :func:`classify_file` says,
    remembered per file name."""
    kind = _kinds.get(filename)
    if kind is None:
        if len(_kinds) >= _CACHE_LIMIT:
            _kinds.clear()
        kind = _kinds[filename] = classify_file(filename)
    return kind


def _line_of(code: CodeType, frame: FrameType) -> int:
    """The frame's current line; ``f_lineno`` is None while a frame runs an instruction
    without a line (seen when the watchdog samples another thread), so fall back to the
    line table, then to the function's first line."""
    line = frame.f_lineno
    if line is not None:
        return line
    offset = frame.f_lasti
    for start, end, number in code.co_lines():
        if start <= offset < end and number is not None:
            return number
    return code.co_firstlineno


def _frame_json(code: CodeType, frame: FrameType, lines: dict[int, str]) -> str:
    """The encoded ``[file, line, function]`` of a user frame (cached per offset)."""
    name = getattr(code, "co_qualname", code.co_name)
    text = frame_json(code.co_filename, _line_of(code, frame), name)
    if len(lines) < 1000:
        lines[frame.f_lasti] = text
    return text


def _frame_json_at(code: CodeType, line: int) -> str:
    """The encoded ``[file, line, function]`` of a frame at a given line (not cached)."""
    return frame_json(code.co_filename, line, getattr(code, "co_qualname", code.co_name))


def capture_py(frame: FrameType | None) -> tuple[str | None, int]:
    """The API called and the user stack, starting at ``frame`` (the caller of a hook).

    Args:
        frame: the frame that called into dl2 (for a process-group method, the frame
            that called the method; for a call from C++, the last Python frame).

    Returns:
        ``(api, stack id)``: ``api`` is the outermost function of
        torch.distributed.distributed_c10d (or of the functional collectives) among the
        library frames between ``frame`` and the first user frame: the API the user (or
        a torch library such as FSDP) called.  None when there is none: the call came
        from C++ on behalf of no such function, e.g. from DDP's reducer during
        ``loss.backward()``.  The stack id is :func:`user_stack_id`'s.
    """
    kinds = _kinds
    api: str | None = None
    f = frame
    while f is not None:
        code = f.f_code
        kind = kinds.get(code.co_filename)
        if kind is None:
            kind = file_kind(code.co_filename)
        if kind in _RECORDED:
            break
        if kind == API:
            api = code.co_name
        f = f.f_back
    return api, user_stack_id(f)


def user_stack_id(frame: FrameType | None, lines: dict[int, int] | None = None) -> int:
    """The id (in :data:`STACKS`) of the up to MAX_FRAMES user frames from ``frame``
    outwards, innermost first, a recursion's repeated frame (same function, same line)
    kept once; when all of them are installed packages' frames, the last is replaced
    by the first frame of the user's own code further out (if within MAX_WALK
    frames).  ``lines``: id(frame) -> the line to name for it instead of its current
    one (a traceback's: where the exception passed)."""
    cache = _cache
    parts: list[str] = []
    own = False  # a frame of the user's own code (not an installed package) is kept
    f = frame
    for _ in range(MAX_WALK):
        if f is None:
            break
        code = f.f_code
        entry = cache.get(id(code)) or _entry(code)
        if entry[1] == USER:
            text = entry[2].get(f.f_lasti) or _frame_json(code, f, entry[2])
            if lines is not None and id(f) in lines:
                text = _frame_json_at(code, lines[id(f)])
            if parts and text is parts[-1]:
                # recursion (the same function at the same line): kept once, so that
                # the frames that started it still fit
                f = f.f_back
                continue
            if len(parts) < MAX_FRAMES - 1:  # room for more after this one
                parts.append(text)
                own = True
                f = f.f_back
                continue
            if len(parts) < MAX_FRAMES:
                parts.append(text)
            else:
                parts[-1] = text  # the outermost kept: the user's
            break
        if entry[1] == THIRD and len(parts) < MAX_FRAMES:
            if lines is not None and id(f) in lines:
                parts.append(_frame_json_at(code, lines[id(f)]))
            else:
                parts.append(entry[2].get(f.f_lasti) or _frame_json(code, f, entry[2]))
            if len(parts) >= MAX_FRAMES and own:
                break
        f = f.f_back
    # The frames' cached texts are the key: their hashes are cached, so a stack seen
    # before costs one lookup, and is never joined again.
    key = tuple(parts)
    sid = _ids.get(key)
    if sid is None:
        if len(_ids) >= _CACHE_LIMIT:
            _ids.clear()
        sid = _ids[key] = STACKS.intern(stack_json(parts))
    return sid


def _compiled_capture() -> Any:
    """:func:`capture_py` in C (:mod:`dl2._speedups`, over the same caches, calling it
    on a miss), or None where it was not built or ``DL2_PURE_PYTHON`` is set."""
    fast = speedups.module()
    if fast is None:
        return None
    try:
        fast.setup(_kinds, _cache, _ids, capture_py, USER, THIRD, API, MAX_FRAMES, MAX_WALK)
    except Exception:
        return None
    return fast.capture


#: :func:`capture_py`, in C where it was built: the recorder's capture at every call.
capture: Callable[[FrameType | None], tuple[str | None, int]] = _compiled_capture() or capture_py


def raised_at(exc: BaseException) -> int:
    """The id of the user stack where ``exc`` was raised (from its traceback's innermost
    frame outwards: a torch call that raised names the user's line that called it)."""
    tb = exc.__traceback__
    if tb is None:
        return 0
    # each frame the exception passed is named at the line it passed there, not where
    # the frame is now (a ``finally`` block may have run since)
    lines: dict[int, int] = {}
    while True:
        if isinstance(tb.tb_lineno, int) and tb.tb_lineno > 0:
            lines[id(tb.tb_frame)] = tb.tb_lineno
        if tb.tb_next is None:
            break
        tb = tb.tb_next
    return user_stack_id(tb.tb_frame, lines)


def in_distributed_call(frame: FrameType | None) -> bool:
    """Whether a torch.distributed API function is on the stack from ``frame`` outwards
    (within MAX_WALK frames): what runs there runs on behalf of that call (a backend's
    progress thread started while init_process_group builds it)."""
    f = frame
    for _ in range(MAX_WALK):
        if f is None:
            return False
        if f.f_code.co_filename in _API_FILES:
            return True
        f = f.f_back
    return False


def user_stack(frame: FrameType | None) -> str:
    """The encoded stack of :func:`user_stack_id` (a JSON array of frames)."""
    return STACKS.text(user_stack_id(frame))


_BACKWARD_NAMES = frozenset({"_engine_run_backward", "run_backward"})
# Where a thread blocked in communication has its innermost Python frame: a
# torch.distributed API function (the C++ call under it blocks), dl2's recording hooks
# (a work's wait), torch.futures (``torch.futures.wait_all([work.get_future(), ...])``,
# ``future.wait()``: no dl2 frame on that stack)
_FUTURES_DIRS = tuple(os.path.join(d, "futures", "") for d in _TORCH_DIRS)
_COMM_DIRS = _FUTURES_DIRS + tuple(os.path.join(d, "record", "") for d in _DL2_DIRS)
#: functions there that never wait: a work's queries, a future's done(), dl2's wrapping
#: of a work's future for the user (its callbacks counted as threads)
_QUERY_NAMES = frozenset(
    {
        "is_completed",
        "is_success",
        "exception",
        "source_rank",
        "_source_rank",
        "get_future",
        "_get_op_type",
        "_get_duration",
        "done",
        "__del__",
        "watched_future",
        "counting",
        "attach",
        "transfer",
        "marked_future",
        "_complete_with",
        "<lambda>",
    }
)
#: torch.futures' functions that wait (on a future not complete)
_FUTURE_WAITS = frozenset({"wait", "value", "wait_all"})
_DIST_DIRS = tuple(os.path.join(d, "distributed", "") for d in _TORCH_DIRS)
#: seconds a frame elsewhere in torch.distributed, or a backward pass, must stay at one
#: instruction without running before it counts as blocked in communication:
#: torch.distributed also runs plain Python for long (a checkpoint written, a batch
#: moved with ``_recursive_to``), a backward computes, and a rank doing so with a work
#: pending is not waiting on it
STILL_S = 2.0


def where(frame: FrameType | None, still_s: float = 0.0, in_call: bool = False) -> str:
    """What a (blocked or running) thread is doing, judged from its stack.

    Args:
        frame: the thread's innermost frame (``sys._current_frames()[ident]``).
        still_s: how long the thread has been at this frame and instruction (the
            watchdog's samples): in torch.distributed outside its API functions, a frame
            is taken as blocked in communication only after :data:`STILL_S`.
        in_call: the thread is in a blocking op the recorder saw issued.  Without one,
            an API function's frame also counts only after :data:`STILL_S`: the API
            also holds helpers that return at once (``get_rank()``, the Python before a
            collective is issued), where a look may land on a rank that computes.

    Returns:
        "comm" when the innermost frame is a torch.distributed API function in a
        blocking op, in torch.futures waiting on a future not complete, or in dl2's
        recording hooks (a communication call or a wait, also on a work's future), or
        elsewhere in torch.distributed (its API included) and still; "backward"
        when the thread is still inside the autograd engine's backward call (DDP's
        backward waiting on its buckets; one that computes, or Python code it runs,
        is "python"); "python" otherwise.
    """
    f = frame
    if f is not None:
        code = f.f_code
        name = code.co_filename
        if code.co_name != "<module>" and (
            (in_call and name in _API_FILES)
            or (name.startswith(_COMM_DIRS) and not _returns_at_once(f))
            or (still_s >= STILL_S and (name.startswith(_DIST_DIRS) or name in _API_FILES))
        ):
            return "comm"
    if still_s < STILL_S or f is None:
        return "python"  # running: a backward that computes is not waiting on anything
    code = f.f_code
    if code.co_name in _BACKWARD_NAMES and code.co_filename.startswith(_TORCH_DIRS):
        # still inside the autograd engine itself (DDP's reducer waits there); Python
        # code the engine runs (a custom backward, a hook) waiting on a queue is no
        # wait on communication
        return "backward"
    return "python"


def _returns_at_once(frame: FrameType) -> bool:
    """Whether ``frame``, of torch.futures or of dl2's recording hooks, is a call that
    returns at once: a query on a work (``work.is_completed()`` asked by a rank that
    computes meanwhile), a future built, chained or completed (``then``,
    ``set_result``, ``collect_all``: a user's own pipeline of futures), or a wait on
    futures already complete (a checkpoint writer's ``write_data(...).wait()``).  The
    watchdog gets the GIL as such a call releases it, and must not take that instant
    for a wait in communication."""
    name = frame.f_code.co_name
    if name in _QUERY_NAMES:
        return True
    if not frame.f_code.co_filename.startswith(_FUTURES_DIRS):
        return False
    if name not in _FUTURE_WAITS:
        return True
    try:
        local = frame.f_locals
        futures = [local["self"]] if "self" in local else list(local.get("futures") or ())
        return bool(futures) and not any(_awaits_work(future) for future in futures)
    except Exception:
        return False


def _awaits_work(future: object) -> bool:
    """Whether a wait on ``future`` may wait on communication: it is not complete, and
    it is a work's (wrapped by dl2 for the user, marked ``_dl2_work``) or one torch
    made (a work's raw future, a ``then`` chained on one), not a plain
    ``torch.futures.Future()`` of the user's own, which a thread of theirs completes."""
    if future.done():  # type: ignore[attr-defined]
        return False
    own = getattr(sys.modules.get("torch.futures"), "Future", None)  # the user's kind
    return bool(getattr(future, "_dl2_work", False)) or type(future) is not own


def caller_frame(depth: int = 1) -> FrameType | None:
    """The frame ``depth`` levels above the function that calls this one (1: its
    caller), or None where the stack is not that deep: a hook called from a thread C++
    started, with no Python frame below it (DDP's reducer on a CUDA autograd thread,
    a C++ callback), which ``sys._getframe(depth)`` answers with a ValueError."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None
