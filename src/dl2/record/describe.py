"""Describers: the op-specific fields of a collective's ``op`` record, from its arguments.

A describer turns a recording group's ``(args, kwargs)`` of one ``ProcessGroup`` method
into the record's own fields (an encoded fragment from :mod:`dl2.trace.schema.encode`:
root, reduce op, dtype and element count, split sizes, timeout) and whether the call is
async.  :data:`COLLECTIVES` maps each recorded method to its op name and describer.

Everything here sits on the recorder's hot path: names of dtypes and reduce ops are
cached, and the all_reduce of one tensor (DDP's bucket, the common user call) is
described without a generic walk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Protocol

import torch
import torch.distributed as dist

from dl2.trace.schema.encode import count_field
from dl2.trace.schema.encode import redop_field
from dl2.trace.schema.encode import reduce_fields
from dl2.trace.schema.encode import root_field
from dl2.trace.schema.encode import splits_field
from dl2.trace.schema.encode import tensor_fields
from dl2.trace.schema.encode import timeout_field

_Tensor = torch.Tensor


class Group(Protocol):
    """What a describer asks of the recording group."""

    _dl2_size: int

    def _dl2_global(self, group_rank: Any) -> int | None: ...


# A describer turns (group, args, kwargs) into (the op's encoded fields, async flag).
Describer = Callable[[Group, tuple[Any, ...], dict[str, Any]], tuple[str, bool]]

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


def tensor_desc(tensors: Any) -> str:
    """The dtype and element count fields of the tensors of one rank's input."""
    try:
        if type(tensors) is list and len(tensors) == 1:  # the common [tensor]
            t = tensors[0]
            if isinstance(t, _Tensor):
                return tensor_fields(_DTYPES.get(t.dtype) or _dtype(t), t.numel())
        return tensor_fields(_dtype(_first(tensors)), _numel(tensors))
    except (IndexError, TypeError, AttributeError):
        return count_field(0)


def arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, *names: str) -> Any:
    """Argument ``index`` of a call, positional or by one of its keyword ``names``."""
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


_SUM = dist.ReduceOp.SUM
# (dtype, element count) -> the encoded fields of a sum all_reduce of one such tensor:
# DDP's buckets and a training loop's own calls repeat a handful of shapes.
_SUM_FIELDS: dict[tuple[Any, int], str] = {}
_SUM_FIELDS_LIMIT = 4096


def _sum_fields(t: Any) -> str:
    """reduce_fields of a sum over tensor ``t``, cached by dtype and size."""
    key = (t.dtype, t.numel())
    fields = _SUM_FIELDS.get(key)
    if fields is None:
        if len(_SUM_FIELDS) >= _SUM_FIELDS_LIMIT:
            _SUM_FIELDS.clear()
        fields = _SUM_FIELDS[key] = reduce_fields("sum", _dtype(t), key[1])
    return fields


def _hashed_redops() -> dict[int, str]:
    """hash(ReduceOp) -> the op's lower-case name.

    torch's ReduceOp hashes as its RedOpType's int, so one pybind call (no comparison,
    whose argument conversion costs more, above all with cold caches in a DDP backward)
    names any op.  Checked here for every op type: empty (the comparisons are used) if
    that does not hold.
    """
    table: dict[int, str] = {}
    try:
        for name, kind in dist.ReduceOp.RedOpType.__members__.items():
            try:
                op = dist.ReduceOp(kind)
            except Exception:
                continue  # PREMUL_SUM takes a factor
            code = hash(op)
            if code != int(kind) or code in table or (op == _SUM) != (name == "SUM"):
                return {}
            table[code] = name.lower()
    except Exception:
        return {}
    return table if table.get(hash(dist.ReduceOp(_SUM))) == "sum" else {}


_BY_HASH = _hashed_redops()


def _d_allreduce(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    if len(a) == 2 and not k:  # the (tensors, opts) form every caller but users uses
        tensors, opts = a
        if type(tensors) is list and len(tensors) == 1:  # the hot path, inlined
            try:
                t = tensors[0]
                if _BY_HASH:
                    redop = _BY_HASH.get(hash(opts.reduceOp))
                elif opts.reduceOp == _SUM:  # the one cheap comparison pybind offers
                    redop = "sum"
                else:
                    redop = _REDOPS.get(int(opts.reduceOp.op))
                if redop is not None and isinstance(t, _Tensor):
                    if redop == "sum":  # _sum_fields(t), its cache looked up inline
                        fields = _SUM_FIELDS.get((t.dtype, t.numel())) or _sum_fields(t)
                    else:
                        dtype = _DTYPES.get(t.dtype) or _dtype(t)
                        fields = reduce_fields(redop, dtype, t.numel())
                    return fields, opts.asyncOp is True  # a bool (pybind)
            except (AttributeError, TypeError, ValueError):
                pass
    else:
        tensors = arg(a, k, 0, "tensors", "tensor")
        opts = arg(a, k, 1, "opts", "op")
    redop = _redop(opts) if opts is not None else "sum"
    return redop_field(redop) + tensor_desc(tensors), _async(opts)


def _d_allreduce_coalesced(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    """all_reduce's fields plus the element count of each tensor, as ``splits``: which
    tensors were fused into this one collective (dl2's fusion prediction reads them)."""
    desc, is_async = _d_allreduce(pg, a, k)
    tensors = arg(a, k, 0, "tensors", "tensor")
    if type(tensors) is list and all(isinstance(t, _Tensor) for t in tensors):
        desc += splits_field([[int(t.numel()) for t in tensors]])
    return desc, is_async


def _d_broadcast(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    tensors = arg(a, k, 0, "tensors", "tensor")
    opts = arg(a, k, 1, "opts", "root")
    root = opts.rootRank if _is_opts(opts) else opts
    return root_field(pg._dl2_global(root)) + tensor_desc(tensors), _async(opts)


def _d_reduce(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    tensors = arg(a, k, 0, "tensors", "tensor")
    opts = arg(a, k, 1, "opts", "root")
    if _is_opts(opts):
        root, redop = opts.rootRank, _redop(opts)
    else:
        op = arg(a, k, 2, "op")
        root, redop = opts, (_redop(op) if op is not None else "sum")
    desc = root_field(pg._dl2_global(root)) + redop_field(redop)
    return desc + tensor_desc(tensors), _async(opts)


_INPUT_NAMES = ("input_tensors", "input_tensor", "input", "inputs", "input_list")


def _d_gather_like(input_index: int) -> Describer:
    """all_gather / gather-style: the input is argument ``input_index``."""

    def describe(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
        inputs = arg(a, k, input_index, *_INPUT_NAMES)
        opts = arg(a, k, input_index + 1, "opts")
        return tensor_desc(inputs), _async(opts)

    return describe


def _d_gather(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    inputs = arg(a, k, 1, "input_tensors", "input_tensor")
    opts = arg(a, k, 2, "opts", "root")
    root = opts.rootRank if _is_opts(opts) else opts
    return root_field(pg._dl2_global(root)) + tensor_desc(inputs), _async(opts)


def _d_scatter(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    # Only the root has inputs; every rank has the same output: describe the output.
    outputs = arg(a, k, 0, "output_tensors", "output_tensor")
    opts = arg(a, k, 2, "opts", "root")
    root = opts.rootRank if _is_opts(opts) else opts
    return root_field(pg._dl2_global(root)) + tensor_desc(outputs), _async(opts)


def _d_reduce_scatter(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    """The reduce op, dtype and count; for the list form also each rank's shard size,
    as ``splits`` (the same total split otherwise on two ranks hangs gloo)."""
    inputs = arg(a, k, 1, "input_tensors", "input", "inputTensor", "inputs")
    opts = arg(a, k, 2, "opts", "op")
    redop = _redop(opts) if opts is not None else "sum"
    desc = redop_field(redop) + tensor_desc(inputs)
    if type(inputs) is list and len(inputs) == 1 and type(inputs[0]) is list:
        shards = inputs[0]
        if shards and all(isinstance(t, _Tensor) for t in shards):
            desc += splits_field([[int(t.numel()) for t in shards]])
    return desc, _async(opts)


def _d_alltoall(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    outputs = arg(a, k, 0, "output_tensors")
    inputs = arg(a, k, 1, "input_tensors")
    opts = arg(a, k, 2, "opts")
    splits = [[int(t.numel()) for t in inputs], [int(t.numel()) for t in outputs]]
    return tensor_desc(inputs) + splits_field(splits), _async(opts)


def _split_elems(tensor: Any, splits: Any, n: int) -> list[int]:
    """Split sizes in elements (rows times row size); even splits when none given."""
    rows = int(tensor.shape[0]) if tensor.dim() > 0 else 0
    row = int(tensor.numel()) // rows if rows else 0
    sizes = [int(s) for s in splits] if splits else [rows // n] * n if n else []
    return [s * row for s in sizes]


def _d_all_to_all_single(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    output = arg(a, k, 0, "output")
    input_ = arg(a, k, 1, "input")
    out_splits = arg(a, k, 2, "output_split_sizes")
    in_splits = arg(a, k, 3, "input_split_sizes")
    opts = arg(a, k, 4, "opts", "timeout")
    n = pg._dl2_size
    splits = [_split_elems(input_, in_splits, n), _split_elems(output, out_splits, n)]
    return tensor_desc(input_) + splits_field(splits), _async(opts)


def _d_barrier(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    return "", _async(arg(a, k, 0, "opts"))


def _d_monitored_barrier(pg: Group, a: tuple[Any, ...], k: dict[str, Any]) -> tuple[str, bool]:
    timeout = arg(a, k, 0, "timeout")
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else None
    return (timeout_field(seconds) if seconds is not None else ""), False


#: Python method name -> (recorded op name, describer).  The deprecated names are the
#: ones the trampoline falls back to, and old callers may still use.
COLLECTIVES: dict[str, tuple[str, Describer]] = {
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
