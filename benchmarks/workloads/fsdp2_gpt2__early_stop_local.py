# dl2-case: label=deadlock world=2 category=fsdp2
# dl2-expect: ranks=0,1
"""FSDP2 GPT-2 training with early stopping on each rank's own validation loss (computed
on its own data shard): rank 1 stops after step 3, rank 0 goes on into the next
forward's parameter all_gather while rank 1 waits in the final barrier."""

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
    patience = {0: 6, 1: 3}[rank]  # stands for a local metric that plateaus earlier
    for step in range(_common.steps(8)):
        ids = _common.tokens(1000 * rank + step)
        loss = model(input_ids=ids, labels=ids).loss  # dl2: culprit
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step + 1 >= patience:
            break
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
