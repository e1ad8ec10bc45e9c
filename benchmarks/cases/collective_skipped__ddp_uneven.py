# dl2-case: label=deadlock world=2 category=collective-skipped
# dl2-expect: ranks=0,1
"""DDP with uneven data: rank 0 has one more batch than rank 1.

Rank 0's extra backward() issues DDP's gradient all_reduce; rank 1 has left the
loop and waits in the final barrier. Neither collective can complete.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(3, 4) for _ in range(3 if rank == 0 else 2)]
    for x in batches:
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()  # dl2: culprit
        opt.step()
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
