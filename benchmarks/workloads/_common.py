"""Shared set-up of the real workloads: tiny randomly initialised transformers models.

Every model is built offline from a config (no hub download) and trained on random
data.  Each rank can log its per-step wall times and its peak RSS: when the environment
names a directory in ``DL2_BENCH_LOG``, :meth:`StepLog.save` writes
``rank<R>.json`` there (``{"steps": [s, ...], "maxrss_kb": N}``).  ``DL2_BENCH_STEPS``
overrides a workload's number of steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

VOCAB = 256
SEQ = 32
WIDTH = 64


def init() -> tuple[int, int]:
    """Initialise the default gloo group; returns (rank, world size)."""
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # same initial weights on every rank
    return dist.get_rank(), dist.get_world_size()


def steps(default: int) -> int:
    return int(os.environ.get("DL2_BENCH_STEPS", default))


def gpt2(layers: int = 2) -> Any:
    """A GPT-2 LM of width 64, ``layers`` blocks, vocabulary 256 (about 0.1 M params)."""
    from transformers import GPT2Config
    from transformers import GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=WIDTH,
        n_layer=layers,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def swin() -> Any:
    """A two-stage Swin classifier for 32×32 images, 10 classes (about 20 k params)."""
    from transformers import SwinConfig
    from transformers import SwinForImageClassification

    config = SwinConfig(
        image_size=32,
        patch_size=4,
        num_channels=3,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[1, 2],
        window_size=4,
        num_labels=10,
        drop_path_rate=0.0,
    )
    return SwinForImageClassification(config)


def tokens(seed: int, batch: int = 4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, SEQ), generator=gen)


def images(seed: int, batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, 32, 32, generator=gen), torch.randint(
        0, 10, (batch,), generator=gen
    )


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
    )


class StepLog:
    """Per-step wall times of one rank, saved as JSON when ``DL2_BENCH_LOG`` is set."""

    def __init__(self) -> None:
        self.times: list[float] = []

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.times.append(time.perf_counter() - start)

    def save(self) -> None:
        where = os.environ.get("DL2_BENCH_LOG")
        if not where:
            return
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        record = {
            "steps": self.times,
            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        }
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"rank{rank}.json").write_text(json.dumps(record))


class GPT2Stage(torch.nn.Module):
    """One pipeline stage of a GPT-2 LM: the first stage embeds the tokens, the last
    applies the final norm and the LM head; each holds ``blocks`` of the model's blocks."""

    def __init__(self, model: Any, stage: int, stages: int) -> None:
        super().__init__()
        blocks = list(model.transformer.h)
        per = len(blocks) // stages
        self.first = stage == 0
        self.last = stage == stages - 1
        self.blocks = torch.nn.ModuleList(blocks[stage * per : (stage + 1) * per])
        if self.first:
            self.wte = model.transformer.wte
            self.wpe = model.transformer.wpe
        if self.last:
            self.ln_f = model.transformer.ln_f
            self.lm_head = model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.size(1)))
        for block in self.blocks:
            out = block(x)
            x = out[0] if isinstance(out, tuple) else out
        if self.last:
            x = self.lm_head(self.ln_f(x))
        return x
