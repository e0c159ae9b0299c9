"""At start, with LAS enabled: does its Nice keep the site's fair share in charge?

The daemon reads Slurm's priority settings once (``scontrol show config`` and ``show
partition -o`` through the Slurm client, slurm/config.py), checks them against
``[policy.las]`` (policy/las_floor.py) and logs one warning line for each problem, naming
the setting to change. A client that cannot say (the simulator, pyslurm) or a Slurm that
does not answer costs one line and no check; the daemon runs on either way.
"""

from __future__ import annotations

import logging

from slurmgpu.policy.las_floor import SitePriority, nice_warnings
from slurmgpu.policy.settings import AttainedServiceSettings
from slurmgpu.slurm.client import SlurmClient, SlurmError
from slurmgpu.slurm.config import PriorityConfigClient

__all__ = ["check_las_priority"]

log = logging.getLogger("slurmgpu.daemon")


def check_las_priority(settings: AttainedServiceSettings, slurm: SlurmClient) -> list[str]:
    """Log (and return) the warnings of policy/las_floor.py for this cluster."""
    if not isinstance(slurm, PriorityConfigClient):
        log.info("LAS: this Slurm client cannot read the priority weights; not checked")
        return []
    try:
        config = slurm.priority_config()
    except SlurmError as exc:
        log.warning("LAS: Slurm's priority weights not read, Nice not checked: %s", exc)
        return []
    site = SitePriority(
        multifactor=config.multifactor,
        base=config.base,
        base_from=config.base_reason(),
        weight_fairshare=config.weight_fairshare,
    )
    lines = nice_warnings(settings, site)
    for line in lines:
        log.warning("%s", line)
    return lines
