"""``make fuzz``: Schemathesis over the OpenAPI document of a real ``dlcloud up``, signed, as two callers.

Starts ``dlcloud up`` on a free port with a temporary data dir, creates a second tenant with a member, then
runs the Schemathesis CLI over ``/api/v1/openapi.json`` twice: signed as the platform admin, and signed as
the other tenant's member (``tests/fuzz/hooks.py`` signs each request as sent). Every phase runs (schema
examples, coverage of boundaries and invalid values, random fuzzing, stateful sequences), in positive and
negative mode, with these checks on every response:

- ``not_a_server_error``: no 5xx;
- ``status_code_conformance``: the status is declared for the operation;
- ``response_schema_conformance``, ``content_type_conformance``, ``response_headers_conformance``: the body,
  media type and headers are the documented ones;
- ``unsupported_method``, ``allow_header_conformance``: an undocumented method is a 405 with a true ``Allow``.

The run fails if a check fails, if fewer than ``--min-cases`` requests were sent in all, or if the server
logged a traceback. It prints the statuses each operation answered.

Examples:

    .venv/bin/python tests/fuzz/run.py                      # what `make fuzz` runs
    .venv/bin/python tests/fuzz/run.py --max-examples 3 --min-cases 300 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(ROOT))

from dlcloud.client import Client, Credentials  # noqa: E402
from tests.e2e.conftest import Server, free_port  # noqa: E402

HOOKS = Path(__file__).resolve().parent / "hooks.py"
SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "response_schema_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "unsupported_method",
    "allow_header_conformance",
)
OTHER_TENANT, MEMBER = "fuzz-other", "mallory"


NO_RATE_LIMITS = {"DLCLOUD_API_RATE_LIMIT_PER_KEY": "0", "DLCLOUD_API_RATE_LIMIT_PER_TENANT": "0"}


def _callers(server: Server) -> dict[str, Credentials]:
    boot = json.loads((server.data_dir / "bootstrap-admin.json").read_text())
    admin = Credentials(server.endpoint, boot["access_key"], boot["secret_key"])
    with Client(admin) as sdk:
        sdk.tenants.create(OTHER_TENANT, {})
        sdk.users.create(MEMBER, tenant=OTHER_TENANT, role="member")
        key = sdk.keys.create(user=MEMBER, tenant=OTHER_TENANT)
    return {"admin": admin, "member": Credentials(server.endpoint, key.access_key, key.secret_key)}


def _schemathesis(
    server: Server, who: str, creds: Credentials, log: Path, args: argparse.Namespace, workdir: Path
) -> int:
    cmd = [
        SCHEMATHESIS,
        "run",
        f"{server.endpoint}/api/v1/openapi.json",
        "--checks",
        os.environ.get("DLCLOUD_FUZZ_CHECKS", ",".join(CHECKS)),
        "--max-examples",
        str(args.max_examples),
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    if args.phases:
        cmd += ["--phases", args.phases]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": str(HOOKS),
        "DLCLOUD_FUZZ_ACCESS_KEY": creds.access_key,
        "DLCLOUD_FUZZ_SECRET_KEY": creds.secret_key,
        "DLCLOUD_FUZZ_WHO": who,
        "DLCLOUD_FUZZ_LOG": str(log),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    print(f"== schemathesis as {who} ==", flush=True)
    return subprocess.run(cmd, env=env, cwd=workdir, timeout=args.timeout).returncode


def _report(log: Path) -> tuple[int, str]:
    seen: Counter[tuple[str, str, str, str]] = Counter()
    for line in log.read_text().splitlines() if log.exists() else []:
        who, method, path, status = line.split(" ")
        seen[(method, path, who, status)] += 1
    by_status: Counter[str] = Counter()
    for (_, _, _, status), n in seen.items():
        by_status[status] += n
    total = sum(seen.values())
    lines = [f"{total} requests; by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(by_status.items()))]
    ops: dict[tuple[str, str, str], list[str]] = {}
    for (method, path, who, status), n in sorted(seen.items()):
        ops.setdefault((method, path, who), []).append(f"{status}x{n}")
    lines += [f"  {method:6} {path:62} {who:6} {' '.join(st)}" for (method, path, who), st in ops.items()]
    return total, "\n".join(lines)


@contextmanager
def _database(postgres: str | None) -> Iterator[list[str]]:
    """``dlcloud up`` arguments for the database: SQLite in the data dir, or a fresh PostgreSQL database."""
    if postgres is None:
        yield []
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    admin_url = postgres.replace("postgresql://", "postgresql+psycopg://", 1)
    name = f"dlcloud_fuzz_{os.getpid()}_{secrets.token_hex(3)}"
    admin = create_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield ["--database-url", postgres.rsplit("/", 1)[0] + f"/{name}"]
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run(args: argparse.Namespace) -> int:
    """Run the fuzz; 0 when every check passed and enough requests were sent."""
    with tempfile.TemporaryDirectory(prefix="dlcloud-fuzz-") as tmp, _database(args.postgres) as db_args:
        root = Path(tmp)
        # the fuzz sends as fast as it can with one key: the rate limits would answer most of it 429
        server = Server(root, free_port(), extra_args=db_args, extra_env=NO_RATE_LIMITS)
        started = time.monotonic()
        server.start()
        failed: list[str] = []
        try:
            log = root / "calls.log"
            for who, creds in _callers(server).items():
                if _schemathesis(server, who, creds, log, args, root) != 0:
                    failed.append(f"schemathesis as {who} found failures (above)")
        finally:
            server.stop()
        total, report = _report(log)
        print(report)
        if args.report:
            Path(args.report).write_text(report + "\n")
        server_log = (root / "server.log").read_text(errors="replace")
        if "Traceback" in server_log:
            failed.append(f"the server logged a traceback:\n{server_log[-5000:]}")
        if total < args.min_cases:
            failed.append(f"only {total} requests were sent, fewer than {args.min_cases}")
        print(f"fuzz: {total} requests in {time.monotonic() - started:.0f} s; " + ("FAILED" if failed else "passed"))
        for reason in failed:
            print(f"  {reason}")
        return 1 if failed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-examples", type=int, default=50, help="Schemathesis examples per operation and phase")
    p.add_argument("--min-cases", type=int, default=1000, help="fail unless at least this many requests were sent")
    p.add_argument("--seed", type=int, default=None, help="Schemathesis seed (default: random, printed)")
    p.add_argument("--phases", default=None, help="Schemathesis phases (default: all)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for each Schemathesis run")
    p.add_argument("--report", default=None, help="also write the per-operation status table to this file")
    p.add_argument(
        "--postgres",
        nargs="?",
        const=os.environ.get("DLCLOUD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        default=None,
        metavar="URL",
        help="run the server on a fresh database of this PostgreSQL server (default URL: "
        "$DLCLOUD_TEST_POSTGRES_URL or postgresql://postgres@127.0.0.1:5432/postgres) instead of SQLite",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run(parse_args()))
