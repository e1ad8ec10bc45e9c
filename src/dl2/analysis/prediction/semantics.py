"""Backend semantics that decide whether a recorded op sequence can deadlock.

A recorded run shows one execution.  Whether the same per-rank op sequences deadlock
under another backend or configuration depends on a few facts, each a field of
:class:`Semantics`:

``eager_bytes``
    A send of at most this many bytes completes without its receive (the message waits
    in the receiver's buffer); a larger send waits until the peer has posted the matching
    receive (rendezvous).  0 means every send is a rendezvous.

    * gloo: 0.  *Measured* with torch 2.13: a gloo send blocks until the peer posts the
      matching recv at every size; a send/send cycle deadlocks at 1 B and at 64 MB.
    * NCCL: ``NCCL_BUFFSIZE``, 4 MiB by default.  NCCL documentation, environment
      variables (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
      NCCL_BUFFSIZE: "the size of the buffer that NCCL uses when communicating data
      between pairs of GPUs", default 4194304).  A send that fits completes on the device
      before its receive is posted; a larger one waits for it.  The model ignores that
      several outstanding sends to one peer share that buffer (see the known gaps in
      :mod:`.search`).

``fused_batches_atomic``
    The ops of one ``batch_isend_irecv`` (or coalescing block: records sharing a
    ``batch`` id) are launched as one unit, and that unit can only start when every op
    of it can be matched by ops the peers have posted.

    * gloo: False.  gloo has no group launch: ``batch_isend_irecv`` issues each op on its
      own, as if the user had called isend/irecv in a loop.
    * NCCL: True, a *conservative* model of group semantics.  NCCL documentation,
      point-to-point communication
      (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/p2p.html): calls in
      one ncclGroupStart/End "will be blocking until that group of calls completes", and
      "it is important to merge calls that need to progress concurrently".  A batch whose
      sends are received by a batch split differently on the peer is reported even where
      NCCL might progress it partially.

``serial_batches``
    Under ``fused_batches_atomic``, whether a rank's batches start one at a time, in
    issue order (a batch starts once the rank's earlier batches completed).

    * gloo: False (no group launch).
    * NCCL: True.  A batch is one ``ncclGroupStart/End`` launched on the process group's
      stream, and the kernels of one stream run in order: a batch that waits for a peer
      holds the rank's later batches.  Two ranks that each post a batch of receives and
      then a batch of sends (``[irecv]``, ``[isend]``) complete on gloo and hang on
      NCCL; a rank whose one batch holds both directions meets a peer that splits them
      (``[isend, irecv]`` against ``[isend]``, ``[irecv]``), which NCCL completes.

``any_source``
    Whether a receive from any source (``recv(src=None)``, a wildcard) exists, so that
    its sender can differ from the recorded one.

    * gloo: True (``recv_anysource``).
    * NCCL: False.  torch's ProcessGroupNCCL does not implement ``recvAnysource`` (it
      raises "ProcessGroupNCCL does not support recvAnysource"); a program with wildcard
      receives cannot run on NCCL, so NCCL predictions keep the recorded matches.

``independent_groups``
    True: the async works of a rank complete in any order, whatever their process group
    (gloo: each group has its own threads and P2P buffers; NCCL: one stream per
    communicator, so groups do not wait on each other).  False: a rank's works complete
    in issue order, one at a time, like a single serial stream; offered to check code
    against such a backend (``--semantics gloo+serial``), used by no preset.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from typing import TYPE_CHECKING

from dl2.errors import ConfigError
from dl2.units import format_size
from dl2.units import parse_size

if TYPE_CHECKING:
    from dl2.trace.session import Session

__all__ = [
    "GLOO",
    "NCCL",
    "NCCL_BUFFSIZE_DEFAULT",
    "Semantics",
    "eager",
    "parse_semantics",
    "recorded_semantics",
]

#: NCCL's default NCCL_BUFFSIZE (NCCL documentation, environment variables).
NCCL_BUFFSIZE_DEFAULT = 4 << 20


@dataclass(frozen=True)
class Semantics:
    """How a backend completes sends, batches and async works; see the module docstring.

    Attributes:
        name: "gloo", "nccl", "eager" or a user's label.
        eager_bytes: sends of at most this many bytes complete without their receive.
        fused_batches_atomic: a batch starts as one unit once all its ops can be matched.
        independent_groups: works complete in any order (else in issue order per rank).
        any_source: wildcard receives may match another sender than recorded.
        serial_batches: a rank's batches start one at a time, in issue order.
    """

    name: str
    eager_bytes: int = 0
    fused_batches_atomic: bool = False
    independent_groups: bool = True
    any_source: bool = True
    serial_batches: bool = False

    @property
    def buffered(self) -> bool:
        """Whether the eager buffer is a setting of this backend (gloo has none)."""
        return self.name != "gloo"

    def with_buffer(self, eager_bytes: int) -> Semantics:
        """The same backend with another eager buffer size."""
        return replace(self, eager_bytes=eager_bytes)

    @property
    def label(self) -> str:
        """``gloo``, ``nccl (4 MiB buffer)``, ``eager (64 KiB buffer)``."""
        serial = "" if self.independent_groups else ", serial"
        if not self.buffered and self.eager_bytes == 0:
            return self.name + (" (serial)" if serial else "")
        return f"{self.name} ({format_size(self.eager_bytes)} buffer{serial})"

    @property
    def summary(self) -> str:
        """How it treats sends, batches and works: ``sends ≤ 4 MiB eager, fused batches``."""
        sends = (
            "rendezvous sends"
            if self.eager_bytes == 0
            else f"sends ≤ {format_size(self.eager_bytes)} eager"
        )
        batches = "fused batches" if self.fused_batches_atomic else "batches op by op"
        order = "" if self.independent_groups else ", in issue order"
        return f"{sends}, {batches}{order}"

    @property
    def spec(self) -> str:
        """The ``--semantics`` value that parses back to this configuration."""
        if self.name == "gloo" and self.eager_bytes == 0:
            base = "gloo"
        elif self.name == "nccl" and self.eager_bytes == NCCL_BUFFSIZE_DEFAULT:
            base = "nccl"
        else:
            base = f"{self.name}:{self.eager_bytes}"
        return base if self.independent_groups else base + "+serial"


#: gloo, as measured: rendezvous sends, batches issued op by op, groups independent.
GLOO = Semantics("gloo", eager_bytes=0, fused_batches_atomic=False, independent_groups=True)
#: NCCL from its documentation: eager sends up to NCCL_BUFFSIZE, batches launched as
#: groups, no wildcard receive.
NCCL = Semantics(
    "nccl",
    eager_bytes=NCCL_BUFFSIZE_DEFAULT,
    fused_batches_atomic=True,
    independent_groups=True,
    any_source=False,
    serial_batches=True,
)


def eager(eager_bytes: int) -> Semantics:
    """An MPI-like backend: sends up to ``eager_bytes`` are buffered, batches not fused."""
    if eager_bytes < 0:
        raise ConfigError(f"eager buffer size must not be negative: {eager_bytes}")
    return Semantics("eager", eager_bytes=eager_bytes)


def parse_semantics(text: str) -> Semantics:
    """A configuration from a CLI value.

    Accepted: ``gloo``, ``nccl``, ``nccl:1MiB`` (NCCL with another NCCL_BUFFSIZE),
    ``eager:64KiB`` (buffered sends, batches not fused), ``rendezvous`` (= ``eager:0``);
    a ``+serial`` suffix makes a rank's works complete in issue order.

    Raises:
        ConfigError: an unknown name or a bad size.
    """
    spec = text.strip().lower()
    serial = spec.endswith("+serial")
    if serial:
        spec = spec[: -len("+serial")]
    name, _, size = spec.partition(":")
    if name == "gloo" and not size:
        result = GLOO
    elif name == "nccl":
        result = NCCL if not size else NCCL.with_buffer(parse_size(size))
    elif name == "eager" and size:
        result = eager(parse_size(size))
    elif name == "rendezvous" and not size:
        result = eager(0)
    else:
        raise ConfigError(
            f"unknown semantics {text!r}: use gloo, nccl, nccl:SIZE, eager:SIZE or rendezvous"
        )
    return replace(result, independent_groups=False) if serial else result


def recorded_semantics(session: Session) -> Semantics | None:
    """The configuration a run was recorded under, from its trace headers.

    gloo as is (:data:`GLOO`); gloo with emulated eager sends (``dl2 run --buffer-size``:
    ``eager(N)``) or also with fused batches (``dl2 replay`` of an NCCL witness: a
    configuration named "emulated"); None when unknown (another backend, or ranks that
    disagree).
    """
    headers = [t.header for t in session.traces.values()]
    if not headers or any(h.backend != "gloo" for h in headers):
        return None
    emulations = [h.emulate for h in headers]
    if any(e != emulations[0] for e in emulations):
        return None
    emulate = emulations[0]
    if emulate is None:
        return GLOO
    eager_bytes = max(0, emulate.eager_bytes)
    fused = emulate.fused_batches
    if fused:
        return Semantics("emulated", eager_bytes=eager_bytes, fused_batches_atomic=True)
    return GLOO if eager_bytes == 0 else Semantics("eager", eager_bytes=eager_bytes)
