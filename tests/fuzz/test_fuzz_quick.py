"""The quick fuzz in ``make test``: tests/fuzz/run.py with few examples and a fixed seed (``make fuzz`` runs
the long one)."""

from __future__ import annotations

import pytest

from tests.fuzz.run import parse_args, run

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(600)]


def test_openapi_fuzz_quick(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(parse_args(["--max-examples", "3", "--min-cases", "300", "--seed", "20261124"]))
    out = capsys.readouterr().out
    assert rc == 0, out[-20000:]
    assert "passed" in out.splitlines()[-1]
