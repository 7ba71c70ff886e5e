"""build specs name no host path: ``environment_builds.spec`` loses the interpreter, the base environment's
directories and the wheels' file paths; a wheel is named by its storage key (decision 7: the Kubernetes executor
builds the same spec where none of this host's paths exist)

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 16:30:00.000000

A wheel's key is that of an upload with its checksum (``code_uploads``: the bytes are the same whichever upload
it is). A wheel no upload has any more keeps an empty key: building it again fails with "missing in storage",
as it did when its file was gone. Builds are known by hash: rows keep theirs, and venvs on disk stay where they
are; new specs hash anew (``HASH_FORMAT`` 2).
"""

import os
import shutil
import sys
import sysconfig
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

HOST_FIELDS = ("interpreter", "base_prefix", "base_site")
BUILDS = sa.table("environment_builds", sa.column("spec_hash", sa.String), sa.column("spec", sa.JSON))


def _rows(conn: sa.Connection) -> list[tuple[str, dict[str, Any]]]:
    return [(h, dict(spec)) for h, spec in conn.execute(sa.select(BUILDS.c.spec_hash, BUILDS.c.spec)).all()]


def _save(conn: sa.Connection, spec_hash: str, spec: dict[str, Any]) -> None:
    conn.execute(sa.update(BUILDS).where(BUILDS.c.spec_hash == spec_hash).values(spec=spec))


def upgrade() -> None:
    conn = op.get_bind()
    keys: dict[str, str] = dict(
        conn.execute(sa.text("SELECT sha256, MIN(storage_key) FROM code_uploads GROUP BY sha256")).all()
    )
    for spec_hash, spec in _rows(conn):
        if not any(f in spec for f in HOST_FIELDS) and not spec.get("wheels"):
            continue
        for field in HOST_FIELDS:
            spec.pop(field, None)
        spec["wheels"] = [[sha, keys.get(sha, "")] for sha, _path in spec.get("wheels") or []]
        _save(conn, spec_hash, spec)


def _interpreter(version: str) -> str:
    """What the older code stored: this host's interpreter of ``version`` (the migration runs on the server)."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return os.path.abspath(sys.executable)
    return shutil.which(f"python{version}") or f"python{version}"


def downgrade() -> None:
    # the host fields come back as the older code would have found them on this host; wheels keep their keys,
    # relative to the data dir, as 0008's downgrade keeps code keys (a downgraded server runs from the data dir)
    conn = op.get_bind()
    paths = sysconfig.get_paths()
    site = list(dict.fromkeys(os.path.abspath(d) for d in (paths["purelib"], paths["platlib"]) if d))
    for spec_hash, spec in _rows(conn):
        spec["interpreter"] = _interpreter(str(spec["python"]))
        if spec.get("inherit"):
            spec["base_prefix"], spec["base_site"] = os.path.abspath(sys.prefix), site
        _save(conn, spec_hash, spec)
