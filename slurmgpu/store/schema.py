"""The database schema (SQLAlchemy 2 Core tables). Alembic migrations mirror it exactly.

Tables:
- ``jobs``: one row per job incarnation (a Slurm job id can be reused after slurmctld
  loses its state, so ``id`` is ours and ``job_id`` is Slurm's).
- ``job_events``: state transitions, requeues and disappearances of a job, in order.
- ``nodes``, ``gpus``: the inventory as Slurm and the agents report it.
- ``submissions``: what a job asked slurmgpu for, recorded by the daemon from Slurm's
  view of the job when first seen (store/submission_record.py; ``argv`` only in rows
  ``sgpu submit`` wrote in older releases).
- ``samples``: raw per-job GPU and host usage from node agents (idempotent by sample_uid).
- ``sample_hours``: samples older than the retention, rolled up per job, node, GPU and hour.
- ``held_samples``: samples of jobs the daemon had not seen yet, held out of every reader
  until the job's run is known (then moved to ``samples`` or dropped).
- ``job_summaries``: the per-job usage summary written when a job ends (kept for ever).
- ``actions``: the audit of every policy decision, taken or suppressed.
- ``transactions``: persisted multi-step actions (resize, requeue, co-locate).
- ``meta``: small key/value facts (daemon lease, last cycle).
- ``notifications``: user email decisions (the per-user, per-alert rate limit).
- ``report_*``: per-day rollups of ``sgpu report`` (a cache kept fresh by triggers).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC and always read back timezone-aware (SQLite drops zones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use timezone-aware UTC")
        return value.astimezone(UTC).replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def as_utc(value: Any) -> datetime:
    """Aggregates bypass the column type on SQLite (strings or naive datetimes come back)."""
    if value is None:
        return datetime.fromtimestamp(0, UTC)
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if not isinstance(moment, datetime):
        raise TypeError(f"not a timestamp: {value!r}")
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


TS = UtcDateTime()
# 64-bit ids where rows accumulate fast (20k samples/s passes 2^31 in ~30 h); SQLite's
# autoincrement needs INTEGER, which is 64-bit there anyway.
BIG_ID = BigInteger().with_variant(Integer(), "sqlite")

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False, default=""),
    Column("job_id", BigInteger, nullable=False),
    Column("name", String(256), nullable=False, default=""),
    Column("user", String(64), nullable=False, default=""),
    Column("uid", BigInteger),
    Column("account", String(64), nullable=False, default=""),
    Column("partition", String(512), nullable=False, default=""),
    Column("qos", String(64), nullable=False, default=""),
    Column("state", String(24), nullable=False),
    Column("state_flags", String(256), nullable=False, default=""),
    Column("reason", String(256), nullable=False, default=""),
    Column("array_job_id", BigInteger),
    Column("array_task_id", Integer),
    Column("array_task_spec", String(256)),
    Column("array_max_tasks", Integer),
    Column("submit_time", TS),
    Column("eligible_time", TS),
    Column("start_time", TS),
    Column("end_time", TS),
    Column("time_limit_s", BigInteger),
    Column("cpus", Integer, nullable=False, default=0),
    Column("memory_mib", BigInteger),
    Column("node_count", Integer, nullable=False, default=0),
    Column("tasks", Integer, nullable=False, default=0),
    Column("gpus", Integer, nullable=False, default=0),
    Column("gpus_per_node", Integer),
    Column("gpus_per_job", Integer),
    Column("gpus_per_task", Integer),
    Column("gpu_type", String(64)),
    Column("shards", Integer, nullable=False, default=0),
    Column("shards_per_node", Integer),
    Column("gpu_sources", String(128), nullable=False, default=""),
    Column("nodes", Text, nullable=False, default=""),
    Column("gpu_alloc", JSON, nullable=False, default=list),
    Column("restart_count", Integer, nullable=False, default=0),
    Column("requeue", Boolean, nullable=False, default=False),
    Column("comment", Text, nullable=False, default=""),
    Column("admin_comment", Text, nullable=False, default=""),
    Column("work_dir", Text, nullable=False, default=""),
    Column("command", Text, nullable=False, default=""),
    Column("exit_code", Integer),
    Column("batch", Boolean, nullable=False, default=True),
    Column("first_seen", TS, nullable=False),
    Column("last_seen", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    Column("gone", Boolean, nullable=False, default=False),
    # the job's gres/mps request (migration 0012): total and per node
    Column("mps", Integer, nullable=False, default=0, server_default=text("0")),
    Column("mps_per_node", Integer),
    Index(None, "cluster", "job_id"),
    Index(None, "state"),
    Index(None, "end_time"),
    Index(None, "user"),
)

job_events = Table(
    "job_events",
    metadata,
    Column("id", BIG_ID, primary_key=True, autoincrement=True),
    Column("job_row", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("at", TS, nullable=False),
    Column("kind", String(24), nullable=False),  # submitted | state | requeue | gone | vanished
    Column("from_state", String(24)),
    Column("to_state", String(24)),
    Column("restart_count", Integer, nullable=False, default=0),
    Column("detail", JSON),
    Index(None, "job_row", "at"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("cluster", String(64), primary_key=True, default=""),
    Column("name", String(128), primary_key=True),
    Column("state", String(24), nullable=False),
    Column("state_flags", String(256), nullable=False, default=""),
    Column("cpus", Integer, nullable=False, default=0),
    Column("cpus_allocated", Integer, nullable=False, default=0),
    Column("memory_mib", BigInteger, nullable=False, default=0),
    Column("memory_allocated_mib", BigInteger, nullable=False, default=0),
    Column("gpus", Integer, nullable=False, default=0),
    Column("gpu_type", String(64)),
    Column("shards", Integer, nullable=False, default=0),
    Column("gpus_used", Integer, nullable=False, default=0),
    Column("gpu_indices_used", String(256), nullable=False, default=""),
    Column("shards_used", Integer, nullable=False, default=0),
    Column("partitions", String(256), nullable=False, default=""),
    Column("reason", Text, nullable=False, default=""),
    Column("address", String(256), nullable=False, default=""),
    Column("last_seen", TS, nullable=False),
    # "1g.10gb:4,3g.40gb:2": the node's typed GPUs (migration 0011)
    Column("gpu_types", String(512), nullable=False, default="", server_default=text("''")),
    Column("mps", Integer, nullable=False, default=0, server_default=text("0")),
)

gpus = Table(
    "gpus",
    metadata,
    Column("cluster", String(64), primary_key=True, default=""),
    Column("node", String(128), primary_key=True),
    Column("index", Integer, primary_key=True),  # Slurm's device index on the node
    Column("gpu_type", String(64)),
    Column("uuid", String(64)),
    Column("pci_bus_id", String(32)),
    Column("minor", Integer),
    Column("memory_total_mib", BigInteger),
    Column("last_seen", TS, nullable=False),
)

submissions = Table(
    "submissions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False, default=""),
    Column("job_id", BigInteger, nullable=False),
    Column("submitted_at", TS, nullable=False),
    Column("uid", BigInteger, nullable=False),
    Column("user", String(64), nullable=False, default=""),
    Column("cwd", Text, nullable=False, default=""),
    Column("argv", JSON, nullable=False),
    Column("malleable_min", Integer),
    Column("malleable_max", Integer),
    Column("checkpoint_signal", String(16)),
    Column("checkpoint_grace_s", Integer),
    Column("hints", JSON),
    Index(None, "cluster", "job_id"),
)

samples = Table(
    "samples",
    metadata,
    Column("id", BIG_ID, primary_key=True, autoincrement=True),
    Column("sample_uid", String(128), nullable=False),  # idempotency key from the agent
    Column("cluster", String(64), nullable=False, default=""),
    Column("node", String(128), nullable=False),
    Column("kind", String(4), nullable=False),  # gpu | host
    Column("job_id", BigInteger),  # None: unattributed process or unallocated GPU
    Column("gpu_index", Integer),  # Slurm's device index; None for host samples
    Column("at", TS, nullable=False),
    Column("util_pct", Float),
    Column("memory_used_mib", Float),
    Column("memory_total_mib", Float),
    Column("power_w", Float),
    Column("temperature_c", Float),
    Column("processes", Integer),
    Column("shared", Boolean),
    Column("source", String(8)),  # process | device | idle | error
    Column("cpu_pct", Float),
    Column("cpus_allocated", Integer),
    Column("rss_mib", Float),
    Column("cgroup_memory_mib", Float),
    Column("energy_mj", BigInteger),  # the device's NVML energy counter (migration 0007)
    Column("iowait_pct", Float),  # host: the job's processes' block I/O wait (0007)
    UniqueConstraint("sample_uid"),
    Index(None, "job_id", "kind", "at"),
    Index(None, "at"),
)

# Samples of a job the daemon had not seen (yet) when they arrived (store/sample_hold.py):
# the columns of ``samples`` plus when they arrived. No report, summary, rollup, policy or
# metric reads this table; once Slurm lists the job, each row is checked against where and
# when the job ran and moved to ``samples`` or dropped. Bounded per node and by age.
held_samples = Table(
    "held_samples",
    metadata,
    Column("id", BIG_ID, primary_key=True, autoincrement=True),
    Column("sample_uid", String(128), nullable=False),
    Column("cluster", String(64), nullable=False, default=""),
    Column("node", String(128), nullable=False),
    Column("kind", String(4), nullable=False),
    Column("job_id", BigInteger, nullable=False),
    Column("gpu_index", Integer),
    Column("at", TS, nullable=False),
    Column("util_pct", Float),
    Column("memory_used_mib", Float),
    Column("memory_total_mib", Float),
    Column("power_w", Float),
    Column("temperature_c", Float),
    Column("processes", Integer),
    Column("shared", Boolean),
    Column("source", String(8)),
    Column("cpu_pct", Float),
    Column("cpus_allocated", Integer),
    Column("rss_mib", Float),
    Column("cgroup_memory_mib", Float),
    Column("energy_mj", BigInteger),
    Column("iowait_pct", Float),
    Column("held_at", TS, nullable=False),  # when it arrived: the hold's age limit
    UniqueConstraint("sample_uid"),
    Index(None, "cluster", "node"),
    Index(None, "cluster", "job_id"),
    Index(None, "held_at"),
)

# Raw samples older than the retention (daemon.sample_retention), rolled up per job,
# node, GPU (-1: the host) and UTC hour before they are deleted (store/retention.py).
# Several rows may share a key (samples that arrived after their hour was rolled up):
# readers add them up, every figure being a count, a sum or a max.
sample_hours = Table(
    "sample_hours",
    metadata,
    Column("id", BIG_ID, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False, default=""),
    Column("job_id", BigInteger, nullable=False),
    Column("node", String(128), nullable=False),
    Column("kind", String(4), nullable=False),  # gpu | host
    Column("gpu_index", Integer, nullable=False),  # -1 for host rows
    Column("hour", TS, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("util_n", Integer, nullable=False, default=0),
    Column("util_sum", Float),
    Column("util_max", Float),
    Column("memory_max_mib", Float),
    Column("memory_total_mib", Float),
    Column("first_at", TS),
    Column("last_at", TS),
    Column("last_busy_at", TS),
    Column("shared", Boolean),
    Column("errors", Integer, nullable=False, default=0),
    Column("processes_max", Integer),
    Column("cpu_n", Integer, nullable=False, default=0),
    Column("cpu_sum", Float),
    Column("cpu_max", Float),
    Column("cpus_max", Integer),
    Column("host_memory_max_mib", Float),
    # Energy by store/energy_rule.py (gpu rows) and I/O wait sums (host rows), migration
    # 0009; NULL in hours rolled up before it.
    Column("energy_j", Float),
    Column("idle_energy_j", Float),
    Column("counter_intervals", Integer),
    Column("power_intervals", Integer),
    Column("covered_s", Float),
    Column("power_n", Integer),
    Column("power_sum", Float),
    Column("first_power_w", Float),
    Column("last_power_w", Float),
    Column("iowait_n", Integer),
    Column("iowait_sum", Float),
    Index(None, "cluster", "job_id"),
    Index(None, "hour"),
)

job_summaries = Table(
    "job_summaries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False, default=""),
    Column("job_id", BigInteger, nullable=False),
    Column("created_at", TS, nullable=False),
    Column("summary", JSON, nullable=False),  # jobstats-style per-node/per-GPU summary
    # The job-level figures the reports aggregate (store/summary_columns.py; NULL: unknown).
    Column("gpus_reported", Integer),
    Column("gpus_busy", Integer),
    Column("gpu_util_pct", Float),
    Column("gpu_idle_pct", Float),
    Column("gpu_memory_max_mib", Float),
    Column("cpu_memory_max_mib", Float),
    Column("energy_j", Float),  # the job's GPU energy, and the part on idle GPUs (0007)
    Column("idle_energy_j", Float),
    # Covers the report's join (the job's summary and its figures): on a million jobs,
    # reading the wide summary rows instead took most of a report's time (migration 0006).
    Index(
        "ix_job_summaries_report",
        "cluster",
        "job_id",
        "created_at",
        "gpu_util_pct",
        "gpu_idle_pct",
        "gpus_reported",
        "gpus_busy",
        "cpu_memory_max_mib",
    ),
)

actions = Table(
    "actions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", TS, nullable=False),
    Column("cluster", String(64), nullable=False, default=""),
    Column("job_id", BigInteger),
    Column("policy", String(32), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("mode", String(16), nullable=False),
    Column("taken", Boolean, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("numbers", JSON),
    Column("user", String(64), nullable=False, default=""),
    Column("alert", String(64), nullable=False, default=""),
    Column("fields", JSON),  # the scontrol update fields, for updates
    Column("execute", Boolean, nullable=False, default=False),  # the engine's verdict
    Column("notify", Boolean, nullable=False, default=False),
    Column("suppressed", Text, nullable=False, default=""),  # why a guardrail held it back
    # pending → done | failed | skipped (not executed) | notified; "taken" = done
    Column("outcome", String(32), nullable=False, default="pending"),
    Column("error", Text),
    Column("caller_uid", Integer),
    Column("transaction_id", Integer, ForeignKey("transactions.id")),
    Index(None, "job_id", "at"),
    Index(None, "at"),
)

transactions = Table(
    "transactions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False, default=""),
    Column("job_id", BigInteger, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("state", String(32), nullable=False),
    Column("created_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    Column("deadline", TS),
    Column("attempts", Integer, nullable=False, default=0),
    Column("payload", JSON),
    Column("error", Text),
    Index(None, "state"),
    Index(None, "job_id"),
)

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", TS, nullable=False),
)

# One row per user email decision (sent, rate_limited, dry_run, failed): the per-(user, alert)
# rate limit reads it, and it answers "was this user told about job J, and when?".
notifications = Table(
    "notifications",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False, default=""),
    Column("user", String(64), nullable=False),
    Column("alert", String(64), nullable=False),
    Column("job_id", BigInteger),  # None for admin reports
    Column("sent_at", TS, nullable=False),
    Column("subject", Text, nullable=False, default=""),
    Column("outcome", String(16), nullable=False),  # sent | rate_limited | dry_run | failed
    Index(None, "cluster", "user", "alert", "sent_at"),
)

# -- report rollups (slurmgpu/report/rollup.py) ------------------------------------
# Per UTC day and per hour (``span`` = 86400 or 3600 s, ``bucket`` = seconds since 1970 //
# span of the jobs' end): what ``sgpu report`` would compute from the jobs that ended in
# that bucket, so a 30-day report reads a few thousand rows instead of every job. A cache,
# never the truth: database triggers (migration 0006) mark a day and an hour dirty when a
# finished job of theirs or its summary is written, and the report rebuilds dirty and
# missing buckets from the jobs before reading.

# Buckets whose rollup no longer matches the jobs (written by the triggers only).
report_dirty = Table(
    "report_dirty",
    metadata,
    Column("cluster", String(64), primary_key=True),
    Column("span", Integer, primary_key=True),
    Column("bucket", Integer, primary_key=True),
)

# Buckets whose rollup rows are built, and with which settings (shard ratio, thresholds).
report_built = Table(
    "report_built",
    metadata,
    Column("cluster", String(64), primary_key=True),
    Column("span", Integer, primary_key=True),
    Column("bucket", Integer, primary_key=True),
    Column("fingerprint", String(256), nullable=False),
    Column("built_at", TS, nullable=False),
)

# Figures per (bucket, user, account, partition): the report's group rows and totals.
report_rollup_groups = Table(
    "report_rollup_groups",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False),
    Column("span", Integer, nullable=False),
    Column("bucket", Integer, nullable=False),
    Column("user", String(64)),
    Column("account", String(64)),
    Column("partition", String(512)),
    Column("jobs", Integer, nullable=False),
    Column("jobs_with_usage", Integer, nullable=False),
    Column("alloc", Float, nullable=False),
    Column("known", Float, nullable=False),
    Column("used", Float, nullable=False),
    Column("idle", Float, nullable=False),
    Column("unused", Float, nullable=False),
    Column("flagged", Integer, nullable=False),
    Column("flag_idle", Integer, nullable=False),
    Column("flag_low_util", Integer, nullable=False),
    Column("flag_time", Integer, nullable=False),
    Column("flag_memory", Integer, nullable=False),
    Column("flag_gpus", Integer, nullable=False),
    Column("wait_sum", Float),
    Column("wait_n", Integer, nullable=False),
    Column("wait_max", Float),
    Index(None, "cluster", "span", "bucket"),
)

# Jobs per (bucket, utilisation bin, queue-wait bin): the histogram, series and waits.
report_rollup_cells = Table(
    "report_rollup_cells",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False),
    Column("span", Integer, nullable=False),
    Column("bucket", Integer, nullable=False),
    Column("hbin", Integer, nullable=False),
    Column("wbin", Integer, nullable=False),
    Column("jobs", Integer, nullable=False),
    Column("alloc", Float, nullable=False),
    Column("known", Float, nullable=False),
    Column("used", Float, nullable=False),
    Column("idle", Float, nullable=False),
    Index(None, "cluster", "span", "bucket"),
)

# Each bucket's candidates for the report's job lists: the most wasteful flagged jobs
# (``list`` = "flagged") and each user's, account's and partition's worst jobs (``list`` =
# "user" | "account" | "partition", ``grp`` its name). A window's top N is among its
# buckets' top N, so the lists stay exact.
report_rollup_jobs = Table(
    "report_rollup_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False),
    Column("span", Integer, nullable=False),
    Column("bucket", Integer, nullable=False),
    Column("list", String(16), nullable=False),
    Column("grp", String(512)),
    Column("job_id", BigInteger, nullable=False),
    Column("name", String(256)),
    Column("user", String(64)),
    Column("account", String(64)),
    Column("partition", String(512)),
    Column("state", String(24)),
    Column("gpus", Float),
    Column("elapsed_s", Float),
    Column("alloc_h", Float),
    Column("used_h", Float),
    Column("idle_h", Float),
    Column("waste_h", Float),
    Column("util_pct", Float),
    Column("flag_idle", Integer),
    Column("flag_low_util", Integer),
    Column("flag_time", Integer),
    Column("flag_memory", Integer),
    Column("flag_gpus", Integer),
    Index(None, "cluster", "list", "span", "bucket"),
)
