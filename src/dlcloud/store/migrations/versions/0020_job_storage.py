"""a job's saved outputs and its checkpoints count in its tenant's storage quota: the bytes of each, on the job
(``jobs.outputs_bytes``, ``jobs.checkpoints_bytes``; docs/quotas-and-usage.md)

Revision ID: 0020
Revises: 0019
Create Date: 2027-01-09 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("outputs_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("checkpoints_bytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("checkpoints_bytes")
        batch_op.drop_column("outputs_bytes")
