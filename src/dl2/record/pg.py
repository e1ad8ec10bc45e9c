"""RecordingProcessGroup: a Python process group that records every call, then runs gloo.

torch.distributed's Python API and its C++ callers (DDP's Reducer, through the pybind
trampoline of ``ProcessGroup``) both reach the methods overridden here.  Each one:

1. writes an ``op`` record (before anything is issued: a gloo size mismatch aborts the
   process within milliseconds),
2. calls the same method of an inner plain ``ProcessGroup`` that holds the real
   ``ProcessGroupGloo`` (the inner group exposes every method name and overload the
   Python API uses, which the gloo backend object alone does not),
3. writes ``ret`` (with ``err`` and re-raises if the call raised), and
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

Records are assembled with f-strings rather than ``json.dumps``: about ten times faster,
and every string pasted in is either a fixed identifier or JSON-encoded once and cached.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dl2.record.recorder import Recorder
from dl2.record.recorder import compact
from dl2.record.recorder import source_of
from dl2.record.stack import capture
from dl2.record.stack import user_stack

_getframe = sys._getframe
_now = time.monotonic_ns
_tid = threading.get_ident
_Tensor = torch.Tensor
_Work = dist.Work
_BOOL = ("false", "true")

_DTYPES: dict[Any, str] = {}


def _dtype(t: Any) -> str:
    d = t.dtype
    name = _DTYPES.get(d)
    if name is None:
        name = str(d).removeprefix("torch.")
        _DTYPES[d] = name
    return name


_REDOPS: dict[int, str] = {}


def _redop(value: Any) -> str:
    """The lower-case name of a ReduceOp, RedOpType or options object's reduceOp."""
    op = getattr(value, "reduceOp", value)
    kind = getattr(op, "op", op)  # ReduceOp wraps a RedOpType
    try:
        code = int(kind)  # pybind enums hash slowly; their int is cheap to key on
    except (TypeError, ValueError):
        code = None
    if code is not None:
        name = _REDOPS.get(code)
        if name is not None:
            return name
    label = getattr(kind, "name", None)
    text = label.lower() if isinstance(label, str) else str(kind).rsplit(".", 1)[-1].lower()
    if code is not None:
        _REDOPS[code] = text
    return text


def _first(tensors: Any) -> Any:
    """The first tensor of a tensor, a list of tensors or a list of lists."""
    while not isinstance(tensors, _Tensor):
        tensors = tensors[0]
    return tensors


def _numel(tensors: Any) -> int:
    if isinstance(tensors, _Tensor):
        return int(tensors.numel())
    return sum(_numel(t) for t in tensors)


def _tensor_desc(tensors: Any) -> str:
    """',"dtype":...,"count":...' for the tensors of one rank's input."""
    try:
        if type(tensors) is list and len(tensors) == 1:  # the common [tensor]
            t = tensors[0]
            if isinstance(t, _Tensor):
                name = _DTYPES.get(t.dtype) or _dtype(t)
                return f',"dtype":"{name}","count":{t.numel()}'
        return f',"dtype":"{_dtype(_first(tensors))}","count":{_numel(tensors)}'
    except (IndexError, TypeError, AttributeError):
        return ',"count":0'


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, *names: str) -> Any:
    if len(args) > index:
        return args[index]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def _is_opts(value: Any) -> bool:
    return getattr(value, "asyncOp", None) is not None


def _async(opts: Any) -> bool:
    """asyncOp of an options object; True for the overloads without one (they return a
    work the caller must wait on)."""
    flag = getattr(opts, "asyncOp", None)
    return True if flag is None else bool(flag)


# A describer turns (group, args, kwargs) into (extra JSON fields, async flag).
Describer = Callable[["RecordingProcessGroup", tuple[Any, ...], dict[str, Any]], tuple[str, bool]]


def _d_allreduce(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    if len(a) == 2 and not k:  # the (tensors, opts) form every caller but users uses
        tensors, opts = a
        if type(tensors) is list and len(tensors) == 1:  # the hot path, inlined
            try:
                redop = _REDOPS.get(int(opts.reduceOp.op))
                if redop is not None:
                    t = tensors[0]
                    dtype = _DTYPES.get(t.dtype) or _dtype(t)
                    desc = f',"redop":"{redop}","dtype":"{dtype}","count":{t.numel()}'
                    return desc, bool(opts.asyncOp)
            except (AttributeError, TypeError, ValueError):
                pass
    else:
        tensors = _arg(a, k, 0, "tensors", "tensor")
        opts = _arg(a, k, 1, "opts", "op")
    redop = _redop(opts) if opts is not None else "sum"
    return f',"redop":"{redop}"{_tensor_desc(tensors)}', _async(opts)


def _d_allreduce_coalesced(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    """all_reduce's fields plus the element count of each tensor, as ``splits``: which
    tensors were fused into this one collective (dl2's fusion prediction reads them)."""
    desc, is_async = _d_allreduce(pg, a, k)
    tensors = _arg(a, k, 0, "tensors", "tensor")
    if type(tensors) is list and all(isinstance(t, _Tensor) for t in tensors):
        desc += f',"splits":[{compact([int(t.numel()) for t in tensors])}]'
    return desc, is_async


def _d_broadcast(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    tensors = _arg(a, k, 0, "tensors", "tensor")
    opts = _arg(a, k, 1, "opts", "root")
    root = opts.rootRank if _is_opts(opts) else opts
    return f',"root":{pg._dl2_global(root)}' + _tensor_desc(tensors), _async(opts)


def _d_reduce(pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    tensors = _arg(a, k, 0, "tensors", "tensor")
    opts = _arg(a, k, 1, "opts", "root")
    if _is_opts(opts):
        root, redop = opts.rootRank, _redop(opts)
    else:
        op = _arg(a, k, 2, "op")
        root, redop = opts, (_redop(op) if op is not None else "sum")
    desc = f',"root":{pg._dl2_global(root)},"redop":"{redop}"'
    return desc + _tensor_desc(tensors), _async(opts)


_INPUT_NAMES = ("input_tensors", "input_tensor", "input", "inputs", "input_list")


def _d_gather_like(input_index: int) -> Describer:
    """all_gather / gather-style: the input is argument ``input_index``."""

    def describe(
        pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
    ) -> tuple[str, bool]:
        inputs = _arg(a, k, input_index, *_INPUT_NAMES)
        opts = _arg(a, k, input_index + 1, "opts")
        return _tensor_desc(inputs), _async(opts)

    return describe


def _d_gather(pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    inputs = _arg(a, k, 1, "input_tensors", "input_tensor")
    opts = _arg(a, k, 2, "opts", "root")
    root = opts.rootRank if _is_opts(opts) else opts
    return f',"root":{pg._dl2_global(root)}' + _tensor_desc(inputs), _async(opts)


def _d_scatter(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    # Only the root has inputs; every rank has the same output: describe the output.
    outputs = _arg(a, k, 0, "output_tensors", "output_tensor")
    opts = _arg(a, k, 2, "opts", "root")
    root = opts.rootRank if _is_opts(opts) else opts
    return f',"root":{pg._dl2_global(root)}' + _tensor_desc(outputs), _async(opts)


def _d_reduce_scatter(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    inputs = _arg(a, k, 1, "input_tensors", "input", "inputTensor", "inputs")
    opts = _arg(a, k, 2, "opts", "op")
    redop = _redop(opts) if opts is not None else "sum"
    return f',"redop":"{redop}"' + _tensor_desc(inputs), _async(opts)


def _d_alltoall(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    outputs = _arg(a, k, 0, "output_tensors")
    inputs = _arg(a, k, 1, "input_tensors")
    opts = _arg(a, k, 2, "opts")
    splits = [[int(t.numel()) for t in inputs], [int(t.numel()) for t in outputs]]
    return _tensor_desc(inputs) + f',"splits":{compact(splits)}', _async(opts)


def _split_elems(tensor: Any, splits: Any, n: int) -> list[int]:
    """Split sizes in elements (rows times row size); even splits when none given."""
    rows = int(tensor.shape[0]) if tensor.dim() > 0 else 0
    row = int(tensor.numel()) // rows if rows else 0
    sizes = [int(s) for s in splits] if splits else [rows // n] * n if n else []
    return [s * row for s in sizes]


def _d_all_to_all_single(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    output = _arg(a, k, 0, "output")
    input_ = _arg(a, k, 1, "input")
    out_splits = _arg(a, k, 2, "output_split_sizes")
    in_splits = _arg(a, k, 3, "input_split_sizes")
    opts = _arg(a, k, 4, "opts", "timeout")
    n = pg._dl2_size
    splits = [_split_elems(input_, in_splits, n), _split_elems(output, out_splits, n)]
    return _tensor_desc(input_) + f',"splits":{compact(splits)}', _async(opts)


def _d_barrier(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    return "", _async(_arg(a, k, 0, "opts"))


def _d_monitored_barrier(
    pg: RecordingProcessGroup, a: tuple[Any, ...], k: dict[str, Any]
) -> tuple[str, bool]:
    timeout = _arg(a, k, 0, "timeout")
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else None
    return (f',"timeout":{seconds:g}' if seconds is not None else ""), False


# Python method name -> (recorded op name, describer).  The deprecated names are the
# ones the trampoline falls back to, and old callers may still use.
_COLLECTIVES: dict[str, tuple[str, Describer]] = {
    "allreduce": ("all_reduce", _d_allreduce),
    "allreduce_coalesced": ("all_reduce_coalesced", _d_allreduce_coalesced),
    "broadcast": ("broadcast", _d_broadcast),
    "reduce": ("reduce", _d_reduce),
    "allgather": ("all_gather", _d_gather_like(1)),
    "all_gather_single": ("all_gather_into_tensor", _d_gather_like(1)),
    "_allgather_base": ("all_gather_into_tensor", _d_gather_like(1)),
    "allgather_coalesced": ("all_gather_coalesced", _d_gather_like(1)),
    "all_gather_single_coalesced": ("all_gather_into_tensor_coalesced", _d_gather_like(1)),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", _d_gather_like(1)),
    "gather": ("gather", _d_gather),
    "scatter": ("scatter", _d_scatter),
    "reduce_scatter": ("reduce_scatter", _d_reduce_scatter),
    "reduce_scatter_single": ("reduce_scatter_tensor", _d_reduce_scatter),
    "_reduce_scatter_base": ("reduce_scatter_tensor", _d_reduce_scatter),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced", _d_reduce_scatter),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", _d_reduce_scatter),
    "alltoall": ("all_to_all", _d_alltoall),
    "all_to_all_single": ("all_to_all_single", _d_all_to_all_single),
    "alltoall_base": ("all_to_all_single", _d_all_to_all_single),
    "barrier": ("barrier", _d_barrier),
    "monitored_barrier": ("monitored_barrier", _d_monitored_barrier),
}

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


def _json_api(api: str | None) -> str:
    return "null" if api is None else f'"{api}"'


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
        self._dl2_inner = inner
        self._dl2_backend = backend
        self._dl2_gid = gid
        self._dl2_gid_json = json.dumps(gid)
        self._dl2_ranks = ranks
        self._dl2_size = size
        self._dl2_rec = recorder
        self._dl2_seq = 0
        self._dl2_p2p_seq: dict[tuple[int | None, str], int] = {}

    # -- what torch and user code ask of a group ---------------------------------------

    def getBackendName(self) -> str:  # the trampoline's name (ProcessGroup::getBackendName)
        """Report the inner backend's name: code that tests ``== "gloo"`` keeps working."""
        return "gloo"

    def _dl2_global(self, group_rank: Any) -> int | str:
        try:
            return self._dl2_ranks[int(group_rank)]
        except (IndexError, TypeError, ValueError):
            return "null"

    # -- recording --------------------------------------------------------------------

    def _dl2_call(
        self,
        method: str,
        op: str,
        describe: Describer,
        frame: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Record a collective, run it on the inner group, wrap its work."""
        rec = self._dl2_rec
        fn = getattr(self._dl2_inner, method)
        if not rec.active:
            return fn(*args, **kwargs)
        try:
            try:
                extra, is_async = describe(self, args, kwargs)
            except Exception:
                extra, is_async = "", True
            api, stack = capture(frame)
            seq = self._dl2_seq
            self._dl2_seq = seq + 1
            oid = next(rec.ids)
            rec.last_tid = tid = _tid()
            rec.emit(
                f'{{"k":"op","id":{oid},"t":{_now()},"tid":{tid},"gid":{self._dl2_gid_json},'
                f'"seq":{seq},"op":"{op}","api":{_json_api(api)}{extra},'
                f'"async":{_BOOL[is_async]},"stack":{stack}}}\n'
            )
        except Exception:
            return fn(*args, **kwargs)
        return self._dl2_issue(oid, fn, args, kwargs, is_async, None, stack)

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
        if not rec.active:
            return fn(*args, **kwargs)
        try:
            tensors = _arg(args, kwargs, 0, "tensors", "arg0")
            anyranks: list[int] | None = None
            if method == "recv_anysource":
                peer: int | str | None = None
                tag = _arg(args, kwargs, 1, "tag", "arg1")
                direction = "recv"
                anyranks = self._dl2_ranks
            else:
                peer = self._dl2_global(_arg(args, kwargs, 1, "dstRank", "srcRank"))
                tag = _arg(args, kwargs, 2, "tag")
                direction = method
            api, stack, sync = _capture_p2p(frame)
            key = (peer if isinstance(peer, int) else None, direction)
            seq = self._dl2_p2p_seq.get(key, 0)
            self._dl2_p2p_seq[key] = seq + 1
            oid = next(rec.ids)
            peer_json = "null" if peer is None else peer
            rec.last_tid = tid = _tid()
            batch = ""
            in_batch = False
            if rec.batches:
                slot = rec.batches.get(tid)
                if slot is not None:
                    in_batch = True
                    if not slot[0]:
                        slot[0] = oid
                    batch = f',"batch":{slot[0]}'
            # Emulated semantics (dl2.record.emulate): an eager send, a deferred batch op.
            eager_args = (
                _eager_copy(args)
                if direction == "send"
                and rec.eager_bytes >= 0
                and _eager_fits(args, kwargs, rec.eager_bytes)
                else None
            )
            eager = eager_args is not None
            gate = rec.gate
            deferred = gate is not None and in_batch and not sync
            extra = ',"eager":true' if eager else ""
            if deferred:
                extra += ',"deferred":true'
            rec.emit(
                f'{{"k":"op","id":{oid},"t":{_now()},"tid":{tid},"gid":{self._dl2_gid_json},'
                f'"seq":{seq},"op":"{direction}","api":{_json_api(api)},"peer":{peer_json},'
                f'"tag":{int(tag or 0)}{_tensor_desc(tensors)},"async":{_BOOL[not sync]}'
                f'{batch}{extra},"stack":{stack}}}\n'
            )
        except Exception:
            return fn(*args, **kwargs)
        if gate is not None:
            try:
                placeholder = self._dl2_post(
                    gate, direction, peer, tag, deferred, oid, fn, args, kwargs, eager_args,
                    anyranks, stack,
                )  # fmt: skip
            except Exception:
                placeholder = None  # the store failed: the op runs as gloo runs it
            if placeholder is not None:
                return placeholder
        if eager_args is not None:
            return self._dl2_eager(oid, fn, eager_args, sync, stack)
        return self._dl2_issue(oid, fn, args, kwargs, not sync, anyranks, stack, True)

    def _dl2_post(
        self,
        gate: Any,
        direction: str,
        peer: int | str | None,
        tag: Any,
        deferred: bool,
        oid: int,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        eager_args: tuple[Any, ...] | None,
        anyranks: list[int] | None,
        stack: str,
    ) -> Any:
        """Fused-batch emulation: count the op as posted in the job's store; for an op of a
        batch, defer its issue to the batch's launch and return the caller's placeholder
        work (None: issue it now)."""
        me = self._dl2_ranks[self.rank()]
        src: int | None
        if direction == "send":
            if not isinstance(peer, int):
                raise ValueError("a send without a peer")
            src, dst = me, peer
        else:
            src, dst = (peer if isinstance(peer, int) else None), me
        gid = self._dl2_gid
        position = gate.post(direction, gid, src, dst, int(tag or 0))
        if not deferred:
            return None
        from dl2.record.emulate import Deferred

        def issue() -> Any:
            if eager_args is not None:
                return self._dl2_eager(oid, fn, eager_args, False, stack)
            return self._dl2_issue(oid, fn, args, kwargs, True, anyranks, stack, True)

        placeholder = DeferredWork()
        keys = gate.partner_keys(direction, gid, src, dst, int(tag or 0))
        gate.defer(_tid(), Deferred(issue, keys, position, placeholder))
        return placeholder

    def _dl2_eager(self, oid: int, fn: Any, args: tuple[Any, ...], sync: bool, stack: str) -> Any:
        """Issue an eager send (``args`` holds the copy of its tensors, see
        :func:`_eager_copy`): gloo sends the copy in the background, the caller goes on."""
        rec = self._dl2_rec
        buffer = args[0]
        try:
            work = fn(*args)
        except BaseException as err:
            rec.ret(oid, err)
            raise
        try:
            rec.eager.add(work, buffer)
        except Exception:
            pass
        if sync:
            # The blocking send returns at once: its ret, wait and wait's ret together.
            wid = next(rec.ids)
            t = _now()
            rec.emit(
                f'{{"k":"ret","id":{oid},"t":{t}}}\n{{"k":"wait","id":{wid},"t":{t},'
                f'"tid":{_tid()},"work":{oid},"stack":{stack}}}\n{{"k":"ret","id":{wid},"t":{t}}}\n'
            )
            return EagerWork(oid, rec, buffer, waited=True)
        rec.ret(oid)
        return EagerWork(oid, rec, buffer, waited=False)

    def _dl2_issue(
        self,
        oid: int,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        is_async: bool,
        anyranks: list[int] | None,
        stack: str,
        point_to_point: bool = False,
    ) -> Any:
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
            rec.ret(oid)
            try:
                rec.add_pending(oid, work, anyranks)
                return RecordedWork(work, oid, rec, anyranks)
            except Exception:
                return work
        # A blocking call (asyncOp=False, or c10d's send/recv): the API waits on the work
        # at once, from the same user frames.  Wait here, recorded; the op's ret and the
        # wait go out in one write, the wait's ret shares the next one.
        try:
            wid = next(rec.ids)
            t = _now()
            tid = _tid()
            rec.emit(
                f'{{"k":"ret","id":{oid},"t":{t}}}\n{{"k":"wait","id":{wid},"t":{t},'
                f'"tid":{tid},"work":{oid},"stack":{stack}}}\n'
            )
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
            rec.ret_later(wid, source_of(work, anyranks) if anyranks is not None else None)
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
        return self._dl2_p2p("send", _getframe(1), args, kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        """Record and run ``recv(tensors, srcRank, tag)``."""
        return self._dl2_p2p("recv", _getframe(1), args, kwargs)

    def recv_anysource(self, *args: Any, **kwargs: Any) -> Any:
        """Record and run ``recv_anysource(tensors, tag)`` (a wildcard recv)."""
        return self._dl2_p2p("recv_anysource", _getframe(1), args, kwargs)


def _capture_p2p(frame: Any) -> tuple[str | None, str, bool]:
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
    def override(self: RecordingProcessGroup, *args: Any, **kwargs: Any) -> Any:
        return self._dl2_call(method, op, describe, _getframe(1), args, kwargs)

    override.__name__ = method
    override.__qualname__ = f"RecordingProcessGroup.{method}"
    override.__doc__ = f"Record ``{op}`` and run ``ProcessGroup.{method}`` on gloo."
    return override


for _method, (_op, _describe) in _COLLECTIVES.items():
    setattr(RecordingProcessGroup, _method, _make_collective(_method, _op, _describe))


def _eager_fits(args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> bool:
    """Whether a send's tensors (positional, dense) hold at most ``limit`` bytes."""
    if not args or kwargs or type(args[0]) is not list:
        return False
    total = 0
    for t in args[0]:
        if not isinstance(t, _Tensor) or t.layout is not torch.strided:
            return False
        total += int(t.numel()) * int(t.element_size())
    return total <= limit


def _eager_copy(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The send's arguments with its tensors copied (the eager buffer: the receiver gets
    the values of the moment of the call); None if they cannot be copied."""
    try:
        buffer = [t.detach().clone(memory_format=torch.contiguous_format) for t in args[0]]
    except Exception:
        return None
    return (buffer, *args[1:])


class EagerWork(dist.Work):  # type: ignore[misc]
    """The work of an eager send: complete for the caller from the start.

    ``wait()`` returns True at once; for an async send, each wait is still recorded
    (a ``wait`` and its ``ret``), as for any other work.

    Args:
        oid: the op record's id.
        recorder: the process's recorder.
        buffer: the copy gloo sends (also what ``result()`` returns).
        waited: True for a blocking send, whose wait the group recorded already.
    """

    def __init__(self, oid: int, recorder: Recorder, buffer: list[Any], waited: bool) -> None:
        super().__init__()
        self._dl2_oid = oid
        self._dl2_rec = recorder
        self._dl2_buffer = buffer
        self._dl2_waited = waited

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._dl2_waited:
            return True
        rec = self._dl2_rec
        try:
            if rec.active:
                wid = next(rec.ids)
                t = _now()
                rec.emit(
                    f'{{"k":"wait","id":{wid},"t":{t},"tid":{_tid()},"work":{self._dl2_oid},'
                    f'"stack":{user_stack(_getframe(1))}}}\n{{"k":"ret","id":{wid},"t":{t}}}\n'
                )
        except Exception:
            pass
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def result(self) -> Any:
        return list(self._dl2_buffer)

    def synchronize(self) -> None:
        return None

    def get_future(self) -> Any:
        future: Any = torch.futures.Future()
        future.set_result(list(self._dl2_buffer))
        return future

    def block_current_stream(self) -> None:
        return None


class DeferredWork(dist.Work):  # type: ignore[misc]
    """The work of a fused-batch op, bound to the real work when its batch launches
    (before ``batch_isend_irecv`` returns); every method forwards to it."""

    def __init__(self) -> None:
        super().__init__()
        self._dl2_work: Any = None

    def _dl2_bind(self, work: Any) -> None:
        self._dl2_work = work

    def wait(self, timeout: timedelta | None = None) -> bool:
        work = self._dl2_work
        return bool(work.wait() if timeout is None else work.wait(timeout))

    def is_completed(self) -> bool:
        return bool(self._dl2_work.is_completed())

    def is_success(self) -> bool:
        return bool(self._dl2_work.is_success())

    def exception(self) -> Any:
        return self._dl2_work.exception()

    def result(self) -> Any:
        return self._dl2_work.result()

    def synchronize(self) -> Any:
        return self._dl2_work.synchronize()

    def get_future(self) -> Any:
        return self._dl2_work.get_future()

    def source_rank(self) -> int:
        return int(self._dl2_work.source_rank())

    def _source_rank(self) -> int:
        return int(self._dl2_work._source_rank())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_dl2_"):
            raise AttributeError(name)
        return getattr(self._dl2_work, name)


class RecordedWork(dist.Work):  # type: ignore[misc]
    """The work of a recorded async op: ``wait()`` is recorded, the rest is forwarded.

    Args:
        inner: gloo's work.
        oid: the op record's id.
        recorder: the process's recorder.
        anyranks: for a wildcard recv, the group's global ranks (to name the sender).
        waited: for a blocking P2P op already waited on (and recorded) by the group,
            the result its wait() returns again without waiting.
    """

    def __init__(
        self,
        inner: Any,
        oid: int,
        recorder: Recorder,
        anyranks: list[int] | None,
        waited: bool | None = None,
    ) -> None:
        super().__init__()
        self._dl2_inner = inner
        self._dl2_oid = oid
        self._dl2_rec = recorder
        self._dl2_anyranks = anyranks
        self._dl2_waited = waited
        self._dl2_poll_stack: str | None = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the op, between a ``wait`` and a ``ret`` record; returns gloo's bool."""
        if self._dl2_waited is not None:
            return self._dl2_waited
        inner = self._dl2_inner
        rec = self._dl2_rec
        if not rec.active:
            return bool(inner.wait() if timeout is None else inner.wait(timeout))
        try:
            wid = next(rec.ids)
            rec.emit(
                f'{{"k":"wait","id":{wid},"t":{_now()},"tid":{_tid()},'
                f'"work":{self._dl2_oid},"stack":{user_stack(_getframe(1))}}}\n'
            )
        except Exception:
            return bool(inner.wait() if timeout is None else inner.wait(timeout))
        try:
            ok = inner.wait() if timeout is None else inner.wait(timeout)
        except BaseException as err:
            rec.ret(wid, err)
            raise
        rec.pending.pop(self._dl2_oid, None)
        anyranks = self._dl2_anyranks
        rec.ret_later(wid, source_of(inner, anyranks) if anyranks is not None else None)
        return bool(ok)

    def get_future(self) -> Any:
        return self._dl2_inner.get_future()

    def is_completed(self) -> bool:
        completed = bool(self._dl2_inner.is_completed())
        if self._dl2_waited is not None:
            return completed
        try:
            rec = self._dl2_rec
            if completed:  # seen complete by its owner: record it now, not at the next poll
                if rec.pending.pop(self._dl2_oid, None) is not None:
                    rec.done(self._dl2_oid, source_of(self._dl2_inner, self._dl2_anyranks))
            elif self._dl2_oid not in rec.polled:
                # The user polls it: the watchdog tells a rank spinning on polls apart
                # from one computing (see Watchdog.tick).
                stack = self._dl2_poll_stack
                if stack is None:
                    stack = self._dl2_poll_stack = user_stack(_getframe(1))
                rec.polled[self._dl2_oid] = stack
        except Exception:
            pass
        return completed

    def is_success(self) -> bool:
        return bool(self._dl2_inner.is_success())

    def exception(self) -> Any:
        return self._dl2_inner.exception()

    def result(self) -> Any:
        return self._dl2_inner.result()

    def synchronize(self) -> Any:
        return self._dl2_inner.synchronize()

    def source_rank(self) -> int:
        return int(self._dl2_inner.source_rank())

    def _source_rank(self) -> int:
        return int(self._dl2_inner._source_rank())

    def get_future_result(self) -> Any:
        return self._dl2_inner.get_future_result()

    def block_current_stream(self) -> Any:
        return self._dl2_inner.block_current_stream()

    def _get_op_type(self) -> Any:
        return self._dl2_inner._get_op_type()

    def _get_duration(self) -> Any:
        return self._dl2_inner._get_duration()

    def __getattr__(self, name: str) -> Any:
        # Only reached for names neither this class nor dist.Work defines.
        if name.startswith("_dl2_"):
            raise AttributeError(name)
        return getattr(self._dl2_inner, name)


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
    oid = 0
    try:
        c10d = dist.distributed_c10d
        if not given or c10d.GroupMember.WORLD is None:
            recorder.open(ranks[rank], size, str(torch.__version__))
        if recorder.active:
            ctx = getattr(recorder.local, "group_ctx", None)
            api, stack = ctx if ctx is not None else capture(_getframe(1))
            oid = next(recorder.ids)
            recorder.emit(
                f'{{"k":"op","id":{oid},"t":{_now()},"tid":{_tid()},"gid":{json.dumps(gid)},'
                f'"seq":null,"op":"create_group","api":{_json_api(api)},'
                f'"ranks":{compact(ranks)},"async":false,"stack":{stack}}}\n'
            )
    except Exception:
        oid = 0
    try:
        backend = ProcessGroupGloo(store, rank, size, timeout=dist_opts.timeout)
        backend.options.global_ranks_in_group = given
        backend.options.group_name = gid
        backend._set_sequence_number_for_group()
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
