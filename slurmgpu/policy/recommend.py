"""What each (user, job name, partition) should ask for next time: the submit-time side of
rightsizing, exported for ``plugins/job_submit.lua``. Pure: priors in, values out."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from slurmgpu.policy.priors import Estimate, Priors
from slurmgpu.policy.settings import RightsizeSettings


def _round_up(value: float, step: float) -> float:
    return math.ceil(value / step) * step


def advice(est: Estimate, s: RightsizeSettings) -> dict[str, int | None]:
    """The requests history supports, by the same rules as RightsizePolicy."""
    seconds = max(est.run_time.total_seconds() * s.time_headroom, s.min_time_limit.total_seconds())
    time_min = int(_round_up(seconds, s.time_round.total_seconds()) // 60) if s.time_limit else None
    mem = None
    if s.memory and est.oom_runs == 0 and est.peak_node_memory_mib:
        mem = int(_round_up(est.peak_node_memory_mib * s.memory_headroom, 256))
    gpus = None
    if s.gpus and est.gpus_used is not None and est.gpus_used_samples >= s.min_history:
        gpus = max(1, est.gpus_used)
    return {
        "time_limit_min": time_min,
        "mem_mib": mem,
        "cpus": None,
        "gpus": gpus,
        "samples": est.samples,
    }


def recommendations(
    priors: Priors, settings: RightsizeSettings
) -> tuple[dict[str, dict[str, int | None]], dict[str, dict[str, int | None]]]:
    """(by "user|name|partition", fallback by user) for the export.

    The per-user fallback carries no time limit unless ``time_from_other_jobs``: as in
    RightsizePolicy, the user's other jobs never set a job's limit (one too short kills
    the run).
    """
    by_key = {
        f"{user}|{name}|{partition}": advice(est, settings)
        for (user, name, partition), est in _sorted(priors.key_estimates())
    }
    user_level = settings if settings.time_from_other_jobs else replace(settings, time_limit=False)
    fallback = {user: advice(est, user_level) for user, est in priors.user_estimates()}
    return by_key, fallback


def _sorted(
    items: Iterable[tuple[tuple[str, str, str], Estimate]],
) -> list[tuple[tuple[str, str, str], Estimate]]:
    return sorted(items, key=lambda kv: kv[0])
