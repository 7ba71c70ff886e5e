"""Persistence: SQLAlchemy 2 ORM, queries and Alembic migrations.

Invariants:
- Every query on a tenant-owned table takes ``tenant_id`` and filters by it; another tenant's row is
  simply not found.
- Store functions add/flush and never commit: services own transactions (``Database.write()``).
- SQLite (WAL) and PostgreSQL behave the same; write transactions on SQLite start with
  ``BEGIN IMMEDIATE`` so read-check-write sequences (quotas) are serialised.
"""
