# dl2-case: label=ok world=2 category=ddp
"""DDP training of a tiny GPT-2 (transformers, random init): each rank trains on its own
shard of random token batches; 20 steps by default."""

import _common
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank, _ = _common.init()
    model = DDP(_common.gpt2())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    log = _common.StepLog()
    for step in range(_common.steps(20)):
        with log.step():
            ids = _common.tokens(1000 * rank + step)
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    log.save()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
