"""dataset sources: a dataset version registered in place from objects already in a bucket keeps its source,
and its state while its manifest is computed in the background (pending, ready, failed) with the server
process computing it

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dataset_versions") as batch_op:
        # every version before this one was pushed from an upload, and is ready
        batch_op.add_column(sa.Column("state", sa.String(length=16), nullable=False, server_default="ready"))
        batch_op.add_column(sa.Column("state_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("source_url", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("claimed_by", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_dataset_versions_state", ["state"])


def downgrade() -> None:
    with op.batch_alter_table("dataset_versions") as batch_op:
        batch_op.drop_index("ix_dataset_versions_state")
        batch_op.drop_column("claimed_at")
        batch_op.drop_column("claimed_by")
        batch_op.drop_column("source_url")
        batch_op.drop_column("state_reason")
        batch_op.drop_column("state")
