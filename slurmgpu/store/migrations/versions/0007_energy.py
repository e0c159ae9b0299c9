"""energy: the GPUs' NVML energy counter and the jobs' I/O wait in samples, a job's GPU
energy in job_summaries

Revision ID: 0007
Revises: 0006

Plain ADD COLUMNs (no batch mode): on SQLite a batch alter recreates the table and
drops the report's triggers on job_summaries (see 0006). Summaries written before this
revision keep NULL energy: unknown, not zero.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("samples", "energy_mj", sa.BigInteger()),
    ("samples", "iowait_pct", sa.Float()),
    ("job_summaries", "energy_j", sa.Float()),
    ("job_summaries", "idle_energy_j", sa.Float()),
)


def upgrade() -> None:
    for table, name, kind in _COLUMNS:
        op.add_column(table, sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, name, _ in reversed(_COLUMNS):
        if sqlite:  # SQLite >= 3.35 drops a column in place, keeping the triggers
            op.execute(f"ALTER TABLE {table} DROP COLUMN {name}")
        else:
            op.drop_column(table, name)
