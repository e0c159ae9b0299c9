"""job mps: a job's gres/mps request (total and per node) kept with the job

Revision ID: 0012
Revises: 0011

The jobs table kept GPUs and shards but not a ``gres/mps`` request, so a pending MPS job
read back from the store asked for no GPU at all (issue 39, item 4): the report left it
out and the policies' store view lost its request. Plain ADD COLUMNs (see 0007), with
defaults: a job written before this revision has no MPS request until the daemon sees
it again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("mps", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column("jobs", sa.Column("mps_per_node", sa.Integer(), nullable=True))


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for name in ("mps_per_node", "mps"):
        if sqlite:
            op.execute(f"ALTER TABLE jobs DROP COLUMN {name}")
        else:
            op.drop_column("jobs", name)
