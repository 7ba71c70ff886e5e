"""fair scheduling: tenant guarantees, borrowing limits, weights and priority ranges; job priority classes,
preemption and run-time declarations (docs/scheduling.md)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-20 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TENANT_COLUMNS = (
    ("guarantee_gpus", sa.Integer(), False, "0"),
    ("guarantee_cpus", sa.Float(), False, "0"),
    ("guarantee_memory", sa.BigInteger(), False, "0"),
    ("borrow_gpus", sa.Integer(), True, None),
    ("borrow_cpus", sa.Float(), True, None),
    ("borrow_memory", sa.BigInteger(), True, None),
    ("weight", sa.Float(), False, "1"),
    ("priority_min", sa.Integer(), False, "-1000"),
    ("priority_max", sa.Integer(), False, "1000"),
)
JOB_COLUMNS = (
    ("priority_class", sa.String(length=63), True, None),
    ("preemptible", sa.Boolean(), False, sa.true()),
    ("max_run_time_seconds", sa.Float(), True, None),
    ("preempt_requested", sa.Boolean(), False, sa.false()),
    ("preempt_reason", sa.Text(), True, None),
    ("preemptions", sa.Integer(), False, "0"),
    ("attained_gpu_seconds", sa.Float(), False, "0"),
    ("estimated_start", sa.DateTime(timezone=True), True, None),
    ("reclaiming", sa.Boolean(), False, sa.false()),
)


def _add(table: str, columns: tuple) -> None:
    # existing rows get the defaults: no guarantee, unlimited borrowing, weight 1, the whole priority range;
    # preemptible jobs, never preempted
    with op.batch_alter_table(table, schema=None) as batch_op:
        for name, type_, nullable, default in columns:
            batch_op.add_column(sa.Column(name, type_, nullable=nullable, server_default=default))


def upgrade() -> None:
    _add("tenants", TENANT_COLUMNS)
    _add("jobs", JOB_COLUMNS)


def downgrade() -> None:
    for table, columns in (("jobs", JOB_COLUMNS), ("tenants", TENANT_COLUMNS)):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, *_ in reversed(columns):
                batch_op.drop_column(name)
