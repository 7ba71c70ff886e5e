"""wait reasons: why queued jobs wait and when they may start move from two columns of ``jobs`` to the scheduling
pass's own tables, one text shared by the jobs of a tenant that wait for the same (store/waits.py): a pass that
changes the reasons of thousands of jobs writes one row per distinct text, not thousands of job rows

Revision ID: 0015
Revises: 0014
Create Date: 2027-01-10 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

QUEUE_STATES = ("QUEUED", "RESTARTING")
JOBS = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("tenant_id", sa.String),
    sa.column("state", sa.String),
    sa.column("wait_reason", sa.Text),
    sa.column("estimated_start", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    bind = op.get_bind()
    q = sa.select(JOBS.c.id, JOBS.c.tenant_id, JOBS.c.wait_reason, JOBS.c.estimated_start).where(
        JOBS.c.state.in_(QUEUE_STATES),
        sa.or_(JOBS.c.wait_reason.is_not(None), JOBS.c.estimated_start.is_not(None)),
    )
    kept = bind.execute(q).all()  # read before the columns go (SQLite: the table is rebuilt without them)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("estimated_start")
        batch_op.drop_column("wait_reason")
    reasons = op.create_table(
        "wait_reasons",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("estimated_start", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    job_waits = op.create_table(
        "job_waits",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("wait_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["wait_id"], ["wait_reasons.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index(op.f("ix_job_waits_wait_id"), "job_waits", ["wait_id"], unique=False)
    # the queued jobs keep what they showed, one shared row per tenant and text
    ids: dict[tuple, int] = {}
    members = []
    for job_id, tenant_id, reason, start in kept:
        wait_id = ids.setdefault((tenant_id, reason, start), len(ids) + 1)
        members.append({"job_id": job_id, "wait_id": wait_id})
    if ids:
        rows = [{"id": i, "tenant_id": t, "reason": r, "estimated_start": st} for (t, r, st), i in ids.items()]
        bind.execute(reasons.insert(), rows)
        bind.execute(job_waits.insert(), members)


def downgrade() -> None:
    bind = op.get_bind()
    q = sa.text(
        "SELECT job_waits.job_id, wait_reasons.reason, wait_reasons.estimated_start FROM job_waits "
        "JOIN wait_reasons ON wait_reasons.id = job_waits.wait_id"
    ).columns(sa.column("job_id"), sa.column("reason"), sa.column("estimated_start", sa.DateTime(timezone=True)))
    kept = bind.execute(q).all()
    op.drop_index(op.f("ix_job_waits_wait_id"), table_name="job_waits")
    op.drop_table("job_waits")
    op.drop_table("wait_reasons")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("wait_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("estimated_start", sa.DateTime(timezone=True), nullable=True))
    if kept:
        bind.execute(
            JOBS.update()
            .where(JOBS.c.id == sa.bindparam("job"))
            .values(wait_reason=sa.bindparam("reason"), estimated_start=sa.bindparam("start")),
            [{"job": j, "reason": r, "start": st} for j, r, st in kept],
        )
