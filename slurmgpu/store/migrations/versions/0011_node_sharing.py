"""node sharing: each node's GPU types with their counts (MIG profiles) and its gres/mps

Revision ID: 0011
Revises: 0010

``sgpu eff`` advises the share of a GPU a light job needs among what the nodes offer
(issue 39: a MIG slice, an MPS share or shards); the nodes table kept only one GPU type
and the shard count. Plain ADD COLUMNs (see 0007), with defaults: a node written before
this revision offers no MIG slice and no MPS until the daemon sees it again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("gpu_types", sa.String(length=512), sa.text("''")),
    ("mps", sa.Integer(), sa.text("0")),
)


def upgrade() -> None:
    for name, kind, default in _COLUMNS:
        op.add_column("nodes", sa.Column(name, kind, nullable=False, server_default=default))


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for name, _, _ in reversed(_COLUMNS):
        if sqlite:
            op.execute(f"ALTER TABLE nodes DROP COLUMN {name}")
        else:
            op.drop_column("nodes", name)
