"""Malleable Hugging Face ``transformers.Trainer``: a callback and resume logic.

An ordinary Trainer script becomes malleable with three added lines (run it under
``sgpu launch -- torchrun ...``, docs/malleable.md, "Hugging Face Trainer")::

    from slurmgpu.elastic import huggingface as ehf             # 1

    args = TrainingArguments(output_dir=..., per_device_train_batch_size=8, ...)
    run = ehf.init(args, global_batch=64)                       # 2: signals -> flags,
                                                                #    accumulation 64/(8 x W)
    trainer = Trainer(model=model, args=args, train_dataset=data, ...)
    ehf.attach(trainer, run)                                    # 3: callback + safe resume
    trainer.train()                    # unchanged: resumes from the newest complete checkpoint

**Signal.** sgpu owns it: :func:`slurmgpu.elastic.init` turns the checkpoint signal and
SIGTERM into flags. :func:`make_callback`'s callback all-reduces the flag at every optimizer
step's end (:func:`slurmgpu.elastic.torch.agree`, so every rank saves at the same step)
and sets ``control.should_save``; the Trainer then writes its ordinary
``checkpoint-<step>`` directory. In ``on_save`` every rank waits for the others
(the Trainer's save is not synchronised at its end), rank 0 writes ``sgpu-elastic.json``
into the directory (the mark of a complete checkpoint, with the world size, batch plan and
samples seen) and ``hf_checkpoint.json`` into the job's state directory, and then every
rank answers through :meth:`ElasticRun.acknowledge`: ``ack.json`` and the hold until the
requeue's SIGTERM, exactly as for :mod:`slurmgpu.elastic.torch`. If nobody requeues the
job (resize aborted) training goes on.

**Resume at another world size.** With ``keep_global_batch`` the global batch
(per-device batch x accumulation x world size) is the same at every size, so a step means
the same samples and the Trainer's ``global_step``, ``max_steps`` and LR scheduler carry on
unchanged (the checkpoint's ``scheduler.pt`` is at the saved step). The Trainer's own data
skip-ahead is then exact: its sampler's permutation depends only on the seed and the epoch,
and accelerate gives process ``r`` the ``r``-th per-device slice of each run of ``W``
batches, so ``(global_step mod steps-per-epoch) x accumulation`` batches at the new size
are the same ``step x G`` samples the old size trained on (tests/integration/
test_elastic_hf.py checks every sample once per epoch across 2 -> 1 -> 2 ranks). RNG
states: the Trainer loads ``rng_state_<rank>.pth`` (or ``rng_state.pth``) whatever size
wrote them and with several GPUs per process restores every GPU's CUDA state, which fails
when the device count differs. :func:`attach` replaces that step: at the size the
checkpoint was written at (processes and GPUs per process) the Trainer's own restore
runs; at another size every RNG (python, numpy, torch CPU and CUDA) is seeded from
``args.seed``, the global step and the rank instead, so no stream repeats an earlier one
and nothing is loaded that does not fit.

``transformers`` is imported only when a function here runs.
"""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmgpu.elastic.checkpoint import write_atomic
from slurmgpu.elastic.extras import require
from slurmgpu.elastic.marked_checkpoints import (
    CHECKPOINT_DIR,
    CHECKPOINT_MARK,
    cuda_devices,
    newest_marked,
    read_mark,
)
from slurmgpu.elastic.runtime import ElasticRun
from slurmgpu.elastic.runtime import init as init_run

__all__ = [
    "CHECKPOINT_MARK",
    "POINTER_FILE",
    "attach",
    "init",
    "keep_global_batch",
    "latest_checkpoint",
    "make_callback",
    "read_mark",
    "seed_everything",
]

POINTER_FILE = "hf_checkpoint.json"  # in the job's state directory: the newest one
FORMAT_VERSION = 1


def _transformers() -> Any:
    return require("transformers", "huggingface", "slurmgpu.elastic.huggingface")


@dataclass(frozen=True, slots=True)
class Accumulation:
    """How :func:`keep_global_batch` split the global batch at this world size."""

    global_batch: int
    per_device: int
    world_size: int
    gradient_accumulation_steps: int


def keep_global_batch(
    args: Any, global_batch: int, *, world_size: int | None = None
) -> Accumulation:
    """Set ``args.gradient_accumulation_steps`` so that per-device batch x accumulation x
    world size is ``global_batch`` at this run's size (ValueError when it does not divide).

    ``args`` is the run's ``TrainingArguments``; ``world_size`` defaults to
    ``args.world_size`` (the processes torchrun started). Call it before building the
    Trainer. The learning rate stays as given: the averaged gradient is over the same
    ``global_batch`` samples at every size.
    """
    world = int(world_size if world_size is not None else args.world_size)
    per_device = int(args.per_device_train_batch_size)
    if world < 1 or per_device < 1:
        raise ValueError("world size and per-device batch must be at least 1")
    share = per_device * world
    if global_batch < share or global_batch % share:
        raise ValueError(
            f"global batch {global_batch} is not a multiple of per-device batch {per_device} "
            f"x {world} processes: choose a per-device batch that divides "
            f"{global_batch} / {world}"
        )
    steps = global_batch // share
    args.gradient_accumulation_steps = steps
    return Accumulation(global_batch, per_device, world, steps)


def init(args: Any, global_batch: int | None = None) -> ElasticRun:
    """This process's :class:`ElasticRun` (:func:`slurmgpu.elastic.init`: the checkpoint
    signal and SIGTERM become flags) with ``args`` planned for this world size.

    With ``global_batch``, :func:`keep_global_batch` sets the gradient accumulation so that
    an optimizer step is ``global_batch`` samples at every size (ValueError when it does
    not divide). Call it after building ``TrainingArguments`` and before the Trainer.
    """
    run = init_run()
    if global_batch is not None:
        keep_global_batch(args, global_batch)
    return run


def _is_complete(path: Path) -> bool:
    return (path / CHECKPOINT_MARK).is_file() and (path / "trainer_state.json").is_file()


def latest_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-<step>`` under ``output_dir`` that was completed (saved by
    every rank and marked by the callback), or None for a fresh start.

    A directory without the mark (a save killed half-way, or a run without the callback)
    is passed over: the Trainer's ``get_last_checkpoint`` would take it.
    """
    newest = newest_marked(output_dir, _is_complete)
    return None if newest is None else str(newest)


def seed_everything(seed: int, step: int, rank: int) -> int:
    """Seed python, numpy, torch CPU and every CUDA device from (seed, step, rank).

    For a rank resumed at another world size: distinct from every rank's stream and from
    the run's start (``set_seed(seed)``), so no dropout mask of an earlier step repeats.
    Returns the seed used.
    """
    import torch

    value = (seed * 1_000_003 + step * 7919 + rank * 104_729 + 1) % (2**31)
    random.seed(value)
    torch.manual_seed(value)  # also every CUDA device's generator
    try:
        import numpy
    except ImportError:  # pragma: no cover - transformers needs numpy
        pass
    else:
        numpy.random.seed(value)
    return value


def _dist() -> Any | None:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


def make_callback(run: ElasticRun) -> Any:
    """The ``transformers.TrainerCallback`` that saves on the signal and acknowledges it
    (the class is built on first use, so importing this module needs no transformers)."""
    return _callback_class()(run)


@functools.cache
def _callback_class() -> Any:
    """The callback class, defined on first use so transformers loads only when needed."""
    base = _transformers().TrainerCallback

    class _ElasticCallback(base):  # type: ignore[misc, valid-type]
        """Save at the next step boundary after the checkpoint signal, then acknowledge."""

        def __init__(self, run: ElasticRun) -> None:
            self.run = run
            self.requested_at: int | None = None  # the step whose end saw the request

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            from slurmgpu.elastic import torch as etorch

            self.run.step_done(
                samples=float(args.per_device_train_batch_size)
                * args.gradient_accumulation_steps
                * args.world_size,
                step=int(state.global_step),
            )
            if etorch.agree(self.run):
                self.requested_at = int(state.global_step)
                control.should_save = True
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            step = int(state.global_step)
            output_dir = Path(args.output_dir) / f"checkpoint-{step}"
            _barrier()  # every rank's part of the checkpoint is written
            if self.run.is_rank0:
                self._mark(args, state, output_dir)
            _barrier()  # complete and marked before any rank acknowledges or exits
            requested = self.requested_at is not None
            self.requested_at = None
            if requested:
                self.run.acknowledge(step)  # exits at the requeue's SIGTERM
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.run.close()
            return control

        def _mark(self, args: Any, state: Any, output_dir: Path) -> None:
            world = int(args.world_size)
            global_batch = (
                int(args.per_device_train_batch_size)
                * int(args.gradient_accumulation_steps)
                * world
            )
            doc = {
                "format": "slurmgpu.elastic.huggingface",
                "version": FORMAT_VERSION,
                "step": int(state.global_step),
                "epoch": float(state.epoch or 0.0),
                "world_size": world,
                "devices": cuda_devices(),
                "per_device_train_batch_size": int(args.per_device_train_batch_size),
                "gradient_accumulation_steps": int(args.gradient_accumulation_steps),
                "global_batch": global_batch,
                "samples_seen": int(state.global_step) * global_batch,
                "seed": int(args.seed),
                "job_id": self.run.job_id,
                "restart_count": self.run.restart_count,
            }
            data = json.dumps(doc, indent=1).encode()
            write_atomic(output_dir / CHECKPOINT_MARK, data, mode=0o644)
            pointer = {"checkpoint": str(output_dir.resolve()), **doc}
            write_atomic(self.run.dir / POINTER_FILE, json.dumps(pointer).encode(), mode=0o644)

    return _ElasticCallback


def attach(trainer: Any, run: ElasticRun, *, check_batch: bool = True) -> str | None:
    """Make ``trainer`` malleable; return the checkpoint it resumes from (None: fresh).

    Adds the callback (:func:`make_callback`), replaces the Trainer's RNG restore with one
    that loads RNG files only at the processes and GPUs per process that wrote them (else
    seeds from seed, step and rank), and finds :func:`latest_checkpoint` of
    ``args.output_dir``, which ``trainer.train()`` then resumes from unless the call names
    another ``resume_from_checkpoint`` (so the user's ``train()`` line stays as it was).
    With ``check_batch``, a checkpoint written at another global batch is refused
    (ValueError): its step count would mean other samples and its scheduler another
    schedule.
    """
    args = trainer.args
    trainer.add_callback(make_callback(run))
    original = getattr(trainer, "_load_rng_state", None)
    if original is None:  # pragma: no cover - a transformers without the method
        raise RuntimeError(
            "this transformers' Trainer has no _load_rng_state to replace (tested with 5.25)"
        )

    def load_rng_state(checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        mark = read_mark(checkpoint)
        world = int(args.world_size)
        # The same processes *and* the same GPUs per process: one process over several
        # GPUs (DataParallel) restores every GPU's state, which fails at another count.
        same = mark is not None and int(mark.get("world_size", -1)) == world
        if same and mark is not None and int(mark.get("devices", -1)) == cuda_devices():
            original(checkpoint)
            return
        step = int(mark["step"]) if mark is not None else _step_of(checkpoint)
        seed_everything(int(args.seed), step, int(args.process_index))

    trainer._load_rng_state = load_rng_state
    checkpoint = latest_checkpoint(args.output_dir)
    if checkpoint is not None and check_batch:
        mark = read_mark(checkpoint) or {}
        saved = int(mark.get("global_batch", 0))
        now = (
            int(args.per_device_train_batch_size)
            * int(args.gradient_accumulation_steps)
            * int(args.world_size)
        )
        if saved and saved != now:
            raise ValueError(
                f"{checkpoint} was trained at global batch {saved}, this run's is {now} "
                f"(per-device {args.per_device_train_batch_size} x accumulation "
                f"{args.gradient_accumulation_steps} x {args.world_size} processes): "
                "call keep_global_batch(args, global_batch) before building the Trainer"
            )
    train = trainer.train

    @functools.wraps(train)
    def train_resuming(*a: Any, **kw: Any) -> Any:
        if not a and "resume_from_checkpoint" not in kw:
            kw["resume_from_checkpoint"] = checkpoint
        return train(*a, **kw)

    trainer.train = train_resuming
    return checkpoint


def _step_of(checkpoint: str) -> int:
    match = CHECKPOINT_DIR.match(os.path.basename(os.path.normpath(checkpoint)))
    return int(match.group(1)) if match else 0
