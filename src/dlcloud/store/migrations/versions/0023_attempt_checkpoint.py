"""the last change an attempt made to its job's checkpoint directory (``job_attempts.checkpoint_at``): a preemption
loses the work since (docs/scheduling.md#preemption)

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 13:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checkpoint_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_column("checkpoint_at")
