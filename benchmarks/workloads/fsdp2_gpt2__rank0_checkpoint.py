# dl2-case: label=defect world=2 category=fsdp2
# dl2-expect: ranks=0,1
"""FSDP2 GPT-2 training that saves a full checkpoint at step 4 on rank 0 only: gathering
each sharded parameter with DTensor.full_tensor() is an all_gather that rank 1 never
joins (it is already in the next step's forward, whose FSDP all_gather of a block's
parameters has another size): gloo aborts rank 0 (SIGABRT, size mismatch) and rank 1
fails with "Connection reset by peer"."""

import _common
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main():
    rank, _ = _common.init()
    model = _common.gpt2()
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(_common.steps(8)):
        ids = _common.tokens(1000 * rank + step)
        loss = model(input_ids=ids, labels=ids).loss  # dl2: culprit
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 4 and rank == 0:
            full = {k: v.full_tensor() for k, v in model.state_dict().items()}  # dl2: culprit
            torch.save(full, "/dev/null")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
