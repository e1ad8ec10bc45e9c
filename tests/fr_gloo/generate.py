"""Regenerate the gloo Flight Recorder fixtures: ``python tests/fr_gloo/generate.py``.

Each case of ``cases.py`` runs as 2 ranks (3 for ``subgroup``), one process each, with
a hard timeout, and leaves ``tests/fr_gloo/<case>/fr_trace_rank_<r>``.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = [
    "cross_group",
    "cross_group_ok",
    "skipped",
    "skipped_ok",
    "dtype",
    "dtype_ok",
    "op_type",
    "op_type_ok",
    "early_exit",
    "early_exit_ok",
    "size",
    "size_ok",
    "subgroup",
    "subgroup_ok",
]
#: ranks of each case (2 unless named)
WORLD = {"subgroup": 3, "subgroup_ok": 3}


def run(case: str, port: int) -> None:
    out = HERE / case
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    procs = []
    world = WORLD.get(case, 2)
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCH_FR_BUFFER_SIZE="2000",
            FR_OUT=str(out),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "cases.py"), case], env=env, start_new_session=True
            )
        )
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
    print(case, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    for i, name in enumerate(sys.argv[1:] or CASES):
        run(name, 29700 + i)
