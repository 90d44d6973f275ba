"""delivery done and one run in flight per thread

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 01:39:04.788885
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


import storage.models

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('delivered_at', storage.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.create_index('uq_runs_one_in_flight_per_conversation', ['conversation_id'], unique=True, sqlite_where=sa.text("state IN ('queued', 'running')"), postgresql_where=sa.text("state IN ('queued', 'running')"))



def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('uq_runs_one_in_flight_per_conversation', sqlite_where=sa.text("state IN ('queued', 'running')"), postgresql_where=sa.text("state IN ('queued', 'running')"))
        batch_op.drop_column('delivered_at')

