"""watches: research that comes back on its own schedule; a run's watch; a source's checksum; a workspace's time zone

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 17:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import storage.models

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'watches',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('platform', sa.String(length=16), nullable=False),
        sa.Column('workspace', sa.String(length=64), nullable=False),
        sa.Column('channel', sa.String(length=64), nullable=False),
        sa.Column('thread', sa.String(length=64), nullable=False),
        sa.Column('visibility', sa.String(length=16), server_default=sa.text("'private'"), nullable=False),
        sa.Column('created_by', sa.String(length=64), nullable=False),
        sa.Column('question', sa.Text(), nullable=False),
        sa.Column('options', sa.JSON(), nullable=False),
        sa.Column('schedule', sa.JSON(), nullable=False),
        sa.Column('one_thread', sa.Boolean(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('stopped_reason', sa.Text(), nullable=True),
        sa.Column('next_due_at', storage.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('claimed_by', sa.String(length=128), nullable=True),
        sa.Column('claimed_until', storage.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column('origin_run_id', sa.Integer(), nullable=True),
        sa.Column('last_run_id', sa.Integer(), nullable=True),
        sa.Column('last_fired_at', storage.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column('fired', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('created_at', storage.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_watches')),
    )
    with op.batch_alter_table('watches', schema=None) as batch_op:
        batch_op.create_index('ix_watches_state_next_due', ['state', 'next_due_at'], unique=False)
        batch_op.create_index('ix_watches_place', ['platform', 'workspace', 'channel'], unique=False)
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('watch_id', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_runs_watch_id'), ['watch_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_runs_watch_id_watches'), 'watches', ['watch_id'], ['id'],
                                    ondelete='SET NULL')
    with op.batch_alter_table('sources', schema=None) as batch_op:
        batch_op.add_column(sa.Column('checksum', sa.String(length=64), nullable=True))
    op.create_table(
        'workspace_settings',
        sa.Column('platform', sa.String(length=16), nullable=False),
        sa.Column('workspace', sa.String(length=64), nullable=False),
        sa.Column('timezone', sa.String(length=64), nullable=False),
        sa.Column('updated_by', sa.String(length=64), nullable=True),
        sa.Column('updated_at', storage.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('platform', 'workspace', name=op.f('pk_workspace_settings')),
    )


def downgrade() -> None:
    op.drop_table('workspace_settings')
    with op.batch_alter_table('sources', schema=None) as batch_op:
        batch_op.drop_column('checksum')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_runs_watch_id_watches'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_runs_watch_id'))
        batch_op.drop_column('watch_id')
    with op.batch_alter_table('watches', schema=None) as batch_op:
        batch_op.drop_index('ix_watches_place')
        batch_op.drop_index('ix_watches_state_next_due')
    op.drop_table('watches')
