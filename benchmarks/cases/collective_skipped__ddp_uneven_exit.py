# dl2-case: label=defect world=2 category=collective-skipped
# dl2-expect: ranks=0,1
"""DDP with uneven data and no final synchronisation.

Rank 0's extra backward() issues DDP's gradient all_reduce while rank 1 has
finished and exits. Plain gloo does not hang: rank 0's all_reduce raises
"Connection closed by peer" once rank 1's process is gone.
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


if __name__ == "__main__":
    main()
