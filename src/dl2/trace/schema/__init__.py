"""The record schema of a trace file: every record kind, its fields, and its wire layout.

This package is the one place that knows how records look on disk.  Its
:mod:`~dl2.trace.schema.encode` writes them (the recorder inside every rank and the test
builders use it; it imports nothing but the standard library) and its
:mod:`~dl2.trace.schema.decode` reads them back as typed records (msgspec structs, for
the analysis side only).  :mod:`dl2.trace.format` handles what is file-level: the header
check, file naming, lines and truncation.

A trace file is JSON Lines: line 1 is a header, every later line is one record, a JSON
object whose ``"k"`` key names its kind.  Readers ignore fields they do not know and
keep records of kinds they do not know (forward compatibility); a record of a known kind
with a field of the wrong type is corrupt.

Header (``k = "header"``)::

    magic      "dl2-trace"
    format     FORMAT_VERSION
    dl2        writer version
    rank       global rank;  world_size
    pid, host  the process that wrote the file
    t0         time.monotonic_ns() when the file was opened (record times use it)
    wall       time.time_ns() at the same moment (aligns ranks for display only)
    torch      torch.__version__;  backend: the inner backend ("gloo")
    argv       sys.argv of the rank
    emulate    present only when dl2 emulated other send semantics on gloo
               (``dl2 run --buffer-size``, ``dl2 replay``; see dl2.record.emulate):
               {"eager_bytes": sends of at most this many bytes were eager,
                "fused_batches": each batch_isend_irecv launched as one unit}

Records (times ``t`` are ``time.monotonic_ns()``; ids are per file, increasing):

``op``       a communication call on a process group, written *before* it is issued::

               id, t, tid (thread ident), gid (group name), seq (per-group index of this
               collective, or of this P2P op on its (peer, direction) channel; null for
               create_group),
               op      all_reduce | broadcast | reduce | all_gather | all_gather_into_tensor |
                       gather | scatter | reduce_scatter | reduce_scatter_tensor | all_to_all |
                       all_to_all_single | barrier | monitored_barrier |
                       all_reduce_coalesced | all_gather_coalesced |
                       all_gather_into_tensor_coalesced | reduce_scatter_tensor_coalesced |
                       send | recv | create_group
                       (the two *_tensor_coalesced ops are what _coalescing_manager and, in
                       torch 2.13, the functional collectives issue, even for one tensor)
               api     the torch.distributed function the user called (all_gather_object,
                       batch_isend_irecv, ...) or null when issued from C++ (DDP)
               peer    P2P: global rank of the other side; null for a wildcard recv
               root    broadcast/reduce/gather/scatter: global rank of the root
               tag     P2P tag;  redop: "sum", "max", ...;  dtype: "float32", ...
               count   elements of the input (per rank; summed over the tensors of list
                       and coalesced forms; for scatter, the output, as only the root has
                       an input); splits: all_to_all split sizes [input splits, output
                       splits], in elements, one per rank (even splits written out);
                       all_reduce_coalesced: [[elements of each tensor, in call order]]
               ranks   create_group: global ranks of the new group
               timeout monitored_barrier: its timeout in seconds (torch fills in the
                       group's default when the user gave none)
               async   true if the user asked for async_op / isend / irecv
               batch   ops issued by one batch_isend_irecv call (or coalescing block) share
                       this id (the id of the batch's first op); null otherwise
               eager   true for a send of at most ``emulate.eager_bytes`` bytes: it
                       completed for its rank when issued (the blocking call returned at
                       once, its work's wait too); gloo delivered a copy in the background
               deferred  true for an op of a batch under ``emulate.fused_batches``: issued
                       (its ``ret``) only when every op of its batch could be matched
               stack   [[file, line, function], ...] user frames, innermost first
             Fields that do not apply to an op are absent (a wildcard recv has "peer": null).

``ret``      the call returned: ``id``, ``t``; ``err`` (str) if it raised.  For an op
             this means *issued* (the work may still be pending); for a wait, *completed*.
             A wait's ``ret`` carries ``src``, the matched sender of a wildcard recv.
             A wait's ``ret`` may share the write of the next record, or be written by the
             watchdog up to one period (0.2 s) later; its ``t`` is when the wait returned.
``wait``     ``id``, ``t``, ``tid``, ``work`` (the op id waited on), ``stack``.
``done``     an async op was seen complete: ``id`` (the op id), ``t``, ``src`` (a wildcard
             recv only).
``drop``     the user dropped the work of an async send or receive (``id``, the op id;
             ``t``) before it completed and without waiting on it: gloo then never moves
             the message, so the recorder lets go of the work too (the job behaves as
             without dl2) and the peer's matching op can never complete.
``newgroup`` a call of new_group by any rank, member or not: ``id``, ``t``, ``ranks``
             (null means all), ``gid`` (null for a non-member), ``stack``.
``nonmember`` a collective called on a group this rank is not a member of (torch skips it
             silently): ``t``, ``api``, ``stack``.
``state``    the watchdog's view while the rank is quiet: ``t``, ``pending`` (ids of
             issued ops not yet complete: async ops not seen done, and the blocking op a
             thread is waiting on), ``where`` ("backward", "comm", "python"), ``stack``
             (the thread that issued the last op, else the main thread; innermost first).
             ``where`` "poll": the rank keeps polling ``is_completed()`` on the works
             in ``pending`` (only those), ``stack`` is where it first polled them.
``end``      the rank is shutting down cleanly: ``t``, ``how`` ("exit" | "destroy").
``store``    a call of a c10d Store method (``torch.distributed.Store`` and its subclasses
             TCPStore, FileStore, HashStore, PrefixStore) made by user code or a library,
             written *before* the call; the store traffic of torch.distributed itself
             (init_process_group, new_group, barrier: any call made inside one of its
             API functions) and of dl2 is not recorded::

               id, t, tid,
               op      get | wait | multi_get (wait until every key is set: ``block``
                       true, a ``ret`` with this ``id`` follows when the call returns,
                       with ``err`` if it raised, e.g. on the store's timeout) |
                       set | add | compare_set | multi_set | append (set their keys) |
                       delete_key | check
               store   the store behind the PrefixStores: "tcp:<port>" (TCPStore),
                       "file:<path>" (FileStore), or null when it cannot be told (a
                       HashStore, a store written in Python, a PrefixStore whose prefix
                       dl2 did not see when it was created)
               prefix  the PrefixStore prefixes in front of the keys, outermost last,
                       each followed by "/" ("default_pg/"); "" for none.  The key
                       the store holds is ``prefix + key``: two records name the same
                       key when their ``store`` and ``prefix + key`` agree
               keys    the keys as the caller passed them, in order
               block   true for get, wait and multi_get
               timeout wait(keys, timeout): that timeout in seconds (absent when the
                       store's own timeout applies)
               stack   as for ``op``

Every stack is a list of ``[file, line, function]`` frames, innermost first; the line a
report names is :func:`dl2.trace.schema.decode.report_frame`'s.
"""

from __future__ import annotations

MAGIC = "dl2-trace"

# History of FORMAT_VERSION:
#   1: first version (header + op/ret/wait/done/newgroup/nonmember/state/end records).
#      Later additions, optional and ignored by older readers: header "emulate", op
#      "eager" and "deferred", per-tensor "splits" of all_reduce_coalesced, the
#      "store" and "drop" records (older readers keep them as records of an unknown kind).
FORMAT_VERSION = 1

#: The kinds of record after the header, as the ``"k"`` key names them.
RECORD_KINDS = frozenset(
    {"op", "ret", "wait", "done", "drop", "newgroup", "nonmember", "state", "end", "store"}
)

#: ``store`` ops that wait until their keys are set (``block`` true)
STORE_WAITS = frozenset({"get", "wait", "multi_get"})
#: ``store`` ops that set their keys
STORE_SETS = frozenset({"set", "add", "compare_set", "multi_set", "append"})
