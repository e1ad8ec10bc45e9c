# dl2-case: label=ok world=2 category=fsdp2
"""FSDP2 (fully_shard on every GPT-2 block and on the root) training of a tiny GPT-2;
20 steps by default."""

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
