"""PyTorch Flight Recorder (FR) dumps read as dl2 traces.

FR keeps a ring buffer of every collective and P2P launch per process and dumps it per
rank (pickle or JSON).  :mod:`~dl2.flight.safe` loads a dump without running anything
from it, :mod:`~dl2.flight.dump` checks its schema into typed entries,
:mod:`~dl2.flight.mapping` turns one rank's entries into the typed records of
:mod:`dl2.trace.schema.decode`, and :mod:`~dl2.flight.loader` finds the dumps and
assembles a :class:`dl2.trace.session.Session`: the model and every analysis read it
unchanged.  This package sits beside :mod:`dl2.trace` and imports only it (and the
leaves).
"""
