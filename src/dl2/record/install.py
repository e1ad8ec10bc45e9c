"""Turn recording on inside a process: register the "dl2" backend and patch group creation.

:func:`install` patches ``torch.distributed.distributed_c10d._new_process_group_helper``,
the one function every group creation goes through (``init_process_group``,
``new_group``, ``new_subgroups``, DeviceMesh), so that a group whose backend is gloo on
every device it uses is built by the "dl2" backend instead, i.e. as a
:class:`~dl2.record.pg.RecordingProcessGroup` around gloo.  User code is unchanged: the
group's entry in ``_world.pg_map`` keeps the backend name the user asked for, so
``dist.get_backend()`` still says "gloo" (and ``monitored_barrier``, which checks it,
still works).

It also records ``newgroup`` for every caller of a group creation, ``nonmember`` when a
rank calls a collective on a group it is not in, and ``end`` at
``destroy_process_group`` and at exit; it wraps ``batch_isend_irecv`` so that the
ops of one batch share a ``batch`` id, and the c10d Store methods
(:mod:`dl2.record.store`) so that user and library store calls are recorded.

Every patch is wrapped so that a failure in dl2 leaves the job's behaviour unchanged.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import inspect
import os
import sys
import threading
import time
import warnings
from typing import Any

from dl2.notice import notice
from dl2.record import recorder as _recorder_mod
from dl2.record.recorder import Recorder
from dl2.record.source import SourceRank
from dl2.record.source import via_of
from dl2.record.stack import API
from dl2.record.stack import USER
from dl2.record.stack import caller_frame
from dl2.record.stack import capture
from dl2.record.stack import classify_file
from dl2.record.stack import in_distributed_call
from dl2.record.stack import user_stack_id
from dl2.record.writer import ENV_RUN_DIR
from dl2.record.writer import note_exit
from dl2.record.writer import rendezvous_mark

_now = time.monotonic_ns

BACKEND_NAME = "dl2"
ENV_DISABLE = "DL2_DISABLE"


class _Installed:
    """What install() changed, so uninstall() can undo it."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.patches: list[tuple[Any, str, Any]] = []  # (object, attribute, original)
        self.helper_signature: inspect.Signature | None = None

    def patch(self, obj: Any, name: str, new: Any) -> Any:
        original = getattr(obj, name)
        self.patches.append((obj, name, original))
        setattr(obj, name, new)
        return original


_INSTALLED: _Installed | None = None
_REGISTERED = False
_AT_EXIT_REGISTERED = False
_FORK_HOOK_REGISTERED = False


def is_installed() -> bool:
    """True while recording is installed in this process."""
    return _INSTALLED is not None


def recorder() -> Recorder | None:
    """The process's recorder, or None when not installed."""
    return _INSTALLED.recorder if _INSTALLED is not None else None


def install(run_dir: str | None = None) -> bool:
    """Record this process's torch.distributed communication into ``run_dir``.

    Args:
        run_dir: the trace directory; defaults to ``$DL2_RUN_DIR``.

    Returns:
        True if recording is (now or already) installed; False when there is no run
        directory, ``DL2_DISABLE=1`` is set, torch.distributed is unavailable, or the
        install failed (a one-line notice on stderr says why; the job is untouched).
    """
    global _INSTALLED
    if _INSTALLED is not None:
        return True
    run_dir = run_dir or os.environ.get(ENV_RUN_DIR)
    if not run_dir or os.environ.get(ENV_DISABLE, "") not in ("", "0"):
        return False
    state: _Installed | None = None
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return False
        rec = Recorder(os.path.abspath(run_dir))
        _configure_emulation(rec)
        state = _Installed(rec)
        _register_backend(dist)
        _patch(state, dist)
        _patch_comm_hooks(state, dist)
        _patch_threads(state)
        _patch_spawn(state)
        _patch_launchers(state)
        _patch_exit(state)
        _INSTALLED = state
        _recorder_mod.RECORDER = rec
        _register_process_hooks()
        return True
    except Exception as err:
        if state is not None:
            _undo(state)
        notice(f"recording not installed: {err!r}; the job continues")
        return False


def _configure_emulation(rec: Recorder) -> None:
    """Turn on the emulated send semantics the environment asks for (dl2.record.emulate)."""
    from dl2.record import emulate

    rec.eager_bytes = emulate.eager_bytes_from_env()
    if rec.eager_bytes >= 0:
        rec.eager = emulate.EagerSends()
    if emulate.fused_batches_from_env():
        rec.gate = emulate.BatchGate()


def uninstall() -> None:
    """Undo :func:`install` (for tests): restore torch, stop the watchdog, close the file.

    The "dl2" backend stays registered (torch cannot unregister one); groups created
    with it afterwards are still gloo groups, recorded into nothing.
    """
    global _INSTALLED
    state = _INSTALLED
    if state is None:
        return
    _INSTALLED = None
    _undo(state)
    rec = state.recorder
    watchdog = rec.watchdog
    if watchdog is not None:
        watchdog.stop()
    rec.close()
    rec.writer = None
    if _recorder_mod.RECORDER is rec:
        _recorder_mod.RECORDER = None


def _undo(state: _Installed) -> None:
    for obj, name, original in reversed(state.patches):
        try:
            setattr(obj, name, original)
        except Exception:
            pass
    state.patches.clear()


# -- the backend ----------------------------------------------------------------------


_INACTIVE = Recorder("")


def _create(dist_opts: Any, backend_options: Any) -> Any:
    """The registered creator: dispatches to the installed recorder (if any)."""
    from dl2.record.pg import create_group

    state = _INSTALLED
    return create_group(state.recorder if state else _INACTIVE, dist_opts, backend_options)


def _register_backend(dist: Any) -> None:
    global _REGISTERED
    if not _REGISTERED:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
        _REGISTERED = True


def translate_backend(backend: Any) -> str | None:
    """BACKEND_NAME if a group asked with ``backend`` would use only gloo; else None.

    "gloo", None/"undefined" on a machine without an accelerator, and "cpu:gloo,..."
    whose other devices cannot be used here (no CUDA device, but NCCL built in, so that
    torch itself would have accepted the string) all become the recording backend.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import BackendConfig

    name = str(backend).lower() if backend is not None else "undefined"
    if name == BACKEND_NAME:
        return None
    device_map = BackendConfig(dist.Backend(name)).get_device_backend_map()
    used = {}
    for device, device_backend in device_map.items():
        if str(device_backend).lower() == "gloo":
            used[device] = "gloo"
        elif device == "cuda" and not torch.cuda.is_available() and dist.is_nccl_available():
            continue  # torch would build NCCL lazily and never use it on this machine
        else:
            return None
    return BACKEND_NAME if "cpu" in used else None


# -- the patches ----------------------------------------------------------------------


def _patch_comm_hooks(state: _Installed, dist: Any) -> None:
    """A comm hook's future is read in C++ (DDP's reducer, through
    ``dist._register_comm_hook``, which ``DistributedDataParallel.register_comm_hook``
    calls): the hook's result goes back as the future torch made
    (:func:`~dl2.record.works.source_future`), so that an op that fails fails the
    backward pass with the op's own error, as it does without dl2."""
    original = getattr(dist, "_register_comm_hook", None)
    if original is None:
        return
    from dl2.record.works import source_future  # imports torch: here, not at import

    def _register_comm_hook(reducer: Any, hook_state: object, hook: Any) -> Any:
        if not callable(hook):
            return original(reducer, hook_state, hook)

        def returns_torchs_future(*args: Any, **kwargs: Any) -> Any:
            return source_future(hook(*args, **kwargs))

        return original(reducer, hook_state, returns_torchs_future)

    state.patch(dist, "_register_comm_hook", _register_comm_hook)


def _patch(state: _Installed, dist: Any) -> None:
    c10d = dist.distributed_c10d
    original_helper = c10d._new_process_group_helper
    state.helper_signature = inspect.signature(original_helper)
    original_warn = c10d._warn_not_in_group
    original_destroy = c10d.destroy_process_group
    rec = state.recorder

    def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        try:
            prepared = _prepare_group(state, c10d, caller_frame(), args, kwargs)
        except Exception:
            prepared = None
        if prepared is None:
            return original_helper(*args, **kwargs)
        call_args, call_kwargs, original_backend, device = prepared
        if device is not None:
            return _device_group(rec, c10d, original_helper, call_args, call_kwargs, device)
        try:
            result = original_helper(*call_args, **call_kwargs)
        finally:
            rec.local.group_ctx = None
        if original_backend is not None:
            _restore_backend_name(c10d, result, original_backend)
        return result

    def _warn_not_in_group(op_name: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if rec.active:
                rec.nonmember(_now(), str(op_name), user_stack_id(caller_frame()))
        except Exception:
            pass
        if args or kwargs:
            return original_warn(op_name, *args, **kwargs)
        # torch's own text and level, one frame further up (calling the original from
        # here would point the warning at this file instead of the caller's line).
        world = c10d.GroupMember.WORLD
        global_rank = -1 if world is None else world.rank()
        warnings.warn(
            f"Running {op_name} on global rank {global_rank} which does not "
            "belong to the given group.",
            stacklevel=3,
        )
        return None

    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            if group is None or group is c10d.GroupMember.WORLD:
                rec.end("destroy")
                # A buffered backend delivers what it holds before it shuts down.
                rec.drain_eager(_drain_seconds())
        except Exception:
            pass
        return original_destroy(group, *args, **kwargs)

    original_batch = c10d.batch_isend_irecv

    @functools.wraps(original_batch)
    def batch_isend_irecv(*args: Any, **kwargs: Any) -> Any:
        # The P2P ops issued inside share a batch id: the id of the first one.
        tid = threading.get_ident()
        rec.batches[tid] = [0]
        try:
            return original_batch(*args, **kwargs)
        finally:
            rec.batches.pop(tid, None)
            gate = rec.gate
            if gate is not None and gate.deferred:
                gate.launch(tid)  # fused-batch emulation: issue the batch as one unit

    def marked(original: Any) -> Any:
        """``get_global_rank`` / ``get_group_rank``, keeping a wildcard sender's mark: on
        a subgroup torch translates the sender ``recv(src=None, group=g)`` returns to a
        global rank, and a peer the program names from it back to a group rank."""

        @functools.wraps(original)
        def translate(group: Any, rank: int) -> int:
            found: int = original(group, rank)
            via = via_of(rank)
            if via is None or type(found) is not int:
                return found
            try:
                return SourceRank(found, via)
            except Exception:
                return found

        return translate

    from dl2.record.works import marked_future  # imports torch: here, not at import

    futures_mod = sys.modules.get("torch.futures")
    original_collect: Any = getattr(futures_mod, "collect_all", None)

    def collect_all(futures: Any) -> Any:
        # the combined future of a work's futures is waited on under the user's line:
        # a Python future marked as a work's lets the watchdog see that wait
        combined = original_collect(futures)
        try:
            if any(getattr(f, "_dl2_work", False) for f in futures):
                return marked_future(combined)
        except Exception:
            pass
        return combined

    if original_collect is not None:
        functools.update_wrapper(collect_all, original_collect)
        state.patch(futures_mod, "collect_all", collect_all)
    original_rendezvous: Any = getattr(c10d, "rendezvous", None)

    def rendezvous(*args: Any, **kwargs: Any) -> Any:
        # init_process_group meets the other ranks here, before any group (and so this
        # rank's trace) exists: a mark tells the monitor this process waits there
        try:
            open(rendezvous_mark(rec.run_dir, os.getpid()), "wb").close()
        except Exception:
            pass
        return original_rendezvous(*args, **kwargs)

    if original_rendezvous is not None:
        functools.update_wrapper(rendezvous, original_rendezvous)
        state.patch(c10d, "rendezvous", rendezvous)
    destroy_process_group.__doc__ = original_destroy.__doc__
    for name in ("get_global_rank", "get_group_rank"):
        original = getattr(c10d, name, None)
        if original is None:
            continue
        state.patch(c10d, name, marked(original))
        if getattr(dist, name, None) is original:
            state.patch(dist, name, getattr(c10d, name))
    state.patch(c10d, "_new_process_group_helper", _new_process_group_helper)
    state.patch(c10d, "_warn_not_in_group", _warn_not_in_group)
    state.patch(c10d, "destroy_process_group", destroy_process_group)
    if getattr(dist, "destroy_process_group", None) is original_destroy:
        state.patch(dist, "destroy_process_group", destroy_process_group)
    state.patch(c10d, "batch_isend_irecv", batch_isend_irecv)
    if getattr(dist, "batch_isend_irecv", None) is original_batch:
        state.patch(dist, "batch_isend_irecv", batch_isend_irecv)
    try:
        from dl2.record.store import patch_stores

        patch_stores(state.patch, rec)
    except Exception as err:  # the store calls go unrecorded; the rest still records
        notice(f"store calls not recorded: {err!r}")


def _patch_threads(state: _Installed) -> None:
    """Count the threads that run the user's own code: each one's start and end is a
    ``threads`` record (a rank blocked in one thread may be released by another).  A
    thread started inside a torch.distributed call (a backend's progress thread, started
    while init_process_group builds it) works for that call, not for the user."""
    rec = state.recorder
    original = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
    original_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        try:
            self._dl2_user = runs_user_code(self) and not in_distributed_call(caller_frame())  # type: ignore[attr-defined]
        except Exception:
            pass
        original_start(self)

    def _bootstrap_inner(self: threading.Thread) -> None:
        counted = getattr(self, "_dl2_user", False)
        if counted:
            rec.thread_started()
        try:
            original(self)
        finally:
            if counted:
                rec.thread_ended()

    state.patch(threading.Thread, "start", start)
    state.patch(threading.Thread, "_bootstrap_inner", _bootstrap_inner)
    _patch_pools(state)
    _patch_excepthook(state)


def _patch_excepthook(state: _Installed) -> None:
    """A thread's uncaught exception is a ``thread_error`` record, then goes to the
    hook there was (which prints it): a helper thread that dies leaves its rank without
    what it was to do (send, set a key), and the report names it."""
    rec = state.recorder
    original = threading.excepthook

    def excepthook(args: Any) -> None:
        try:
            exc = args.exc_value
            if exc is not None and not isinstance(exc, SystemExit):
                thread = args.thread
                name = thread.name if thread is not None else "?"
                rec.thread_error(name, exc)
        except Exception:
            pass
        original(args)

    state.patch(threading, "excepthook", excepthook)


def _counts(fn: Any, caller: Any) -> bool:
    """Whether a function handed to a pool counts as a thread of the user's: the user's
    own code, not handed over inside a torch.distributed call (never raises)."""
    try:
        return is_user_callable(fn) and not in_distributed_call(caller)
    except Exception:
        return False


def _patch_pools(state: _Installed) -> None:
    """Count a function of the user's code submitted to a ``ThreadPoolExecutor`` like a
    thread of it, from its submission until it finished: the pool's worker threads are
    the standard library's, but what they run may release a blocked thread."""
    pools = sys.modules.get("concurrent.futures.thread")
    executor = getattr(pools, "ThreadPoolExecutor", None)
    if executor is None:
        return
    rec = state.recorder
    original = executor.submit

    def _finished(future: Any) -> None:
        rec.thread_ended()

    @functools.wraps(original)
    def submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if not _counts(fn, caller_frame()):
            return original(self, fn, *args, **kwargs)
        rec.thread_started()
        try:
            future = original(self, fn, *args, **kwargs)
        except BaseException:
            rec.thread_ended()
            raise
        try:
            future.add_done_callback(_finished)
        except Exception:
            rec.thread_ended()
        return future

    state.patch(executor, "submit", submit)
    _patch_thread_pool(state)


#: the asynchronous calls of ``multiprocessing.pool.ThreadPool``: each takes the function
#: first and ``callback`` and ``error_callback`` as its 3rd and 4th other argument
_THREAD_POOL_CALLS = ("apply_async", "map_async", "starmap_async")


def _patch_thread_pool(state: _Installed) -> None:
    """Count a function of the user's code given to ``multiprocessing.pool.ThreadPool``
    asynchronously like a thread of it, until its result (or error) is delivered: as
    with ``ThreadPoolExecutor``, the workers are the standard library's threads."""
    try:
        import multiprocessing.pool as pools
    except Exception:
        return
    for name in _THREAD_POOL_CALLS:
        original = getattr(pools.ThreadPool, name, None)
        if original is not None:
            state.patch(pools.ThreadPool, name, _counted_pool_call(state.recorder, original))


def _counted_pool_call(rec: Recorder, original: Any) -> Any:
    @functools.wraps(original)
    def call(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if not _counts(func, caller_frame()):
            return original(self, func, *args, **kwargs)
        positional = list(args)
        finished = threading.Event()

        def finish() -> None:
            if not finished.is_set():
                finished.set()
                rec.thread_ended()

        def chained(index: int, key: str) -> None:
            given = positional[index] if len(positional) > index else kwargs.get(key)

            def callback(value: Any) -> None:
                try:
                    if given is not None:
                        given(value)
                finally:
                    finish()

            if len(positional) > index:
                positional[index] = callback
            else:
                kwargs[key] = callback

        chained(2, "callback")
        chained(3, "error_callback")
        rec.thread_started()
        try:
            return original(self, func, *positional, **kwargs)
        except BaseException:
            finish()
            raise

    return call


def _prepare_group(
    state: _Installed, c10d: Any, frame: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], Any, _DeviceGroup | None] | None:
    """Record ``newgroup``, stash the caller's stack for ``create_group``, and swap a
    gloo backend for the recording one.  Returns the arguments to call with, the user's
    backend when it was swapped, and for any other backend what :func:`_device_group`
    needs to wrap the group torch builds (None for a rank outside the group)."""
    rec = state.recorder
    signature = state.helper_signature
    if signature is None:
        return None
    bound = signature.bind(*args, **kwargs)
    arguments = bound.arguments
    backend = arguments.get("backend")
    new_backend = translate_backend(backend)
    original_backend = None
    if new_backend is not None:
        arguments["backend"] = c10d.Backend(new_backend)
        original_backend = backend
    api, stack = capture(frame)
    rec.local.group_ctx = (api, stack)
    ranks = [int(r) for r in arguments.get("global_ranks_in_group") or []]
    if ranks and rec.active and c10d.GroupMember.WORLD is not None:
        my_rank = c10d.GroupMember.WORLD.rank()
        gid = str(arguments.get("group_name")) if my_rank in ranks else None
        rec.newgroup(next(rec.ids), _now(), ranks, gid, stack)
    device = None
    if new_backend is None and str(backend).lower() != BACKEND_NAME:
        device = _device_target(c10d, arguments, ranks, backend)
    return bound.args, bound.kwargs, original_backend, device


class _DeviceGroup:
    """A group built by torch with a backend other than gloo, to be wrapped."""

    def __init__(self, rank: int, size: int, given: list[int], gid: str, backend: str) -> None:
        self.rank = rank
        self.size = size
        self.given = given
        self.gid = gid
        self.backend = backend


def _device_target(
    c10d: Any, arguments: dict[str, Any], ranks: list[int], backend: Any
) -> _DeviceGroup | None:
    """What a non-gloo group's wrapper needs, or None when this rank is not a member."""
    world = c10d.GroupMember.WORLD
    if ranks and world is not None and world.rank() not in ranks:
        return None
    rank = int(arguments.get("group_rank", -1))
    size = int(arguments.get("group_size", 0))
    if rank < 0 or size <= 0:
        return None
    return _DeviceGroup(rank, size, ranks, str(arguments.get("group_name")), str(backend))


def _device_group(
    rec: Recorder,
    c10d: Any,
    helper: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: _DeviceGroup,
) -> Any:
    """Build a non-gloo group with torch's own helper, recorded around its creation,
    then put a recording group in front of it (dl2.record.device)."""
    oid = 0
    try:
        from dl2.record.pg import record_create

        if not device.given or c10d.GroupMember.WORLD is None:
            import torch

            ranks = device.given or list(range(device.size))
            rec.open(ranks[device.rank], device.size, str(torch.__version__), device.backend)
        oid = record_create(rec, device.gid, device.rank, device.size, device.given)
    except Exception:
        oid = 0
    try:
        result = helper(*args, **kwargs)
    except BaseException as err:
        if oid:
            rec.ret(oid, err)
        raise
    finally:
        rec.local.group_ctx = None
    if oid:
        rec.ret(oid)
    if not rec.active:
        return result
    try:
        from dl2.record.device import wrap_group

        return wrap_group(rec, c10d, result, device.given, device.gid)
    except Exception as err:
        notice(f"group {device.gid} is not recorded: {err!r}")
        return result


def _restore_backend_name(c10d: Any, result: Any, original_backend: Any) -> None:
    """Put the user's backend name back in the world's maps (for get_backend())."""
    try:
        pg, _store = result
        world = c10d._world
        if pg in world.pg_map:
            world.pg_map[pg] = (original_backend, world.pg_map[pg][1])
            world.pg_backend_config[pg] = str(c10d.BackendConfig(original_backend))
    except Exception:
        pass


# -- process life ---------------------------------------------------------------------


def runs_user_code(thread: threading.Thread) -> bool:
    """Whether a thread runs the user's own code: its target (or its class's ``run``)
    is defined in a file that is neither torch, dl2, the standard library nor an
    installed package (a DataLoader's pin-memory thread, tqdm's monitor and the
    watchdog do not count)."""
    target = getattr(thread, "_target", None)
    if target is None and isinstance(thread, threading.Timer):
        target = thread.function  # a Timer calls the user's function once
    args = getattr(thread, "_args", ())
    if isinstance(getattr(target, "__self__", None), contextvars.Context) and args:
        target = args[0]  # Thread(target=copy_context().run, args=(fn, ...))
    if target is None:
        run = type(thread).run
        if run is threading.Thread.run:
            return False
        target = run
    return is_user_callable(target)


def is_user_callable(target: Any) -> bool:
    """Whether a callable is defined in the user's own code (see :func:`runs_user_code`),
    or is a torch.distributed function itself (``Thread(target=dist.send, ...)``)."""
    if isinstance(target, functools.partial):
        inner: Any = target.func
        if isinstance(getattr(inner, "__self__", None), contextvars.Context) and target.args:
            inner = target.args[0]  # asyncio.to_thread: partial(context.run, fn, ...)
        target = inner
    for _ in range(8):  # through decorators (torch wraps its API in a logger)
        inner = getattr(target, "__wrapped__", None)
        if inner is None:
            break
        target = inner
    target = getattr(target, "__func__", target)  # a bound method
    code = getattr(target, "__code__", None)
    if code is None and callable(target):  # an object of a class with __call__
        code = getattr(type(target).__call__, "__code__", None)
    return code is not None and classify_file(code.co_filename) in (USER, API)


def _at_exit(exc: BaseException | None = None) -> None:
    state = _INSTALLED
    if state is None:
        return
    try:
        rec = state.recorder
        if rec.watchdog is not None:
            rec.watchdog.stop()
        rec.end("exit", exc or _uncaught())
        rec.drain_eager(_drain_seconds())
    except Exception:
        pass


def _at_process_exit() -> None:
    """The exit of a ``multiprocessing`` child (a finaliser its ``_bootstrap`` runs
    after the target returned or raised): a forked child then ends with ``os._exit``,
    which runs no exit hook, so without this its trace would end as if it were killed.
    An exception still in flight (``sys.exc_info`` inside that ``finally``) is the one
    that ended it."""
    exc = sys.exc_info()[1]
    _at_exit(None if isinstance(exc, (SystemExit, KeyboardInterrupt)) else exc)


def _in_process_child(recorder: Recorder) -> None:
    """Run in a ``multiprocessing`` child by its ``_bootstrap``, after the registry of
    exit finalisers was cleared: register :func:`_at_process_exit` there."""
    try:
        import multiprocessing.util as mp_util

        mp_util.Finalize(None, _at_process_exit, exitpriority=0)
    except Exception:
        pass


def _uncaught() -> BaseException | None:
    """The exception that ended the program, if one did: Python sets ``sys.last_exc``
    (3.12) and ``sys.last_value`` when it prints an uncaught exception, before the exit
    hooks run; in a ``torch.multiprocessing.spawn`` worker, which catches it and exits
    with status 1, :func:`_patch_spawn` keeps it.  ``SystemExit`` is an exit, not a
    failure."""
    exc = (
        getattr(sys, "last_exc", None)
        or getattr(sys, "last_value", None)
        or _SPAWN_RAISED
        or _EXIT_HANDLING
    )
    if not isinstance(exc, BaseException) or isinstance(exc, SystemExit):
        return None
    return exc


# The exception a torch.multiprocessing.spawn worker's function raised (see _patch_spawn).
_SPAWN_RAISED: BaseException | None = None
# The exception being handled when the program called sys.exit with a failure status.
_EXIT_HANDLING: BaseException | None = None


def _patch_exit(state: _Installed) -> None:
    """Keep the exception a program was handling when it called ``sys.exit`` with a
    failure status (``except Exception: log.exception(...); sys.exit(1)``, a common
    ``main()``): the exception is the cause, though Python never sees it uncaught."""
    original = sys.exit

    def exit(status: Any = None) -> Any:
        global _EXIT_HANDLING
        try:
            if status not in (None, 0):
                handling = sys.exc_info()[1]
                if handling is not None and not isinstance(handling, SystemExit):
                    _EXIT_HANDLING = handling
        except Exception:
            pass
        return original(status)

    exit.__doc__ = original.__doc__
    state.patch(sys, "exit", exit)


def _patch_spawn(state: _Installed) -> None:
    """Keep the exception of a ``torch.multiprocessing.spawn`` worker's function.

    torch runs the function in its ``_wrap``, which catches an exception, hands the
    parent its traceback and exits with status 1: Python never sees it uncaught.  The
    child looks ``_wrap`` up by name when it unpickles its process object, after torch
    (and so this install) was imported, and gets this wrapper.
    """
    module = sys.modules.get("torch.multiprocessing.spawn")
    original = getattr(module, "_wrap", None)
    if original is None or getattr(original, "_dl2_wrapped", False):
        return

    @functools.wraps(original)
    def _wrap(fn: Any, *rest: Any) -> Any:
        return original(functools.partial(_keeping_raised, fn), *rest)

    _wrap._dl2_wrapped = True  # type: ignore[attr-defined]
    state.patch(module, "_wrap", _wrap)


def _patch_launchers(state: _Installed) -> None:
    """In a launcher of ranks, note how a rank it reaped ended (:func:`note_exit`):
    ``dl2 run`` sees its own child only, and a rank killed by a signal (the OOM killer,
    a scheduler) would otherwise be one that vanished.

    ``torch.multiprocessing.spawn``: the rank whose ending made ``join`` raise (it then
    ends the others itself).  torchrun (its agent imports torch.distributed.run): the
    first failure its workers' context reports (the others' are its own doing).
    """
    run_dir = state.recorder.run_dir
    spawn = sys.modules.get("torch.multiprocessing.spawn")
    exited = getattr(spawn, "ProcessExitedException", None)
    init = getattr(exited, "__init__", None)
    if init is not None and not getattr(init, "_dl2_wrapped", False):
        # torch builds it in join() for the rank whose ending failed the job; hooked
        # there rather than around join(), so no dl2 frame shows in the user's traceback

        @functools.wraps(init)
        def noted(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            pid, code = getattr(self, "error_pid", None), getattr(self, "exit_code", None)
            if isinstance(pid, int) and isinstance(code, int):
                note_exit(run_dir, pid, code)

        noted._dl2_wrapped = True  # type: ignore[attr-defined]
        state.patch(exited, "__init__", noted)
    if not _torchrun_agent():
        return  # its worker API is imported in torchrun's agent only, not in every rank
    try:
        from torch.distributed.elastic.multiprocessing import api
    except Exception:
        return
    wait = getattr(api.PContext, "wait", None)
    if wait is None or getattr(wait, "_dl2_wrapped", False):
        return

    @functools.wraps(wait)
    def waited(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = wait(self, *args, **kwargs)
        try:
            failures = getattr(result, "failures", None)
            if failures and not getattr(self, "_dl2_noted", False):
                # the first failure only: the agent then ends the other workers itself
                # (SIGTERM) and reports those endings among the failures too
                self._dl2_noted = True
                first = min(failures.values(), key=lambda f: f.timestamp)
                note_exit(run_dir, first.pid, first.exitcode)
        except Exception:
            pass
        return result

    waited._dl2_wrapped = True  # type: ignore[attr-defined]
    state.patch(api.PContext, "wait", waited)


def _torchrun_agent() -> bool:
    """Whether this process is torchrun's agent (``torchrun``, ``python -m
    torch.distributed.run`` or ``.launch``): torch, imported first, installs dl2 before
    torch.distributed.run itself is imported."""
    launchers = ("torch.distributed.run", "torch.distributed.launch")
    if any(name in sys.modules for name in launchers):
        return True
    argv = list(getattr(sys, "orig_argv", None) or sys.argv or [""])
    return any(name in argv[:4] for name in launchers) or any(
        os.path.basename(word) == "torchrun" for word in argv[:2]
    )


def _keeping_raised(fn: Any, *args: Any) -> Any:
    """Call a spawn worker's function, keeping the exception it raises."""
    global _SPAWN_RAISED
    try:
        return fn(*args)
    except Exception as exc:
        _SPAWN_RAISED = exc
        raise


def _drain_seconds() -> float:
    from dl2.record.emulate import drain_seconds_from_env

    return drain_seconds_from_env()


def _after_fork_in_child() -> None:
    state = _INSTALLED
    if state is None:
        return
    try:
        state.recorder.reset_after_fork()
    except Exception:
        pass


def _register_process_hooks() -> None:
    global _AT_EXIT_REGISTERED, _FORK_HOOK_REGISTERED
    if not _AT_EXIT_REGISTERED:
        atexit.register(_at_exit)
        try:
            import multiprocessing.util as mp_util

            mp_util.register_after_fork(_INSTALLED.recorder, _in_process_child)  # type: ignore[union-attr]
        except Exception:
            pass
        _AT_EXIT_REGISTERED = True
    if not _FORK_HOOK_REGISTERED and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _FORK_HOOK_REGISTERED = True
