"""trial segments: a study trial paused at an ASHA rung is resumed as a new job from its checkpoint; the trial
keeps every job it ran (``segments``) and the step its current one trains to (``budget``) (docs/tuning.md)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-30 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


STUDIES = sa.table("studies", sa.column("id", sa.String), sa.column("algorithm", sa.String), sa.column("spec", sa.JSON))


def upgrade() -> None:
    # existing trials ran as one job each: no segments recorded, no budget
    with op.batch_alter_table("study_trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("segments", sa.JSON(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("budget", sa.Integer(), nullable=True))
    # an ASHA study submitted before pausing existed keeps Optuna's pruner (pausing is now the default for
    # template trials, and a study's way of running must not change under it)
    bind = op.get_bind()
    for study_id, spec in bind.execute(sa.select(STUDIES.c.id, STUDIES.c.spec).where(STUDIES.c.algorithm == "asha")):
        es = dict(spec.get("early_stopping") or {})
        if es.get("pause") is None:
            es["pause"] = False
            bind.execute(STUDIES.update().where(STUDIES.c.id == study_id).values(spec={**spec, "early_stopping": es}))


def downgrade() -> None:
    with op.batch_alter_table("study_trials", schema=None) as batch_op:
        batch_op.drop_column("budget")
        batch_op.drop_column("segments")
