"""Prediction: deadlocks this run did not hit but another run of the same program can.

The recorded op sequences are executed again on an abstract machine under other backend
semantics (eager send sizes, fused P2P batches, serialised groups) and wildcard matches,
and the fusion passes are regrouped.  Modules, in the order they build on each other:

* :mod:`.semantics`: what a backend guarantees (``Semantics``, the gloo and NCCL presets,
  ``--semantics`` specs) and the configuration a run was recorded under.
* :mod:`.program`: the recorded ops indexed once for the machine (``Program``).
* :mod:`.machine`: the abstract machine that runs every rank's program under a semantics
  (``Machine``, one execution's ``State``, where it stopped: ``Outcome``).
* :mod:`.blocking`: on whom the machine's blocked ranks wait, and which are deadlocked
  (graph reduction of :mod:`dl2.model.stuck`).
* :mod:`.witness`: a potential deadlock's witness and its JSON document (``dl2 replay
  --choices`` reads it).
* :mod:`.search`: the search over wildcard choices for reachable deadlocks, and each
  witness's buffer threshold (``predict``, ``sweep``, ``Prediction``).
* :mod:`.fusion`: gradient-fusion passes regrouped under other bucket limits.
* :mod:`.findings`: predictions turned into ``potential-deadlock`` findings.

Byte sizes (``parse_size``, ``format_size``) are in :mod:`dl2.units`, dtype sizes in
:mod:`dl2.model.dtypes`; ``dl2 predict``'s output is drawn by :mod:`dl2.render.prediction`.
"""
