# dl2-case: label=deadlock world=2 category=early-stop
# dl2-expect: ranks=0,1
"""Early stopping on the local validation loss: rank 1's loss drops below the threshold
at step 2 and it leaves the loop; rank 0 keeps training and waits in the gradient
all_reduce of step 3 while rank 1 waits in the final barrier."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    w = torch.zeros(4)
    for step in range(1, 6):
        grad = torch.full((4,), 0.1 * (rank + 1))
        dist.all_reduce(grad)  # dl2: culprit
        w -= grad
        local_val_loss = 1.0 / (step * (1 + 3 * rank))
        if local_val_loss < 0.2:
            break
    dist.barrier()  # dl2: culprit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
