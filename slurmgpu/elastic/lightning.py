"""Malleable PyTorch Lightning training: an ordinary LightningModule + Trainer, three lines.

::

    from slurmgpu.elastic.lightning import ElasticLightning         # 1
    elastic = ElasticLightning(global_batch=64)                      # 2 (first: signals)
    trainer = L.Trainer(max_epochs=10, **elastic.trainer_kwargs())   # 3 (the Trainer line)
    trainer.fit(model, datamodule=dm)                                # unchanged

**Signals: sgpu owns them.** ``ElasticLightning()`` calls :func:`slurmgpu.elastic.init`,
whose handlers only set flags. Lightning's SLURM auto-requeue is off
(``SLURMEnvironment(auto_requeue=False)`` when Lightning would pick SLURM; under torchrun
it picks ``TorchElasticEnvironment``, which has none), and at ``on_train_start``, right
after Lightning installed its own SIGTERM handler (which broadcasts a tensor from inside
the handler and raises ``SIGTERMException`` later), the runtime's handlers are installed
again (and at ``on_sanity_check_start``, which comes first when there is validation):
SIGTERM and the checkpoint signal are flags, nothing else.

**Checkpoint at the next step boundary.** ``on_train_batch_end`` of a batch that ended an
optimizer step all-reduces the flag (:func:`slurmgpu.elastic.torch.agree`); when any rank
was signalled every rank builds Lightning's own checkpoint (``dump_checkpoint``: model,
optimizers, schedulers, loops, callbacks, precision plugin) and rank 0 writes it
atomically (temp file, fsync, rename, fsync of the directory) to
``<state dir>/<job id>/lightning.ckpt``; then the runtime's ``acknowledge`` writes
``ack.json``/``progress.json`` exactly as for a hand-written loop and waits for the
requeue, whose SIGTERM ends the process (``os._exit(0)``). If nobody requeues it (resize
aborted) training goes on. The next run's ``Trainer.fit`` resumes from that file with no
``ckpt_path`` argument (preloaded in the callback's ``setup``).

**Mid-epoch, no sample repeated or skipped.** The training DataLoader your module or
data module returns is rebuilt around an :class:`~slurmgpu.elastic.torch.ElasticSampler`
(same dataset, workers, collate function; shuffle and drop_last taken from it): each
optimizer step trains on the next ``global_batch`` indices of the epoch's permutation,
split over the ranks, whatever their number. Its position goes into the checkpoint (the
loader is *stateful* for Lightning), and Lightning's batch counters are rescaled to the
new micro-batch size on resume, so the epoch ends after exactly the samples not yet seen.

**Batch and learning rate** follow :func:`slurmgpu.elastic.torch.plan_batch`: by default
the global batch is kept. Each rank takes ``global_batch / world`` samples per step; when
that exceeds ``max_local_batch`` (what fits one GPU; default: the batch size of your
DataLoader) the step is split into ``accumulate_grad_batches`` micro-batches, and Lightning
divides the loss by that count, so the gradient is the mean over the same samples at every
size and the learning rate stays. With ``per_rank_batch=`` the global batch follows the
size and the learning rate the rule (``sqrt``/``linear``/``adascale``), re-applied to the
optimizers and schedulers after Lightning restores them.

**RNG.** Every rank's RNG states (python, numpy, torch CPU/CUDA) are gathered into the
checkpoint; they are restored only when the world size is unchanged. At another size each
rank's streams are derived from ``(seed, step, rank)`` instead of restoring some other
rank's state (which would make two ranks draw the same dropout masks).

Limits: map-style datasets (an ``IterableDataset`` has no index to resume at); the
DDP-family strategies (every rank holds the whole model; FSDP/DeepSpeed need sharded
checkpoints); one training DataLoader; validation loaders are not split over ranks
(``use_distributed_sampler=False``, which the elastic loader needs).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sized
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

from slurmgpu.elastic.checkpoint import write_atomic
from slurmgpu.elastic.runtime import ElasticRun, init
from slurmgpu.elastic.scaling import LrRule
from slurmgpu.elastic.torch import (
    BatchPlan,
    ElasticSampler,
    agree,
    plan_batch,
    rng_state,
    set_rng_state,
)

try:
    import lightning.pytorch as pl
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without lightning
    raise ImportError(
        "slurmgpu.elastic.lightning needs lightning (pip install 'slurmgpu[lightning]')"
    ) from exc

__all__ = ["LIGHTNING_CHECKPOINT_FILE", "ElasticCallback", "ElasticLightning", "LightningSampler"]

LIGHTNING_CHECKPOINT_FILE = "lightning.ckpt"


class LightningSampler(ElasticSampler):
    """:class:`ElasticSampler` whose length is the epoch's, counted in micro-batches.

    Lightning counts the batches of an epoch (``batch_progress``) and ends it when that
    count reaches ``len(loader)``. A resumed run starts iterating at ``consumed``, so its
    length is ``offset`` (the micro-batches already trained on, in this run's units) plus
    the batches left; the callback sets Lightning's counters to ``offset``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base = 0  # consumed when the current iteration started

    @property
    def offset(self) -> int:
        return -(-self.base // self.global_batch)

    def __iter__(self) -> Any:
        self.base = self.consumed
        return super().__iter__()

    def __len__(self) -> int:
        left = max(self.epoch_size - self.base, 0)
        return self.offset + -(-left // self.global_batch)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self.consumed == 0:
            self.base = 0

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.epoch_done:  # saved at the epoch's last step: the next one starts
            self.epoch, self.consumed = self.epoch + 1, 0
        self.base = self.consumed


class _ElasticLoader(torch.utils.data.DataLoader[Any]):
    """The user's loader's dataset and settings around a :class:`LightningSampler`;
    stateful for Lightning (its position is saved in the loop's checkpoint state)."""

    def state_dict(self) -> dict[str, Any]:
        return cast(LightningSampler, self.batch_sampler).state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        cast(LightningSampler, self.batch_sampler).load_state_dict(state)


def _local_world(env: Any) -> tuple[int, int]:
    """Processes on this node and nodes, as torchrun or srun started them."""
    local = env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE") or "1"
    nodes = env.get("GROUP_WORLD_SIZE") or env.get("SLURM_JOB_NUM_NODES") or "1"
    try:
        return max(int(local), 1), max(int(nodes), 1)
    except ValueError:
        return 1, 1


class ElasticCallback(pl.Callback):
    """The Lightning side of :class:`ElasticLightning` (see the module's docstring)."""

    def __init__(self, owner: ElasticLightning) -> None:
        self.owner = owner
        self.sampler: LightningSampler | None = None
        self._loaded: dict[str, Any] | None = None  # this callback's state, when resumed
        self._rngs: list[Any] = []
        self._last_step = -1
        self.events: list[dict[str, Any]] = []  # what happened, for logs and tests

    # ------------------------------------------------------------------ set-up

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        source = trainer.fit_loop._data_source
        if not getattr(source, "_sgpu_elastic", False):  # once, however often fit runs
            original = source.dataloader
            source.dataloader = lambda: self._elastic_loader(original(), trainer)
            source._sgpu_elastic = True
        trainer.accumulate_grad_batches = self.owner.accumulate
        path = self.owner.checkpoint_path
        if path.exists() and not trainer.ckpt_path:
            # Preloaded here, Lightning's _run restores model, callbacks, optimizers and
            # loops from it as if fit(ckpt_path=...) had been given.
            trainer._checkpoint_connector.resume_start(str(path), weights_only=False)

    def _elastic_loader(self, loader: Any, trainer: Any) -> Any:
        DataLoader = torch.utils.data.DataLoader
        if not isinstance(loader, DataLoader) or isinstance(
            loader.dataset, torch.utils.data.IterableDataset
        ):
            raise TypeError(
                "slurmgpu.elastic.lightning resumes mid-epoch by sample index: the training "
                "dataloader must be one torch DataLoader over a map-style dataset"
            )
        owner = self.owner
        if owner.max_local_batch is None and loader.batch_size:
            owner.set_max_local_batch(int(loader.batch_size))
            trainer.accumulate_grad_batches = owner.accumulate
        shuffle = isinstance(loader.sampler, torch.utils.data.RandomSampler)
        sampler = LightningSampler(
            len(cast(Sized, loader.dataset)),
            owner.micro_batch * owner.world_size,
            rank=owner.run.rank,
            world_size=owner.world_size,
            seed=owner.seed,
            shuffle=shuffle,
            drop_last=bool(loader.drop_last),
        )
        if self.sampler is not None:  # a reloaded dataloader keeps its place
            sampler.load_state_dict(self.sampler.state_dict())
        elif self._loaded is not None and self._loaded.get("sampler"):
            # From the callback's state, restored before the loader is built: Lightning
            # hands the loader its own saved state only when it resumes mid-epoch, and
            # its first batch is fetched before on_train_epoch_start.
            sampler.load_state_dict(self._loaded["sampler"])
        self.sampler = sampler
        workers = int(loader.num_workers)
        return _ElasticLoader(
            loader.dataset,
            batch_sampler=sampler,
            num_workers=workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            worker_init_fn=loader.worker_init_fn,
            persistent_workers=bool(loader.persistent_workers) and workers > 0,
            generator=torch.Generator(),  # never draws on the global RNG
        )

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning installs its SIGTERM handler (a collective inside the handler, then
        # SIGTERMException) right before the sanity check and the training: the runtime's
        # flags win from here on.
        self.owner.run.install_handlers()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.owner.run.install_handlers()  # again: no sanity check without val loaders
        self._last_step = trainer.global_step
        loaded = self._loaded
        if loaded is None:
            self._rescale_lr(trainer, self.owner.plan.lr_scale)
            return
        self._rescale_lr(trainer, self.owner.plan.lr_scale / float(loaded["lr_scale"]))
        if self.sampler is not None:
            self._finish_saved_epoch(trainer, self.sampler.epoch)
            self._set_batch_progress(trainer, self.sampler.offset)
        rngs = loaded.get("rng") or []
        rank, world = self.owner.run.rank, self.owner.world_size
        if loaded.get("world_size") == world and rank < len(rngs):
            set_rng_state(rngs[rank])
        else:
            pl.seed_everything(self._derived_seed(trainer.global_step, rank), verbose=False)
        self.events.append(
            {"event": "resumed", "step": trainer.global_step, "from_world": loaded["world_size"]}
        )

    def _derived_seed(self, step: int, rank: int) -> int:
        return (self.owner.seed * 1_000_003 + step * 7919 + rank * 104_729 + 1) % (2**31)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(trainer.current_epoch)

    @staticmethod
    def _finish_saved_epoch(trainer: Any, sampler_epoch: int) -> None:
        """Count the saved epoch as finished when the checkpoint was taken at its last
        step and Lightning did not (the sampler already moved on to the next epoch).

        Lightning infers it from its restart stage: a run that itself began at an epoch
        boundary and then saved at the next one restores with the finished epoch still
        current, and without this it trains that epoch's samples again (seen on the lab).
        """
        progress = trainer.fit_loop.epoch_progress
        if sampler_epoch == trainer.current_epoch + 1:
            progress.increment_processed()
            progress.increment_completed()

    @staticmethod
    def _set_batch_progress(trainer: Any, offset: int) -> None:
        """Lightning's batch counters of this epoch, in this run's micro-batches.

        Saved in ``on_train_batch_end`` they read ready = started = processed = k,
        completed = k - 1 (Lightning adds the last one on restart); the totals keep the
        same differences, which is how Lightning recognises where it was saved.
        """
        progress = trainer.fit_loop.epoch_loop.batch_progress
        delta = offset - int(progress.current.ready)
        for tracker in (progress.current, progress.total):
            for name in ("ready", "started", "processed", "completed"):
                if hasattr(tracker, name):
                    setattr(tracker, name, getattr(tracker, name) + delta)

    def _rescale_lr(self, trainer: Any, ratio: float) -> None:
        if ratio == 1.0:
            return
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * ratio
                if "initial_lr" in group:
                    group["initial_lr"] = group["initial_lr"] * ratio
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if hasattr(scheduler, "base_lrs"):
                scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]
            last = getattr(scheduler, "_last_lr", None)
            if last is not None:
                scheduler._last_lr = [lr * ratio for lr in last]

    # ------------------------------------------------------------------ each step

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.sampler is not None:
            self.sampler.advance()
        if trainer.global_step == self._last_step:
            return  # accumulating: not a step boundary
        self._last_step = trainer.global_step
        run = self.owner.run
        run.step_done(samples=self.owner.plan.global_batch, step=trainer.global_step)
        if agree(run):
            self.checkpoint(trainer)

    def checkpoint(self, trainer: Any) -> bool:
        """Save now (collective; rank 0 writes), then answer a pending request."""
        run = self.owner.run
        step = int(trainer.global_step)
        self._rngs = self._gather_rngs()
        state = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        if trainer.global_rank == 0:
            buf = io.BytesIO()
            torch.save(state, buf)
            write_atomic(self.owner.checkpoint_path, buf.getvalue())
        trainer.strategy.barrier("sgpu-checkpoint")  # durable before any rank acks or exits
        self.events.append({"event": "checkpoint", "step": step})
        return run.acknowledge(step)

    @staticmethod
    def _gather_rngs() -> list[Any]:
        mine = rng_state()
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            return gathered
        return [mine]

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.owner.run.close()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        owner = self.owner
        return {
            "format": "slurmgpu.elastic.lightning",
            "version": 1,
            "world_size": owner.world_size,
            "global_batch": owner.plan.global_batch,
            "micro_batch": owner.micro_batch,
            "accumulate": owner.accumulate,
            "lr_scale": owner.plan.lr_scale,
            "plan": asdict(owner.plan),
            "job_id": owner.run.job_id,
            "restart_count": owner.run.restart_count,
            "rng": self._rngs,
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("format") != "slurmgpu.elastic.lightning":
            raise ValueError("not a slurmgpu.elastic.lightning callback state")
        self._loaded = dict(state_dict)


class ElasticLightning:
    """Make a Lightning ``Trainer`` malleable: ``Trainer(..., **elastic.trainer_kwargs())``.

    Create it first thing in the script (it installs the runtime's signal handlers).
    Give ``global_batch`` (kept at every size; the default) or ``per_rank_batch`` (kept per
    rank; the learning rate follows ``rule`` relative to ``base_world_size``, where the
    rate your ``configure_optimizers`` sets was tuned). ``max_local_batch``: the most
    samples one rank takes per forward pass (default: your DataLoader's ``batch_size``);
    beyond it the step is accumulated. ``seed`` orders the data and derives RNG streams
    at a new size.
    """

    def __init__(
        self,
        *,
        global_batch: int | None = None,
        per_rank_batch: int | None = None,
        max_local_batch: int | None = None,
        base_world_size: int = 1,
        rule: LrRule = "sqrt",
        seed: int = 0,
        run: ElasticRun | None = None,
        env: Any = None,
    ) -> None:
        self.env = os.environ if env is None else env
        self.run = run if run is not None else init(self.env)
        self.world_size = max(self.run.world_size, 1)
        self.seed = seed
        self.max_local_batch = max_local_batch
        self.plan: BatchPlan = plan_batch(
            self.world_size,
            base_lr=1.0,  # the module's own rate is scaled by plan.lr_scale
            global_batch=global_batch,
            per_rank_batch=per_rank_batch,
            base_world_size=base_world_size,
            rule=rule,
        )
        self.accumulate = 1
        self.micro_batch = self.plan.local_batch
        if max_local_batch is not None:
            self.set_max_local_batch(max_local_batch)
        self.callback = ElasticCallback(self)

    def set_max_local_batch(self, limit: int) -> None:
        """Split each rank's share into the fewest equal micro-batches of at most ``limit``."""
        if limit < 1:
            raise ValueError("max_local_batch must be at least 1")
        self.max_local_batch = limit
        local = self.plan.local_batch
        for accumulate in range(1, local + 1):
            if local % accumulate == 0 and local // accumulate <= limit:
                self.accumulate, self.micro_batch = accumulate, local // accumulate
                return

    @property
    def checkpoint_path(self) -> Path:
        return self.run.dir / LIGHTNING_CHECKPOINT_FILE

    @property
    def resumed(self) -> bool:
        return self.checkpoint_path.exists()

    def plugins(self) -> list[Any]:
        """Lightning's SLURM auto-requeue off where Lightning would pick SLURM."""
        from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
        from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment

        if TorchElasticEnvironment.detect() or not SLURMEnvironment.detect():
            return []
        return [SLURMEnvironment(auto_requeue=False)]

    def trainer_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """Keyword arguments for ``Trainer``; ``callbacks``/``plugins`` given here are kept."""
        local, nodes = _local_world(self.env)
        out: dict[str, Any] = {
            "devices": local,
            "num_nodes": nodes,
            "use_distributed_sampler": False,
            "accumulate_grad_batches": self.accumulate,
        }
        out.update(kwargs)
        out["callbacks"] = [*list(kwargs.get("callbacks") or []), self.callback]
        out["plugins"] = [*list(kwargs.get("plugins") or []), *self.plugins()]
        return out
