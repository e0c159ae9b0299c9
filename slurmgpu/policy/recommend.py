"""What each (user, job name, partition) should ask for next time: the submit-time side of
rightsizing, exported for ``plugins/job_submit.lua``. Pure: priors in, values out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from slurmgpu.policy.priors import Estimate, Priors
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.policy.sizing import SizingRules, key_sizes, limit_from_history, time_limit_s


def advice(est: Estimate, s: RightsizeSettings, rules: SizingRules) -> dict[str, int | None]:
    """The requests history supports, by the rules RightsizePolicy uses (the site's
    :class:`~slurmgpu.policy.sizing.SizingRules`): the same time limit (in minutes, a
    whole number of ``time_round``), memory per node and GPUs. No CPU count: rightsizing keeps
    ``target_cores_per_gpu`` per GPU of the job, and a per-key export cannot know how
    many GPUs the next submission asks for. No time limit from a key with a restarted
    run (:func:`~slurmgpu.policy.sizing.limit_from_history`; the levels are the
    caller's: :func:`recommendations` leaves the user's fallback without one). The time
    headroom grows by ``timeout_margin_growth`` per ``TIMEOUT`` run at the key, as
    rightsizing's. The export is per key, not per request: rightsizing's bound for a job
    Slurm may split over nodes (``--gpus=k``: k x the run time) is not in it, and
    plugins/slurmgpu_submit.lua still lowers such a job's time to the packed figure (a
    known gap: the daemon restores only limits it lowered itself)."""
    time_min = None
    if s.time_limit and limit_from_history(est, from_other_jobs=True):
        # the key's margin grows with every run of it that hit its limit, as rightsizing's
        headroom = rules.time_headroom * s.timeout_margin_growth**est.timeouts
        seconds = time_limit_s(
            est.run_time.total_seconds(),
            headroom,
            rules.time_round.total_seconds(),
            rules.min_time_limit.total_seconds(),
        )
        time_min = -(-seconds // 60)
    sizes = key_sizes(
        est, rules, memory=s.memory, cpus=s.cpus, gpus=s.gpus, min_history=s.min_history
    )
    return {
        "time_limit_min": time_min,
        "mem_mib": sizes.memory_mib,
        "cpus": None,
        "gpus": sizes.gpus,
        "samples": est.samples,
    }


# RightsizePolicy.hold_back's field names -> the export's columns
_COLUMNS = {"time_limit": "time_limit_min", "memory": "mem_mib", "cpus": "cpus", "gpus": "gpus"}


def recommendations(
    priors: Priors,
    settings: RightsizeSettings,
    rules: SizingRules,
    held_back: Mapping[tuple[str, str, str], frozenset[str]] | None = None,
) -> tuple[dict[str, dict[str, int | None]], dict[str, dict[str, int | None]]]:
    """(by "user|name|partition", fallback by user) for the export.

    The per-user fallback carries no time limit unless ``time_from_other_jobs``: as in
    RightsizePolicy, the user's other jobs never set a job's limit (one too short kills
    the run). ``held_back`` (``RightsizePolicy.held_back``): fields rightsizing no longer
    lowers for a key, one of whose jobs a site minimum stopped
    (:mod:`slurmgpu.policy.rightsize_undo`); they are left out of that key's row and of
    its user's fallback (the same QOS minimum holds for the user's other jobs).
    """
    by_key = {
        f"{user}|{name}|{partition}": advice(est, settings, rules)
        for (user, name, partition), est in _sorted(priors.key_estimates())
    }
    user_level = settings if settings.time_from_other_jobs else replace(settings, time_limit=False)
    fallback = {user: advice(est, user_level, rules) for user, est in priors.user_estimates()}
    for (user, name, partition), fields in (held_back or {}).items():
        for row in (by_key.get(f"{user}|{name}|{partition}"), fallback.get(user)):
            if row is not None:
                for f in fields:
                    row[_COLUMNS[f]] = None
    return by_key, fallback


def _sorted(
    items: Iterable[tuple[tuple[str, str, str], Estimate]],
) -> list[tuple[tuple[str, str, str], Estimate]]:
    return sorted(items, key=lambda kv: kv[0])
