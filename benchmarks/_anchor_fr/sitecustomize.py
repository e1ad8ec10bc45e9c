"""Flight Recorder dump hook for the ``fr`` anchor of ``benchmarks/evaluate.py``.

Put on ``PYTHONPATH`` of a job's ranks (with ``TORCH_FR_BUFFER_SIZE`` > 0, which makes
torch record every gloo collective into its in-memory Flight Recorder).  torch 2.13 only
writes a dump file by itself from the NCCL watchdog; for gloo it offers the on-demand
``torch._C._distributed_c10d._dump_fr_trace()`` (what the debug server's ``fr_trace``
handler returns).  This hook writes that dump to ``TORCH_FR_DUMP_TEMP_FILE<rank>`` (the
name torch's own dumps use):

* when the file named by ``BENCH_FR_TRIGGER`` appears (the harness creates it when the
  job has run for its cap, i.e. a watchdog timeout), from a daemon thread: gloo releases
  the GIL while a rank is blocked, so the thread runs in a hung rank;
* at an uncaught exception, and when the job calls ``destroy_process_group`` (the
  thread wraps it once ``torch.distributed`` is imported), or at exit if it does not.

The dump symbolises the recorded Python stacks, which costs a few CPU seconds per rank;
so that a job slowed down by its own dump at ``destroy_process_group`` is not taken for
a hung one, the hook leaves ``destroy.<rank>`` and ``dumped.<rank>`` (holding the
reason) in the directory ``BENCH_FR_STATE``.

A rank killed by a signal (gloo's SIGABRT on a size mismatch) writes nothing.
"""

import atexit
import os
import sys
import threading
import time

_done = threading.Lock()
_written = []


def _dump(reason):
    if not _done.acquire(blocking=False):
        return
    try:
        prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        if not prefix:
            return
        import torch.distributed as dist
        from torch._C._distributed_c10d import _dump_fr_trace

        if not dist.is_initialized():
            return
        data = _dump_fr_trace(True, True, False)
        rank = dist.get_rank()
        tmp = f"{prefix}{rank}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, f"{prefix}{rank}")
        _mark(f"dumped.{rank}", reason)
        _written.append(reason)
    except Exception as err:  # never disturb the job
        print(f"[fr-anchor] dump failed: {err!r}", file=sys.stderr, flush=True)


def _mark(name, text=""):
    """Leave ``name`` in ``BENCH_FR_STATE`` (the harness reads how far each rank got)."""
    where = os.environ.get("BENCH_FR_STATE")
    if where:
        try:
            with open(os.path.join(where, name), "w") as handle:
                handle.write(text)
        except OSError:
            pass


def _wrap_destroy(dist):
    original = dist.destroy_process_group

    def destroy_process_group(*args, **kwargs):
        if dist.is_initialized():
            _mark(f"destroy.{dist.get_rank()}")
        _dump("destroy")
        return original(*args, **kwargs)

    dist.destroy_process_group = destroy_process_group


def _watch(trigger):
    wrapped = False
    while not os.path.exists(trigger):
        if not wrapped:
            dist = sys.modules.get("torch.distributed")
            if dist is not None and hasattr(dist, "destroy_process_group"):
                _wrap_destroy(dist)
                wrapped = True
        time.sleep(0.05)
    _dump("trigger")


def _excepthook(kind, value, tb):
    _dump("exception")
    _previous(kind, value, tb)


if os.environ.get("BENCH_FR_TRIGGER"):
    threading.Thread(
        target=_watch, args=(os.environ["BENCH_FR_TRIGGER"],), daemon=True, name="fr-anchor"
    ).start()
    _previous = sys.excepthook
    sys.excepthook = _excepthook
    atexit.register(_dump, "exit")
