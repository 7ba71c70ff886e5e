"""deployment lease holders: a lease records its user and key, and is named per holding tenant

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TABLE = "model_deployments"
NEW_UNIQUE = "uq_model_deployments_version_tenant_name"
# SQLite keeps 0002's unique constraint without a name: batch mode names it after this convention
NAMING = {"uq": "uq_%(table_name)s_%(column_0_N_name)s"}


def _unique_named(columns: list[str]) -> str:
    for uc in sa.inspect(op.get_bind()).get_unique_constraints(TABLE):
        if list(uc["column_names"]) == columns:
            return uc["name"] or f"uq_{TABLE}_{'_'.join(columns)}"
    raise RuntimeError(f"{TABLE} has no unique constraint on {columns}")


def upgrade() -> None:
    old = _unique_named(["model_version_id", "name"])
    with op.batch_alter_table(TABLE, naming_convention=NAMING) as batch_op:
        # leases made before holders were recorded get an empty holder: their tenant's next renewal adopts them
        batch_op.add_column(sa.Column("holder_id", sa.String(length=32), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("holder_key", sa.String(length=64), nullable=False, server_default=""))
        batch_op.drop_constraint(old, type_="unique")
        batch_op.create_unique_constraint(NEW_UNIQUE, ["model_version_id", "tenant_id", "name"])
    with op.batch_alter_table(TABLE) as batch_op:
        batch_op.alter_column("holder_id", existing_type=sa.String(length=32), server_default=None)
        batch_op.alter_column("holder_key", existing_type=sa.String(length=64), server_default=None)


def downgrade() -> None:
    # the old constraint is one lease name per version: keep the oldest lease of a name
    op.execute(
        sa.text(f"DELETE FROM {TABLE} WHERE id NOT IN (SELECT MIN(id) FROM {TABLE} GROUP BY model_version_id, name)")
    )
    with op.batch_alter_table(TABLE, naming_convention=NAMING) as batch_op:
        batch_op.drop_constraint(NEW_UNIQUE, type_="unique")
        batch_op.create_unique_constraint(f"uq_{TABLE}_model_version_id_name", ["model_version_id", "name"])
        batch_op.drop_column("holder_key")
        batch_op.drop_column("holder_id")
