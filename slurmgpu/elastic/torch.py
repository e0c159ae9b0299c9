"""Malleable PyTorch training: one atomic checkpoint of everything a run needs to go on.

torch is imported only when a function here runs, so ``slurmgpu.elastic`` stays usable
without it. In a torchrun/DDP training script::

    from slurmgpu import elastic
    from slurmgpu.elastic import torch as etorch

    run = elastic.init()                                   # after torchrun set RANK etc.
    plan = etorch.plan_batch(world, base_lr=0.1, global_batch=64)   # the rule, below
    sampler = etorch.ElasticSampler(len(data), plan.global_batch, rank=rank, world_size=world)
    loader = DataLoader(data, batch_sampler=sampler)
    state = etorch.TrainingState(run, model=ddp, optimizer=opt, scheduler=sched,
                                 scaler=scaler, sampler=sampler, plan=plan)
    state.load()                                           # resumes, or starts fresh
    while state.step < total:
        for batch in loader:                               # the rest of this epoch
            train_one_step(batch)
            state.step_done()                              # step += 1, sampler advances
            if etorch.agree(run):                          # any rank asked: all ranks
                state.checkpoint()                         # save, ack, wait for requeue
        sampler.set_epoch(sampler.epoch + 1)

**What the checkpoint holds** (``<state dir>/<job id>/checkpoint.pt``, written by rank 0
atomically: temp file, fsync, rename, fsync of the directory): the model (unwrapped from
DDP), optimizer, LR scheduler, AMP grad scaler, the sampler's epoch and position, the
step, the world size and batch plan it ran with, and every rank's RNG states (python,
numpy when loaded, torch CPU and CUDA), gathered to rank 0. ``run.resumed`` is true once
it exists.

**Resuming at another size.** A rank that did not exist before seeds its RNGs from
(step, rank); the sampler goes on with exactly the samples of the epoch not yet consumed
(none repeated, none skipped), however many ranks share them now.

**The batch and learning-rate rule** (:func:`plan_batch`), under DDP, whose all-reduce
*averages* the ranks' gradients:

- ``global_batch=G`` given (the default to use): the global batch stays ``G``; each of
  ``W`` ranks takes ``G / W`` samples of it (``G`` must divide by ``W``). The averaged
  gradient is the mean over the same ``G`` samples at every size, so the learning rate
  stays ``base_lr`` and training follows the uninterrupted run's trajectory up to
  floating-point summation order. This is also the rule that keeps ``ElasticSampler``'s
  steps the same across sizes: step ``k`` sees the same ``G`` samples at any ``W``.
- ``per_rank_batch=B`` given: each rank keeps ``B``, the global batch becomes ``B * W``
  and the learning rate follows :func:`slurmgpu.elastic.scaling.scaled_lr` (``linear``,
  ``sqrt`` or ``adascale``) relative to ``B * base_world_size``, where ``base_lr`` was
  tuned. DDP's average over ``W`` ranks is the gradient of the mean over ``B * W``
  samples, which is what these rules assume: no extra gradient scaling is needed.

The checkpoint records the plan's ``lr_scale`` (learning rate / ``base_lr``); on loading
at another size :meth:`TrainingState.load` multiplies the optimizer's learning rates, the
groups' ``initial_lr`` and the scheduler's ``base_lrs``/last LR by ``new / saved`` *after*
loading their state dicts (which would otherwise put the old size's rates back), so
closed-form schedulers (``LambdaLR``, ``OneCycleLR``...) and chained ones (``StepLR``...)
both carry on at the new scale.

**Bit-identical resumption** at the same size also needs two things outside the
checkpoint: the DataLoader's own ``generator=torch.Generator()`` (a DataLoader otherwise
draws its seed from the global RNG each time it starts iterating, so a resumed run's
dropout stream would be one draw off), and, under DDP, a gradient-bucket layout that does
not change after the first iteration (``find_unused_parameters=True``; by default DDP
rebuilds its buckets after the first step, so that step after a restart sums the ranks'
gradients in another order: differences of one float rounding, ~1e-7 relative). Resuming
at another size is never bit-identical (the all-reduce sums over other ranks) but, with
the global batch kept, follows the same trajectory to that precision.

**Exit.** After a durable checkpoint the process leaves with ``os._exit(0)`` once the
requeue's SIGTERM arrives (:func:`slurmgpu.elastic.runtime.hard_exit`): torch's
interpreter teardown would hold the GPUs for seconds more.
"""

from __future__ import annotations

import io
import random
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmgpu.elastic.checkpoint import write_atomic
from slurmgpu.elastic.extras import require
from slurmgpu.elastic.runtime import ElasticRun
from slurmgpu.elastic.scaling import LrRule, scaled_lr

__all__ = [
    "TORCH_CHECKPOINT_FILE",
    "BatchPlan",
    "ElasticSampler",
    "TrainingState",
    "agree",
    "checkpoint",
    "load",
    "plan_batch",
    "save",
    "set_lr",
]

TORCH_CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_VERSION = 1


def _torch() -> Any:
    return require("torch", "torch", "slurmgpu.elastic.torch")


def _dist() -> Any | None:
    """torch.distributed when a process group is up, else None (a single process)."""
    dist = _torch().distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def agree(run: ElasticRun) -> bool:
    """True on every rank when any rank has a pending checkpoint request (all-reduce MAX).

    The signal reaches ranks at different steps; without this they would checkpoint at
    different steps (or one would wait in a collective the others never enter).
    """
    torch = _torch()
    dist = _dist()
    if dist is None:
        return run.checkpoint_requested
    flag = torch.tensor([1 if run.checkpoint_requested else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    agreed = bool(flag.item())
    # A signal that arrived during the all-reduce (where ranks spend their waits, so often)
    # has set the flag after it was read: keep it for the next step, never overwrite it.
    if agreed:
        run.checkpoint_requested = True
    return agreed


def set_lr(optimizer: Any, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


# --------------------------------------------------------------------------- batch plan


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Batch sizes and learning rate for one world size (see the module's rule)."""

    world_size: int
    global_batch: int
    local_batch: int  # per rank
    lr: float
    lr_scale: float  # lr / base_lr


def plan_batch(
    world_size: int,
    *,
    base_lr: float,
    global_batch: int | None = None,
    per_rank_batch: int | None = None,
    base_world_size: int = 1,
    rule: LrRule = "sqrt",
    var: float = 0.0,
    sqr: float = 0.0,
) -> BatchPlan:
    """The batch and learning rate at ``world_size``: give exactly one of ``global_batch``
    (kept; lr unchanged) or ``per_rank_batch`` (kept; lr by ``rule``). ValueError otherwise."""
    if world_size < 1 or base_world_size < 1:
        raise ValueError("world sizes must be at least 1")
    if (global_batch is None) == (per_rank_batch is None):
        raise ValueError("give exactly one of global_batch or per_rank_batch")
    if global_batch is not None:
        if global_batch < world_size or global_batch % world_size:
            raise ValueError(
                f"global batch {global_batch} does not split evenly over {world_size} ranks"
            )
        return BatchPlan(world_size, global_batch, global_batch // world_size, base_lr, 1.0)
    assert per_rank_batch is not None
    if per_rank_batch < 1:
        raise ValueError("per_rank_batch must be at least 1")
    batch = per_rank_batch * world_size
    lr = scaled_lr(base_lr, per_rank_batch * base_world_size, batch, rule, var=var, sqr=sqr)
    return BatchPlan(world_size, batch, per_rank_batch, lr, lr / base_lr if base_lr else 1.0)


# --------------------------------------------------------------------------- sampler


class ElasticSampler:
    """A batch sampler whose position survives a change of world size mid-epoch.

    Each epoch is one permutation of ``range(n)`` (seeded by ``seed`` and the epoch, the
    same on every rank and at every size). A step takes the next ``global_batch`` indices
    of it and gives rank ``r`` the ``r``-th of ``world_size`` contiguous, near-equal
    slices. ``consumed`` counts the epoch's indices already trained on, over all ranks;
    after a resize the new ranks split ``permutation[consumed:]`` the same way, so every
    index is used exactly once per epoch, whatever the sizes were. The last global batch
    of an epoch may be short (``drop_last=False``): it is split as evenly as possible.

    Use it as ``DataLoader(dataset, batch_sampler=sampler)`` and call :meth:`advance`
    (or :meth:`TrainingState.step_done`) after each optimizer step: a DataLoader reads
    ahead, so iteration alone does not say what was trained on.
    """

    def __init__(
        self,
        n: int,
        global_batch: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        if n < 1 or global_batch < 1:
            raise ValueError("need at least one sample and a batch of at least one")
        self.n = n
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.consumed = 0
        self.global_batch = global_batch
        self.rank = 0
        self.world_size = 1
        self.resize(rank, world_size, global_batch)

    def resize(self, rank: int, world_size: int, global_batch: int | None = None) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        self.rank, self.world_size = rank, world_size
        if global_batch is not None:
            if global_batch < 1:
                raise ValueError("global_batch must be at least 1")
            self.global_batch = global_batch

    @property
    def epoch_size(self) -> int:
        """Indices trained on per epoch (``n``, or whole global batches with drop_last)."""
        if self.drop_last:
            return self.n - self.n % self.global_batch
        return self.n

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (a new epoch starts at its beginning; the same one keeps its place)."""
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def permutation(self, epoch: int | None = None) -> list[int]:
        order = list(range(self.n))
        if self.shuffle:
            key = f"{self.seed}:{self.epoch if epoch is None else epoch}"
            random.Random(key).shuffle(order)  # noqa: S311 - a data order, not a secret
        return order

    def _share(self, chunk: list[int]) -> list[int]:
        q, r = divmod(len(chunk), self.world_size)
        start = self.rank * q + min(self.rank, r)
        return chunk[start : start + q + (1 if self.rank < r else 0)]

    def __iter__(self) -> Iterator[list[int]]:
        order = self.permutation()
        end = self.epoch_size
        for start in range(self.consumed, end, self.global_batch):
            yield self._share(order[start : min(start + self.global_batch, end)])

    def __len__(self) -> int:
        left = max(self.epoch_size - self.consumed, 0)
        return (left + self.global_batch - 1) // self.global_batch

    @property
    def epoch_done(self) -> bool:
        return self.consumed >= self.epoch_size

    def advance(self, steps: int = 1) -> None:
        """``steps`` optimizer steps were taken on this sampler's batches."""
        self.consumed = min(self.consumed + steps * self.global_batch, self.epoch_size)

    def state_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "consumed": self.consumed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("n") != self.n or state.get("seed") != self.seed:
            raise ValueError(
                f"the checkpoint's sampler had {state.get('n')} samples and seed "
                f"{state.get('seed')}, this one {self.n} and {self.seed}"
            )
        self.epoch = int(state["epoch"])
        self.consumed = min(int(state["consumed"]), self.n)


# --------------------------------------------------------------------------- checkpoint


def _rank_world() -> tuple[int, int]:
    dist = _dist()
    if dist is None:
        return 0, 1
    return int(dist.get_rank()), int(dist.get_world_size())


def rng_state() -> dict[str, Any]:
    """This process's RNG states: python, numpy (when imported), torch CPU and CUDA."""
    torch = _torch()
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch = _torch()
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"][: torch.cuda.device_count()]
        for device, cuda_state in enumerate(states):
            torch.cuda.set_rng_state(cuda_state, device)


def seed_rng(step: int, rank: int) -> None:
    """Fresh, distinct RNG streams for a rank the checkpoint has no state for."""
    torch = _torch()
    seed = (step * 1_000_003 + rank * 7919 + 1) % (2**31)
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)


def _unwrap(model: Any) -> Any:
    """The module inside DistributedDataParallel/DataParallel (its keys lack ``module.``)."""
    inner = getattr(model, "module", None)
    return inner if inner is not None and hasattr(inner, "state_dict") else model


class TrainingState:
    """Everything one training run must carry across a resize, saved in one file.

    ``save``/``checkpoint``/``load`` are collective when a process group is up: every
    rank calls them at the same step (``agree`` makes sure of that); rank 0 writes.
    """

    def __init__(
        self,
        run: ElasticRun,
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        sampler: ElasticSampler | None = None,
        plan: BatchPlan | None = None,
        extra: dict[str, Any] | None = None,
        path: str | Path | None = None,
    ) -> None:
        self.run = run
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.sampler = sampler
        self.plan = plan
        self.extra: dict[str, Any] = dict(extra or {})
        self.path = Path(path) if path is not None else run.dir / TORCH_CHECKPOINT_FILE
        self.step = 0
        self.resumed_from: dict[str, Any] | None = None  # the loaded checkpoint's header

    @property
    def resumed(self) -> bool:
        return self.resumed_from is not None

    def step_done(self, steps: int = 1) -> None:
        """One optimizer step taken: count it and move the sampler past its batch."""
        self.step += steps
        if self.sampler is not None:
            self.sampler.advance(steps)

    def state_dict(self) -> dict[str, Any] | None:
        """The checkpoint's contents on rank 0 (None on other ranks); collective."""
        rank, world = _rank_world()
        dist = _dist()
        mine = rng_state()
        if dist is not None:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, mine)
            rngs = gathered
        else:
            rngs = [mine]
        if rank != 0:
            return None
        return {
            "format": "slurmgpu.elastic.torch",
            "version": FORMAT_VERSION,
            "step": self.step,
            "world_size": world,
            "job_id": self.run.job_id,
            "restart_count": self.run.restart_count,
            "plan": asdict(self.plan) if self.plan is not None else None,
            "model": _unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
            "rng": rngs,
            "extra": self.extra,
        }

    def save(self) -> bool:
        """Write the checkpoint atomically (rank 0; collective). True on the writer."""
        state = self.state_dict()
        if state is None:
            return False
        torch = _torch()
        buf = io.BytesIO()
        torch.save(state, buf)
        write_atomic(self.path, buf.getvalue())
        return True

    def checkpoint(self) -> bool:
        """``save`` then answer a pending request (ack, wait for the requeue, exit).

        Returns True when training may go on (no request, or nobody requeued the job).
        """
        self.save()
        dist = _dist()
        if dist is not None:
            dist.barrier()  # the file is durable before any rank acknowledges or exits
        return self.run.acknowledge(self.step)

    def load(self) -> bool:
        """Restore everything from the checkpoint if there is one; True when resumed."""
        torch = _torch()
        if not self.path.exists():
            return False
        state = torch.load(self.path, map_location="cpu", weights_only=False)
        if not isinstance(state, dict) or state.get("format") != "slurmgpu.elastic.torch":
            raise ValueError(f"{self.path} is not a slurmgpu.elastic.torch checkpoint")
        rank, world = _rank_world()
        _unwrap(self.model).load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        if self.sampler is not None and state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
            self.sampler.resize(rank, world)
        self.step = int(state["step"])
        self.extra = dict(state.get("extra") or {})
        saved_plan = state.get("plan")
        if self.plan is not None and saved_plan is not None:
            self._rescale_lr(self.plan.lr_scale / float(saved_plan["lr_scale"]))
        rngs = state["rng"]
        if state["world_size"] == world and rank < len(rngs):
            set_rng_state(rngs[rank])
        else:
            seed_rng(self.step, rank)  # another size: same-seeded streams would repeat
        self.resumed_from = {
            k: state[k] for k in ("step", "world_size", "job_id", "restart_count", "plan")
        }
        return True

    def _rescale_lr(self, ratio: float) -> None:
        if ratio == 1.0:
            return
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * ratio
                if "initial_lr" in group:
                    group["initial_lr"] = group["initial_lr"] * ratio
        if self.scheduler is not None:
            if hasattr(self.scheduler, "base_lrs"):
                self.scheduler.base_lrs = [lr * ratio for lr in self.scheduler.base_lrs]
            last = getattr(self.scheduler, "_last_lr", None)
            if last is not None:
                self.scheduler._last_lr = [lr * ratio for lr in last]


# --------------------------------------------------------------------------- plain helpers


def save(run: ElasticRun, state: Any, path: str | Path | None = None) -> bool:
    """``torch.save`` of any ``state`` to the run's checkpoint path atomically (rank 0)."""
    if not run.is_rank0:
        return False
    torch = _torch()
    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(path or run.dir / TORCH_CHECKPOINT_FILE, buf.getvalue())
    return True


def load(run: ElasticRun, path: str | Path | None = None, default: Any = None) -> Any:
    torch = _torch()
    target = Path(path or run.dir / TORCH_CHECKPOINT_FILE)
    if not target.exists():
        return default
    return torch.load(target, map_location="cpu", weights_only=False)


def checkpoint(run: ElasticRun, state: Any, step: int | None = None) -> bool:
    """``save`` then ``run.acknowledge``: True when training may go on."""
    save(run, state)
    return run.acknowledge(step)
