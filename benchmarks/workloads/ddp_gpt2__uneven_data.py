# dl2-case: label=deadlock world=2 category=ddp
# dl2-expect: ranks=0,1
"""DDP GPT-2 training on a dataset of 13 batches split round-robin without drop_last:
rank 0 gets 7 batches, rank 1 gets 6. Rank 0's 7th backward waits in DDP's gradient
all_reduce while rank 1 waits in the barrier before saving."""

import _common
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank, world = _common.init()
    model = DDP(_common.gpt2())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = [_common.tokens(i) for i in range(13)]
    for ids in dataset[rank::world]:
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()  # dl2: culprit
        opt.step()
    dist.barrier()  # dl2: culprit
    if rank == 0:
        torch.save(model.module.state_dict(), "/dev/null")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
