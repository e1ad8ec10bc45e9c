"""Checkpoints: where a rank's trace starts when its earlier segments were rotated away.

The record belongs to the trace schema (:class:`dl2.trace.schema.decode.CheckpointRecord`):
the recorder writes one at the start of every segment after the first, and the reader
gives it back as the first record of a trace whose earlier segments are gone.
``tests/checkpoints.py`` synthesises one from a trace prefix, to check the model against
a build from the whole trace.

What the model reads of a checkpoint (see :meth:`dl2.model.rank_state.RankModel.start`):

* ``ops_before``: the op records of earlier segments; the next op's program-order index.
* ``collectives``: group -> collectives issued on it so far (the next collective
  ``seq``): the rank's position on each group.  Collectives at lower positions were
  issued: a slot they belong to does not wait on this rank.
* ``channels``: (group, sender, receiver, tag, count): P2P ops issued so far per
  channel (:func:`dl2.model.program.channel_key`; a wildcard receive that completed
  counts under the sender it matched, one still pending under sender ``-1``).
* ``groups``: the groups this rank created (group -> global ranks, None for all).
* ``open``: the op records entered and not complete, in program order; ``issued``: the
  ids among them whose call returned; ``waits``: the waits entered and not returned.
  An open collective keeps its position (its recorded ``seq``); the open P2P ops of a
  channel are taken as its last ones (the recorder writes ``done`` for the works gloo
  completed before it writes a checkpoint, and gloo completes one channel's messages in
  order).
* ``dropped``: the ids among ``open`` whose work was dropped (``drop`` records).
* ``stores``: the blocking store calls entered and not returned.
* ``pending`` (async works not seen complete) is implied by ``open`` and not read.

What a checkpoint cannot tell, and the model then does not claim: mismatches between an
op of an earlier segment and one after it, failed ops of earlier segments, new_group
calls and non-member calls of earlier segments, and store keys set before it.
"""

from __future__ import annotations

from dl2.trace.schema.decode import CheckpointRecord as CheckpointRecord
from dl2.trace.schema.decode import Record

#: what a rank model is fed: the records of a trace, checkpoints included
ModelRecord = Record
