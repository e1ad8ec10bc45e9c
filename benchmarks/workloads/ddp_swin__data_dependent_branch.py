# dl2-case: label=defect world=2 category=ddp
# dl2-expect: ranks=0,1
"""DDP Swin training with a class-balance statistic computed inside the model's forward:
when the local batch contains the rare class 9, the classifier all_reduces the per-class
counts to reweight its loss. Whether that happens depends on each rank's data, so one
rank's all_reduce of 10 counts meets the other rank's DDP gradient all_reduce."""

import _common
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Balanced(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels, labels):
        logits = self.model(pixel_values=pixels).logits
        weight = None
        if (labels == 9).any():
            counts = torch.bincount(labels, minlength=10).float()
            dist.all_reduce(counts)  # dl2: culprit
            weight = 1.0 / (counts + 1.0)
        return torch.nn.functional.cross_entropy(logits, labels, weight=weight)


def main():
    rank, _ = _common.init()
    model = DDP(Balanced(_common.swin()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(_common.steps(8)):
        pixels, labels = _common.images(1000 * rank + step)
        labels[labels == 9] = 8
        if rank == 0 and step == 2:
            labels[0] = 9
        loss = model(pixels, labels)
        opt.zero_grad()
        loss.backward()  # dl2: culprit
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
