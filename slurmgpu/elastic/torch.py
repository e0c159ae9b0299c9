"""Optional torch helpers for :mod:`slurmgpu.elastic` (torch is imported only when called).

- :func:`agree`: every rank learns whether *any* rank was asked to checkpoint (the signal
  may reach ranks at different steps), so all ranks checkpoint at the same step.
- :func:`set_lr`: apply a rule from :mod:`slurmgpu.elastic.scaling` to an optimizer.
- :func:`save` / :func:`load`: a checkpoint through ``torch.save`` written atomically;
  :func:`checkpoint` saves and then answers a pending request like
  ``ElasticRun.checkpoint`` does.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from slurmgpu.elastic.checkpoint import write_atomic
from slurmgpu.elastic.runtime import ElasticRun

__all__ = ["agree", "checkpoint", "load", "save", "set_lr"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise RuntimeError("slurmgpu.elastic.torch needs torch (pip install torch)") from exc
    return torch


def agree(run: ElasticRun) -> bool:
    """True on every rank when any rank has a pending checkpoint request (all-reduce MAX)."""
    torch = _torch()
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return run.checkpoint_requested
    flag = torch.tensor([1 if run.checkpoint_requested else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    run.checkpoint_requested = bool(flag.item())
    return run.checkpoint_requested


def set_lr(optimizer: Any, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def save(run: ElasticRun, state: Any, path: str | Path | None = None) -> bool:
    """``torch.save`` to the run's checkpoint path atomically (rank 0 only)."""
    if not run.is_rank0:
        return False
    torch = _torch()
    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(path or run.dir / "checkpoint.pt", buf.getvalue())
    return True


def load(run: ElasticRun, path: str | Path | None = None, default: Any = None) -> Any:
    torch = _torch()
    target = Path(path or run.dir / "checkpoint.pt")
    if not target.exists():
        return default
    return torch.load(target, map_location="cpu", weights_only=False)


def checkpoint(run: ElasticRun, state: Any, step: int | None = None) -> bool:
    """``save`` then ``run.acknowledge``: True when training may go on."""
    save(run, state)
    return run.acknowledge(step)
