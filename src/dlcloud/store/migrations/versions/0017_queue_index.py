"""the queue's index covers what a scheduling pass reads of every queued job: the columns that change while a job
waits follow the queue order's, so a pass reads the index alone, not the jobs' rows (control/scheduling.py)

Revision ID: 0017
Revises: 0016
Create Date: 2027-01-06 10:00:00.000000
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_BEFORE = ["state", "priority", "created_at"]
_AFTER = [*_BEFORE, "id", "not_before", "attained_gpu_seconds", "reclaiming"]


def upgrade() -> None:
    op.drop_index("ix_jobs_queue", table_name="jobs")
    op.create_index("ix_jobs_queue", "jobs", _AFTER)


def downgrade() -> None:
    op.drop_index("ix_jobs_queue", table_name="jobs")
    op.create_index("ix_jobs_queue", "jobs", _BEFORE)
