#!/usr/bin/env python3
"""A tiny PyTorch DDP training that shrinks and grows with its Slurm job (CPU/gloo or GPU/NCCL).

Run it anywhere (no Slurm: state in ./.sgpu-elastic/0/)::

    torchrun --standalone --nproc-per-node=2 examples/torch_ddp_elastic.py --steps 200 \\
        --train-log train.jsonl

On a cluster, malleable between 2 and 4 GPUs (docs/malleable.md, step by step)::

    sgpu submit --malleable 2:4 --gres=gpu:4 --wrap "torchrun --standalone \\
        --nproc-per-node=\\$SGPU_GPUS examples/torch_ddp_elastic.py --steps 5000 \\
        --train-log train.jsonl"

A regression MLP on a fixed synthetic data set (seeded), trained with SGD + momentum, a
step LR schedule and AMP's grad scaler, through :mod:`slurmgpu.elastic.torch`:
``ElasticSampler`` (each step's global batch is the same samples at any world size, each
sample once per epoch), ``plan_batch`` (the global batch is kept, so the learning rate is
too; ``--keep per-rank`` keeps the per-rank batch and scales the learning rate by
``--lr-rule`` instead), ``TrainingState`` (one atomic checkpoint; ``agree`` makes every
rank checkpoint at the same step when any was signalled). Rank 0 appends one JSON line
per step to ``--train-log`` (``step``, ``loss``, ``world``, ``restart``, ``lr``, ``epoch``, ``at``)
and an ``event: start`` line per run, so a resized run's loss can be compared with an
uninterrupted one of the same ``--seed``. On fake GPUs (the lab cluster, the demo),
``--sample-time`` sleeps per sample of a rank's batch in place of GPU compute, so more
ranks make a step faster, as on real GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from slurmgpu import elastic
from slurmgpu.elastic import torch as etorch
from slurmgpu.elastic.scaling import RULES


def make_data(seed: int, n: int, dim: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, 1, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--samples", type=int, default=4096, help="data set size")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--keep", choices=("global", "per-rank"), default="global")
    p.add_argument("--base-world", type=int, default=1, help="world size --lr was tuned at")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-rule", choices=RULES, default="sqrt")
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step (seconds)")
    p.add_argument(
        "--sample-time",
        type=float,
        default=0.0,
        help="sleep per sample of this rank's batch (seconds): stands in for GPU compute on "
        "fake GPUs, so a step at more ranks is faster as on real ones",
    )
    p.add_argument("--save-every", type=int, default=0, help="periodic checkpoint (0: none)")
    p.add_argument(
        "--stop-at", type=int, default=0, help="end this run after this step (comparisons)"
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--train-log", type=Path, required=True)
    args = p.parse_args(argv)

    run = elastic.init()  # first: from now on the checkpoint signal is a flag, not a death
    cuda = torch.cuda.is_available() and run.local_gpus > 0
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)

    if args.keep == "global":
        plan = etorch.plan_batch(world, base_lr=args.lr, global_batch=args.global_batch)
    else:
        per_rank = max(args.global_batch // args.base_world, 1)
        plan = etorch.plan_batch(
            world,
            base_lr=args.lr,
            per_rank_batch=per_rank,
            base_world_size=args.base_world,
            rule=args.lr_rule,
        )
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    net = torch.nn.Sequential(
        torch.nn.Linear(args.dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).to(device or "cpu")
    # (DistributedDataParallel(net, find_unused_parameters=True) would keep DDP's first
    # gradient-bucket layout and make a run resumed at the same size bit-identical, at the
    # cost of a graph traversal per step; without it the first step after a restart sums
    # the gradients in another order, a difference of one float rounding.)
    model: Any = DistributedDataParallel(net) if world > 1 else net
    opt = torch.optim.SGD(model.parameters(), lr=plan.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(args.steps // 4, 1), gamma=0.5)
    scaler = torch.amp.GradScaler("cuda" if cuda else "cpu")
    data = make_data(args.seed, args.samples, args.dim)
    sampler = etorch.ElasticSampler(
        len(data), plan.global_batch, rank=rank, world_size=world, seed=args.seed
    )
    state = etorch.TrainingState(
        run, model=model, optimizer=opt, scheduler=sched, scaler=scaler, sampler=sampler, plan=plan
    )
    state.load()  # resumes where the last run checkpointed (any world size), or starts fresh
    log = args.train_log.open("a", buffering=1) if rank == 0 else None

    def emit(record: dict[str, Any]) -> None:
        if log is not None:
            log.write(json.dumps(record) + "\n")

    emit(
        {
            "event": "start",
            "job_id": run.job_id,
            "restart": run.restart_count,
            "world": world,
            "gpus": run.gpus,
            "resumed_step": state.step,
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "at": time.time(),
        }
    )
    last = min(args.steps, args.stop_at) if args.stop_at else args.steps
    while state.step < last:
        loader = DataLoader(
            data, batch_sampler=sampler, generator=torch.Generator()
        )  # its own generator: resuming does not shift the global RNG
        for batch_x, batch_y in loader:
            x, y = (
                (batch_x, batch_y) if device is None else (batch_x.to(device), batch_y.to(device))
            )
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            lr = opt.param_groups[0]["lr"]
            sched.step()
            mean = loss.detach().clone()
            if world > 1:
                dist.all_reduce(mean)
            state.step_done()  # step += 1; the sampler moves past this batch
            emit(
                {
                    "step": state.step,
                    "loss": float(mean) / world,
                    "world": world,
                    "restart": run.restart_count,
                    "lr": lr,
                    "epoch": sampler.epoch,
                    "at": round(time.time(), 3),
                }
            )
            run.step_done(samples=plan.global_batch, step=state.step)
            if args.step_time or args.sample_time:
                time.sleep(args.step_time + args.sample_time * plan.local_batch)
            if etorch.agree(run):  # some rank was signalled: all checkpoint at this step
                state.checkpoint()  # exits here once the job is requeued
                emit({"event": "resumed_in_place", "step": state.step, "at": time.time()})
            elif args.save_every and state.step % args.save_every == 0:
                state.save()
            if state.step >= last:
                break
        if sampler.epoch_done:
            sampler.set_epoch(sampler.epoch + 1)
    state.save()
    run.close()
    emit({"event": "done", "step": state.step, "at": time.time()})
    if log is not None:
        log.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # Everything is saved and closed when main() returns, so leave without the
    # interpreter's teardown: with gloo, torch 2.13 sometimes aborts a rank there
    # (SIGABRT, "terminate called without an active exception", no Python frame left;
    # 3 runs in 42 of this script at 2 ranks), which torchrun and Slurm report as a
    # failed job although the training finished.
    elastic.hard_exit(main())
