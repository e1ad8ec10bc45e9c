"""Which cases an evaluation runs: every case and workload, the ``--quick`` subset, filters.

The ground truth of each case is its header (:func:`benchmarks._harness.parse_case`).
"""

from __future__ import annotations

from benchmarks._harness import Case
from benchmarks._harness import discover

#: the ``--quick`` subset: one or two per kind of bug, and one workload
QUICK = (
    "send_send__2ranks",
    "recv_recv__ok_send_first",
    "collective_order__2ranks",
    "collective_skipped__early_exit",
    "count_mismatch__4_vs_8",
    "reduce_op_mismatch__sum_max",
    "nonmember_call__3ranks",
    "object_subset__ok_all_ranks",
    "batch_p2p__missing_irecv",
    "p2p_collective_order__ok_isend_barrier",
    "dtype_mismatch__p2p_float_int",
    "wildcard__race_any_then_named",
    "early_stop__ok_all_reduce_flag",
    "ddp_gpt2__ok_train",
    "ddp_gpt2__uneven_data",
)


def select_cases(quick: bool, filters: list[str]) -> list[Case]:
    """The cases to run: all, or the ``QUICK`` ones; then those matching any filter."""
    cases = discover()
    if quick:
        cases = [c for c in cases if c.name in QUICK]
    if filters:
        cases = [c for c in cases if any(f in c.name for f in filters)]
    return cases
