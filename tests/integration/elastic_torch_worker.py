"""One rank of a tiny DDP training (CPU, gloo) for tests/integration/test_elastic_torch.py.

``python -m tests.integration.elastic_torch_worker SCENARIO OUT`` with MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE, SLURM_JOB_ID and SGPU_ELASTIC_DIR set like torchrun and Slurm would.

- ``reference``: trains steps 1..STEPS (dropout on), checkpointing after SAVE_AT into the
  job's state dir (a copy kept as ``ckpt-dropout.pt``); then, in the same processes with
  the RNGs deliberately scrambled, builds everything afresh, loads that checkpoint and
  trains to STEPS again; then the same reference without dropout (``ckpt-plain.pt``).
- ``resume``: loads ``ckpt-plain.pt`` at this world size and trains to STEPS.

Rank 0 writes OUT (JSON): per step the global mean loss, each rank's sample indices,
the learning rate; final parameters.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from slurmgpu import elastic
from slurmgpu.elastic import torch as etorch

N, GLOBAL_BATCH, STEPS, SAVE_AT, BASE_LR = 96, 8, 16, 6, 0.05


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(N, 1, generator=g)
    return TensorDataset(x, y)


def build(run: elastic.ElasticRun, dropout: float) -> dict[str, Any]:
    torch.manual_seed(1)  # same initial weights on every rank
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(16, 1)
    )
    # No bucket rebuild after the first iteration: the all-reduce sums in the same order
    # in an uninterrupted run and in the first step after a restart (bit-identity).
    model = DistributedDataParallel(net, find_unused_parameters=True)
    plan = etorch.plan_batch(dist.get_world_size(), base_lr=BASE_LR, global_batch=GLOBAL_BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=plan.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    sampler = etorch.ElasticSampler(
        N, plan.global_batch, rank=dist.get_rank(), world_size=dist.get_world_size(), seed=3
    )
    state = etorch.TrainingState(
        run, model=model, optimizer=opt, scheduler=sched, scaler=scaler, sampler=sampler, plan=plan
    )
    return {"model": model, "opt": opt, "sched": sched, "scaler": scaler, "state": state}


def train(
    parts: dict[str, Any], until: int, save_at: int | None, keep: Path | None
) -> dict[str, Any]:
    data = dataset()
    state: etorch.TrainingState = parts["state"]
    sampler = state.sampler
    assert sampler is not None
    record: dict[str, Any] = {"steps": {}}
    while state.step < until:
        # Its own generator: a DataLoader otherwise seeds itself from the global RNG
        # each time it starts iterating, shifting dropout's stream in a resumed run.
        loader = DataLoader(
            data, batch_sampler=sampler, collate_fn=lambda b: b, generator=torch.Generator()
        )
        for idx in loader:
            x = torch.stack([b[0] for b in idx])
            y = torch.stack([b[1] for b in idx])
            parts["opt"].zero_grad()
            loss = torch.nn.functional.mse_loss(parts["model"](x), y)
            parts["scaler"].scale(loss).backward()
            parts["scaler"].step(parts["opt"])
            parts["scaler"].update()
            lr = parts["opt"].param_groups[0]["lr"]
            parts["sched"].step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            indices: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(indices, _indices(sampler))
            state.step_done()
            record["steps"][state.step] = {
                "loss": float(mean) / dist.get_world_size(),
                "indices": indices,
                "lr": lr,
                "epoch": sampler.epoch,
                "params": _params(parts["model"]),
            }
            if save_at is not None and state.step == save_at:
                state.save()
                dist.barrier()
                if dist.get_rank() == 0 and keep is not None:
                    shutil.copy(state.path, keep)
            if state.step >= until:
                break
        if sampler.epoch_done:
            sampler.set_epoch(sampler.epoch + 1)
    record["params"] = _params(parts["model"])
    return record


def _params(model: Any) -> list[list[float]]:
    return [p.detach().flatten().tolist() for p in etorch._unwrap(model).parameters()]


def _indices(sampler: etorch.ElasticSampler) -> list[int]:
    # The batch this rank just trained on: the sampler's next batch before advance().
    return next(iter(sampler))


def main() -> int:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    run = elastic.init(install_handlers=False)
    result: dict[str, Any] = {}
    if scenario == "reference":
        state_dir = Path(os.environ["SGPU_ELASTIC_DIR"])
        parts = build(run, 0.2)
        result["dropout"] = train(parts, STEPS, SAVE_AT, state_dir / "ckpt-dropout.pt")
        torch.manual_seed(12345 + dist.get_rank())  # scrambled: load() must restore them
        parts = build(run, 0.2)
        parts["state"].path = state_dir / "ckpt-dropout.pt"
        result["resumed_at"] = parts["state"].load()
        result["resumed_step"] = parts["state"].step
        result["dropout_resumed"] = train(parts, STEPS, None, None)
        parts = build(run, 0.0)
        result["plain"] = train(parts, STEPS, SAVE_AT, state_dir / "ckpt-plain.pt")
        result["resumed_flag"] = run.resumed
    else:
        parts = build(run, 0.0)
        parts["state"].path = Path(os.environ["SGPU_ELASTIC_DIR"]) / "ckpt-plain.pt"
        result["resumed_at"] = parts["state"].load()
        result["resumed_step"] = parts["state"].step
        loaded = torch.load(parts["state"].path, weights_only=False)["model"]
        net = etorch._unwrap(parts["model"])
        result["loaded_equal"] = all(torch.equal(v, loaded[k]) for k, v in net.state_dict().items())
        result["lr_after_load"] = parts["opt"].param_groups[0]["lr"]
        result["plain"] = train(parts, STEPS, None, None)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # Past the final barrier everything is written: leave without the interpreter's
    # teardown, where torch 2.13's gloo sometimes aborts a rank (see the example's end).
    elastic.hard_exit(main())
