# dl2-case: label=defect world=2 category=ddp
# dl2-expect: ranks=0,1
"""DDP GPT-2 training with evaluation every 5 steps on rank 0 only; evaluate() averages
the validation loss over ranks with an all_reduce (it was written for distributed
evaluation). Rank 0's 1-element all_reduce meets rank 1's next gradient all_reduce."""

import _common
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@torch.no_grad()
def evaluate(model):
    ids = _common.tokens(99)
    loss = model(input_ids=ids, labels=ids).loss.reshape(1)
    dist.all_reduce(loss)  # dl2: culprit
    return loss.item() / dist.get_world_size()


def main():
    rank, _ = _common.init()
    model = DDP(_common.gpt2())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(_common.steps(12)):
        ids = _common.tokens(1000 * rank + step)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()  # dl2: culprit
        opt.step()
        if step % 5 == 4 and rank == 0:
            print(f"step {step}: val loss {evaluate(model):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
