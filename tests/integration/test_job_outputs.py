"""A job's outputs are saved into the object store when each attempt ends — and nothing a job leaves there
stops the control plane: names that cannot be stored, deep trees, links, FIFOs and sparse giants are left out
or refused with a note, while the other tenants' jobs go on (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud.errors import InvalidArgument
from dlcloud.executors.local.executor import LocalExecutor
from tests.conftest import Env, build_env, control_running, make_settings, wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
HOSTILE = (
    'cd "$DLCLOUD_OUTPUT_DIR" && printf ok > model.onnx && touch "$(printf "\\377")"'
    " && ln -s /etc/passwd leak && mkfifo pipe"
    " && python3 -c \"import os; p='d'; [p := p + '/d' for _ in range(60)]; os.makedirs(p)\""
)


@pytest.fixture
def small_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """A running platform whose outputs may hold 1 MiB at most (max_unpacked_bytes)."""
    settings = make_settings(tmp_path, db_url, max_unpacked_bytes=1024 * 1024)
    with control_running(build_env(settings, LocalExecutor())) as e:
        yield e


def _ended(client, name: str) -> dict:
    return wait_for(lambda: (j := client.jobs.get(name))["state"] in TERMINAL and j, 90, what=f"{name} to end")


def test_what_a_job_leaves_in_its_outputs_never_stops_the_control_plane(small_env: Env) -> None:
    env = small_env
    alice = env.new_tenant_user("acme", "alice")
    bob = env.new_tenant_user("beta", "bob")
    alice.jobs.submit({"name": "hostile", "command": HOSTILE})
    assert _ended(alice, "hostile")["state"] == "SUCCEEDED"
    bob.jobs.submit({"name": "after", "command": "echo fine"})  # scheduled and supervised as ever
    assert _ended(bob, "after")["state"] == "SUCCEEDED"
    v = alice.models.register("kept", "onnx", from_job="hostile", path="model.onnx")
    assert v["source_path"] == "model.onnx"
    for path, fragment in {"leak": "symbolic link", "pipe": "FIFO", "d": "too long or too deep"}.items():
        with pytest.raises(InvalidArgument, match=fragment):
            alice.models.register("kept", "onnx", from_job="hostile", path=path)

    # a sparse file of 2 GiB (nothing on disk) is over the limit: nothing is saved, the job is told
    alice.jobs.submit({"name": "giant", "command": 'truncate -s 2G "$DLCLOUD_OUTPUT_DIR/big"'})
    assert _ended(alice, "giant")["state"] == "SUCCEEDED"
    events = [e["reason"] for e in alice.jobs.get("giant")["events"]]
    assert any("more than 1048576 bytes" in r for r in events), events
    with pytest.raises(InvalidArgument, match="no saved outputs"):
        alice.models.register("giant", "onnx", from_job="giant", path="big")


def test_only_the_latest_attempts_outputs_are_kept(small_env: Env) -> None:
    env = small_env
    c = env.admin
    once = 'cd "$DLCLOUD_OUTPUT_DIR"; echo "$DLCLOUD_ATTEMPT" > n; [ "$DLCLOUD_ATTEMPT" = 2 ]'
    job = c.jobs.submit({"name": "twice", "command": once, "restart": {"max_restarts": 1, "backoff_seconds": 0}})
    assert _ended(c, "twice")["state"] == "SUCCEEDED"
    tenant_id = c.tenants.get("default")["id"]
    kept = sorted(i.key for i in env.platform.objects.list(f"jobs/{tenant_id}/{job['id']}/outputs"))
    assert [k.split("/outputs/")[1] for k in kept if not k.endswith(".json")] == ["attempt-2/n"], kept
