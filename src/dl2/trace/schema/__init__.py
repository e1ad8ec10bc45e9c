"""The record schema of a trace: every record kind, its fields, and its wire layout.

This package is the one place that knows how records look on disk.  The writer side
imports nothing but the standard library (the recorder runs it inside every rank):
:mod:`~dl2.trace.schema.encode` formats every line, :mod:`~dl2.trace.schema.stream`
encodes and writes a rank's stream of records (interning, deltas, merged records, what
is open, checkpoints) and :mod:`~dl2.trace.schema.state` holds the counting rules both
sides share.  The
reader side is for the analysis only (msgspec): :mod:`~dl2.trace.schema.wire` decodes
lines, :mod:`~dl2.trace.schema.reader` resolves them into the typed records of
:mod:`~dl2.trace.schema.decode`, which are what the rest of dl2 reads.
:mod:`dl2.trace.format` handles what is file-level: segments, header check, lines,
truncation and corrupt lines.

Typed records (what a reader gives back, whatever the wire form; times ``t`` are
``time.monotonic_ns()``; ids are per process, increasing):

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
               via     P2P, optional: the id of the wildcard recv whose returned sender
                       this op's peer was computed from (``dst=src``, ``src=3 - first``):
                       the program follows whichever sender that recv matched
               root    broadcast/reduce/gather/scatter: global rank of the root
               tag     P2P tag;  redop: "sum", "max", ...;  dtype: "float32", ...
               count   elements of the input (per rank; summed over the tensors of list
                       and coalesced forms; for scatter, the output, as only the root has
                       an input); splits: all_to_all split sizes [input splits, output
                       splits], in elements, one per rank (even splits written out);
                       all_reduce_coalesced: [[elements of each tensor, in call order]];
                       reduce_scatter (list form): [[elements of each rank's shard]]
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
``checkpoint`` what the records before a segment said, for a reader that starts there
             (the older segments may be gone): ``t``, ``segment``, ``next_id`` (ids below
             it were issued before), ``ops_before`` (op records before: the base of the
             program-order index), ``collectives`` (gid -> collectives issued on it, i.e.
             the next collective ``seq``), ``channels`` ([gid, sender, receiver, tag,
             count]: P2P ops issued per channel, global ranks, sender -1 for a wildcard
             recv), ``groups`` (gid -> global ranks of every group created), ``open`` (the
             ops entered and neither complete nor failed, as full ``op`` records),
             ``issued`` (ids among ``open`` whose call returned), ``waits`` (waits entered
             and not returned, as full ``wait`` records), ``pending`` (async ops issued
             and not seen complete), ``newgroups`` (every new_group call so far, as full
             ``newgroup`` records), ``dropped`` (ids among ``open`` whose work was
             dropped), ``stores`` (blocking store calls entered and not returned, as
             full ``store`` records).  An op is *complete* once a wait on it returned or it
             was seen ``done``; an eager send, and a blocking create_group or
             monitored_barrier, once its call returned.

Every stack is a tuple of ``Frame(file, line, function)``, innermost first; the line a
report names is :func:`dl2.trace.schema.decode.report_frame`'s.

The files (format version 2).  A rank's trace is a series of segment files (see
:mod:`dl2.trace.format` for their names).  Each starts with a header line, a JSON
object::

    k "header", magic "dl2-trace", format FORMAT_VERSION, dl2 (writer version),
    rank (global), world_size, pid, host,
    t0      time.monotonic_ns() when the process's first segment was opened (the same
            in every segment: record times are µs after it)
    wall    time.time_ns() at the same moment (aligns ranks for display only)
    segment this file's number (0, 1, ...)
    torch   torch.__version__;  backend: the inner backend ("gloo");  argv: sys.argv
    emulate present only when dl2 emulated other send semantics on gloo
            (``dl2 run --buffer-size``, ``dl2 replay``; see dl2.record.emulate):
            {"eager_bytes": sends of at most this many bytes were eager,
             "fused_batches": each batch_isend_irecv launched as one unit}
    retain  {"segment_bytes": a new segment after this many bytes,
             "keep": segments kept, the oldest deleted (0: all)}
    follows true when the writer marks with ``via`` every P2P op whose peer came from a
            wildcard receive's returned sender (absent: such ops are not told apart)
    follows_groups true when it does so for a wildcard on a subgroup too, whose sender
            torch translates to a global rank (absent: only on the default group)
    child_of the pid of the rank process this process descends from (a helper the rank
            started: a checkpointing process, an eval job); absent for a rank itself
    ppid    the pid of the process that started this one (a traced parent makes this
            one a helper of a rank, whenever its own trace opened)
    run_id  the id ``dl2 run`` gave the run (absent when recorded without it): a
            file of another run is not read as one of this run's ranks

Every later line is a JSON array whose first element names its kind.  Lines depend on
the lines before them in the same segment, so a reader goes through a segment in order
and keeps, from its start (or from a checkpoint): the stack table, the op-description
table, ``us`` (the time of the last timed line, µs after t0), ``last`` (the id of the
last line that created one), ``last_tid`` and ``last_sid`` (thread and stack of the last
``o`` line) and, per seq key (a collective's gid; ``(gid, peer, op)`` of a P2P op), the
seq expected next (one more than the last, or the checkpoint's count).  ``dt`` is a
time: ``us += dt``, ``t = t0 + us * 1000``.  An element left out (or null) takes the
value in brackets.  Definitions, written once per segment before their first use::

  ["s", sid, stack]          stack ``sid`` is ``[[file, line, function], ...]`` (sid 0
                             is the empty stack, never defined)
  ["d", did, {desc}]         op description ``did``: the ``op`` fields that repeat,
                             with their record names (gid, op, api, peer, root, tag,
                             redop, dtype, count, splits, ranks, timeout, async, eager,
                             deferred), plus ``tid`` and ``stack`` (a sid)

Records:

  ["o", dt, did, id?, seq?, batch?]   op record (description ``did``);  id [last + 1],
                                      seq [the key's expected seq], batch [null]
  ["b", dt, back?, wid?, tid?, sid?]  a blocking op was issued and its thread waits on
                                      it: ``ret`` of op ``last - back`` [last] plus
                                      ``wait`` wid [last + 1] on it, same ``t``, by tid
                                      [last_tid] at stack sid [last_sid]
  ["k", dt, dt2]                      a blocking op issued and waited on, the wait
                                      returned at ``dt2``: ``b`` (short form) then ``r``
  ["r", dt, back?, src?, err?]        ``ret`` of op or wait ``last - back`` [last]
  ["w", dt, back, sid, tid?, id?]     ``wait`` id [last + 1] on op ``last - back``, by
                                      tid [last_tid], at stack sid
  ["x", dt, back, src?]               ``done`` of op ``last - back``
  ["g", dt, ranks, gid, sid, id?]     ``newgroup`` id [last + 1]
  ["n", dt, api, sid]                 ``nonmember``
  ["q", dt, pending, where, sid]      ``state`` (pending: absolute ids)
  ["e", dt, how, err?, sid?]          ``end``; err, sid: the uncaught exception that
                                      ended the program ("Type: message") and the
                                      stack it was raised at [null, 0]
  ["h", dt, live]                     ``threads``: threads of the user's own code
                                      alive besides the main one (after a checkpoint
                                      while some are)
  ["u", dt, tid, name, err, sid]      ``thread_error``: thread tid (named name) ended
                                      with the uncaught exception err raised at sid
  ["p", dt, back]                     ``drop`` of op ``last - back``
  ["t", dt, sid, tid, op, store, prefix, keys, block, timeout?, id?]
                                      ``store`` id [last + 1] (timeout [null])
  ["c", us, {body}]                   ``checkpoint`` at ``us`` (absolute).  Its body has
                                      the record's fields, with ``open`` as
                                      [id, us, did, seq, batch], ``waits`` as [id, us,
                                      tid, work, sid], ``newgroups`` as [id, us, ranks,
                                      gid, sid] (dids and sids defined before it).  After
                                      it, last = next_id - 1, last_tid = 0, last_sid = -1
                                      and the expected seqs are its counts.

Every segment but the first starts with a checkpoint (after the definitions it uses);
the recorder also writes one every so often within a segment: a reader that had to
skip a corrupt line resynchronises there (and says whether records were lost).  A
reader gives back the checkpoint that starts a segment only when the segment is the
first it reads of the process.  A blocking op costs two short lines (``o``, then ``k``
or ``b`` and ``r``: about 22 bytes once its description and stack are defined).

A group's ranks (``ranks`` of a description or a ``g`` line, a checkpoint's ``groups``
and ``newgroups``) that form an arithmetic progression of four or more are written as
``{"start": a, "stop": b, "step": s}`` (the world group of 8,192 ranks costs a few
bytes, not 40 KB, in every rank's trace); a reader expands it.

Readers ignore elements they do not know at the end of a line and keep lines of kinds
they do not know (as ``UnknownRecord``); a line of a known kind with an element of the
wrong type is corrupt.
"""

from __future__ import annotations

MAGIC = "dl2-trace"

# History of FORMAT_VERSION:
#   1: one JSON Lines file per rank: header + op/ret/wait/done/newgroup/nonmember/state/end
#      records as JSON objects with a "k" key, every field written out (stacks as
#      frames, ns times).  Later additions, optional and ignored by older readers:
#      header "emulate", op "eager" and "deferred", per-tensor "splits" of
#      all_reduce_coalesced, the "store" and "drop" records.
#   2: compact records (JSON arrays, a one-letter kind first): stacks and the constant
#      part of op records interned per segment, µs time deltas, implied ids and seqs,
#      a blocking op's issue and wait merged into one "b" record; segments (header
#      "segment", "retain") rotated and deleted past a bound, each starting with a
#      "checkpoint" record.  The typed records read back are version 1's, plus
#      CheckpointRecord.  A version-1 trace is refused with its version named.
FORMAT_VERSION = 2

#: The kinds of typed record, as their ``kind`` (``"k"``) names them.
RECORD_KINDS = frozenset(
    {
        "op",
        "ret",
        "wait",
        "done",
        "drop",
        "newgroup",
        "nonmember",
        "state",
        "end",
        "threads",
        "thread_error",
        "store",
        "checkpoint",
    }
)

#: ``store`` ops that wait until their keys are set (``block`` true)
STORE_WAITS = frozenset({"get", "wait", "multi_get"})
#: ``store`` ops that set their keys
STORE_SETS = frozenset({"set", "add", "compare_set", "multi_set", "append"})
#: The ``peer`` (or ``root``) of an op called with a rank that is not one of its group's
#: (negative, or past the group's size): no rank can ever match it.  Not -1, which the
#: model's channels use for "any sender".
NO_RANK = -2
