"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 00:19:51.148003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


import storage.models

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('conversations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('platform', sa.String(length=16), nullable=False),
    sa.Column('workspace', sa.String(length=64), nullable=False),
    sa.Column('channel', sa.String(length=64), nullable=False),
    sa.Column('thread', sa.String(length=64), nullable=False),
    sa.Column('created_by', sa.String(length=64), nullable=False),
    sa.Column('created_at', storage.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_conversations')),
    sa.UniqueConstraint('platform', 'workspace', 'channel', 'thread', name='uq_conversations_place')
    )
    op.create_table('messages',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('conversation_id', sa.Integer(), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('author', sa.String(length=64), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('platform_message_id', sa.String(length=64), nullable=True),
    sa.Column('mode', sa.String(length=16), nullable=True),
    sa.Column('created_at', storage.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'], name=op.f('fk_messages_conversation_id_conversations'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_messages'))
    )
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_messages_conversation_id'), ['conversation_id'], unique=False)

    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('conversation_id', sa.Integer(), nullable=False),
    sa.Column('workspace', sa.String(length=64), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('question', sa.Text(), nullable=False),
    sa.Column('options', sa.JSON(), nullable=False),
    sa.Column('plan', sa.JSON(), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('requested_by', sa.String(length=64), nullable=False),
    sa.Column('cancelled_by', sa.String(length=64), nullable=True),
    sa.Column('status_message', sa.JSON(), nullable=True),
    sa.Column('delivered_messages', sa.JSON(), nullable=True),
    sa.Column('delivery_intent_at', storage.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('celery_task_id', sa.String(length=64), nullable=True),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('lease_until', storage.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('lease_owner', sa.String(length=128), nullable=True),
    sa.Column('report_markdown', sa.Text(), nullable=True),
    sa.Column('report_json', sa.JSON(), nullable=True),
    sa.Column('partial', sa.Boolean(), nullable=False),
    sa.Column('partial_reason', sa.Text(), nullable=True),
    sa.Column('usage', sa.JSON(), nullable=True),
    sa.Column('phase_timings', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', storage.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('started_at', storage.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('finished_at', storage.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'], name=op.f('fk_runs_conversation_id_conversations'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_conversation_id'), ['conversation_id'], unique=False)
        batch_op.create_index('ix_runs_requester_state', ['requested_by', 'state'], unique=False)
        batch_op.create_index('ix_runs_state_created', ['state', 'created_at'], unique=False)
        batch_op.create_index('ix_runs_workspace_state', ['workspace', 'state'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('type', sa.String(length=32), nullable=False),
    sa.Column('phase', sa.String(length=32), nullable=True),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('at', storage.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_events_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events')),
    sa.UniqueConstraint('run_id', 'seq', name='uq_events_run_seq')
    )
    op.create_table('sources',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('source_id', sa.String(length=16), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('title', sa.Text(), nullable=True),
    sa.Column('snippet', sa.Text(), nullable=True),
    sa.Column('provider', sa.String(length=32), nullable=True),
    sa.Column('published', sa.String(length=32), nullable=True),
    sa.Column('fetch_status', sa.String(length=16), nullable=True),
    sa.Column('fetch_reason', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_sources_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sources')),
    sa.UniqueConstraint('run_id', 'source_id', name='uq_sources_run_source_id')
    )
    with op.batch_alter_table('sources', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sources_run_id'), ['run_id'], unique=False)

    op.create_table('passages',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('source_row_id', sa.Integer(), nullable=False),
    sa.Column('passage_id', sa.String(length=16), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('start', sa.Integer(), nullable=False),
    sa.Column('end', sa.Integer(), nullable=False),
    sa.Column('is_snippet', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_passages_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['source_row_id'], ['sources.id'], name=op.f('fk_passages_source_row_id_sources'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_passages')),
    sa.UniqueConstraint('run_id', 'passage_id', name='uq_passages_run_passage_id')
    )
    with op.batch_alter_table('passages', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_passages_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_passages_source_row_id'), ['source_row_id'], unique=False)

    op.create_table('citations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('passage_row_id', sa.Integer(), nullable=True),
    sa.Column('sentence', sa.Text(), nullable=False),
    sa.Column('verdict', sa.String(length=16), nullable=False),
    sa.ForeignKeyConstraint(['passage_row_id'], ['passages.id'], name=op.f('fk_citations_passage_row_id_passages'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_citations_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_citations'))
    )
    with op.batch_alter_table('citations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_citations_passage_row_id'), ['passage_row_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_citations_run_id'), ['run_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('citations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_citations_run_id'))
        batch_op.drop_index(batch_op.f('ix_citations_passage_row_id'))

    op.drop_table('citations')
    with op.batch_alter_table('passages', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_passages_source_row_id'))
        batch_op.drop_index(batch_op.f('ix_passages_run_id'))

    op.drop_table('passages')
    with op.batch_alter_table('sources', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sources_run_id'))

    op.drop_table('sources')
    op.drop_table('events')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_workspace_state')
        batch_op.drop_index('ix_runs_state_created')
        batch_op.drop_index('ix_runs_requester_state')
        batch_op.drop_index(batch_op.f('ix_runs_conversation_id'))

    op.drop_table('runs')
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_messages_conversation_id'))

    op.drop_table('messages')
    op.drop_table('conversations')
