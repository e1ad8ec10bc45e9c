# dl2-case: label=ok world=2 category=collective-skipped
"""Correct twin of DDP with uneven data: the loop runs under the Join context
manager, which shadows the missing all_reduces of the rank that runs out of data.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(3, 4) for _ in range(3 if rank == 0 else 2)]
    with Join([model]):
        for x in batches:
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
