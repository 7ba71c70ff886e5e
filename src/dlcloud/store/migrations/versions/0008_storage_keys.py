"""storage keys: code uploads and model versions name their bytes by object-store key, not by host path

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 09:00:00.000000

The keys are exactly where the files already are under the data dir (the default local store's root), so
an existing data dir keeps working without moving a file: ``code/<tenant>/<id>/<file>`` (``code.tar.gz``
for an archive, the package's own name for a wheel or sdist) and ``models/<tenant>/<model>/<version>``
(a tree holding the artifact).
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("code_uploads") as batch_op:
        batch_op.add_column(sa.Column("storage_key", sa.Text(), nullable=True))
    op.execute(
        "UPDATE code_uploads SET storage_key = 'code/' || tenant_id || '/' || id || '/' || "
        "CASE WHEN kind = 'archive' THEN 'code.tar.gz' ELSE filename END"
    )
    with op.batch_alter_table("code_uploads") as batch_op:
        batch_op.alter_column("storage_key", existing_type=sa.Text(), nullable=False)
        batch_op.drop_column("path")

    with op.batch_alter_table("model_versions") as batch_op:
        batch_op.add_column(sa.Column("artifact_key", sa.Text(), nullable=True))
    op.execute(
        "UPDATE model_versions SET artifact_key = "
        "'models/' || tenant_id || '/' || model_id || '/' || CAST(version AS VARCHAR(12))"
    )
    with op.batch_alter_table("model_versions") as batch_op:
        batch_op.alter_column("artifact_key", existing_type=sa.Text(), nullable=False)
        batch_op.drop_column("artifact_path")


def downgrade() -> None:
    # the host paths of a local store rooted at the data dir cannot be rebuilt here (the migration does not
    # know the data dir): the keys are kept, relative, and a downgraded server must run from the data dir
    with op.batch_alter_table("model_versions") as batch_op:
        batch_op.add_column(sa.Column("artifact_path", sa.Text(), nullable=True))
    op.execute("UPDATE model_versions SET artifact_path = artifact_key || '/' || artifact_name")
    with op.batch_alter_table("model_versions") as batch_op:
        batch_op.alter_column("artifact_path", existing_type=sa.Text(), nullable=False)
        batch_op.drop_column("artifact_key")
    with op.batch_alter_table("code_uploads") as batch_op:
        batch_op.add_column(sa.Column("path", sa.Text(), nullable=True))
    op.execute("UPDATE code_uploads SET path = storage_key")
    with op.batch_alter_table("code_uploads") as batch_op:
        batch_op.alter_column("path", existing_type=sa.Text(), nullable=False)
        batch_op.drop_column("storage_key")
