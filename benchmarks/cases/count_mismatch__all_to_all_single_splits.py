# dl2-case: label=defect world=2 category=count-mismatch
# dl2-expect: ranks=0,1
"""all_to_all_single with split sizes that disagree: rank 0 sends [1, 3] elements and
expects [1, 3] back, rank 1 sends [2, 2] and expects [2, 2] (each rank computed the
splits from its own token counts instead of exchanging them first)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    splits = [1, 3] if rank == 0 else [2, 2]
    send = torch.full((4,), float(rank))
    recv = torch.empty(4)
    dist.all_to_all_single(recv, send, output_split_sizes=splits, input_split_sizes=splits)  # dl2: culprit
    print(f"rank {rank}: {recv.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
