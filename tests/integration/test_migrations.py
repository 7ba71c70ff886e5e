"""The Alembic migrations produce exactly the schema the ORM models describe, on both databases."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from dlcloud.store.models import Base


def test_migrations_match_models(db_url):
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == []
