"""A small LightningModule trained through slurmgpu.elastic.lightning, run by torchrun in
tests/integration/test_elastic_lightning.py and tests/slurm/test_malleable_lightning_real.py
(WORKER_EPOCHS, default 2; WORKER_STEP_SLEEP, seconds per micro-batch). Each rank appends
one JSON line per micro-batch to ``<out>/<WORKER_RUN>.rank<R>.jsonl``: the optimizer step
it belongs to, the sample indices, their mean loss, the learning rate and the world size."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from slurmgpu.elastic.lightning import ElasticLightning  # 1

SAMPLES, DIM, GLOBAL_BATCH, PER_GPU = 96, 8, 8, 4
RUN = os.environ.get("WORKER_RUN", "run")
ELASTIC: list[ElasticLightning] = []


class Indexed(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(SAMPLES, DIM, generator=g)
        w = torch.randn(DIM, 1, generator=g)
        self.y = torch.tanh(self.x @ w) + 0.05 * torch.randn(SAMPLES, 1, generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


class Regression(pl.LightningModule):
    def __init__(self, log: Path, step_sleep: float) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.log_path = log
        self.step_sleep = step_sleep

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        idx, x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        record = {
            "step": int(self.trainer.global_step),
            "epoch": int(self.trainer.current_epoch),
            "indices": [int(i) for i in idx],
            "loss": float(loss.detach()),
            "lr": float(self.trainer.optimizers[0].param_groups[0]["lr"]),
            "world": int(self.trainer.world_size),
            "accumulate": int(self.trainer.accumulate_grad_batches),
            "at": time.time(),
        }
        with self.log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.step_sleep:
            time.sleep(self.step_sleep)
        return loss

    def on_train_start(self) -> None:  # after the callback's: record how this run began
        events = ELASTIC[0].callback.events if ELASTIC else []
        with (self.log_path.parent / "events.jsonl").open("a") as f:
            for event in events:
                f.write(json.dumps({**event, "rank": self.global_rank, "run": RUN}) + "\n")

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(Indexed(), batch_size=PER_GPU, shuffle=True)


def main() -> int:
    out = Path(sys.argv[1])
    elastic = ElasticLightning(global_batch=GLOBAL_BATCH, seed=5)  # 2
    ELASTIC.append(elastic)
    rank = int(os.environ.get("RANK", "0"))
    log = out / f"{RUN}.rank{rank}.jsonl"
    model = Regression(log, float(os.environ.get("WORKER_STEP_SLEEP", "0")))
    trainer = pl.Trainer(
        max_epochs=int(os.environ.get("WORKER_EPOCHS", "2")),
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **elastic.trainer_kwargs(),  # 3
    )
    trainer.fit(model)
    with (out / "events.jsonl").open("a") as f:
        f.write(
            json.dumps({"event": "done", "rank": rank, "run": RUN, "step": trainer.global_step})
        )
        f.write("\n")
    return 0


if __name__ == "__main__":
    code = main()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    from slurmgpu.elastic import hard_exit

    hard_exit(code)
