"""RecordingProcessGroup: a Python process group that records every call, then runs gloo.

torch.distributed's Python API and its C++ callers (DDP's Reducer, through the pybind
trampoline of ``ProcessGroup``) both reach the methods overridden here.  Each one:

1. writes an ``op`` record (before anything is issued: a gloo size mismatch aborts the
   process within milliseconds),
2. calls the same method of an inner plain ``ProcessGroup`` that holds the real
   ``ProcessGroupGloo`` (the inner group exposes every method name and overload the
   Python API uses, which the gloo backend object alone does not),
3. writes ``ret`` (with ``err`` and re-raises if the call raised; the ``ret`` of an
   async op issued is held back to share the next record's write), and
4. for an async call (``async_op=True``, ``isend``/``irecv``, DDP's C++ calls) returns a
   :class:`RecordedWork` whose ``wait()`` writes ``wait`` and ``ret``; for a blocking
   one (``async_op=False``, ``send``/``recv``), whose API would wait at once, it waits
   itself between ``wait`` and ``ret`` records and returns gloo's completed work.

The gloo backend is also registered on the wrapper itself (as the GLOO backend type,
matching ``getBackendName() == "gloo"``, which DDP's logger looks up), so C++ code that
reaches the group through methods the trampoline does not forward (``reduce``,
``gather``, ``scatter``, ``alltoall``, ``all_gather_single``, ``reduce_scatter_single``)
still runs gloo, unrecorded.  In torch 2.13 the functional collectives go through the
forwarded methods (``all_gather_single_coalesced``, ``reduce_scatter_single_coalesced``,
``allreduce``, ...) and are recorded, with their waits.

Records are encoded by the recorder's stream encoder (:mod:`dl2.trace.schema.stream`,
with the group name encoded once and cached, and stacks passed as interned ids).  The
op-specific fields come from :mod:`dl2.record.describe`, the works handed back from
:mod:`dl2.record.works`, and the emulated send semantics from :mod:`dl2.record.emulated`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dl2 import speedups
from dl2.record import emulated
from dl2.record.describe import COLLECTIVES
from dl2.record.describe import Describer
from dl2.record.describe import arg
from dl2.record.describe import tensor_desc
from dl2.record.recorder import PRUNE_AT
from dl2.record.recorder import Recorder
from dl2.record.recorder import source_of
from dl2.record.source import via_of
from dl2.record.stack import caller_frame
from dl2.record.stack import capture
from dl2.record.works import RecordedWork
from dl2.record.works import work_completed
from dl2.trace.schema import NO_RANK
from dl2.trace.schema.encode import json_str
from dl2.trace.schema.encode import peer_tag_fields
from dl2.trace.schema.encode import ranks_field
from dl2.trace.schema.encode import via_field

_getframe = sys._getframe
_now = time.monotonic_ns
_tid = threading.get_ident
_Work = dist.Work
#: whether the stream encoder has its C hot path (see :mod:`dl2.speedups`)
_HOT = speedups.active()


def _engine_code() -> Any:
    """The code of the Python function that runs autograd's C++ engine (the last Python
    frame under a hook the engine calls from C++: DDP's reducer), if this torch has it."""
    try:
        from torch.autograd import graph

        return graph._engine_run_backward.__code__
    except Exception:
        return None


_ENGINE = _engine_code()

# Point-to-point method names (recorded as send / recv).
P2P_METHODS = ("send", "recv", "recv_anysource")


def _devices() -> list[Any]:
    """The devices a gloo group serves: the CPU, and CUDA tensors where CUDA is usable
    (gloo handles both; plain torch registers gloo for both for backend "gloo")."""
    devices = [torch.device("cpu")]
    try:
        if torch.cuda.is_available():
            devices.append(torch.device("cuda"))
    except Exception:
        pass
    return devices


class RecordingProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """A process group that records each call and forwards it to gloo.

    Args:
        rank: this process's rank in the group.
        size: the group's size.
        inner: a plain ``ProcessGroup`` with the gloo backend registered (calls go here).
        backend: the ``ProcessGroupGloo`` itself (also registered on this group).
        gid: the group's name (``group_name``), the records' ``gid``.
        ranks: global rank of each group rank.
        recorder: the process's recorder.
    """

    #: a group whose waits may return before the op completes (see dl2.record.device)
    _dl2_device = False

    def __init__(
        self,
        rank: int,
        size: int,
        inner: Any,
        backend: Any,
        gid: str,
        ranks: list[int],
        recorder: Recorder,
    ) -> None:
        super().__init__(rank, size)
        for device in _devices():
            self._register_backend(device, dist.ProcessGroup.BackendType.GLOO, backend)
        self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        self._dl2_bind(inner, backend, gid, ranks, size, recorder)

    def _dl2_bind(
        self, inner: Any, backend: Any, gid: str, ranks: list[int], size: int, recorder: Recorder
    ) -> None:
        """Set what the recording methods read: the group in front of which this one
        stands, its name, members and the recorder."""
        self._dl2_inner = inner
        self._dl2_backend = backend
        self._dl2_gid = gid
        self._dl2_gid_json = json_str(gid)
        self._dl2_ranks = ranks
        self._dl2_size = size
        self._dl2_rec = recorder
        self._dl2_seq = 0
        self._dl2_p2p_seq: dict[tuple[int | None, str], int] = {}

    # -- what torch and user code ask of a group ---------------------------------------

    def __repr__(self) -> str:
        """As torch's own group reads (``<torch.distributed.distributed_c10d.ProcessGroup
        object at 0x...>``): error messages that name a group read as without dl2."""
        base = dist.ProcessGroup
        return f"<{base.__module__}.{base.__qualname__} object at {id(self):#x}>"

    def getBackendName(self) -> str:  # the trampoline's name (ProcessGroup::getBackendName)
        """Report the inner backend's name: code that tests ``== "gloo"`` keeps working."""
        return "gloo"

    def _dl2_global(self, group_rank: Any) -> int | None:
        """The global rank of a group rank: None if it is not a number,
        :data:`NO_RANK` if it is not a rank of the group (negative, or past its size:
        gloo then waits forever)."""
        try:
            index = int(group_rank)
        except (TypeError, ValueError):
            return None
        ranks = self._dl2_ranks
        return ranks[index] if 0 <= index < len(ranks) else NO_RANK

    # -- recording --------------------------------------------------------------------

    def _dl2_p2p(
        self,
        method: str,
        frame: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Record a send / recv / recv_anysource, run it, wrap its work."""
        rec = self._dl2_rec
        fn = getattr(self._dl2_inner, method)
        if rec.fd < 0:
            return fn(*args, **kwargs)
        try:
            tensors = arg(args, kwargs, 0, "tensors", "arg0")
            anyranks: list[int] | None = None
            peer: int | None
            fields_via = ""
            if method == "recv_anysource":
                peer = None
                tag = int(arg(args, kwargs, 1, "tag", "arg1") or 0)
                direction = "recv"
                anyranks = self._dl2_ranks
            else:
                named = arg(args, kwargs, 1, "dstRank", "srcRank")
                peer = self._dl2_global(named)
                tag = int(arg(args, kwargs, 2, "tag") or 0)
                direction = method
                via = via_of(named)
                if via is not None:  # the peer was chosen from a wildcard's sender
                    fields_via = via_field(via)
            api, stack, sync = _capture_p2p(frame)
            key = (peer, direction)
            seq = self._dl2_p2p_seq.get(key, 0)
            self._dl2_p2p_seq[key] = seq + 1
            oid = next(rec.ids)
            rec.last_tid = tid = _tid()
            batch: int | None = None
            if rec.batches:
                slot = rec.batches.get(tid)
                if slot is not None:
                    if not slot[0]:
                        slot[0] = oid
                    batch = slot[0]
            # Emulated semantics (dl2.record.emulate): an eager send, a deferred batch op.
            limit = rec.eager_bytes
            eager = (
                emulated.eager_args(args, kwargs, limit)
                if direction == "send" and limit >= 0
                else None
            )
            gate = rec.gate
            deferred = gate is not None and batch is not None and not sync
            fields = peer_tag_fields(peer, tag) + tensor_desc(tensors) + fields_via
            rec.enc.op(  # type: ignore[union-attr]
                oid, _now(), tid, self._dl2_gid, self._dl2_gid_json, seq, direction, api,
                fields, not sync, stack, batch, eager is not None, deferred, peer, tag,
            )  # fmt: skip
        except Exception:
            return fn(*args, **kwargs)
        if gate is not None:
            try:
                placeholder = emulated.post(
                    self, gate, direction, peer, tag, deferred, oid, fn, args, kwargs, eager,
                    anyranks, stack,
                )  # fmt: skip
            except Exception:
                placeholder = None  # the store failed: the op runs as gloo runs it
            if placeholder is not None:
                return placeholder
        if eager is not None:
            return emulated.issue_eager(rec, oid, fn, eager, sync, stack)
        return self._dl2_issue(oid, fn, args, kwargs, not sync, anyranks, stack, tid, True)

    def _dl2_issue(
        self,
        oid: int,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        is_async: bool,
        anyranks: list[int] | None,
        stack: int,
        tid: int,
        point_to_point: bool = False,
        wrap: bool = True,
    ) -> Any:
        """Issue op ``oid`` (recorded by thread ``tid``) and record what follows
        (``wrap``: hand back an async op's work wrapped, its waits recorded)."""
        rec = self._dl2_rec
        try:
            work = fn(*args, **kwargs)
        except BaseException as err:
            rec.ret(oid, err)
            raise
        if not isinstance(work, _Work):
            rec.ret(oid)
            return work  # monitored_barrier: synchronous, no work
        if is_async:
            enc = rec.enc  # rec.ret_later(oid, None), inlined (as below)
            if enc is not None:
                enc.tail.append((oid, _now(), None))  # issued: shares the next write
            try:
                pending = rec.pending  # rec.add_pending, inlined
                pending[oid] = (work, anyranks)
                if len(pending) >= PRUNE_AT:
                    rec.poll_pending()
                if not wrap:
                    return work
                return RecordedWork(
                    work, oid, rec, anyranks, None, point_to_point, self._dl2_device
                )
            except Exception:
                return work
        # A blocking call (asyncOp=False, or c10d's send/recv): the API waits on the work
        # at once, from the same user frames.  Wait here, recorded; the op's ret and the
        # wait go out in one write, the wait's ret shares the next one.
        # (rec.issued_wait and rec.ret_later, inlined: the encoder's tail takes them.)
        try:
            wid = next(rec.ids)
            t = _now()
            enc = rec.enc
            if enc is not None and rec.fd >= 0:
                enc.tail.append((oid, wid, t, tid, stack))
            blocking = rec.blocking
            blocking[tid] = oid  # pending while waited on (the watchdog lists it)
        except Exception:
            return work  # the API waits on it, unrecorded
        try:
            ok = work.wait()
        except BaseException as err:
            blocking.pop(tid, None)
            rec.ret(wid, err)
            raise
        blocking.pop(tid, None)
        try:
            if self._dl2_device and not work_completed(work):
                rec.device_wait(wid, work)  # the device waits; the ret when it is done
            else:
                src = source_of(work, anyranks) if anyranks is not None else None
                enc = rec.enc
                if enc is not None:
                    enc.tail.append((wid, _now(), src))
        except Exception:
            pass
        if point_to_point:
            # gloo's P2P wait is not idempotent (a second wait waits for another
            # message): hand back a work whose wait() just repeats the result.
            try:
                return RecordedWork(work, oid, rec, anyranks, waited=bool(ok))
            except Exception:
                pass
        return work  # a collective's second wait() returns at once

    # -- point-to-point ---------------------------------------------------------------

    def send(self, *args: Any, **kwargs: Any) -> Any:
        """Record and run ``send(tensors, dstRank, tag)``."""
        return self._dl2_p2p("send", caller_frame(), args, kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        """Record and run ``recv(tensors, srcRank, tag)``."""
        return self._dl2_p2p("recv", caller_frame(), args, kwargs)

    def recv_anysource(self, *args: Any, **kwargs: Any) -> Any:
        """Record and run ``recv_anysource(tensors, tag)`` (a wildcard recv)."""
        return self._dl2_p2p("recv_anysource", caller_frame(), args, kwargs)


class DeviceRecordingGroup(RecordingProcessGroup):
    """A recording group in front of a group torch built with another backend (NCCL,
    mixed ``cpu:gloo,cuda:nccl``, a custom one): see :mod:`dl2.record.device`.

    The inner group's backends are registered on this one too, device by device, so C++
    code that reaches the group through methods the trampoline does not forward, and
    code that asks ``_get_backend(device)``, gets torch's own backend.

    Args:
        rank: this process's rank in the group.
        size: the group's size.
        inner: the group torch built (calls go here).
        gid: the group's name.
        ranks: global rank of each group rank.
        recorder: the process's recorder.
    """

    _dl2_device = True

    def __init__(
        self, rank: int, size: int, inner: Any, gid: str, ranks: list[int], recorder: Recorder
    ) -> None:
        dist.ProcessGroup.__init__(self, rank, size)
        types = dist.ProcessGroup.BackendType
        default = None
        for device in list(getattr(inner, "_device_types", None) or ()):
            try:
                backend = inner._get_backend(device)
            except Exception:
                continue
            kind = _backend_type(backend)
            self._register_backend(device, kind, backend)
            if default is None or kind == types.NCCL:
                default = kind
        if default is not None:
            self._set_default_backend(default)
        try:
            self._set_group_name(gid)
            self._set_group_desc(str(inner.group_desc))
        except Exception:
            pass
        try:
            self.bound_device_id = inner.bound_device_id
        except Exception:
            pass
        self._dl2_bind(inner, None, gid, ranks, size, recorder)
        try:
            self._dl2_name = str(inner.name())
        except Exception:
            self._dl2_name = "custom"

    def getBackendName(self) -> str:
        """The inner group's backend name ("nccl", ...)."""
        return self._dl2_name


def _backend_type(backend: Any) -> Any:
    """The ``ProcessGroup.BackendType`` of a backend object."""
    types = dist.ProcessGroup.BackendType
    name = type(backend).__name__
    for kind, label in ((types.NCCL, "NCCL"), (types.GLOO, "Gloo"), (types.UCC, "UCC")):
        if label in name:
            return kind
    if "XCCL" in name and hasattr(types, "XCCL"):
        return types.XCCL
    return types.CUSTOM


def record_create(recorder: Recorder, gid: str, rank: int, size: int, given: list[int]) -> int:
    """Open the trace at the default group and record a ``create_group`` op; its id, or 0
    when nothing was recorded."""
    ranks = given or list(range(size))
    try:
        c10d = dist.distributed_c10d
        if not given or c10d.GroupMember.WORLD is None:
            recorder.open(ranks[rank], size, str(torch.__version__))
        if not recorder.active:
            return 0
        ctx = getattr(recorder.local, "group_ctx", None)
        api, stack = ctx if ctx is not None else capture(caller_frame(2))
        oid = next(recorder.ids)
        fields = ranks_field(ranks)
        recorder.op(
            oid, _now(), _tid(), gid, json_str(gid), None, "create_group", api, fields,
            False, stack, ranks=ranks,
        )  # fmt: skip
        return oid
    except Exception:
        return 0


def _capture_p2p(frame: Any) -> tuple[str | None, int, bool]:
    """capture() plus whether the P2P op is blocking: issued by c10d's ``send``/``recv``
    (and not ``isend``/``irecv``/``batch_isend_irecv``)."""
    api, stack = capture(frame)
    sync = False
    f = frame
    # The chain is short (isend <- send <- send_object_list ...): look at most 4 frames.
    for _ in range(4):
        if f is None:
            break
        name = f.f_code.co_name
        if name in ("send", "recv") and f.f_code.co_filename.endswith("distributed_c10d.py"):
            sync = True
            break
        if name in ("isend", "irecv"):
            f = f.f_back
            continue
        break
    return api, stack, sync


def _make_collective(method: str, op: str, describe: Describer) -> Callable[..., Any]:
    """The override of ``ProcessGroup.<method>``: record a collective, run it on the inner
    group, wrap its work (the recorder's hot path: one Python call per op, no more)."""

    def override(self: RecordingProcessGroup, *args: Any, **kwargs: Any) -> Any:
        rec = self._dl2_rec
        fn = getattr(self._dl2_inner, method)
        if rec.fd < 0:  # not recording (Recorder.active, without the property call)
            return fn(*args, **kwargs)
        try:
            try:
                extra, is_async = describe(self, args, kwargs)
            except Exception:
                extra, is_async = "", True
            try:
                caller = _getframe(1)
            except ValueError:  # no Python frame: called from a thread C++ started
                caller = None  # (DDP's reducer on a CUDA autograd thread)
            api, stack = capture(caller)
            seq = self._dl2_seq
            self._dl2_seq = seq + 1
            oid = next(rec.ids)
            rec.last_tid = tid = _tid()
            enc: Any = rec.enc  # the stream encoder, set while recording is active
            t = _now()
            gid_json = self._dl2_gid_json
            # op_hot writes the steady state in C, given StreamEncoder.op's description
            # key (built only where the C part is in use)
            if not (
                _HOT
                and enc.op_hot(
                    oid, t, tid, (gid_json, op, api, extra, is_async, tid, stack, False, False),
                    seq, is_async, stack,
                )
            ):  # fmt: skip
                enc.op(oid, t, tid, self._dl2_gid, gid_json, seq, op, api, extra, is_async, stack)
        except Exception:
            return fn(*args, **kwargs)
        if is_async:
            # From C++ in autograd's engine, for no API (DDP's reducer, on this thread or
            # on a device's autograd thread, with no Python frame): its work is only asked
            # for its future, never waited on, and is handed back as gloo's own (a wrapper
            # would cost each bucket two more crossings into Python, with caches cold).
            wrap = api is not None or (caller is not None and caller.f_code is not _ENGINE)
            return self._dl2_issue(oid, fn, args, kwargs, True, None, stack, tid, wrap=wrap)
        # A blocking collective: _dl2_issue's blocking path, inlined (see there).
        try:
            work = fn(*args, **kwargs)
        except BaseException as err:
            rec.ret(oid, err)
            raise
        if not isinstance(work, _Work):
            rec.ret(oid)
            return work
        try:
            wid = next(rec.ids)
            t = _now()
            enc = rec.enc
            if enc is not None:
                enc.tail.append((oid, wid, t, tid, stack))
            blocking = rec.blocking
            blocking[tid] = oid
        except Exception:
            return work
        try:
            work.wait()
        except BaseException as err:
            blocking.pop(tid, None)
            rec.ret(wid, err)
            raise
        blocking.pop(tid, None)
        try:
            if self._dl2_device and not work_completed(work):
                rec.device_wait(wid, work)  # the device waits; the ret when it is done
            else:
                enc = rec.enc
                if enc is not None:
                    enc.tail.append((wid, _now(), None))
        except Exception:
            pass
        return work

    override.__name__ = method
    override.__qualname__ = f"RecordingProcessGroup.{method}"
    override.__doc__ = f"Record ``{op}`` and run ``ProcessGroup.{method}`` on gloo."
    return override


for _method, (_op, _describe) in COLLECTIVES.items():
    setattr(RecordingProcessGroup, _method, _make_collective(_method, _op, _describe))


def _debug_wrapper(backend: Any, store: Any, gid: str, rank: int, size: int, timeout: Any) -> Any:
    """The backend behind torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checker, as torch
    puts it around its own gloo backend (a group that is a ProcessGroup, as dl2's is,
    gets none from torch): a job that fails fast on a collective mismatch without dl2
    fails so under dl2 too."""
    c10d = dist.distributed_c10d
    try:
        if c10d.get_debug_level() != c10d.DebugLevel.DETAIL:
            return backend
        wrap = c10d._create_process_group_wrapper
    except Exception:
        return backend
    return wrap(backend, gid, store, rank, size, timeout)


def create_group(recorder: Recorder, dist_opts: Any, backend_options: Any) -> Any:
    """The backend creator registered as "dl2" (``extended_api=True``).

    Records ``create_group`` around the construction of the gloo backend (gloo connects
    to every member in its constructor: a member the others never join blocks there),
    then returns a :class:`RecordingProcessGroup` around it.  If dl2 itself fails after
    gloo was built, the bare gloo backend is returned: the group works, unrecorded.
    """
    from torch.distributed import ProcessGroupGloo

    store = dist_opts.store
    rank = int(dist_opts.group_rank)
    size = int(dist_opts.group_size)
    gid = str(dist_opts.group_id)
    given = [int(r) for r in dist_opts.global_ranks_in_group]
    ranks = given or list(range(size))
    oid = record_create(recorder, gid, rank, size, given)
    try:
        backend = ProcessGroupGloo(store, rank, size, timeout=dist_opts.timeout)
        backend.options.global_ranks_in_group = given
        backend.options.group_name = gid
        backend._set_sequence_number_for_group()
        backend = _debug_wrapper(backend, store, gid, rank, size, dist_opts.timeout)
    except BaseException as err:
        if oid:
            recorder.ret(oid, err)
        raise
    if oid:
        recorder.ret(oid)
    try:
        inner = dist.ProcessGroup(store, rank, size)
        for device in _devices():
            inner._register_backend(device, dist.ProcessGroup.BackendType.GLOO, backend)
        inner._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        return RecordingProcessGroup(rank, size, inner, backend, gid, ranks, recorder)
    except Exception as err:
        print(f"dl2: group {gid} is not recorded: {err!r}", file=sys.stderr, flush=True)
        return backend
