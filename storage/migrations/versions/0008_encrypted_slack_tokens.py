"""encrypted slack tokens: the token and webhook columns become text (a Fernet token outgrows 200 characters), and the
OAuth state table goes (install states are signed, not stored)

The values themselves are encrypted by `storage.migrate.upgrade` after the schema steps whenever DEEPTHREAD_SECRET_KEY
is given (`deepthread migrate`, and every process's start), not here: rows written before the key was set, and rows
an older key encrypted, are then encrypted with the first key whenever that happens, not only when this revision runs.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

SECRET_COLUMNS = {
    'slack_installations': ('bot_token', 'bot_refresh_token', 'user_token', 'user_refresh_token',
                            'incoming_webhook_url'),
    'slack_bots': ('bot_token', 'bot_refresh_token'),
}


def upgrade() -> None:
    for table, columns in SECRET_COLUMNS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in columns:
                batch_op.alter_column(column, existing_type=sa.String(length=200), type_=sa.Text(),
                                      existing_nullable=True)
    op.drop_table('slack_oauth_states')


def downgrade() -> None:
    # Encrypted values stay encrypted; on PostgreSQL one longer than 200 characters stops the downgrade.
    op.create_table(
        'slack_oauth_states',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('state', sa.String(length=200), nullable=False),
        sa.Column('expire_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    for table, columns in SECRET_COLUMNS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in columns:
                batch_op.alter_column(column, existing_type=sa.Text(), type_=sa.String(length=200),
                                      existing_nullable=True)
