"""torch's abort at interpreter teardown, which correct jobs hit now and then.

A rank that did all its work may still die at exit with "terminate called without an
active exception" (SIGABRT: a C++ thread of torch's left joinable at teardown); the
testers saw it in plain torchrun runs too.  dl2 rightly reports such a job as failed.
A test of a correct job that meets it runs the job once more rather than fail on torch.
"""

from __future__ import annotations

from collections.abc import Iterable

#: what libstdc++ prints when torch's teardown aborts
ABORT = "terminate called without an active exception"
#: what dl2 says of a rank that failed so (its report's warning)
AFTER_ITS_PROGRAM = "failed at interpreter exit, after its program had ended"


def torn_down(returncode: int, output: str, warnings: Iterable[str]) -> bool:
    """Whether a job failed only by torch's abort at teardown, after its ranks' work."""
    return returncode != 0 and ABORT in output and any(AFTER_ITS_PROGRAM in w for w in warnings)
