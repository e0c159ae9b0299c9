"""Separating a job from a shared GPU: requeue it held, change its request, release it.

A running job's GRES cannot be changed (docs/ANCHORS.md §2), so the co-location policy's
separation is a requeue whose intents (``update_job``: the backend spells them as
``scontrol update`` fields) are applied while the job is pending and held::

    scontrol requeuehold J  →  scontrol update JobId=J TresPerNode=gres:shard:S Comment=…
                            →  scontrol release J

Holding first closes the window in which Slurm could restart the job with its old, shared
request. The release runs even when the update fails, so a job is never left held by us;
the failure is raised to the actuator, which audits it. Slurm delays the restart of a
requeued job (BeginTime = now + ~121 s on 22.05 to 25.x).

If the daemon dies between the steps, the decision stays ``pending`` in the audit;
:func:`recover_separations` (called by ``Actuator.recover`` on the next start) re-applies
the update where the job is still pending and releases it, so no job stays held.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING

from slurmgpu.intent import Intent, Preempt, Resize
from slurmgpu.slurm.client import SlurmClient, SlurmError
from slurmgpu.slurm.update import parse_fields

if TYPE_CHECKING:  # the simulator loads this module without the store
    from slurmgpu.store.audit import AuditRecord

log = logging.getLogger("slurmgpu.actuate")

SEPARATION_POLICY = "colocate"
# Policies whose ``requeue`` actions carry intents and go through separate(): co-location's
# separation and rightsizing's restore of a lowered time limit (policy.limit_restore).
HELD_REQUEUE_POLICIES = frozenset({SEPARATION_POLICY, "rightsize"})


def separate(slurm: SlurmClient, ref: str | int, intents: Sequence[Intent]) -> None:
    """Requeue ``ref`` held, apply ``intents`` while it is pending, then release it."""
    slurm.requeue(ref, hold=True)
    try:
        slurm.update_job(ref, intents)
    finally:
        slurm.release(ref)


def recover_separations(
    slurm: SlurmClient, records: Iterable[AuditRecord], stale_ids: Collection[int]
) -> int:
    """Finish or undo separations a stopped daemon left half done; return how many.

    For each interrupted separation: the update is tried again (Slurm refuses it when the
    job is not pending, i.e. the requeue never happened) and the job is released (a no-op
    refusal when it was not held). Errors are logged, never raised.
    """
    done = 0
    for r in records:
        if r.id not in stale_ids or r.job_id is None:
            continue
        if r.policy not in HELD_REQUEUE_POLICIES or r.kind != "requeue" or not r.fields:
            continue
        # the audit keeps the intents as rendered fields; what does not read back is skipped
        intents, _unread = parse_fields(r.fields, strict=False)
        update = [i for i in intents if not isinstance(i, Resize | Preempt)]
        if update:
            with contextlib.suppress(SlurmError):
                slurm.update_job(r.job_id, update)
        try:
            slurm.release(r.job_id)
        except SlurmError as exc:
            log.info("interrupted separation of job %d: release: %s", r.job_id, exc)
        done += 1
    return done
