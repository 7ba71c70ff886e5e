"""held GPUs: a job moved by the scheduler (a "defrag" preemption) keeps the GPUs its next attempt gets held for
it until it is placed again (docs/scheduling.md, "Guarantees when jobs are large")

Revision ID: 0016
Revises: 0015
Create Date: 2027-01-05 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # jobs already being moved when the server was upgraded hold nothing: they resume on whatever is free
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hold_gpus", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("hold_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("hold_until")
        batch_op.drop_column("hold_gpus")
