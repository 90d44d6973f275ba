"""shared files: the files shared in a conversation (references only), a source's file details, a passage's page

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import storage.models

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'conversation_files',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('conversation_id', sa.Integer(), nullable=False),
        sa.Column('file_id', sa.Text(), nullable=False),
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('size', sa.Integer(), nullable=True),
        sa.Column('mimetype', sa.String(length=128), nullable=True),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('link', sa.Text(), nullable=True),
        sa.Column('shared_by', sa.String(length=64), nullable=True),
        sa.Column('created_at', storage.models.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'],
                                name=op.f('fk_conversation_files_conversation_id_conversations'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_conversation_files')),
        sa.UniqueConstraint('conversation_id', 'file_id', name='uq_conversation_files_file'),
    )
    with op.batch_alter_table('conversation_files', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_conversation_files_conversation_id'), ['conversation_id'], unique=False)
    with op.batch_alter_table('sources', schema=None) as batch_op:
        batch_op.add_column(sa.Column('file', sa.JSON(), nullable=True))
    with op.batch_alter_table('passages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('page', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('passages', schema=None) as batch_op:
        batch_op.drop_column('page')
    with op.batch_alter_table('sources', schema=None) as batch_op:
        batch_op.drop_column('file')
    with op.batch_alter_table('conversation_files', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_conversation_files_conversation_id'))
    op.drop_table('conversation_files')
