"""sample_hours: the energy and I/O wait of rolled-up hours

Revision ID: 0009
Revises: 0008

The retention (0008) rolled samples up without their energy counter, power and I/O wait,
so a job's energy and mean iowait shrank once its samples were pruned. Each hourly row
now carries the energy rule's sums (store/energy_rule.py) and the I/O wait count and sum.

A new revision rather than an edit of 0008: 0008 is unreleased, but databases already
upgraded to it (development, CI caches, other branches) would never get the columns.
Plain nullable ADD COLUMNs (no batch mode, as 0007); hours rolled up before this
revision keep NULL: unknown, not zero.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("energy_j", sa.Float()),
    ("idle_energy_j", sa.Float()),
    ("counter_intervals", sa.Integer()),
    ("power_intervals", sa.Integer()),
    ("covered_s", sa.Float()),
    ("power_n", sa.Integer()),
    ("power_sum", sa.Float()),
    ("first_power_w", sa.Float()),
    ("last_power_w", sa.Float()),
    ("iowait_n", sa.Integer()),
    ("iowait_sum", sa.Float()),
)


def upgrade() -> None:
    for name, kind in _COLUMNS:
        op.add_column("sample_hours", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for name, _ in reversed(_COLUMNS):
        if sqlite:  # SQLite >= 3.35 drops a column in place
            op.execute(f"ALTER TABLE sample_hours DROP COLUMN {name}")
        else:
            op.drop_column("sample_hours", name)
