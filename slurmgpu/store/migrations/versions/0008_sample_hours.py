"""sample_hours: raw samples rolled up per job, node, GPU and hour before they are pruned

Revision ID: 0008
Revises: 0007

The samples table grew without bound (278 bytes a sample: about 2.4 GB a day at 1,000
GPUs sampled every 10 s). The daemon now rolls samples older than
``daemon.sample_retention`` into this table and deletes them (store/retention.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import slurmgpu.store.schema

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ts = slurmgpu.store.schema.UtcDateTime(timezone=True)
    op.create_table(
        "sample_hours",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=4), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("hour", ts, nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("util_n", sa.Integer(), nullable=False),
        sa.Column("util_sum", sa.Float(), nullable=True),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("memory_max_mib", sa.Float(), nullable=True),
        sa.Column("memory_total_mib", sa.Float(), nullable=True),
        sa.Column("first_at", ts, nullable=True),
        sa.Column("last_at", ts, nullable=True),
        sa.Column("last_busy_at", ts, nullable=True),
        sa.Column("shared", sa.Boolean(), nullable=True),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("processes_max", sa.Integer(), nullable=True),
        sa.Column("cpu_n", sa.Integer(), nullable=False),
        sa.Column("cpu_sum", sa.Float(), nullable=True),
        sa.Column("cpu_max", sa.Float(), nullable=True),
        sa.Column("cpus_max", sa.Integer(), nullable=True),
        sa.Column("host_memory_max_mib", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sample_hours")),
    )
    op.create_index(
        op.f("ix_sample_hours_cluster_job_id"), "sample_hours", ["cluster", "job_id"], unique=False
    )
    op.create_index(op.f("ix_sample_hours_hour"), "sample_hours", ["hour"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sample_hours_hour"), table_name="sample_hours")
    op.drop_index(op.f("ix_sample_hours_cluster_job_id"), table_name="sample_hours")
    op.drop_table("sample_hours")
