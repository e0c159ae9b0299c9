#!/usr/bin/env python3
"""A Hugging Face ``Trainer`` training that shrinks and grows with its Slurm job.

An ordinary Trainer script plus the three lines marked ``# sgpu``
(:mod:`slurmgpu.elastic.huggingface`, docs/malleable.md "Hugging Face Trainer"). Run it
anywhere (no Slurm: state in ./.sgpu-elastic/0/, checkpoints in --output-dir)::

    torchrun --standalone --nproc-per-node=2 examples/hf_trainer_elastic.py \\
        --output-dir hf-out --max-steps 200 --train-log train.jsonl

On a cluster, malleable between 1 and 4 GPUs::

    sgpu submit --malleable 1:4 --gres=gpu:4 --wrap "torchrun --standalone \\
        --nproc-per-node=\\$SGPU_GPUS examples/hf_trainer_elastic.py --output-dir hf-out \\
        --max-steps 5000 --train-log train.jsonl"

The model is a tiny ``PreTrainedModel`` built from its config in code (nothing is
downloaded): a regression MLP with dropout on a fixed synthetic data set. Rank 0 appends
one JSON line per logged step to ``--train-log`` (``step``, ``loss``, ``lr``, ``world``,
``accumulation``, the run's ``restart`` count, the wall-clock time ``at``) and an
``event: start`` line per run; ``--index-log`` makes every rank append the sample indices
of each optimizer step (the tests check each sample once per epoch across resizes).
``--step-time`` sleeps per step in place of real compute.
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
from torch import nn
from torch.utils.data import Dataset
from transformers import (
    PretrainedConfig,
    PreTrainedModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from slurmgpu.elastic import hard_exit
from slurmgpu.elastic import huggingface as ehf  # sgpu


class TinyConfig(PretrainedConfig):  # type: ignore[no-untyped-call]
    model_type = "sgpu-tiny-mlp"

    def __init__(self, dim: int = 8, hidden: int = 32, dropout: float = 0.0, **kw: Any) -> None:
        self.dim, self.hidden, self.dropout = dim, hidden, dropout
        super().__init__(**kw)


class TinyModel(PreTrainedModel):  # type: ignore[no-untyped-call]
    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.net = nn.Sequential(
            nn.Linear(config.dim, config.hidden),
            nn.Tanh(),
            nn.Dropout(config.dropout),
            nn.Linear(config.hidden, 1),
        )
        self.seen: list[int] = []  # sample indices of this rank since the last step end
        self.post_init()  # type: ignore[no-untyped-call]

    def _init_weights(self, module: nn.Module) -> None:
        pass  # torch's default initialisation, seeded by the Trainer's set_seed

    def forward(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> dict[str, Any]:
        # No **kwargs: the Trainer divides the loss by the accumulation steps itself, so
        # the gradient is the mean over the global batch at every world size.
        if self.training:
            self.seen.extend(int(i) for i in idx)
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, y), "logits": out}


class Synthetic(Dataset[dict[str, Any]]):
    def __init__(self, n: int, dim: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        w = torch.randn(dim, 1, generator=g)
        self.y = torch.tanh(self.x @ w) + 0.05 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i], "idx": torch.tensor(i)}


class Record(TrainerCallback):
    """The example's own logs (not needed for malleability)."""

    def __init__(
        self,
        model: TinyModel,
        train_log: Path | None,
        index_log: Path | None,
        step_time: float,
        rank: int,
        restart: int,
    ) -> None:
        self.model, self.train_log, self.index_log = model, train_log, index_log
        self.step_time, self.rank, self.restart = step_time, rank, restart

    def _append(self, path: Path, doc: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps(doc) + "\n")

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.index_log is not None:
            self._append(
                self.index_log,
                {
                    "step": state.global_step,
                    "rank": self.rank,
                    "world": args.world_size,
                    "epoch": state.epoch,
                    "idx": self.model.seen,
                },
            )
        self.model.seen = []
        if self.step_time:
            time.sleep(self.step_time)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if self.train_log is not None and self.rank == 0 and logs and "loss" in logs:
            self._append(
                self.train_log,
                {
                    "step": state.global_step,
                    "loss": logs["loss"],
                    "lr": logs.get("learning_rate"),
                    "world": args.world_size,
                    "accumulation": args.gradient_accumulation_steps,
                    "restart": self.restart,
                    "at": round(time.time(), 3),
                },
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--output-dir", type=Path, required=True)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--per-device-batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--save-steps", type=int, default=0, help="periodic checkpoints (0: none)")
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step (seconds)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--train-log", type=Path)
    p.add_argument("--index-log", type=Path)
    a = p.parse_args(argv)

    args = TrainingArguments(
        output_dir=str(a.output_dir),
        max_steps=a.max_steps,
        per_device_train_batch_size=a.per_device_batch,
        learning_rate=a.lr,
        lr_scheduler_type="linear",
        warmup_steps=5,
        weight_decay=0.0,
        logging_steps=1,
        save_strategy="steps" if a.save_steps else "no",
        save_steps=a.save_steps or 500,
        seed=a.seed,
        data_seed=a.seed,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    run = ehf.init(args, global_batch=a.global_batch)  # sgpu: signals -> flags, accumulation
    set_seed(a.seed)  # the initial weights (the Trainer seeds only after the model exists)
    model = TinyModel(TinyConfig(dim=a.dim, dropout=a.dropout))
    data = Synthetic(a.samples, a.dim, a.seed)
    rank = int(args.process_index)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    record = Record(model, a.train_log, a.index_log, a.step_time, rank, run.restart_count)
    trainer.add_callback(record)
    checkpoint = ehf.attach(trainer, run)  # sgpu: callback, RNG-safe resume, newest checkpoint
    if a.train_log is not None and rank == 0:
        with a.train_log.open("a") as f:
            f.write(
                json.dumps(
                    {
                        "event": "start",
                        "world": args.world_size,
                        "accumulation": args.gradient_accumulation_steps,
                        "resume_from": checkpoint,
                        "restart": run.restart_count,
                        "at": time.time(),
                        "backend": dist.get_backend() if dist.is_initialized() else None,
                    }
                )
                + "\n"
            )
    trainer.train()  # unchanged: attach() made it resume from the job's newest checkpoint
    if rank == 0:
        torch.save(model.state_dict(), a.output_dir / "final.pt")
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    hard_exit(0)  # optional: skips a teardown abort gloo sometimes has (docs/malleable.md)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
