"""Checkpoints: where a rank's trace starts when its earlier segments were rotated away.

# -- CONTRACT (swap point) --------------------------------------------------------------
The record itself belongs to the trace schema, which another change adds (rotated trace
segments, each starting with a ``checkpoint`` record that the reader yields like any
record).  Until it lands, :class:`CheckpointRecord` below is the struct this model
expects; when the schema's lands, replace the class with
``from dl2.trace.schema.decode import CheckpointRecord`` (same fields) and nothing else
changes.  ``tests/checkpoints.py`` synthesises one from a trace prefix: it is what the
recorder must write.
# ----------------------------------------------------------------------------------------

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
* ``pending`` (async works not seen complete) is implied by ``open`` and not read.

What a checkpoint cannot tell, and the model then does not claim: mismatches between an
op of an earlier segment and one after it, failed ops of earlier segments, new_group
calls and non-member calls of earlier segments, store keys set before it, and which
open ops were dropped (``drop`` records; to add: a ``dropped`` id list beside
``issued``, until then a recorder must not cut a segment while a dropped op is open).
"""

from __future__ import annotations

import msgspec

from dl2.trace.schema.decode import OpRecord
from dl2.trace.schema.decode import Record
from dl2.trace.schema.decode import WaitRecord


class CheckpointRecord(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, tag_field="k", tag="checkpoint"
):
    """The first record of a rotated trace segment: the rank's state at that point."""

    t: int = 0
    segment: int = 0
    next_id: int = 0
    ops_before: int = 0
    collectives: dict[str, int] = msgspec.field(default_factory=dict)
    channels: tuple[tuple[str, int, int, int, int], ...] = ()
    groups: dict[str, tuple[int, ...] | None] = msgspec.field(default_factory=dict)
    open: tuple[OpRecord, ...] = ()
    issued: tuple[int, ...] = ()
    waits: tuple[WaitRecord, ...] = ()
    pending: tuple[int, ...] = ()


#: what a rank model is fed: the records of a trace, checkpoints included
ModelRecord = Record | CheckpointRecord
