"""Settings of the policy engine and of each policy: frozen values with documented defaults.

Every default comes from the tools our users already know (docs/ANCHORS.md §1): Job
Defense Shield's zero-utilisation GPU alert (warn at 60 and 105 min, act at 120 min of
0 % from the job's start; 240 / 300 min for a GPU that was busy and then went idle),
jobstats' ``--mem = ceil(1.2 * used)`` and JDS's 12 cores per GPU.

Each class has ``from_mapping(d, where)``, which reads one TOML table (already parsed
into a mapping) and raises :class:`PolicyConfigError` naming the key, so the config loader
can add the file and line::

    [policy.idle_gpu]
    mode = "advise"              # observe | advise | enforce
    warn_after = "60m"
    second_warn_after = "105m"   # "off" (or false) for a single warning
    act_after = "120m"
    action = "requeue"           # requeue | cancel | notify
    requeue_fallback = "cancel"  # for jobs Slurm may not requeue: cancel | notify
    idle_fraction = 1.0          # act when this share of the job's GPUs is idle
    exempt_partitions = ["interactive"]

    [policy.rightsize]
    time_limit = true
    memory_headroom = 1.2
    apply_to_all = false         # true: also jobs that did not opt in

    [policy.engine]
    max_actions_per_cycle = 20
    job_cooldown = "30m"
    exempt_users = ["root"]

Durations are strings such as ``"30s"``, ``"5m"``, ``"1h30m"`` or a number of seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, cast

from slurmgpu.policy import sizing
from slurmgpu.policy.base import Mode
from slurmgpu.policy.sizing import SizingRules
from slurmgpu.settings_table import TableReader

__all__ = [
    "GPU_CONVERSIONS",
    "IDLE_ACTIONS",
    "REQUEUE_FALLBACKS",
    "SIZING_KEYS",
    "AttainedServiceSettings",
    "ColocateSettings",
    "EngineSettings",
    "IdleGpuSettings",
    "MalleableSettings",
    "PolicyConfigError",
    "RightsizeSettings",
    "sizing_from_mappings",
]

IdleAction = Literal["requeue", "cancel", "notify"]
RequeueFallback = Literal["cancel", "notify"]
IDLE_ACTIONS: tuple[IdleAction, ...] = ("requeue", "cancel", "notify")
REQUEUE_FALLBACKS: tuple[RequeueFallback, ...] = ("cancel", "notify")


class PolicyConfigError(ValueError):
    """One bad policy setting: ``key`` (as written in the table) and what is wrong with it.

    ``where`` is the table, e.g. ``"policy.idle_gpu"``; ``str()`` gives
    ``policy.idle_gpu.warn_after must be a duration like "30s", not 'soon'``.
    """

    def __init__(self, key: str, message: str, *, where: str = "") -> None:
        self.key = key
        self.message = message
        self.where = where
        dotted = ".".join(part for part in (where, key) if part)
        super().__init__(f"{dotted} {message}")


class _Table(TableReader):
    """Reads one policy table (see :class:`TableReader`)."""

    def __init__(self, d: Mapping[str, Any], where: str) -> None:
        if not isinstance(d, Mapping):
            raise PolicyConfigError("", "must be a table", where=where)
        super().__init__(d)
        self.where = where

    def fail(self, key: str, message: str) -> PolicyConfigError:
        return PolicyConfigError(key, message, where=self.where)

    def optional_duration(self, key: str, default: timedelta | None) -> timedelta | None:
        if key not in self.raw:
            return default
        value = self.raw[key]
        if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
            self.raw.pop(key)
            return None
        return self.duration(key, timedelta(0))

    def number(
        self,
        key: str,
        default: float,
        *,
        minimum: float,
        maximum: float | None = None,
        above_minimum: bool = False,
    ) -> float:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.fail(key, f"must be a number, not {value!r}")
        if not math.isfinite(value):
            raise self.fail(key, f"must be a finite number, not {value!r}")
        low_ok = value > minimum if above_minimum else value >= minimum
        if not low_ok or (maximum is not None and value > maximum):
            low = f"> {minimum:g}" if above_minimum else f">= {minimum:g}"
            high = f" and <= {maximum:g}" if maximum is not None else ""
            raise self.fail(key, f"must be a number {low}{high}, not {value!r}")
        return float(value)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if not isinstance(value, str) or value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, not {value!r}")
        return value

    def size_mib(self, key: str, default: int | None) -> int | None:
        """A size in MiB: ``"2GiB"``, ``"512MiB"`` or a number of MiB; ``"auto"``: None."""
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if isinstance(value, str) and value.strip().lower() == "auto":
            return None
        from slurmgpu.units import parse_size_mib

        try:
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise ValueError
            mib = value if isinstance(value, int) else parse_size_mib(value)
        except ValueError:
            raise self.fail(key, f'must be a size like "2GiB" or "512MiB", not {value!r}') from None
        if mib < 0:
            raise self.fail(key, f"must not be negative, not {value!r}")
        return mib

    def mode(self, key: str, default: Mode) -> Mode:
        return Mode(self.choice(key, default.value, tuple(m.value for m in Mode)))

    def names(self, key: str, default: frozenset[str]) -> frozenset[str]:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f'must be a list of names like ["a", "b"], not {value!r}')
        return frozenset(cast("list[str]", value))


# SizingRules field -> (the policy table that writes it, its key there): the site's sizing
# knobs are written where they were before issue 37 made them one object.
SIZING_KEYS: Mapping[str, tuple[str, str]] = {
    "time_headroom": ("rightsize", "time_headroom"),
    "time_round": ("rightsize", "time_round"),
    "min_time_limit": ("rightsize", "min_time_limit"),
    "memory_headroom": ("rightsize", "memory_headroom"),
    "memory_round_mib": ("rightsize", "memory_round_mib"),
    "cpu_headroom": ("rightsize", "cpu_headroom"),
    "memory_margin_mib": ("colocate", "memory_margin"),
    "max_jobs_per_gpu": ("colocate", "max_jobs_per_gpu"),
}


def sizing_from_mappings(
    rightsize: Mapping[str, Any], colocate: Mapping[str, Any], where: str = "policy"
) -> tuple[SizingRules, dict[str, Any], dict[str, Any]]:
    """The site's :class:`SizingRules` from the ``[policy.rightsize]`` and
    ``[policy.colocate]`` tables (the keys of :data:`SIZING_KEYS`), and each table without
    them, for :meth:`RightsizeSettings.from_mapping` and
    :meth:`ColocateSettings.from_mapping`. Raises PolicyConfigError naming the table.

    >>> rules, rest, _ = sizing_from_mappings({"time_headroom": 1.5, "mode": "observe"}, {})
    >>> rules.time_headroom, rest
    (1.5, {'mode': 'observe'})
    """
    tables = {"rightsize": rightsize, "colocate": colocate}
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            raise PolicyConfigError("", "must be a table", where=f"{where}.{name}")
    keys = {name: {key for table, key in SIZING_KEYS.values() if table == name} for name in tables}
    r, c = (
        _Table({k: v for k, v in tables[name].items() if k in keys[name]}, f"{where}.{name}")
        for name in tables
    )
    margin = c.size_mib("memory_margin", sizing.MEMORY_MARGIN_MIB)
    rules = SizingRules(
        time_headroom=r.number("time_headroom", sizing.TIME_HEADROOM, minimum=1.0),
        time_round=r.duration("time_round", sizing.TIME_ROUND, minimum=timedelta(minutes=1)),
        min_time_limit=r.duration(
            "min_time_limit", sizing.MIN_TIME_LIMIT, minimum=timedelta(minutes=1)
        ),
        memory_headroom=r.number("memory_headroom", sizing.MEMORY_HEADROOM, minimum=1.0),
        memory_round_mib=r.integer("memory_round_mib", sizing.MEMORY_ROUND_MIB, minimum=1),
        cpu_headroom=r.number("cpu_headroom", sizing.CPU_HEADROOM, minimum=1.0),
        memory_margin_mib=sizing.MEMORY_MARGIN_MIB if margin is None else margin,
        max_jobs_per_gpu=c.integer("max_jobs_per_gpu", sizing.MAX_JOBS_PER_GPU, minimum=2),
    )
    r.finish()
    c.finish()
    rest_r, rest_c = (
        {k: v for k, v in tables[name].items() if k not in keys[name]} for name in tables
    )
    return rules, rest_r, rest_c


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Guardrails the engine applies to every policy's proposals.

    - ``max_actions_per_cycle`` (20): changes executed per cycle, all users; the highest
      priority and then the oldest jobs go first.
    - ``max_actions_per_user_per_hour`` (10): changes executed on one user's jobs per hour
      (``PolicySnapshot.user_actions_last_hour`` plus this cycle's).
    - ``job_cooldown`` (30 min): no change to a job within this long of its last
      executed change (``PolicySnapshot.last_action_at``).
    - ``exempt_users`` / ``exempt_partitions`` / ``exempt_qos``: never acted on nor warned.
    - ``exempt_interactive`` (true): salloc/srun allocations (``Job.batch`` false) too.

    The three rate guardrails bound what slurmgpu *does*: they apply to changes
    (update, requeue, cancel) in enforce mode; warnings and advice are not rate-limited
    here (the notifier limits mail per alert).

    >>> EngineSettings.from_mapping({"job_cooldown": "1h"}, "policy.engine").job_cooldown
    datetime.timedelta(seconds=3600)
    """

    max_actions_per_cycle: int = 20
    max_actions_per_user_per_hour: int = 10
    job_cooldown: timedelta = timedelta(minutes=30)
    exempt_users: frozenset[str] = frozenset()
    exempt_partitions: frozenset[str] = frozenset()
    exempt_qos: frozenset[str] = frozenset()
    exempt_interactive: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], where: str = "policy.engine") -> EngineSettings:
        """Return settings from one config table; raise PolicyConfigError on a bad key."""
        t = _Table(d, where)
        s = cls(
            max_actions_per_cycle=t.integer("max_actions_per_cycle", 20),
            max_actions_per_user_per_hour=t.integer("max_actions_per_user_per_hour", 10),
            job_cooldown=t.duration("job_cooldown", timedelta(minutes=30)),
            exempt_users=t.names("exempt_users", frozenset()),
            exempt_partitions=t.names("exempt_partitions", frozenset()),
            exempt_qos=t.names("exempt_qos", frozenset()),
            exempt_interactive=t.boolean("exempt_interactive", True),
        )
        t.finish()
        return s


@dataclass(frozen=True, slots=True)
class RightsizeSettings:
    """How pending jobs' requests are brought down to what their history shows they use.

    - ``mode`` (advise); ``time_limit`` / ``memory`` / ``cpus`` / ``gpus`` (all true):
      which requests may be changed.
    - ``apply_to_all`` (false): only jobs that opted in (``sgpu submit --rightsize`` or a
      job_submit tag, listed in ``PolicySnapshot.opted_in``) are changed; true changes
      every pending job. Either way every proposal is audited.
    - ``time_quantile`` (0.95, nearest rank) of past run times is what the time limit is
      sized from. The sizing knobs written in this table (``time_headroom``,
      ``time_round``, ``min_time_limit``, ``memory_headroom``, ``memory_round_mib``,
      ``cpu_headroom``) are not fields here: they are read into the site's one
      :class:`~slurmgpu.policy.sizing.SizingRules` (:func:`sizing_from_mappings`), which
      co-location, the export for job_submit.lua and ``sgpu eff`` take too.
    - ``time_from_other_jobs`` (false): a ``TimeLimit`` comes only from runs of the same
      script or job name; the user's other jobs (the ``user+partition`` / ``user``
      history levels) never set one, since a limit that is too short kills the run.
    - ``target_cores_per_gpu`` (12, JDS): CPUs are never cut below this many per GPU.
    - ``min_history`` (3): past runs needed at a key before it is trusted.
    - ``min_change_fraction`` (0.2): smaller reductions are not proposed.
    - ``timeout_margin_growth`` (1.5, >= 1): the time limit's headroom is multiplied by
      this for every run at the key that ended ``TIMEOUT`` (its margin grows).
    - ``max_judged_per_cycle`` (25,000; 0: no limit): pending jobs judged anew in one
      cycle. A job keeps its verdict while it, its opt-in and its history stay the same,
      so only a first cycle on a deep queue, or a reload that changed most users'
      history, has more to judge; the rest wait for the next cycles, jobs without a
      verdict first, each oldest first (the order the engine's rate limit takes
      changes in). A job whose history changed keeps its last verdict until then.

    >>> RightsizeSettings.from_mapping({"time_quantile": 0.9}, "policy.rightsize").time_quantile
    0.9
    """

    mode: Mode = Mode.ADVISE
    time_limit: bool = True
    memory: bool = True
    cpus: bool = True
    gpus: bool = True
    apply_to_all: bool = False
    time_quantile: float = 0.95
    time_from_other_jobs: bool = False
    min_history: int = 3
    target_cores_per_gpu: int = 12
    min_change_fraction: float = 0.2
    max_judged_per_cycle: int = 25_000
    timeout_margin_growth: float = 1.5

    @classmethod
    def from_mapping(
        cls, d: Mapping[str, Any], where: str = "policy.rightsize"
    ) -> RightsizeSettings:
        """Return settings from one config table; raise PolicyConfigError on a bad key."""
        t = _Table(d, where)
        s = cls(
            mode=t.mode("mode", Mode.ADVISE),
            time_limit=t.boolean("time_limit", True),
            memory=t.boolean("memory", True),
            cpus=t.boolean("cpus", True),
            gpus=t.boolean("gpus", True),
            apply_to_all=t.boolean("apply_to_all", False),
            time_quantile=t.number(
                "time_quantile", 0.95, minimum=0.0, maximum=1.0, above_minimum=True
            ),
            time_from_other_jobs=t.boolean("time_from_other_jobs", False),
            min_history=t.integer("min_history", 3, minimum=1),
            target_cores_per_gpu=t.integer("target_cores_per_gpu", 12, minimum=1),
            min_change_fraction=t.number(
                "min_change_fraction", 0.2, minimum=0.0, maximum=1.0, above_minimum=False
            ),
            max_judged_per_cycle=t.integer("max_judged_per_cycle", 25_000, minimum=0),
            timeout_margin_growth=t.number("timeout_margin_growth", 1.5, minimum=1.0),
        )
        t.finish()
        return s


@dataclass(frozen=True, slots=True)
class IdleGpuSettings:
    """When a running job holding idle GPUs is warned, and then requeued or cancelled.

    *Fixed window* (GPUs idle since the job started, every sample zero): first warning at
    ``warn_after`` (60 min), second at ``second_warn_after`` (105 min; None: no second),
    action at ``act_after`` (120 min). *Sliding window* (GPUs that were busy and then
    went idle): warning at ``sliding_warn_after`` (240 min), action at
    ``sliding_act_after`` (300 min). Each step also needs the previous warning to be at
    least ``min_warning_lead`` (15 min) old, so a user always has that long to react.

    - ``idle_fraction`` (1.0): the share of the job's allocated GPUs that must be idle,
      e.g. 0.5 acts on a 4-GPU job with 2 idle GPUs. GPUs without enough samples
      (``min_samples``, 2) or whose last sample is older than ``max_sample_age``
      (10 min) are unknown, and unknown GPUs are never idle.
    - ``action`` (requeue): ``requeue`` | ``cancel`` | ``notify`` (a last notice, no
      change). ``requeue_fallback`` (cancel): what ``requeue`` does for jobs Slurm may
      not requeue (``Job.requeue`` false): ``cancel`` (JDS's behaviour) or ``notify``.
    - ``exempt_interactive`` (true) and ``exempt_partitions``: never considered.
    """

    mode: Mode = Mode.ADVISE
    warn_after: timedelta = timedelta(minutes=60)
    second_warn_after: timedelta | None = timedelta(minutes=105)
    act_after: timedelta = timedelta(minutes=120)
    sliding_warn_after: timedelta = timedelta(minutes=240)
    sliding_act_after: timedelta = timedelta(minutes=300)
    min_warning_lead: timedelta = timedelta(minutes=15)
    action: IdleAction = "requeue"
    requeue_fallback: RequeueFallback = "cancel"
    idle_fraction: float = 1.0
    min_samples: int = 2
    max_sample_age: timedelta = timedelta(minutes=10)
    exempt_interactive: bool = True
    exempt_partitions: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.warn_after <= self.act_after:
            raise PolicyConfigError("act_after", "must not be shorter than warn_after")
        second = self.second_warn_after
        if second is not None and not self.warn_after <= second <= self.act_after:
            raise PolicyConfigError(
                "second_warn_after", "must lie between warn_after and act_after"
            )
        if not self.sliding_warn_after <= self.sliding_act_after:
            raise PolicyConfigError(
                "sliding_act_after", "must not be shorter than sliding_warn_after"
            )
        if not 0.0 < self.idle_fraction <= 1.0:
            raise PolicyConfigError("idle_fraction", "must be a number > 0 and <= 1")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], where: str = "policy.idle_gpu") -> IdleGpuSettings:
        """Return settings from one config table; raise PolicyConfigError on a bad key."""
        t = _Table(d, where)
        kwargs: dict[str, Any] = {
            "mode": t.mode("mode", Mode.ADVISE),
            "warn_after": t.duration("warn_after", timedelta(minutes=60)),
            "second_warn_after": t.optional_duration("second_warn_after", timedelta(minutes=105)),
            "act_after": t.duration("act_after", timedelta(minutes=120)),
            "sliding_warn_after": t.duration("sliding_warn_after", timedelta(minutes=240)),
            "sliding_act_after": t.duration("sliding_act_after", timedelta(minutes=300)),
            "min_warning_lead": t.duration("min_warning_lead", timedelta(minutes=15)),
            "action": t.choice("action", "requeue", IDLE_ACTIONS),
            "requeue_fallback": t.choice("requeue_fallback", "cancel", REQUEUE_FALLBACKS),
            "idle_fraction": t.number(
                "idle_fraction", 1.0, minimum=0.0, maximum=1.0, above_minimum=True
            ),
            "min_samples": t.integer("min_samples", 2, minimum=1),
            "max_sample_age": t.duration(
                "max_sample_age", timedelta(minutes=10), minimum=timedelta(seconds=1)
            ),
            "exempt_interactive": t.boolean("exempt_interactive", True),
            "exempt_partitions": t.names("exempt_partitions", frozenset()),
        }
        t.finish()
        try:
            return cls(**kwargs)
        except PolicyConfigError as exc:
            raise PolicyConfigError(exc.key, exc.message, where=where) from None


GpuConversion = Literal["auto", "always", "never"]
GPU_CONVERSIONS: tuple[GpuConversion, ...] = ("auto", "always", "never")


@dataclass(frozen=True, slots=True)
class ColocateSettings:
    """Which pending 1-GPU jobs are packed onto shared GPUs, and when they are separated.

    Packing (docs/policies.md, "Co-location"):

    - ``mode`` (advise); ``apply_to_all`` (false): only jobs submitted ``--shareable``
      (comment token ``sgpu:shareable``) are packed; true also packs jobs whose history
      alone says they are light.
    - light: mean GPU util of past runs (priors, ``min_history`` runs, 3) at most
      ``max_util_pct`` (40 %); a shareable job without history is taken to be at that
      ceiling. Its GPU memory is the larger of the declared ``--gpu-mem`` and the
      history's peak; unknown memory is never packed.
    - ``device_memory_mib`` (None, written ``"auto"``: the smallest GPU memory the agents
      report) is the memory of one GPU. The shard rule's knobs written in this table,
      ``max_jobs_per_gpu`` (2) and ``memory_margin`` (2 GiB, kept free on every shared
      GPU), are the site's :class:`~slurmgpu.policy.sizing.SizingRules`'
      (:func:`sizing_from_mappings`), as ``sgpu eff``'s shard advice reads them too.
    - ``max_slowdown`` (1.25): the interference model's predicted slowdown of a job and of
      a worst-case partner must stay within it.
    - ``convert_gpu_requests`` (auto): turn ``gres/gpu:1`` requests into shards --
      ``auto`` from Slurm 23.02 on (22.05 refuses to switch a pending job between
      gres/gpu and gres/shard), ``always``, ``never``. A request for one whole GPU's
      shards (``--gres=shard:S``) is narrowed on every version.

    Separation (running jobs sharing a GPU, from the agents' per-process samples): when
    the jobs on one GPU together use ``separate_memory_fraction`` (0.9) of its memory, or
    more than all of it less the margin, or a job's predicted slowdown passes
    ``max_slowdown``, the newest sharing job is requeued onto a whole GPU's shards. A job
    is judged once it has ``min_samples`` (3) samples on that GPU.

    >>> ColocateSettings.from_mapping({"device_memory": "24GiB"}).device_memory_mib
    24576
    """

    mode: Mode = Mode.ADVISE
    apply_to_all: bool = False
    device_memory_mib: int | None = None
    max_util_pct: float = 40.0
    max_slowdown: float = 1.25
    separate_memory_fraction: float = 0.9
    min_history: int = 3
    min_samples: int = 3
    convert_gpu_requests: GpuConversion = "auto"

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], where: str = "policy.colocate") -> ColocateSettings:
        """Return settings from one config table; raise PolicyConfigError on a bad key."""
        t = _Table(d, where)
        s = cls(
            mode=t.mode("mode", Mode.ADVISE),
            apply_to_all=t.boolean("apply_to_all", False),
            device_memory_mib=t.size_mib("device_memory", None),
            max_util_pct=t.number("max_util_pct", 40.0, minimum=0.0, maximum=100.0),
            max_slowdown=t.number("max_slowdown", 1.25, minimum=1.0),
            separate_memory_fraction=t.number(
                "separate_memory_fraction", 0.9, minimum=0.0, maximum=1.0, above_minimum=True
            ),
            min_history=t.integer("min_history", 3, minimum=1),
            min_samples=t.integer("min_samples", 3, minimum=1),
            convert_gpu_requests=cast(
                "GpuConversion", t.choice("convert_gpu_requests", "auto", GPU_CONVERSIONS)
            ),
        )
        t.finish()
        return s


@dataclass(frozen=True, slots=True)
class MalleableSettings:
    """When malleable jobs are shrunk for waiting jobs and expanded into idle GPUs.

    - ``mode`` (advise); ``shrink`` / ``expand`` / ``start_smaller`` (all true): which
      moves are proposed (``start_smaller``: a waiting malleable job's request lowered
      to the GPUs free now).
    - Reconfiguration cost, until resizes here have been measured
      (``PolicySnapshot.resize_cost``, used while ``use_measured_cost``):
      ``checkpoint_time`` (30 s) + ``requeue_delay`` (121 s: Slurm 22.05-25.x's
      credential expiry + 1) + ``startup_time`` (30 s). A waiting job can start after
      its donors' ``checkpoint_time``.
    - ``min_gain`` (0.15): a resize must save at least this share of the job time at
      stake (the waiting job's wait for a shrink; the resized job's remaining time for an
      expansion), after its cost. The dead band is the hysteresis: a move and its reverse
      cannot both pass it.
    - ``min_interval`` (10 min): no resize of a job within this long of its last one.
    - ``min_remaining`` (10 min): the least remaining run time assumed for a running job
      (its estimate is otherwise its history's median run time less its elapsed time, or
      its elapsed time when it has outlived that; never past its time limit).
    - ``max_growth`` (4.0): one expansion at most multiplies a job's GPUs by this.
    - ``reserve_for_blocked`` (true): idle GPUs a waiting job will need once running
      jobs end are not expanded into (as Slurm reserves them for it).
    - ``min_busy_util_pct`` (10): a job whose GPUs average less is never expanded.
    - ``min_history`` (3): past runs of a job's key before its median run time is used.
    - ``scale_time_limit`` (true): a resize (and a start smaller) also sets the job's
      ``TimeLimit`` for its new size (:mod:`slurmgpu.policy.resize_limit`), with
      ``time_limit_headroom`` (1.1) for the speedup curve's error.
    - ``type_aware`` (false): on a cluster of several GPU types, place and grow jobs
      that did not ask for a type on the type where they run fastest (Gavel's idea,
      OSDI'20), from ``type_speed``: per job-name pattern (fnmatch; ``"*"`` is the
      fallback), each type's relative speed, e.g.
      ``type_speed = {"ncf*" = {v100 = 1.0, p100 = 2.17}, "*" = {v100 = 1.0, p100 = 0.8}}``.
      A job that asked for a type is never moved off it.

    >>> MalleableSettings.from_mapping({"min_gain": 0.3}, "policy.malleable").min_gain
    0.3
    >>> s = MalleableSettings.from_mapping({"type_speed": {"*": {"V100": 1, "p100": 0.8}}})
    >>> s.type_speed
    (('*', (('p100', 0.8), ('v100', 1.0))),)
    """

    mode: Mode = Mode.ADVISE
    shrink: bool = True
    expand: bool = True
    start_smaller: bool = True
    checkpoint_time: timedelta = timedelta(seconds=30)
    requeue_delay: timedelta = timedelta(seconds=121)
    startup_time: timedelta = timedelta(seconds=30)
    use_measured_cost: bool = True
    min_gain: float = 0.15
    min_interval: timedelta = timedelta(minutes=10)
    min_remaining: timedelta = timedelta(minutes=10)
    max_growth: float = 4.0
    reserve_for_blocked: bool = True
    min_busy_util_pct: float = 10.0
    min_history: int = 3
    scale_time_limit: bool = True
    time_limit_headroom: float = 1.1
    type_aware: bool = False
    type_speed: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()

    @property
    def default_cost(self) -> timedelta:
        """The reconfiguration cost assumed before any resize was measured."""
        return self.checkpoint_time + self.requeue_delay + self.startup_time

    @classmethod
    def from_mapping(
        cls, d: Mapping[str, Any], where: str = "policy.malleable"
    ) -> MalleableSettings:
        """Return settings from one config table; raise PolicyConfigError on a bad key."""
        t = _Table(d, where)
        s = cls(
            mode=t.mode("mode", Mode.ADVISE),
            shrink=t.boolean("shrink", True),
            expand=t.boolean("expand", True),
            start_smaller=t.boolean("start_smaller", True),
            checkpoint_time=t.duration("checkpoint_time", timedelta(seconds=30)),
            requeue_delay=t.duration("requeue_delay", timedelta(seconds=121)),
            startup_time=t.duration("startup_time", timedelta(seconds=30)),
            use_measured_cost=t.boolean("use_measured_cost", True),
            min_gain=t.number("min_gain", 0.15, minimum=0.0, maximum=1.0),
            min_interval=t.duration("min_interval", timedelta(minutes=10)),
            min_remaining=t.duration("min_remaining", timedelta(minutes=10)),
            max_growth=t.number("max_growth", 4.0, minimum=1.0, above_minimum=True),
            reserve_for_blocked=t.boolean("reserve_for_blocked", True),
            min_busy_util_pct=t.number("min_busy_util_pct", 10.0, minimum=0.0, maximum=100.0),
            min_history=t.integer("min_history", 3, minimum=1),
            scale_time_limit=t.boolean("scale_time_limit", True),
            time_limit_headroom=t.number("time_limit_headroom", 1.1, minimum=1.0),
            type_aware=t.boolean("type_aware", False),
            type_speed=_type_speed_table(t),
        )
        t.finish()
        return s


def _type_speed_table(t: _Table) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """``type_speed``: ``{pattern = {type = speed, ...}, ...}`` (see MalleableSettings)."""
    raw = t.raw.pop("type_speed", None)
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise t.fail("type_speed", "must be a table of job-name patterns")
    out: list[tuple[str, tuple[tuple[str, float], ...]]] = []
    for pattern, speeds in raw.items():
        if not isinstance(speeds, Mapping) or not speeds:
            raise t.fail(
                "type_speed", f"{pattern!r} must map GPU types to speeds, like {{v100 = 1.0}}"
            )
        row: list[tuple[str, float]] = []
        for gpu_type, value in speeds.items():
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(float(value)) or float(value) <= 0:
                raise t.fail(
                    "type_speed", f"{pattern}.{gpu_type} must be a number > 0, not {value!r}"
                )
            row.append((str(gpu_type).lower(), float(value)))
        out.append((str(pattern), tuple(sorted(row))))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class AttainedServiceSettings:
    """Least-attained-service ordering and preemption (``policy.las``), off by default.

    - ``enabled`` (false): the site's opt-in; the daemon runs the policy only when true.
      A job opts in by being checkpointable: submitted ``--malleable`` (it answers the
      checkpoint signal, so it can be preempted through the resize transaction).
    - ``mode`` (advise).
    - ``queue_limits`` ([16] GPU-hours, the Pollux artifact's Tiresias): attained
      GPU-time at which a job drops to the next queue (Tiresias' discretised 2D-LAS);
      the queues are ordered through Slurm's ``Nice`` (``nice_step`` per queue,
      100,000), so within a queue the site's own priority (FIFO, fair share) decides.
    - ``preempt`` (true): a pending job of a better queue that does not fit may take the
      GPUs of running opted-in jobs of worse queues (checkpoint, requeue, back in line).
    - ``shrink`` (true): the GPUs are first sought by shrinking malleable victims (each
      no lower than its ``min_gpus``, the limit raised for the slower size; it keeps
      running and its place), whole preemption only when shrinks cannot free enough;
      ``restart_time`` (30 s) is the checkpoint + start-up the raised limit allows for.
    - ``grow_back`` (unset: automatic): whether this policy gives a job it shrank its
      GPUs back once nobody waits for them. Unset, it does unless the malleable policy
      enforces expansion (that one grows shrunk jobs back itself, pricing each growth).
    - Churn guardrails: ``min_runtime`` (15 min) a job keeps its GPUs after it starts
      before it may be preempted or shrunk; ``max_preemptions_per_cycle`` (4, shrinks
      included); ``min_wait`` (2 min) a job waits before it may preempt anyone.
    """

    enabled: bool = False
    mode: Mode = Mode.ADVISE
    queue_limits: tuple[float, ...] = (16.0,)
    nice_step: int = 100_000
    preempt: bool = True
    min_runtime: timedelta = timedelta(minutes=15)
    max_preemptions_per_cycle: int = 4
    min_wait: timedelta = timedelta(minutes=2)
    shrink: bool = True
    restart_time: timedelta = timedelta(seconds=30)
    grow_back: bool | None = None

    @classmethod
    def from_mapping(
        cls, d: Mapping[str, Any], where: str = "policy.las"
    ) -> AttainedServiceSettings:
        """Return settings from one config table; raise PolicyConfigError on a bad key."""
        t = _Table(d, where)
        limits: tuple[float, ...] = (16.0,)
        if "queue_limits" in t.raw:
            raw = t.raw.pop("queue_limits")
            ok = isinstance(raw, list | tuple) and all(
                isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in raw
            )
            values = [float(v) for v in raw] if ok else []
            if not ok or values != sorted(set(values)):
                raise t.fail(
                    "queue_limits", f"must be increasing GPU-hours like [1, 4, 16], not {raw!r}"
                )
            limits = tuple(values)
        s = cls(
            enabled=t.boolean("enabled", False),
            mode=t.mode("mode", Mode.ADVISE),
            queue_limits=limits,
            nice_step=t.integer("nice_step", 100_000, minimum=1),
            preempt=t.boolean("preempt", True),
            min_runtime=t.duration("min_runtime", timedelta(minutes=15)),
            max_preemptions_per_cycle=t.integer("max_preemptions_per_cycle", 4),
            min_wait=t.duration("min_wait", timedelta(minutes=2)),
            shrink=t.boolean("shrink", True),
            restart_time=t.duration("restart_time", timedelta(seconds=30)),
            grow_back=t.boolean("grow_back", False) if "grow_back" in t.raw else None,
        )
        if (len(s.queue_limits) + 1) * s.nice_step > 2_000_000_000:
            raise t.fail("nice_step", "times the number of queues must stay below 2e9")
        t.finish()
        return s
