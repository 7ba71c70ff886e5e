"""whether a tenant's jobs may make user namespaces of their own (``tenants.user_namespaces``, false by default;
docs/isolation.md#user-namespaces)

Revision ID: 0022
Revises: 0021
Create Date: 2027-01-12 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_namespaces", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("user_namespaces")
