"""A user continues a finished training on the real server with the real CLI: ``--checkpoint-from`` and
``checkpoint_from:`` in a spec file, each job counting on from the checkpoint of the one before; a name that is
not one of the user's jobs is a clear error."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

COUNT = (
    'n=$(cat "$DLCLOUD_CHECKPOINT_DIR/n" 2>/dev/null || echo 0); n=$((n+1)); '
    'echo $n > "$DLCLOUD_CHECKPOINT_DIR/n"; echo "epoch $n"'
)


def test_each_job_goes_on_from_the_checkpoint_of_the_one_before(server: Server) -> None:
    first = server.cli("jobs", "submit", "--name", "first", "--command", COUNT, "--follow")
    assert "epoch 1" in first.stdout
    spec = server.root / "more.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""
            name: more
            checkpoint_from: first
            command: '{COUNT}'
            """
        )
    )
    more = server.cli("jobs", "submit", "-f", str(spec), "--follow")
    assert "epoch 2" in more.stdout
    again = server.cli("jobs", "submit", "--name", "again", "--command", COUNT, "--checkpoint-from", "more", "--follow")
    assert "epoch 3" in again.stdout
    described = server.cli_json("jobs", "describe", "again")
    assert isinstance(described, dict) and described["spec"]["checkpoint_from"] == "more"
    rerun = server.cli("jobs", "submit", "--name", "first-again", "--command", COUNT, "--follow")
    assert "epoch 1" in rerun.stdout  # without checkpoint_from: a job's own, empty checkpoint dir

    missing = server.cli("jobs", "submit", "--name", "x", "--command", "true", "--checkpoint-from", "nope", check=False)
    assert missing.returncode != 0
    assert "checkpoint_from: job 'nope' not found" in missing.stderr and "Traceback" not in missing.stderr
    names = {j["name"] for j in server.cli_json("jobs", "list")}  # type: ignore[union-attr]
    assert names == {"first", "more", "again", "first-again"}
