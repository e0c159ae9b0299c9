#!/usr/bin/env python3
"""An ordinary PyTorch Lightning training made malleable by three lines (marked ``# sgpu``).

Run it anywhere (no Slurm: a checkpoint signal, ``kill -USR2`` to the workers, writes
./.sgpu-elastic/0/lightning.ckpt and the next run resumes from it)::

    torchrun --standalone --nproc-per-node=2 examples/lightning_elastic.py --epochs 3

On a cluster, malleable between 1 and 2 GPUs (docs/malleable.md, "PyTorch Lightning")::

    sgpu submit --malleable 1:2 --gres=gpu:2 -o train.out --wrap "torchrun --standalone \\
        --nproc-per-node=\\$SGPU_GPUS examples/lightning_elastic.py --epochs 20"

The three lines: the import; ``ElasticLightning(global_batch=...)`` first thing (from then
on the checkpoint signal and SIGTERM are flags of ``slurmgpu.elastic``, not Lightning's);
``**elastic.trainer_kwargs()`` in the ``Trainer`` call (the callback that checkpoints at
the next step boundary and resumes mid-epoch, devices/num_nodes of this run, gradient
accumulation where the global batch does not fit the ranks, Lightning's SLURM
auto-requeue off). ``trainer.fit`` is unchanged: it resumes from the job's checkpoint by
itself. Everything else is plain Lightning. ``--train-log`` makes rank 0 append one JSON
line per optimizer step (``step``, ``loss`` over the global batch, ``world``, the run's
``restart`` count, the wall-clock time ``at``) and an ``event: start`` line per run
(``resumed_step``, the process group's ``backend``, ``restart``, ``at``), as the other
examples do; ``--step-time`` sleeps per step in place of real compute.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from slurmgpu.elastic import hard_exit
from slurmgpu.elastic.lightning import ElasticLightning  # sgpu


class Regression(pl.LightningModule):
    def __init__(self, dim: int, lr: float, dropout: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Linear(dim, 64),
            torch.nn.ReLU(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(64, 1),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Data(pl.LightningDataModule):
    def __init__(self, samples: int, dim: int, per_gpu_batch: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(samples, dim, generator=g)
        y = torch.tanh(x @ torch.randn(dim, 1, generator=g)) + 0.05 * torch.randn(
            samples, 1, generator=g
        )
        self.data = TensorDataset(x, y)
        self.per_gpu_batch = per_gpu_batch

    def train_dataloader(self) -> DataLoader[Any]:
        # batch_size: what one GPU holds. The elastic loader keeps the dataset and
        # settings, takes its samples in the resumable order, and accumulates beyond it.
        return DataLoader(self.data, batch_size=self.per_gpu_batch, shuffle=True)


class TrainLog(pl.Callback):
    """Rank 0 appends each optimizer step's loss (the mean of its micro-batches' ``loss``,
    already averaged over the ranks by ``sync_dist``) to a JSON-lines file."""

    def __init__(self, path: Path, step_time: float, restart: int) -> None:
        self.path, self.step_time, self.restart = path, step_time, restart
        self.losses: list[float] = []
        self.last_step = 0

    def _append(self, trainer: pl.Trainer, doc: dict[str, Any]) -> None:
        if trainer.global_rank == 0:
            with self.path.open("a") as f:
                f.write(json.dumps(doc) + "\n")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.last_step = trainer.global_step
        dist = torch.distributed
        backend = dist.get_backend() if dist.is_initialized() else None
        doc = {"event": "start", "world": trainer.world_size, "backend": backend}
        self._append(
            trainer,
            {
                **doc,
                "resumed_step": trainer.global_step,
                "restart": self.restart,
                "at": time.time(),
            },
        )

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.losses.append(float(trainer.callback_metrics["loss"]))
        if trainer.global_step > self.last_step:  # an optimizer step has finished
            self.last_step = trainer.global_step
            loss = sum(self.losses) / len(self.losses)
            doc = {"step": trainer.global_step, "loss": loss, "world": trainer.world_size}
            at = round(time.time(), 3)
            self._append(trainer, {**doc, "restart": self.restart, "at": at})
            self.losses = []
            if self.step_time:
                time.sleep(self.step_time)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--per-gpu-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step (seconds)")
    p.add_argument("--train-log", type=Path)
    args = p.parse_args()

    elastic = ElasticLightning(global_batch=args.global_batch, seed=0)  # sgpu
    pl.seed_everything(0, verbose=False)  # the same initial weights on every rank
    restart = elastic.run.restart_count
    log = [TrainLog(args.train_log, args.step_time, restart)] if args.train_log else []
    trainer = pl.Trainer(max_epochs=args.epochs, **elastic.trainer_kwargs(callbacks=log))  # sgpu
    trainer.fit(
        Regression(args.dim, args.lr, args.dropout),
        datamodule=Data(args.samples, args.dim, args.per_gpu_batch),
    )
    return 0


if __name__ == "__main__":
    # After fit everything is saved; leave without the interpreter's teardown, which with
    # gloo sometimes aborts a finished rank (docs/malleable.md, step by step).
    code = main()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    hard_exit(code)
