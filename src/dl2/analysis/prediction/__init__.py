"""Prediction: deadlocks this run did not hit but another run of the same program can.

The recorded op sequences are executed again on an abstract machine under other backend
semantics (eager send sizes, fused P2P batches, serialised groups) and wildcard matches,
and the fusion passes are regrouped.  Modules, in the order they build on each other:

* :mod:`.semantics`: what a backend guarantees (``Semantics``, the gloo and NCCL presets).
* :mod:`.machine`: the abstract machine that runs every rank's program under a semantics.
* :mod:`.search`: the search over semantics and wildcard choices for reachable deadlocks.
* :mod:`.fusion`: gradient-fusion passes regrouped under other bucket limits.
* :mod:`.findings`: predictions turned into ``potential-deadlock`` findings.
"""
