"""datasets: the sample library (datasets, versions, labels, shares), the dataset versions jobs read, a
tenant's storage quota, and the uploads requests are using

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 10:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch_op:
        batch_op.add_column(sa.Column("quota_storage", sa.BigInteger(), nullable=True))
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("last_version", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant_id", "name"),
    )
    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("storage_key", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("dataset_id", "version"),
    )
    op.create_index("ix_dataset_versions_tenant_id", "dataset_versions", ["tenant_id"])
    op.create_table(
        "dataset_labels",
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("label", sa.String(length=63), nullable=False),
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["version_id"], ["dataset_versions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset_id", "label"),
    )
    op.create_index("ix_dataset_labels_version_id", "dataset_labels", ["version_id"])
    op.create_table(
        "dataset_shares",
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset_id", "tenant_id"),
    )
    op.create_index("ix_dataset_shares_tenant_id", "dataset_shares", ["tenant_id"])
    op.create_table(
        "job_datasets",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["version_id"], ["dataset_versions.id"], ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("job_id", "version_id"),
    )
    op.create_index("ix_job_datasets_version_id", "job_datasets", ["version_id"])
    op.create_table(
        "upload_claims",
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("upload_claims")
    op.drop_index("ix_job_datasets_version_id", table_name="job_datasets")
    op.drop_table("job_datasets")
    op.drop_index("ix_dataset_shares_tenant_id", table_name="dataset_shares")
    op.drop_table("dataset_shares")
    op.drop_index("ix_dataset_labels_version_id", table_name="dataset_labels")
    op.drop_table("dataset_labels")
    op.drop_index("ix_dataset_versions_tenant_id", table_name="dataset_versions")
    op.drop_table("dataset_versions")
    op.drop_table("datasets")
    with op.batch_alter_table("tenants") as batch_op:
        batch_op.drop_column("quota_storage")
