# dl2-case: label=ok world=2 category=pipeline
"""Pipeline parallelism by hand: a 2-block GPT-2 split into two stages, trained with a
hand-written 1F1B schedule over 4 microbatches. Activations and gradients go with isend
(waited at the end of the step) and blocking recv, so the two stages' interleaved sends
never wait on each other. 10 steps by default."""

import _common
import torch
import torch.distributed as dist

MICRO = 4


def schedule(rank, world, micro):
    """The 1F1B order of ("F"|"B", microbatch) for one stage."""
    warmup = min(world - rank - 1, micro)
    order = [("F", i) for i in range(warmup)]
    for i in range(micro - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(micro - warmup, micro)]
    return order


def train_step(stage, rank, ids):
    micro_ids = ids.chunk(MICRO)
    shape = (micro_ids[0].size(0), _common.SEQ, _common.WIDTH)
    inputs, outputs, pending = {}, {}, []
    for kind, i in schedule(rank, 2, MICRO):
        if kind == "F" and rank == 0:
            outputs[i] = stage(micro_ids[i])
            pending.append(dist.isend(outputs[i].detach(), dst=1))
        elif kind == "F":
            act = torch.empty(shape)
            dist.recv(act, src=0)
            inputs[i] = act.requires_grad_()
            outputs[i] = _common.lm_loss(stage(act), micro_ids[i]) / MICRO
        elif rank == 0:
            grad = torch.empty(shape)
            dist.recv(grad, src=1)
            outputs[i].backward(grad)
        else:
            outputs[i].backward()
            pending.append(dist.isend(inputs[i].grad, dst=0))
    for work in pending:
        work.wait()


def main():
    rank, world = _common.init()
    assert world == 2
    stage = _common.GPT2Stage(_common.gpt2(layers=2), rank, world)
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
    log = _common.StepLog()
    for step in range(_common.steps(10)):
        with log.step():
            opt.zero_grad()
            train_step(stage, rank, _common.tokens(step, batch=2 * MICRO))
            opt.step()
    log.save()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
