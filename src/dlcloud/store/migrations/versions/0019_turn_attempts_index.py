"""the attempts placed for a turn get their own (partial) index: a pass's recent GPU-seconds per tenant reads the
live attempts, those that ended within the turn window and those whose turn ends within it, each term by an index,
so the read does not grow with the attempts history (control/scheduling.py, ``recent_usage``)

Revision ID: 0019
Revises: 0018
Create Date: 2027-01-08 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_WHERE = sa.text("turn_until IS NOT NULL")


def upgrade() -> None:
    op.create_index("ix_attempts_turns", "job_attempts", ["turn_until"], postgresql_where=_WHERE, sqlite_where=_WHERE)


def downgrade() -> None:
    op.drop_index("ix_attempts_turns", table_name="job_attempts")
