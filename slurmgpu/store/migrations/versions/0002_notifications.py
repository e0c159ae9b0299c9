"""notifications: user email decisions for the per-(user, alert) rate limit

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import slurmgpu.store.schema

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=64), nullable=False),
        sa.Column("alert", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("sent_at", slurmgpu.store.schema.UtcDateTime(timezone=True), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notifications")),
    )
    op.create_index(
        op.f("ix_notifications_cluster_user_alert_sent_at"),
        "notifications",
        ["cluster", "user", "alert", "sent_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_notifications_cluster_user_alert_sent_at"), table_name="notifications")
    op.drop_table("notifications")
