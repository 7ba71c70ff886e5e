"""a tenant's network policy: what its jobs may reach beyond their own network namespace (``tenants.egress``
none | internet | allow, ``tenants.egress_allow``; NULL: the platform's default; docs/isolation.md#network)

Revision ID: 0021
Revises: 0020
Create Date: 2027-01-10 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("egress", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("egress_allow", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("egress_allow")
        batch_op.drop_column("egress")
