"""The quick fuzz in ``make test``: tests/fuzz/run.py on SQLite and PostgreSQL, without the coverage phase,
with few examples and a fixed seed. ``make fuzz`` runs every phase with many more (docs/api.md)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.conftest import IN_CI, PG_ADMIN_URL
from tests.fuzz.run import parse_args, run

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(600)]
QUICK = ["--max-examples", "8", "--min-cases", "300", "--seed", "20261124", "--phases", "examples,fuzzing,stateful"]


def _postgres() -> str:
    """The PostgreSQL server of the store tests; skipped where it is unreachable, except in CI."""
    engine = create_engine(PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # driver errors vary: any failure means no server
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is required in CI but unreachable: {exc}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {exc}")
    finally:
        engine.dispose()
    return PG_ADMIN_URL


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_openapi_fuzz_quick(capsys: pytest.CaptureFixture[str], database: str) -> None:
    args = QUICK if database == "sqlite" else [*QUICK, "--postgres", _postgres()]
    rc = run(parse_args(args))
    out = capsys.readouterr().out
    assert rc == 0, out[-20000:]
    assert out.splitlines()[-1].endswith("passed"), out[-2000:]
