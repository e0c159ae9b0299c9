#!/usr/bin/env python3
"""A plain Hugging Face Accelerate loop that shrinks and grows with its Slurm job.

An ordinary Accelerate script plus the lines marked ``# sgpu``
(:mod:`slurmgpu.elastic.accelerate`, docs/malleable.md "Accelerate"). Run it anywhere (no
Slurm: state and checkpoints in ./.sgpu-elastic/0/)::

    torchrun --standalone --nproc-per-node=2 examples/accelerate_elastic.py \\
        --epochs 3 --train-log train.jsonl

On a cluster, malleable between 1 and 4 GPUs::

    sgpu submit --malleable 1:4 --gres=gpu:4 --wrap "sgpu launch -- torchrun --standalone \\
        --nproc-per-node=\\$SGPU_GPUS examples/accelerate_elastic.py --epochs 50"

The model is a small MLP with dropout on a fixed synthetic regression set. Rank 0 appends
one JSON line per optimizer step to ``--train-log`` (``step``, ``loss`` over the global
batch, ``lr``, ``world``, ``accumulation``) and an ``event: start`` line per run;
``--index-log`` makes every rank append the sample indices of each optimizer step.
``--step-time`` sleeps per step in place of real compute.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, Dataset

from slurmgpu import elastic
from slurmgpu.elastic import accelerate as eacc


class Synthetic(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    def __init__(self, n: int, dim: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        w = torch.randn(dim, 1, generator=g)
        self.y = torch.tanh(self.x @ w) + 0.05 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def _append(path: Path, doc: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(doc) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=80)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--per-device-batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step (seconds)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, help="write the final weights here (rank 0)")
    p.add_argument("--train-log", type=Path)
    p.add_argument("--index-log", type=Path)
    a = p.parse_args(argv)

    run = elastic.init()  # sgpu: first, so the checkpoint signal is a flag from now on
    set_seed(a.seed)
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    model = nn.Sequential(nn.Linear(a.dim, 32), nn.Tanh(), nn.Dropout(a.dropout), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    total = a.epochs * a.samples // a.global_batch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / (total + 1))
    loader = DataLoader(
        Synthetic(a.samples, a.dim, a.seed), batch_size=a.per_device_batch, shuffle=True
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    loop = eacc.attach(accelerator, run, loader, global_batch=a.global_batch, seed=a.seed)  # sgpu
    rank, world = accelerator.process_index, accelerator.num_processes
    if a.train_log is not None and rank == 0:
        _append(
            a.train_log,
            {
                "event": "start",
                "world": world,
                "accumulation": accelerator.gradient_accumulation_steps,
                "resume_from": str(loop.resumed_from) if loop.resumed_from else None,
                "restart": run.restart_count,
                "backend": dist.get_backend() if dist.is_initialized() else None,
            },
        )
    losses: list[torch.Tensor] = []
    seen: list[int] = []
    for _epoch in loop.epochs(a.epochs):  # sgpu: was range(a.epochs)
        for x, y, idx in loop:  # sgpu: was loader
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.detach())
            seen.extend(int(i) for i in idx)
            if accelerator.sync_gradients:  # an optimizer step: log it
                step = loop.step + 1  # the loop counts it when the next batch is asked for
                mean = accelerator.reduce(torch.stack(losses).mean(), reduction="mean")
                if a.index_log is not None:
                    _append(a.index_log, {"step": step, "rank": rank, "idx": seen})
                if a.train_log is not None and rank == 0:
                    _append(
                        a.train_log,
                        {
                            "step": step,
                            "loss": float(mean),
                            "lr": scheduler.get_last_lr()[0],
                            "world": world,
                            "accumulation": accelerator.gradient_accumulation_steps,
                            "restart": run.restart_count,
                            "at": round(time.time(), 3),
                        },
                    )
                losses, seen = [], []
                if a.step_time:
                    time.sleep(a.step_time)
    if a.out is not None and rank == 0:
        torch.save(accelerator.unwrap_model(model).state_dict(), a.out)
    accelerator.end_training()
    elastic.hard_exit(0)  # skips a teardown abort gloo sometimes has (docs/malleable.md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
