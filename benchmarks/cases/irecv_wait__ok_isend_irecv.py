# dl2-case: label=ok world=2 category=irecv-wait-cycle
"""Correct twin: post irecv and isend first, then wait on both."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    out = torch.full((4,), float(rank))
    inp = torch.empty(4)
    recv_req = dist.irecv(inp, src=peer)
    send_req = dist.isend(out, dst=peer)
    recv_req.wait()
    send_req.wait()
    assert torch.equal(inp, torch.full((4,), float(peer))), inp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
