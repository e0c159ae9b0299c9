"""initial schema

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import slurmgpu.store.schema

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpus",
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=True),
        sa.Column("uuid", sa.String(length=64), nullable=True),
        sa.Column("pci_bus_id", sa.String(length=32), nullable=True),
        sa.Column("minor", sa.Integer(), nullable=True),
        sa.Column("memory_total_mib", sa.BigInteger(), nullable=True),
        sa.Column("last_seen", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "node", "index", name=op.f("pk_gpus")),
    )
    op.create_table(
        "job_summaries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_summaries")),
    )
    with op.batch_alter_table("job_summaries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_job_summaries_cluster_job_id"), ["cluster", "job_id"], unique=False
        )

    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("uid", sa.BigInteger(), nullable=True),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("partition", sa.String(length=512), nullable=False),
        sa.Column("qos", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("state_flags", sa.String(length=256), nullable=False),
        sa.Column("reason", sa.String(length=256), nullable=False),
        sa.Column("array_job_id", sa.BigInteger(), nullable=True),
        sa.Column("array_task_id", sa.Integer(), nullable=True),
        sa.Column("array_task_spec", sa.String(length=256), nullable=True),
        sa.Column("array_max_tasks", sa.Integer(), nullable=True),
        sa.Column("submit_time", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=True),
        sa.Column("eligible_time", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=True),
        sa.Column("start_time", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=True),
        sa.Column("end_time", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=True),
        sa.Column("time_limit_s", sa.BigInteger(), nullable=True),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=True),
        sa.Column("node_count", sa.Integer(), nullable=False),
        sa.Column("tasks", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=True),
        sa.Column("gpus_per_job", sa.Integer(), nullable=True),
        sa.Column("gpus_per_task", sa.Integer(), nullable=True),
        sa.Column("gpu_type", sa.String(length=64), nullable=True),
        sa.Column("shards", sa.Integer(), nullable=False),
        sa.Column("shards_per_node", sa.Integer(), nullable=True),
        sa.Column("gpu_sources", sa.String(length=128), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("gpu_alloc", sa.JSON(), nullable=False),
        sa.Column("restart_count", sa.Integer(), nullable=False),
        sa.Column("requeue", sa.Boolean(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("admin_comment", sa.Text(), nullable=False),
        sa.Column("work_dir", sa.Text(), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("batch", sa.Boolean(), nullable=False),
        sa.Column("first_seen", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("last_seen", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("gone", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_jobs_cluster_job_id"), ["cluster", "job_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_jobs_end_time"), ["end_time"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_state"), ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_user"), ["user"], unique=False)

    op.create_table(
        "meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_meta")),
    )
    op.create_table(
        "nodes",
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("state_flags", sa.String(length=256), nullable=False),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("cpus_allocated", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("memory_allocated_mib", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=True),
        sa.Column("shards", sa.Integer(), nullable=False),
        sa.Column("gpus_used", sa.Integer(), nullable=False),
        sa.Column("gpu_indices_used", sa.String(length=256), nullable=False),
        sa.Column("shards_used", sa.Integer(), nullable=False),
        sa.Column("partitions", sa.String(length=256), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("address", sa.String(length=256), nullable=False),
        sa.Column("last_seen", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "name", name=op.f("pk_nodes")),
    )
    op.create_table(
        "samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("sample_uid", sa.String(length=128), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=4), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("util_pct", sa.Float(), nullable=True),
        sa.Column("memory_used_mib", sa.Float(), nullable=True),
        sa.Column("memory_total_mib", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("processes", sa.Integer(), nullable=True),
        sa.Column("shared", sa.Boolean(), nullable=True),
        sa.Column("source", sa.String(length=8), nullable=True),
        sa.Column("cpu_pct", sa.Float(), nullable=True),
        sa.Column("cpus_allocated", sa.Integer(), nullable=True),
        sa.Column("rss_mib", sa.Float(), nullable=True),
        sa.Column("cgroup_memory_mib", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
        sa.UniqueConstraint("sample_uid", name=op.f("uq_samples_sample_uid")),
    )
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_samples_at"), ["at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_samples_job_id_kind_at"), ["job_id", "kind", "at"], unique=False
        )

    op.create_table(
        "submissions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("submitted_at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("uid", sa.BigInteger(), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=False),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("malleable_min", sa.Integer(), nullable=True),
        sa.Column("malleable_max", sa.Integer(), nullable=True),
        sa.Column("checkpoint_signal", sa.String(length=16), nullable=True),
        sa.Column("checkpoint_grace_s", sa.Integer(), nullable=True),
        sa.Column("hints", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_submissions")),
    )
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_submissions_cluster_job_id"), ["cluster", "job_id"], unique=False
        )

    op.create_table(
        "transactions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("created_at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("deadline", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transactions")),
    )
    with op.batch_alter_table("transactions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_transactions_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_transactions_state"), ["state"], unique=False)

    op.create_table(
        "actions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("taken", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("numbers", sa.JSON(), nullable=True),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("alert", sa.String(length=64), nullable=False),
        sa.Column("fields", sa.JSON(), nullable=True),
        sa.Column("execute", sa.Boolean(), nullable=False),
        sa.Column("notify", sa.Boolean(), nullable=False),
        sa.Column("suppressed", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("caller_uid", sa.Integer(), nullable=True),
        sa.Column("transaction_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["transaction_id"],
            ["transactions.id"],
            name=op.f("fk_actions_transaction_id_transactions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_actions")),
    )
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_actions_at"), ["at"], unique=False)
        batch_op.create_index(batch_op.f("ix_actions_job_id_at"), ["job_id", "at"], unique=False)

    op.create_table(
        "job_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_row", sa.Integer(), nullable=False),
        sa.Column("at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=24), nullable=False),
        sa.Column("from_state", sa.String(length=24), nullable=True),
        sa.Column("to_state", sa.String(length=24), nullable=True),
        sa.Column("restart_count", sa.Integer(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_row"], ["jobs.id"], name=op.f("fk_job_events_job_row_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_job_events_job_row_at"), ["job_row", "at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_events_job_row_at"))

    op.drop_table("job_events")
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_actions_job_id_at"))
        batch_op.drop_index(batch_op.f("ix_actions_at"))

    op.drop_table("actions")
    with op.batch_alter_table("transactions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_transactions_state"))
        batch_op.drop_index(batch_op.f("ix_transactions_job_id"))

    op.drop_table("transactions")
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_submissions_cluster_job_id"))

    op.drop_table("submissions")
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_samples_job_id_kind_at"))
        batch_op.drop_index(batch_op.f("ix_samples_at"))

    op.drop_table("samples")
    op.drop_table("nodes")
    op.drop_table("meta")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_user"))
        batch_op.drop_index(batch_op.f("ix_jobs_state"))
        batch_op.drop_index(batch_op.f("ix_jobs_end_time"))
        batch_op.drop_index(batch_op.f("ix_jobs_cluster_job_id"))

    op.drop_table("jobs")
    with op.batch_alter_table("job_summaries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_summaries_cluster_job_id"))

    op.drop_table("job_summaries")
    op.drop_table("gpus")
