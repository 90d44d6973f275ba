"""status message lookup

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 00:56:11.754110
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op



revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('status_message_id', sa.String(length=64), nullable=True))
        batch_op.create_index('ix_runs_status_message_id', ['status_message_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_status_message_id')
        batch_op.drop_column('status_message_id')

