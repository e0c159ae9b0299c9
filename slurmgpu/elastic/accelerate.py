"""Malleable Hugging Face Accelerate loops: save on the signal, resume at another size.

A plain Accelerate training loop becomes malleable with two added lines and two changed
ones (run it under ``sgpu launch -- torchrun ...``, docs/malleable.md, "Accelerate")::

    from slurmgpu import elastic
    from slurmgpu.elastic import accelerate as eacc

    run = elastic.init()                                          # + first; signals -> flags
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(
        use_seedable_sampler=True))                               #   the order: seed, epoch
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    loop = eacc.attach(accelerator, run, loader, global_batch=64)  # + accumulation, resume
    for epoch in loop.epochs(num_epochs):                         # ~ was range(num_epochs)
        for batch in loop:                                        # ~ was loader
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step(); scheduler.step(); optimizer.zero_grad()

**Steps.** :func:`attach` sets the accelerator's gradient accumulation so that per-device
batch x accumulation x processes is ``global_batch`` at this size (ValueError when it does
not divide), and makes every prepared scheduler step once per optimizer step (Accelerate
steps it once per process otherwise, a schedule that would change with the world size).
Iterating the :class:`ElasticLoop` yields the epoch's batches; after each batch whose
``accumulate`` block ended with an optimizer step (``accelerator.sync_gradients``) it
counts the step and all-reduces the checkpoint flag
(:func:`slurmgpu.elastic.torch.agree`), so every rank saves at the same step.

**Save.** ``accelerator.save_state`` (model, optimizer, schedulers, scaler, each process's
RNG states, objects the script registered with ``register_for_checkpointing``) into
``<run dir>/accelerate/checkpoint-<step>``; then rank 0 writes ``sgpu-elastic.json`` into
it (the mark of a complete checkpoint: world size, batch plan, epoch, steps into the epoch)
and ``accelerate_checkpoint.json`` into the job's state directory, and every rank answers
through :meth:`ElasticRun.acknowledge`: ``ack.json`` and the hold until the requeue's
SIGTERM. If nobody requeues the job (resize aborted) training goes on.

**Resume at another size.** :func:`attach` loads the newest complete checkpoint
(``accelerator.load_state``) and resets the accelerator's micro-step counter (the saved one
counts the old size's micro-batches). With the seedable sampler the epoch's order depends
only on the seed and the epoch, and Accelerate gives process ``r`` the ``r``-th of each
run of ``W`` batches, so one optimizer step is ``global_batch`` consecutive samples of the
order at every size: the resumed epoch skips ``steps x accumulation`` of this process's
batches (``skip_first_batches``) and no sample is repeated or skipped. RNG states: at the
processes and GPUs per process that wrote them Accelerate's restore stands; at another
size every RNG is seeded from the seed, the step and the rank
(:func:`slurmgpu.elastic.huggingface.seed_everything`).

Not supported: DeepSpeed, FSDP and Megatron (their sharded states are laid out for one
world size), iterable datasets and ``DataLoaderDispatcher`` (``dispatch_batches``), a
dataset whose length is not a multiple of the global batch (the short last batch is
padded differently at each size), and ``split_batches=True``.

``accelerate`` is imported only when a function here runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmgpu.elastic.checkpoint import write_atomic
from slurmgpu.elastic.extras import require
from slurmgpu.elastic.marked_checkpoints import (
    CHECKPOINT_MARK,
    cuda_devices,
    newest_marked,
    read_mark,
)
from slurmgpu.elastic.runtime import ElasticRun

__all__ = [
    "CHECKPOINT_MARK",
    "POINTER_FILE",
    "ElasticLoop",
    "attach",
    "latest_checkpoint",
    "read_mark",
]

POINTER_FILE = "accelerate_checkpoint.json"  # in the job's state directory: the newest one
CHECKPOINT_SUBDIR = "accelerate"
FORMAT_VERSION = 1


def _accelerate() -> Any:
    return require("accelerate", "huggingface", "slurmgpu.elastic.accelerate")


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest marked ``checkpoint-<step>`` under ``directory`` (None: start fresh).

    A directory without the mark (a save killed half-way) is passed over.
    """
    return newest_marked(directory)


@dataclass(frozen=True, slots=True)
class Plan:
    """How :func:`attach` split the global batch at this world size."""

    global_batch: int
    per_device: int
    world_size: int
    accumulation: int


def plan(global_batch: int, per_device: int, world_size: int) -> Plan:
    """Accumulation so that ``per_device x accumulation x world_size == global_batch``."""
    if world_size < 1 or per_device < 1:
        raise ValueError("world size and per-device batch must be at least 1")
    share = per_device * world_size
    if global_batch < share or global_batch % share:
        raise ValueError(
            f"global batch {global_batch} is not a multiple of per-device batch {per_device} "
            f"x {world_size} processes: choose a per-device batch that divides "
            f"{global_batch} / {world_size}"
        )
    return Plan(global_batch, per_device, world_size, global_batch // share)


class ElasticLoop:
    """The training loop's epochs and batches, resumable at another world size.

    Built by :func:`attach`; ``epochs(n)`` yields the epochs still to train (from the
    resumed one), iterating the loop yields the rest of the current epoch's batches.
    ``step`` is the global optimizer step (carried across resizes).
    """

    def __init__(
        self,
        accelerator: Any,
        run: ElasticRun,
        loader: Any,
        plan: Plan,
        directory: Path,
        seed: int,
    ) -> None:
        self.accelerator = accelerator
        self.run = run
        self.loader = loader
        self.plan = plan
        self.directory = directory
        self.seed = seed
        self.step = 0  # optimizer steps, all epochs
        self.epoch = 0
        self.steps_in_epoch = 0  # optimizer steps of ``epoch`` already trained
        self.resumed_from: Path | None = None

    # ------------------------------------------------------------------ iteration

    def epochs(self, total: int) -> Iterator[int]:
        """Epochs ``self.epoch .. total - 1`` (the resumed epoch first)."""
        while self.epoch < total:
            yield self.epoch
            self.epoch += 1
            self.steps_in_epoch = 0
        self.run.close()  # the throughput measured, for the daemon's speedup fit

    def __iter__(self) -> Iterator[Any]:
        self.loader.set_epoch(self.epoch)  # the seedable sampler's order for this epoch
        source = self.loader
        if self.steps_in_epoch:
            skip = self.steps_in_epoch * self.plan.accumulation
            source = _accelerate().skip_first_batches(self.loader, skip)
        for batch in source:
            yield batch
            if self.accelerator.sync_gradients:
                self._step_done()

    def _step_done(self) -> None:
        from slurmgpu.elastic import torch as etorch

        self.step += 1
        self.steps_in_epoch += 1
        self.run.step_done(samples=float(self.plan.global_batch), step=self.step)
        if etorch.agree(self.run):
            self.save(acknowledge=True)

    # ------------------------------------------------------------------ checkpoints

    def save(self, *, acknowledge: bool = False) -> Path:
        """``accelerator.save_state`` into ``checkpoint-<step>``, marked complete by rank 0
        once every process has written its part; with ``acknowledge``, answer the request
        (exits at the requeue's SIGTERM; returns when nobody requeues)."""
        accelerator = self.accelerator
        target = self.directory / f"checkpoint-{self.step}"
        accelerator.save_state(str(target))
        accelerator.wait_for_everyone()  # every process's RNG file is written
        if self.run.is_rank0:
            self._mark(target)
        accelerator.wait_for_everyone()  # complete and marked before any rank acknowledges
        if acknowledge:
            self.run.acknowledge(self.step)
        return target

    def _mark(self, target: Path) -> None:
        doc = {
            "format": "slurmgpu.elastic.accelerate",
            "version": FORMAT_VERSION,
            "step": self.step,
            "epoch": self.epoch,
            "steps_in_epoch": self.steps_in_epoch,
            "world_size": self.plan.world_size,
            "devices": cuda_devices(),
            "per_device": self.plan.per_device,
            "accumulation": self.plan.accumulation,
            "global_batch": self.plan.global_batch,
            "samples_seen": self.step * self.plan.global_batch,
            "seed": self.seed,
            "job_id": self.run.job_id,
            "restart_count": self.run.restart_count,
        }
        write_atomic(target / CHECKPOINT_MARK, json.dumps(doc, indent=1).encode(), mode=0o644)
        pointer = {"checkpoint": str(target.resolve()), **doc}
        write_atomic(self.run.dir / POINTER_FILE, json.dumps(pointer).encode(), mode=0o644)

    def load(self, checkpoint: Path) -> None:
        """Restore from a marked checkpoint (collective: every process calls it)."""
        mark = read_mark(checkpoint)
        if mark is None:
            raise ValueError(f"{checkpoint} has no {CHECKPOINT_MARK}: not a complete checkpoint")
        saved = int(mark.get("global_batch", 0))
        if saved != self.plan.global_batch:
            raise ValueError(
                f"{checkpoint} was trained at global batch {saved}, this run's is "
                f"{self.plan.global_batch}: a step would mean other samples"
            )
        accelerator = self.accelerator
        accelerator.load_state(str(checkpoint))
        accelerator.step = 0  # the saved micro-step count is the old size's
        same = int(mark.get("world_size", -1)) == self.plan.world_size
        if not (same and int(mark.get("devices", -1)) == cuda_devices()):
            from slurmgpu.elastic.huggingface import seed_everything

            seed_everything(self.seed, int(mark["step"]), int(accelerator.process_index))
        self.step = int(mark["step"])
        self.epoch = int(mark["epoch"])
        self.steps_in_epoch = int(mark["steps_in_epoch"])
        self.resumed_from = checkpoint


def attach(
    accelerator: Any,
    run: ElasticRun,
    loader: Any,
    *,
    global_batch: int,
    seed: int = 0,
    directory: str | Path | None = None,
) -> ElasticLoop:
    """Make a prepared Accelerate loop malleable (see the module docstring).

    ``loader`` is the training DataLoader returned by ``accelerator.prepare`` (built with
    ``DataLoaderConfiguration(use_seedable_sampler=True)`` when it shuffles); ``seed``
    seeds the RNGs of a rank resumed at another size; checkpoints go to ``directory``
    (default ``<run dir>/accelerate``). Loads the newest complete checkpoint, if any.
    """
    accel = _accelerate()
    if getattr(loader, "split_batches", False) or not hasattr(loader, "total_batch_size"):
        raise ValueError(
            "attach needs the training DataLoader returned by accelerator.prepare "
            "(without split_batches or dispatch_batches)"
        )
    sampler = loader.get_sampler() if hasattr(loader, "get_sampler") else None
    from torch.utils.data import RandomSampler

    seedable = accel.data_loader.SeedableRandomSampler
    if isinstance(sampler, RandomSampler) and not isinstance(sampler, seedable):
        raise ValueError(
            "a shuffling DataLoader needs Accelerator(dataloader_config="
            "DataLoaderConfiguration(use_seedable_sampler=True)): its order must depend "
            "only on the seed and the epoch to resume mid-epoch at another size"
        )
    world = int(accelerator.num_processes)
    per_device = int(loader.total_batch_size) // world
    batch_plan = plan(global_batch, per_device, world)
    accelerator.gradient_accumulation_steps = batch_plan.accumulation
    for scheduler in getattr(accelerator, "_schedulers", []):
        scheduler.split_batches = True  # one scheduler step per optimizer step, any size
    base = Path(directory) if directory is not None else run.dir / CHECKPOINT_SUBDIR
    loop = ElasticLoop(accelerator, run, loader, batch_plan, base, seed)
    checkpoint = latest_checkpoint(base)
    if checkpoint is not None:
        loop.load(checkpoint)
    return loop
