"""job_summaries: the flat job-level figures the reports aggregate, backfilled from the JSON

Revision ID: 0005
Revises: 0002
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

from slurmgpu.store.summary_columns import SUMMARY_COLUMNS, summary_columns

revision = "0005"
down_revision = "0002"
branch_labels = None
depends_on = None

_TYPES: dict[str, Any] = {
    "gpus_reported": sa.Integer(),
    "gpus_busy": sa.Integer(),
    "gpu_util_pct": sa.Float(),
    "gpu_idle_pct": sa.Float(),
    "gpu_memory_max_mib": sa.Float(),
    "cpu_memory_max_mib": sa.Float(),
}


def upgrade() -> None:
    with op.batch_alter_table("job_summaries") as batch:
        for name in SUMMARY_COLUMNS:
            batch.add_column(sa.Column(name, _TYPES[name], nullable=True))
    table = sa.table(
        "job_summaries",
        sa.column("id", sa.Integer()),
        sa.column("summary", sa.Text()),
        *(sa.column(name, _TYPES[name]) for name in SUMMARY_COLUMNS),
    )
    conn = op.get_bind()
    last = 0
    while True:  # in batches, so a large store is not read into memory at once
        rows = conn.execute(
            sa.select(table.c.id, sa.cast(table.c.summary, sa.Text()))
            .where(table.c.id > last)
            .order_by(table.c.id)
            .limit(5000)
        ).all()
        if not rows:
            break
        last = int(rows[-1][0])
        values = []
        for row_id, text in rows:
            try:
                summary = json.loads(text) if text else {}
            except ValueError:
                continue  # an unreadable summary keeps NULL figures: unknown, not zero
            if isinstance(summary, dict):
                values.append({"row_id": row_id, **summary_columns(summary)})
        if values:
            conn.execute(
                table.update()
                .where(table.c.id == sa.bindparam("row_id"))
                .values({name: sa.bindparam(name) for name in SUMMARY_COLUMNS}),
                values,
            )


def downgrade() -> None:
    with op.batch_alter_table("job_summaries") as batch:
        for name in reversed(SUMMARY_COLUMNS):
            batch.drop_column(name)
