"""delivery retries: failed attempts, next try, given up

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


import storage.models

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('delivery_attempts', sa.Integer(), server_default=sa.text('0'), nullable=False))
        batch_op.add_column(sa.Column('delivery_retry_at', storage.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('delivery_given_up_at', storage.models.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('delivery_given_up_at')
        batch_op.drop_column('delivery_retry_at')
        batch_op.drop_column('delivery_attempts')
