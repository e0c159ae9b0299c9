"""report rollups: per-day and per-hour figures of finished jobs, kept fresh by triggers

Revision ID: 0006
Revises: 0005

Also replaces the (cluster, job_id) index of job_summaries with one that covers the
report's join.

The rollup tables are a cache of what ``sgpu report`` computes from the jobs of one UTC
day or hour (slurmgpu/report/rollup.py). Triggers on ``jobs`` and
``job_summaries`` mark the day and the hour of every finished job whose report figures
may have changed in ``report_dirty``; the report rebuilds those before it reads. Buckets
never built have no ``report_built`` row and are built on first use, so no backfill is
needed here.

SQLite drops a table's triggers when Alembic's batch mode recreates the table: a later
migration that batch-alters ``jobs`` or ``job_summaries`` must create them again (the
report checks that they exist and reads the jobs directly when they do not).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import slurmgpu.store.schema

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Terminal job states as of this revision (JobState.is_terminal); the report counts only
# these, so changes to other rows cannot alter a rollup.
_TERMINAL = (
    "'COMPLETED', 'CANCELLED', 'FAILED', 'TIMEOUT', 'NODE_FAIL', 'PREEMPTED', 'BOOT_FAIL', "
    "'DEADLINE', 'OUT_OF_MEMORY', 'UNKNOWN'"
)
# The jobs columns the report reads: an update that changes none of them (last_seen,
# updated_at, ...) leaves the day's rollup valid.
_READ = (
    "cluster",
    "job_id",
    "name",
    '"user"',
    "account",
    "partition",
    "state",
    "submit_time",
    "eligible_time",
    "start_time",
    "end_time",
    "time_limit_s",
    "memory_mib",
    "gpus",
    "shards",
)
_TRIGGERS = (
    ("report_dirty_jobs_insert", "jobs"),
    ("report_dirty_jobs_update", "jobs"),
    ("report_dirty_jobs_delete", "jobs"),
    ("report_dirty_summaries_insert", "job_summaries"),
    ("report_dirty_summaries_update", "job_summaries"),
    ("report_dirty_summaries_delete", "job_summaries"),
)


def _row(prefix: str) -> str:
    return "(" + ", ".join(f"{prefix}.{c}" for c in _READ) + ")"


_SPANS = (86400, 3600)  # a day and an hour


def _sqlite_mark_job(row: str) -> str:
    out = []
    for span in _SPANS:
        bucket = f"unixepoch({row}.end_time) / {span}"
        out.append(
            f"INSERT INTO report_dirty (cluster, span, bucket) "
            f"SELECT {row}.cluster, {span}, {bucket} "
            f"WHERE {row}.end_time IS NOT NULL AND {row}.state IN ({_TERMINAL}) "
            f"AND NOT EXISTS (SELECT 1 FROM report_dirty d WHERE d.cluster = {row}.cluster "
            f"AND d.span = {span} AND d.bucket = {bucket});"
        )
    return " ".join(out)


def _sqlite_mark_summary(row: str) -> str:
    out = []
    for span in _SPANS:
        bucket = f"unixepoch(j.end_time) / {span}"
        out.append(
            f"INSERT INTO report_dirty (cluster, span, bucket) "
            f"SELECT DISTINCT j.cluster, {span}, {bucket} FROM jobs j "
            f"WHERE j.cluster = {row}.cluster AND j.job_id = {row}.job_id "
            f"AND j.end_time IS NOT NULL AND NOT EXISTS (SELECT 1 FROM report_dirty d "
            f"WHERE d.cluster = j.cluster AND d.span = {span} AND d.bucket = {bucket});"
        )
    return " ".join(out)


def _sqlite_triggers() -> list[str]:
    return [
        f"CREATE TRIGGER report_dirty_jobs_insert AFTER INSERT ON jobs "
        f"BEGIN {_sqlite_mark_job('NEW')} END",
        f"CREATE TRIGGER report_dirty_jobs_update AFTER UPDATE ON jobs "
        f"WHEN {_row('OLD')} IS NOT {_row('NEW')} "
        f"BEGIN {_sqlite_mark_job('OLD')} {_sqlite_mark_job('NEW')} END",
        f"CREATE TRIGGER report_dirty_jobs_delete AFTER DELETE ON jobs "
        f"BEGIN {_sqlite_mark_job('OLD')} END",
        f"CREATE TRIGGER report_dirty_summaries_insert AFTER INSERT ON job_summaries "
        f"BEGIN {_sqlite_mark_summary('NEW')} END",
        f"CREATE TRIGGER report_dirty_summaries_update AFTER UPDATE ON job_summaries "
        f"BEGIN {_sqlite_mark_summary('OLD')} {_sqlite_mark_summary('NEW')} END",
        f"CREATE TRIGGER report_dirty_summaries_delete AFTER DELETE ON job_summaries "
        f"BEGIN {_sqlite_mark_summary('OLD')} END",
    ]


def _pg_bucket(column: str, span: int) -> str:
    return f"floor(extract(epoch FROM {column}) / {span})::integer"


def _pg_mark_job(row: str) -> str:
    values = ", ".join(
        f"({row}.cluster, {span}, {_pg_bucket(f'{row}.end_time', span)})" for span in _SPANS
    )
    return (
        f"IF {row}.end_time IS NOT NULL AND {row}.state IN ({_TERMINAL}) THEN "
        f"INSERT INTO report_dirty (cluster, span, bucket) VALUES {values} "
        f"ON CONFLICT DO NOTHING; END IF;"
    )


def _pg_mark_summary(row: str) -> str:
    return " ".join(
        f"INSERT INTO report_dirty (cluster, span, bucket) SELECT DISTINCT j.cluster, {span}, "
        f"{_pg_bucket('j.end_time', span)} FROM jobs j "
        f"WHERE j.cluster = {row}.cluster AND j.job_id = {row}.job_id "
        f"AND j.end_time IS NOT NULL ON CONFLICT DO NOTHING;"
        for span in _SPANS
    )


def _pg_statements() -> list[str]:
    def function(name: str, mark: str) -> str:
        return (
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF TG_OP <> 'INSERT' THEN {mark.replace('ROW', 'OLD')} END IF; "
            f"IF TG_OP <> 'DELETE' THEN {mark.replace('ROW', 'NEW')} END IF; "
            f"RETURN NULL; END $$"
        )

    run_jobs = "FOR EACH ROW EXECUTE FUNCTION report_dirty_jobs()"
    run_summaries = "FOR EACH ROW EXECUTE FUNCTION report_dirty_summaries()"
    return [
        function("report_dirty_jobs", _pg_mark_job("ROW")),
        function("report_dirty_summaries", _pg_mark_summary("ROW")),
        f"CREATE TRIGGER report_dirty_jobs_insert AFTER INSERT ON jobs {run_jobs}",
        f"CREATE TRIGGER report_dirty_jobs_update AFTER UPDATE ON jobs "
        f"FOR EACH ROW WHEN ({_row('OLD')} IS DISTINCT FROM {_row('NEW')}) "
        f"EXECUTE FUNCTION report_dirty_jobs()",
        f"CREATE TRIGGER report_dirty_jobs_delete AFTER DELETE ON jobs {run_jobs}",
        f"CREATE TRIGGER report_dirty_summaries_insert AFTER INSERT ON job_summaries "
        f"{run_summaries}",
        f"CREATE TRIGGER report_dirty_summaries_update AFTER UPDATE ON job_summaries "
        f"{run_summaries}",
        f"CREATE TRIGGER report_dirty_summaries_delete AFTER DELETE ON job_summaries "
        f"{run_summaries}",
    ]


_COVERED = (
    "cluster",
    "job_id",
    "created_at",
    "gpu_util_pct",
    "gpu_idle_pct",
    "gpus_reported",
    "gpus_busy",
    "cpu_memory_max_mib",
)


def upgrade() -> None:
    # The report's join reads the summary figures from this index, not the wide rows; it
    # serves every lookup the (cluster, job_id) index served.
    op.create_index("ix_job_summaries_report", "job_summaries", list(_COVERED))
    op.drop_index("ix_job_summaries_cluster_job_id", table_name="job_summaries")
    op.create_table(
        "report_dirty",
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("span", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "span", "bucket", name=op.f("pk_report_dirty")),
    )
    op.create_table(
        "report_built",
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("span", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=256), nullable=False),
        sa.Column("built_at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "span", "bucket", name=op.f("pk_report_built")),
    )
    op.create_table(
        "report_rollup_groups",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("span", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=True),
        sa.Column("account", sa.String(length=64), nullable=True),
        sa.Column("partition", sa.String(length=512), nullable=True),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("jobs_with_usage", sa.Integer(), nullable=False),
        sa.Column("alloc", sa.Float(), nullable=False),
        sa.Column("known", sa.Float(), nullable=False),
        sa.Column("used", sa.Float(), nullable=False),
        sa.Column("idle", sa.Float(), nullable=False),
        sa.Column("unused", sa.Float(), nullable=False),
        sa.Column("flagged", sa.Integer(), nullable=False),
        sa.Column("flag_idle", sa.Integer(), nullable=False),
        sa.Column("flag_low_util", sa.Integer(), nullable=False),
        sa.Column("flag_time", sa.Integer(), nullable=False),
        sa.Column("flag_memory", sa.Integer(), nullable=False),
        sa.Column("flag_gpus", sa.Integer(), nullable=False),
        sa.Column("wait_sum", sa.Float(), nullable=True),
        sa.Column("wait_n", sa.Integer(), nullable=False),
        sa.Column("wait_max", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_report_rollup_groups")),
    )
    op.create_index(
        op.f("ix_report_rollup_groups_cluster_span_bucket"),
        "report_rollup_groups",
        ["cluster", "span", "bucket"],
    )
    op.create_table(
        "report_rollup_cells",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("span", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("hbin", sa.Integer(), nullable=False),
        sa.Column("wbin", sa.Integer(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("alloc", sa.Float(), nullable=False),
        sa.Column("known", sa.Float(), nullable=False),
        sa.Column("used", sa.Float(), nullable=False),
        sa.Column("idle", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_report_rollup_cells")),
    )
    op.create_index(
        op.f("ix_report_rollup_cells_cluster_span_bucket"),
        "report_rollup_cells",
        ["cluster", "span", "bucket"],
    )
    op.create_table(
        "report_rollup_jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("span", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("list", sa.String(length=16), nullable=False),
        sa.Column("grp", sa.String(length=512), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=True),
        sa.Column("user", sa.String(length=64), nullable=True),
        sa.Column("account", sa.String(length=64), nullable=True),
        sa.Column("partition", sa.String(length=512), nullable=True),
        sa.Column("state", sa.String(length=24), nullable=True),
        sa.Column("gpus", sa.Float(), nullable=True),
        sa.Column("elapsed_s", sa.Float(), nullable=True),
        sa.Column("alloc_h", sa.Float(), nullable=True),
        sa.Column("used_h", sa.Float(), nullable=True),
        sa.Column("idle_h", sa.Float(), nullable=True),
        sa.Column("waste_h", sa.Float(), nullable=True),
        sa.Column("util_pct", sa.Float(), nullable=True),
        sa.Column("flag_idle", sa.Integer(), nullable=True),
        sa.Column("flag_low_util", sa.Integer(), nullable=True),
        sa.Column("flag_time", sa.Integer(), nullable=True),
        sa.Column("flag_memory", sa.Integer(), nullable=True),
        sa.Column("flag_gpus", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_report_rollup_jobs")),
    )
    op.create_index(
        op.f("ix_report_rollup_jobs_cluster_list_span_bucket"),
        "report_rollup_jobs",
        ["cluster", "list", "span", "bucket"],
    )
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        statements = _sqlite_triggers()
    elif dialect == "postgresql":
        statements = _pg_statements()
    else:  # no triggers: the report finds none and reads the jobs directly
        statements = []
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for name, table in _TRIGGERS:
        if dialect == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    if dialect == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS report_dirty_jobs()")
        op.execute("DROP FUNCTION IF EXISTS report_dirty_summaries()")
    op.drop_index(
        op.f("ix_report_rollup_jobs_cluster_list_span_bucket"), table_name="report_rollup_jobs"
    )
    op.drop_table("report_rollup_jobs")
    op.drop_index(
        op.f("ix_report_rollup_cells_cluster_span_bucket"), table_name="report_rollup_cells"
    )
    op.drop_table("report_rollup_cells")
    op.drop_index(
        op.f("ix_report_rollup_groups_cluster_span_bucket"), table_name="report_rollup_groups"
    )
    op.drop_table("report_rollup_groups")
    op.drop_table("report_built")
    op.drop_table("report_dirty")
    op.create_index("ix_job_summaries_cluster_job_id", "job_summaries", ["cluster", "job_id"])
    op.drop_index("ix_job_summaries_report", table_name="job_summaries")
