"""held_samples: samples of jobs the daemon has not seen yet, held out of every reader

Revision ID: 0010
Revises: 0009

Samples for a job id the daemon did not know were stored in ``samples`` unchecked, so a
node could post idle samples for the next job id and have them counted for a job that
then ran elsewhere (issue 36, item 5). They now wait here, read by nothing, until Slurm
lists the job; then each is moved to ``samples`` or dropped (store/sample_hold.py).
A new table, so nothing in ``samples`` changes and no reader needs a filter.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import slurmgpu.store.schema

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ts = slurmgpu.store.schema.UtcDateTime(timezone=True)
    op.create_table(
        "held_samples",
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
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("at", ts, nullable=False),
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
        sa.Column("energy_mj", sa.BigInteger(), nullable=True),
        sa.Column("iowait_pct", sa.Float(), nullable=True),
        sa.Column("held_at", ts, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_held_samples")),
        sa.UniqueConstraint("sample_uid", name=op.f("uq_held_samples_sample_uid")),
    )
    op.create_index(
        op.f("ix_held_samples_cluster_node"), "held_samples", ["cluster", "node"], unique=False
    )
    op.create_index(
        op.f("ix_held_samples_cluster_job_id"), "held_samples", ["cluster", "job_id"], unique=False
    )
    op.create_index(op.f("ix_held_samples_held_at"), "held_samples", ["held_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_held_samples_held_at"), table_name="held_samples")
    op.drop_index(op.f("ix_held_samples_cluster_job_id"), table_name="held_samples")
    op.drop_index(op.f("ix_held_samples_cluster_node"), table_name="held_samples")
    op.drop_table("held_samples")
