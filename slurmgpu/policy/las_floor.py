"""Whether LAS's Nice keeps the site's fair share in charge inside a queue (docs/policies.md,
"With fair share"): the daemon checks once at start and warns, one line a problem, naming
the setting to change.

Two conditions, with ``priority/multifactor`` (any other priority plugin: nothing to
check):

- *no priority reaches Slurm's floor*: the worst queue's Nice, (number of
  ``queue_limits``) x ``nice_step``, must not exceed the priority every job has (its
  base, slurm/config.py). Past it a job's priority can fall to 1, where jobs go in
  submit order and fair share no longer decides;
- *a queue boundary outweighs fair share*: ``nice_step`` >= ``PriorityWeightFairshare``,
  else a fair-share difference carries a job across a queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmgpu.policy.settings import AttainedServiceSettings

__all__ = ["SitePriority", "nice_warnings"]


@dataclass(frozen=True, slots=True)
class SitePriority:
    """The site's priority settings the check needs (read by slurm/config.py)."""

    multifactor: bool
    base: int  # the priority every job has at least, before its Nice
    base_from: str  # how: "PriorityWeightPartition=100000"
    weight_fairshare: int


def nice_warnings(settings: AttainedServiceSettings, site: SitePriority) -> list[str]:
    """One line for each condition LAS's settings break on this site (none: [])."""
    if not site.multifactor:
        return []
    queues = len(settings.queue_limits)
    step = settings.nice_step
    worst = queues * step
    out: list[str] = []
    if worst > site.base:
        # a smaller step is a way out only while it still outweighs fair share
        lower = site.base // queues
        fewer = (
            f"[policy.las] nice_step <= {lower}" if lower >= max(site.weight_fairshare, 1) else ""
        )
        out.append(
            f"LAS can push priorities to Slurm's floor of 1 (then jobs go in submit order, "
            f"not by fair share): the worst queue's Nice is {worst} ({queues} queue_limits x "
            f"nice_step {step}) but every job's base priority is only {site.base} "
            f"({site.base_from}); set PriorityWeightPartition >= {worst} in slurm.conf "
            f"(every partition's PriorityJobFactor alike)" + (f", or {fewer}" if fewer else "")
        )
    if step < site.weight_fairshare:
        out.append(
            f"LAS queues do not outweigh fair share: [policy.las] nice_step {step} is below "
            f"PriorityWeightFairshare {site.weight_fairshare}, so a fair-share difference can "
            f"carry a job across a queue; set nice_step >= {site.weight_fairshare} "
            f"(docs/policies.md, 'With fair share')"
        )
    return out
