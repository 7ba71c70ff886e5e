"""turns: a job placed for its tenant's turn (fair-share) is owed, not reclaimable, until ``turn_until``
(docs/scheduling.md, "Turns")

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
        batch_op.add_column(sa.Column("turn_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("turn_until")
