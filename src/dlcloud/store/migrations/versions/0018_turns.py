"""turns (fair-share): a job preempting for its tenant's turn keeps the turn's length until it is placed
(``jobs.turn_seconds``), and the attempt placed for it is owed, not reclaimable, until ``job_attempts.turn_until``
(docs/scheduling.md, "Guarantees when jobs are large")

Revision ID: 0018
Revises: 0017
Create Date: 2027-01-07 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("turn_seconds", sa.Float(), nullable=True))
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("turn_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_column("turn_until")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("turn_seconds")
