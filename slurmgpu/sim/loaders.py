"""Trace loaders: Pollux workloads, the Philly trace, sacct exports and a generic CSV.

Every loader returns :class:`~slurmgpu.sim.workload.TraceJob` values sorted by submit
time, with submit times in seconds from the first job. A bad row raises
:class:`TraceError` naming the file and line (``philly.csv, line 12: duration must be a
number of seconds, not 'abc'``); nothing is half-loaded.

Formats (``load_trace`` picks one by content):

- **Pollux** (``name,time,application,num_replicas,batch_size``): a profiled job per
  row (:class:`~slurmgpu.sim.workload.ProfiledJob`); the user is drawn from
  ``users`` (8) seeded names, the job name is the application (so history repeats the
  way a user's resubmissions do); every job is malleable between 1 GPU and the most its
  batch size allows (at most the cluster).
- **Philly** (``timestamp,duration,num_gpus,gpu_time,cluster``): a rigid job per row;
  the Philly virtual cluster is the account and the user, and the name is
  ``philly-<num_gpus>g`` (the trace has no job names).
- **sacct JSON** (``sacct --json``): decoded by the daemon's own sacct decoder; every
  finished job with a start and an end becomes a rigid job of its elapsed time, with its
  real user, name, partition, GPUs and time limit.
- **sacct --parsable2** (``|``-separated, header line first) with at least
  ``JobID|User|JobName|Submit|Start|End|AllocTRES|Timelimit``; ``Partition`` and ``State``
  are used when present, job steps (``123.batch``) skipped.
- **generic CSV** with a header: ``submit_s,duration_s,gpus`` required; optional
  ``user``, ``name``, ``time_limit_s``, ``shards``, ``util_pct``, ``memory_mib``,
  ``min_gpus``, ``max_gpus`` (a malleable range), ``application`` and ``batch_size``
  (then the duration comes from the profile and ``duration_s`` may be empty).
- **Lucid pairs** (``shared/data/lucid/colocate_info.csv``): not a trace but the
  measurements a seeded fractional-GPU workload is drawn from
  (:func:`slurmgpu.sim.lucid.lucid_workload`: 600 1-GPU jobs offered at the cluster's
  GPUs, ``seed`` as everywhere).

Time limits missing from a trace are drawn from the seeded
:class:`~slurmgpu.sim.workload.TimeLimitModel`.
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from slurmgpu.sim.lucid import LucidError, lucid_workload, parse_lucid_pairs, solo_profiles
from slurmgpu.sim.profiles import APPLICATIONS, ThroughputProfile
from slurmgpu.sim.workload import (
    JobModel,
    MalleableRange,
    ProfiledJob,
    RigidJob,
    TimeLimitModel,
    TraceJob,
)
from slurmgpu.tokens import malleable_token

__all__ = [
    "TraceError",
    "detect_format",
    "load_generic_csv",
    "load_philly",
    "load_pollux",
    "load_sacct_json",
    "load_sacct_parsable",
    "load_trace",
]

FORMATS = ("pollux", "philly", "sacct-json", "sacct", "csv", "lucid")


class TraceError(ValueError):
    """A trace that cannot be loaded; the message names the file and line."""


# Bounds on what one row may say. Past them a trace is wrong, not big: the simulator
# would overflow its clock (durations, times) or spend minutes placing one job (GPUs).
MAX_SECONDS = 1e9  # ~31.7 years: durations, time limits, and the trace's whole span
MAX_GPUS = 10_000  # GPUs (or shards) of one job
MAX_COUNT = 10**9  # other counts (batch size)
MAX_SUBMIT = 1e11  # submit times: seconds from any origin (Unix time included)


def _show(value: object, limit: int = 40) -> str:
    """``repr`` of a value from the trace, cut so that an error stays one short line."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text)} chars)"
    return repr(text)


def _rng(seed: int, salt: str) -> random.Random:
    return random.Random(f"{seed}:{salt}")  # noqa: S311 - reproducible draws, not secrets


def _where(path: str, line: int) -> str:
    return f"{Path(path).name}, line {line}"


def _number(
    row: Mapping[str, str | None],
    key: str,
    where: str,
    what: str,
    maximum: float = MAX_SECONDS,
) -> float:
    raw = (row.get(key) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{where}: {key} must be {what}, not {_show(raw)}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: {key} must be {what}, not {_show(raw)}")
    if value > maximum:
        raise TraceError(f"{where}: {key} must be {what} up to {maximum:g}, not {_show(raw)}")
    return value


def _count(
    row: Mapping[str, str | None],
    key: str,
    where: str,
    minimum: int = 1,
    maximum: int = MAX_GPUS,
) -> int:
    what = f"a whole number >= {minimum}"
    value = _number(row, key, where, what, maximum)
    if value != int(value) or value < minimum:
        raise TraceError(
            f"{where}: {key} must be {what}, not {_show((row.get(key) or '').strip())}"
        )
    return int(value)


def _reader(
    text: str, path: str, required: Sequence[str], delimiter: str = ","
) -> csv.DictReader[str]:
    # newline="": the csv module sees \r, \n and \r\n line ends itself (a lone \r is
    # a line end, not "new-line character seen in unquoted field").
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        fields = reader.fieldnames or []
    except csv.Error as exc:
        raise TraceError(f"{_where(path, reader.line_num + 1)}: not valid CSV: {exc}") from None
    missing = [c for c in required if c not in fields]
    if missing:
        found = ", ".join(_show(f, 20) for f in fields[:12]) or "nothing"
        raise TraceError(
            f"{Path(path).name}, line {reader.line_num or 1}: missing column(s) "
            f"{', '.join(missing)} (found: {found})"
        )
    return reader


def _rows(reader: csv.DictReader[str], path: str) -> Iterator[tuple[int, dict[str, str | None]]]:
    """Each row with the file line it starts on (blank lines and quoted line breaks count)."""
    while True:
        before = reader.line_num
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            line = reader.line_num + 1  # the line it could not read is not counted yet
            raise TraceError(f"{_where(path, line)}: not valid CSV: {exc}") from None
        values = [v for v in row.values() if isinstance(v, str)]
        breaks = sum(v.count("\n") + v.count("\r") - v.count("\r\n") for v in values)
        yield max(before + 1, reader.line_num - breaks), row


def _finish(jobs: list[TraceJob], path: str) -> list[TraceJob]:
    if not jobs:
        raise TraceError(f"{Path(path).name}: no jobs in the trace")
    jobs.sort(key=lambda j: (j.submit_s, j.line))
    t0 = jobs[0].submit_s
    last = jobs[-1]
    if last.submit_s - t0 > MAX_SECONDS:
        raise TraceError(
            f"{_where(path, last.line)}: submitted {last.submit_s - t0:.3g} s after the first "
            f"job (line {jobs[0].line}); a trace may span at most {MAX_SECONDS:g} s"
        )
    for j in jobs:
        j.submit_s -= t0
    return jobs


def _limits(jobs: list[TraceJob], seed: int, gpus_per_node: int, model: TimeLimitModel) -> None:
    rng = _rng(seed, "time-limit")
    for j in jobs:
        if j.time_limit_s is None:
            j.time_limit_s = model.limit(j.model.run_time(max(1, j.gpus), gpus_per_node), rng)


def load_pollux(
    text: str,
    path: str,
    profiles: Mapping[str, ThroughputProfile],
    *,
    seed: int = 1,
    users: int = 8,
    gpus_per_node: int = 4,
    max_gpus: int = 64,
    limits: TimeLimitModel | None = None,
) -> list[TraceJob]:
    """Pollux workload CSV → profiled, malleable jobs (see the module docstring)."""
    reader = _reader(text, path, ("time", "application", "num_replicas", "batch_size"))
    rng = _rng(seed, "pollux-user")
    jobs: list[TraceJob] = []
    for line, row in _rows(reader, path):
        where = _where(path, line)
        app_name = (row.get("application") or "").strip()
        if app_name not in APPLICATIONS:
            raise TraceError(
                f"{where}: unknown application {_show(app_name)} "
                f"(known: {', '.join(sorted(APPLICATIONS))})"
            )
        if app_name not in profiles:
            raise TraceError(f"{where}: no throughput profile for {app_name}")
        submit = _number(row, "time", where, "seconds >= 0", MAX_SUBMIT)
        replicas = _count(row, "num_replicas", where)
        batch = _count(row, "batch_size", where, maximum=MAX_COUNT)
        profile = profiles[app_name]
        model = ProfiledJob(APPLICATIONS[app_name], profile, batch)
        top = min(max_gpus, max(replicas, profile.max_replicas(batch)))
        jobs.append(
            TraceJob(
                submit_s=submit,
                name=app_name,
                user=f"user{rng.randrange(users) + 1}",
                model=model,
                gpus=min(replicas, max_gpus),
                malleable=MalleableRange(1, top),
                line=line,
                comment=malleable_token(1, top),
            )
        )
    jobs = _finish(jobs, path)
    _limits(jobs, seed, gpus_per_node, limits or TimeLimitModel())
    return jobs


def load_philly(
    text: str,
    path: str,
    *,
    seed: int = 1,
    gpus_per_node: int = 4,
    max_gpus: int | None = None,
    limits: TimeLimitModel | None = None,
) -> list[TraceJob]:
    """Philly CSV → rigid jobs of their measured duration."""
    reader = _reader(text, path, ("timestamp", "duration", "num_gpus"))
    jobs: list[TraceJob] = []
    for line, row in _rows(reader, path):
        where = _where(path, line)
        stamp = (row.get("timestamp") or "").strip()
        try:
            when = datetime.fromisoformat(stamp).replace(tzinfo=UTC)
        except ValueError:
            raise TraceError(
                f"{where}: timestamp must look like 2017-10-09 07:01:55, not {_show(stamp)}"
            ) from None
        duration = _number(row, "duration", where, "a number of seconds")
        gpus = _count(row, "num_gpus", where)
        if max_gpus is not None:
            gpus = min(gpus, max_gpus)
        vc = (row.get("cluster") or "philly").strip() or "philly"
        jobs.append(
            TraceJob(
                submit_s=when.timestamp(),
                name=f"philly-{gpus}g",
                user=vc,
                account=vc,
                model=RigidJob(max(1.0, duration), gpus),
                gpus=gpus,
                line=line,
            )
        )
    jobs = _finish(jobs, path)
    _limits(jobs, seed, gpus_per_node, limits or TimeLimitModel())
    return jobs


def load_generic_csv(
    text: str,
    path: str,
    profiles: Mapping[str, ThroughputProfile] | None = None,
    *,
    seed: int = 1,
    gpus_per_node: int = 4,
    limits: TimeLimitModel | None = None,
) -> list[TraceJob]:
    """The documented generic CSV (see the module docstring)."""
    reader = _reader(text, path, ("submit_s", "gpus"))
    jobs: list[TraceJob] = []
    for line, row in _rows(reader, path):
        where = _where(path, line)
        submit = _number(row, "submit_s", where, "seconds >= 0", MAX_SUBMIT)
        shards = _count(row, "shards", where, 0) if (row.get("shards") or "").strip() else 0
        gpus = _count(row, "gpus", where, 0 if shards else 1)
        app_name = (row.get("application") or "").strip()
        model: JobModel
        if app_name:
            if app_name not in APPLICATIONS or not profiles or app_name not in profiles:
                raise TraceError(f"{where}: no profile for application {_show(app_name)}")
            model = ProfiledJob(
                APPLICATIONS[app_name],
                profiles[app_name],
                _count(row, "batch_size", where, maximum=MAX_COUNT),
            )
        else:
            duration = _number(row, "duration_s", where, "a number of seconds")
            model = RigidJob(max(1.0, duration), max(1, gpus))
        if (row.get("util_pct") or "").strip():
            model.util_pct = _number(row, "util_pct", where, "a percentage", 100.0)
        if (row.get("memory_mib") or "").strip():
            model.memory_mib = _number(row, "memory_mib", where, "MiB", 1e9)
        malleable = None
        if (row.get("min_gpus") or "").strip() or (row.get("max_gpus") or "").strip():
            lo = _count(row, "min_gpus", where)
            hi = _count(row, "max_gpus", where)
            if hi < lo:
                raise TraceError(f"{where}: max_gpus {hi} is below min_gpus {lo}")
            malleable = MalleableRange(lo, hi)
        limit = None
        if (row.get("time_limit_s") or "").strip():
            limit = _number(row, "time_limit_s", where, "a number of seconds")
        name = (row.get("name") or "").strip() or (app_name or f"job-{gpus}g")
        jobs.append(
            TraceJob(
                submit_s=submit,
                name=name,
                user=(row.get("user") or "").strip() or "user1",
                model=model,
                gpus=gpus,
                shards=shards,
                time_limit_s=limit,
                malleable=malleable,
                line=line,
                comment=(
                    malleable_token(malleable.min_gpus, malleable.max_gpus) if malleable else ""
                ),
            )
        )
    jobs = _finish(jobs, path)
    _limits(jobs, seed, gpus_per_node, limits or TimeLimitModel())
    return jobs


def load_sacct_json(
    text: str, path: str, *, seed: int = 1, gpus_per_node: int = 4
) -> list[TraceJob]:
    """``sacct --json`` → rigid jobs of their elapsed time (the daemon's decoder)."""
    from slurmgpu.slurm.client import SlurmError, SlurmParseError
    from slurmgpu.slurm.sacct import decode_sacct

    try:
        records, _ = decode_sacct(text)
    except SlurmParseError as exc:
        raise TraceError(f"{Path(path).name}: not a sacct --json document: {exc}") from None
    except SlurmError as exc:  # the export holds sacct's own errors, not jobs
        raise TraceError(f"{Path(path).name}: the sacct export reports an error: {exc}") from None
    jobs: list[TraceJob] = []
    for index, job in enumerate(records, 1):
        if job.start_time is None or job.end_time is None or job.submit_time is None:
            continue
        gpus = job.gpus.gpus or job.allocated_gpus
        if gpus <= 0:
            continue
        elapsed = max(1.0, (job.end_time - job.start_time).total_seconds())
        limit = None if job.time_limit is None else job.time_limit.total_seconds()
        _check_run(f"{Path(path).name}, job {job.job_id} (record {index})", gpus, elapsed, limit)
        jobs.append(
            TraceJob(
                submit_s=job.submit_time.timestamp(),
                name=job.name,
                user=job.user,
                account=job.account,
                partition=job.partition or "gpu",
                model=RigidJob(elapsed, gpus),
                gpus=gpus,
                time_limit_s=limit,
                line=index,
            )
        )
    if not jobs:
        raise TraceError(f"{Path(path).name}: no finished GPU jobs in the sacct export")
    jobs = _finish(jobs, path)
    _limits(jobs, seed, gpus_per_node, TimeLimitModel())
    return jobs


def _check_run(where: str, gpus: int, elapsed: float, limit: float | None) -> None:
    """Refuse a finished job whose numbers no simulation can take (see MAX_*)."""
    if gpus > MAX_GPUS:
        raise TraceError(f"{where}: {gpus} GPUs; a job may have at most {MAX_GPUS}")
    if elapsed > MAX_SECONDS:
        raise TraceError(f"{where}: ran {elapsed:.3g} s; at most {MAX_SECONDS:g} s")
    if limit is not None and limit > MAX_SECONDS:
        raise TraceError(f"{where}: time limit {limit:.3g} s; at most {MAX_SECONDS:g} s")


def _sacct_time(value: str, where: str, key: str) -> float | None:
    v = value.strip()
    if v in ("", "Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(v).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise TraceError(
            f"{where}: {key} must be a time like 2024-01-02T03:04:05, not {_show(v)}"
        ) from None


def load_sacct_parsable(
    text: str, path: str, *, seed: int = 1, gpus_per_node: int = 4
) -> list[TraceJob]:
    """``sacct --parsable2 --format=JobID,User,JobName,Submit,Start,End,AllocTRES,Timelimit``."""
    from slurmgpu.slurm.parse import parse_time_limit, parse_tres

    required = ("JobID", "User", "JobName", "Submit", "Start", "End", "AllocTRES", "Timelimit")
    reader = _reader(text, path, required, delimiter="|")
    jobs: list[TraceJob] = []
    for line, row in _rows(reader, path):
        where = _where(path, line)
        job_id = (row.get("JobID") or "").strip()
        if "." in job_id or not job_id:
            continue  # a job step, or an empty line
        submit = _sacct_time(row.get("Submit") or "", where, "Submit")
        start = _sacct_time(row.get("Start") or "", where, "Start")
        end = _sacct_time(row.get("End") or "", where, "End")
        if submit is None or start is None or end is None:
            continue  # never ran, or still running
        try:
            tres = parse_tres(row.get("AllocTRES") or "")
        except ValueError as exc:
            raise TraceError(f"{where}: AllocTRES: {exc}") from None
        gpus = tres.gres.get("gpu", 0) or sum(
            v for k, v in tres.gres.items() if k.startswith("gpu:")
        )
        if gpus <= 0:
            continue
        try:
            limit = parse_time_limit((row.get("Timelimit") or "").strip() or None)
        except ValueError:
            raise TraceError(
                f"{where}: Timelimit must look like 1-02:00:00 or UNLIMITED, "
                f"not {_show(row.get('Timelimit') or '')}"
            ) from None
        seconds = None if limit is None else limit.total_seconds()
        _check_run(where, gpus, end - start, seconds)
        jobs.append(
            TraceJob(
                submit_s=submit,
                name=(row.get("JobName") or "").strip() or job_id,
                user=(row.get("User") or "").strip() or "unknown",
                partition=(row.get("Partition") or "").strip() or "gpu",
                model=RigidJob(max(1.0, end - start), gpus),
                gpus=gpus,
                time_limit_s=seconds,
                line=line,
            )
        )
    jobs = _finish(jobs, path)
    _limits(jobs, seed, gpus_per_node, TimeLimitModel())
    return jobs


def detect_format(text: str) -> str:
    """Guess the format from the first line (see FORMATS)."""
    head = text.lstrip()[:4096]
    if head.startswith("{"):
        return "sacct-json"
    first = head.splitlines()[0] if head else ""
    cols = {c.strip() for c in first.replace("|", ",").split(",")}
    if "|" in first and "JobID" in cols:
        return "sacct"
    if {"application", "num_replicas", "batch_size"} <= cols:
        return "pollux"
    if {"timestamp", "duration", "num_gpus"} <= cols:
        return "philly"
    if {"submit_s", "gpus"} <= cols:
        return "csv"
    if {"model1", "model2", "speed1", "speed2", "gmem"} <= cols:
        return "lucid"
    raise TraceError(
        "cannot tell the trace format from its first line; expected a Pollux workload, "
        "the Philly CSV, sacct --json, sacct --parsable2, the generic CSV or Lucid's "
        "colocate_info.csv (docs/simulator.md)"
    )


def load_trace(
    path: Path,
    profiles: Mapping[str, ThroughputProfile] | None,
    *,
    seed: int = 1,
    gpus_per_node: int = 4,
    max_gpus: int = 64,
    fmt: str | None = None,
) -> list[TraceJob]:
    """Read and load a trace file of any supported format."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file") from None
    kind = fmt or detect_format(text)
    name = str(path)
    if kind == "pollux":
        if not profiles:
            raise TraceError(f"{path.name}: a Pollux workload needs the throughput profiles")
        return load_pollux(
            text, name, profiles, seed=seed, gpus_per_node=gpus_per_node, max_gpus=max_gpus
        )
    if kind == "philly":
        return load_philly(text, name, seed=seed, gpus_per_node=gpus_per_node, max_gpus=max_gpus)
    if kind == "sacct-json":
        return load_sacct_json(text, name, seed=seed, gpus_per_node=gpus_per_node)
    if kind == "sacct":
        return load_sacct_parsable(text, name, seed=seed, gpus_per_node=gpus_per_node)
    if kind == "csv":
        return load_generic_csv(text, name, profiles, seed=seed, gpus_per_node=gpus_per_node)
    if kind == "lucid":
        try:
            return lucid_workload(solo_profiles(parse_lucid_pairs(text, name)), max_gpus, seed=seed)
        except LucidError as exc:
            raise TraceError(str(exc)) from None
    raise TraceError(f"unknown trace format {kind!r} (one of {', '.join(FORMATS)})")
