# dl2-case: label=deadlock world=2 category=pipeline
# dl2-expect: ranks=0,1
"""The hand-written pipeline of pp_gpt2__ok_1f1b, but the last stage reads the schedule
name from a config whose default differs: stage 0 runs 1F1B, stage 1 runs GPipe (all
forwards, then all backwards). In the first step stage 0 waits for the gradient of
microbatch 0 while stage 1 waits for the activation of microbatch 2."""

import _common
import torch
import torch.distributed as dist

MICRO = 4


def schedule(name, rank, world, micro):
    if name == "gpipe":
        return [("F", i) for i in range(micro)] + [("B", i) for i in range(micro)]
    warmup = min(world - rank - 1, micro)
    order = [("F", i) for i in range(warmup)]
    for i in range(micro - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(micro - warmup, micro)]
    return order


def train_step(stage, rank, ids, name):
    micro_ids = ids.chunk(MICRO)
    shape = (micro_ids[0].size(0), _common.SEQ, _common.WIDTH)
    inputs, outputs, pending = {}, {}, []
    for kind, i in schedule(name, rank, 2, MICRO):
        if kind == "F" and rank == 0:
            outputs[i] = stage(micro_ids[i])
            pending.append(dist.isend(outputs[i].detach(), dst=1))
        elif kind == "F":
            act = torch.empty(shape)
            dist.recv(act, src=0)  # dl2: culprit
            inputs[i] = act.requires_grad_()
            outputs[i] = _common.lm_loss(stage(act), micro_ids[i]) / MICRO
        elif rank == 0:
            grad = torch.empty(shape)
            dist.recv(grad, src=1)  # dl2: culprit
            outputs[i].backward(grad)
        else:
            outputs[i].backward()
            pending.append(dist.isend(inputs[i].grad, dst=0))
    for work in pending:
        work.wait()


def main():
    rank, world = _common.init()
    config = {"schedule": "1f1b"} if rank == 0 else {}
    name = config.get("schedule", "gpipe")
    stage = _common.GPT2Stage(_common.gpt2(layers=2), rank, world)
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
    for step in range(_common.steps(10)):
        opt.zero_grad()
        train_step(stage, rank, _common.tokens(step, batch=2 * MICRO), name)
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
