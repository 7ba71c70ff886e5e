"""sandbox uids: each tenant gets a number, never reused, from which its jobs' Unix uid is derived

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 02:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sandbox_slot", sa.Integer(), nullable=True))
        batch_op.create_unique_constraint("uq_tenants_sandbox_slot", ["sandbox_slot"])
    conn = op.get_bind()
    ids = [r[0] for r in conn.execute(sa.text("SELECT id FROM tenants ORDER BY created_at, id"))]
    for slot, tenant_id in enumerate(ids, start=1):
        conn.execute(sa.text("UPDATE tenants SET sandbox_slot = :s WHERE id = :i"), {"s": slot, "i": tenant_id})


def downgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_constraint("uq_tenants_sandbox_slot", type_="unique")
        batch_op.drop_column("sandbox_slot")
