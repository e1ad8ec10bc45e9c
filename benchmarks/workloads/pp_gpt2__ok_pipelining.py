# dl2-case: label=ok world=2 category=pipeline
"""Pipeline parallelism with torch.distributed.pipelining: a 2-block GPT-2 split into two
stages (PipelineStage), trained with ScheduleGPipe over 4 microbatches; 10 steps by
default."""

import _common
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import ScheduleGPipe

MICRO = 4


def main():
    rank, world = _common.init()
    stage_mod = _common.GPT2Stage(_common.gpt2(layers=2), rank, world)
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=_common.lm_loss)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=1e-3)
    log = _common.StepLog()
    for step in range(_common.steps(10)):
        with log.step():
            ids = _common.tokens(step, batch=2 * MICRO)
            opt.zero_grad()
            if rank == 0:
                schedule.step(ids)
            else:
                schedule.step(target=ids)
            opt.step()
    log.save()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
