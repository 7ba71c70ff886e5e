"""distributed jobs: replica groups of a job, per-replica attempt records, the managed port range

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 09:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replica_groups", sa.JSON(), nullable=True))
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ports", sa.JSON(), nullable=True))

    op.create_table(
        "job_replicas",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("cpus", sa.Float(), nullable=False),
        sa.Column("memory", sa.BigInteger(), nullable=False),
        sa.Column("ports", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "attempt", "name"),
    )
    with op.batch_alter_table("job_replicas", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_replicas_job_id"), ["job_id"], unique=False)

    op.create_table(
        "job_ports",
        sa.Column("port", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("allocated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("port"),
    )
    with op.batch_alter_table("job_ports", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_ports_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_ports", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_ports_job_id"))
    op.drop_table("job_ports")
    with op.batch_alter_table("job_replicas", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_replicas_job_id"))
    op.drop_table("job_replicas")
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_column("ports")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("replica_groups")
