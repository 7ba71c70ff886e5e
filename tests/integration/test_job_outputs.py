"""A job's outputs are saved into the object store when each attempt ends — and nothing a job leaves there
stops the control plane: names that cannot be stored, deep trees, links, FIFOs and sparse giants are left out
or refused with a note, while the other tenants' jobs go on (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud.errors import InvalidArgument
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.schemas.jobs import JobDetail
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


def _ended(client, name: str) -> JobDetail:
    return wait_for(lambda: (j := client.jobs.get(name)).state in TERMINAL and j, 90, what=f"{name} to end")


def test_what_a_job_leaves_in_its_outputs_never_stops_the_control_plane(small_env: Env) -> None:
    env = small_env
    alice = env.new_tenant_user("acme", "alice")
    bob = env.new_tenant_user("beta", "bob")
    alice.jobs.submit({"name": "hostile", "command": HOSTILE})
    assert _ended(alice, "hostile").state == "SUCCEEDED"
    bob.jobs.submit({"name": "after", "command": "echo fine"})  # scheduled and supervised as ever
    assert _ended(bob, "after").state == "SUCCEEDED"
    v = alice.models.register("kept", "onnx", from_job="hostile", path="model.onnx")
    assert v.source_path == "model.onnx"
    for path, fragment in {"leak": "symbolic link", "pipe": "FIFO", "d": "too long or too deep"}.items():
        with pytest.raises(InvalidArgument, match=fragment):
            alice.models.register("kept", "onnx", from_job="hostile", path=path)

    # a sparse file of 2 GiB (nothing on disk) is over the limit: nothing is saved, the job is told
    alice.jobs.submit({"name": "giant", "command": 'truncate -s 2G "$DLCLOUD_OUTPUT_DIR/big"'})
    assert _ended(alice, "giant").state == "SUCCEEDED"
    events = [e.reason for e in alice.jobs.get("giant").events]
    assert any("more than 1048576 bytes" in r for r in events), events
    with pytest.raises(InvalidArgument, match="no saved outputs"):
        alice.models.register("giant", "onnx", from_job="giant", path="big")


def test_only_the_latest_attempts_outputs_are_kept(small_env: Env) -> None:
    env = small_env
    c = env.admin
    once = 'cd "$DLCLOUD_OUTPUT_DIR"; echo "$DLCLOUD_ATTEMPT" > n; [ "$DLCLOUD_ATTEMPT" = 2 ]'
    job = c.jobs.submit({"name": "twice", "command": once, "restart": {"max_restarts": 1, "backoff_seconds": 0}})
    assert _ended(c, "twice").state == "SUCCEEDED"
    tenant_id = c.tenants.get("default").id
    kept = sorted(i.key for i in env.platform.objects.list(f"jobs/{tenant_id}/{job.id}/outputs"))
    assert [k.split("/outputs/")[1] for k in kept if not k.endswith(".json")] == ["attempt-2/n"], kept


def _stored(env: Env, tenant: str, job_id: str, what: str = "outputs") -> list[str]:
    """The keys the object store holds under the job's ``what`` (outputs, logs)."""
    tenant_id = env.admin.tenants.get(tenant).id
    return sorted(i.key for i in env.platform.objects.list(f"jobs/{tenant_id}/{job_id}/{what}"))


def test_outputs_over_the_storage_quota_are_refused_before_a_byte_is_copied(small_env: Env) -> None:
    env = small_env
    alice = env.new_tenant_user("acme", "alice", quota={"storage": 64 * 1024})
    job = alice.jobs.submit({"name": "big", "command": 'head -c 204800 /dev/zero > "$DLCLOUD_OUTPUT_DIR/big"'})
    ended = _ended(alice, "big")
    assert ended.state == "SUCCEEDED" and ended.exit_code == 0  # the job's end is its own
    refused = [e.reason for e in ended.events if "were not saved" in e.reason]
    assert len(refused) == 1, ended.events
    assert "its outputs (200Ki) were not saved" in refused[0]  # their size, what is left, what to do
    assert "64Ki left of its storage quota of 64Ki" in refused[0] and "ask an admin" in refused[0]
    assert _stored(env, "acme", job.id) == []  # nothing of them, not even a part
    assert _stored(env, "acme", job.id, "logs")  # its logs are saved as ever
    copies = [p for p in env.settings.data_dir.rglob("big") if not p.is_relative_to(env.settings.runs_dir)]
    assert copies == []  # nor a staged copy of them in the server's data dir
    assert alice.accounting.quota().usage.storage == 0
    with pytest.raises(InvalidArgument, match="no saved outputs"):
        alice.models.register("big", "onnx", from_job="big", path="big")

    # within what is left they are saved, and counted
    alice.jobs.submit({"name": "small", "command": 'head -c 1000 /dev/zero > "$DLCLOUD_OUTPUT_DIR/small"'})
    assert _ended(alice, "small").state == "SUCCEEDED"
    assert alice.accounting.quota().usage.storage == 1000


def test_outputs_and_checkpoints_count_in_the_storage_quota_until_the_job_is_deleted(small_env: Env) -> None:
    env = small_env
    alice = env.new_tenant_user("acme", "alice", quota={"storage": 1024 * 1024})
    command = (
        'head -c 300000 /dev/zero > "$DLCLOUD_CHECKPOINT_DIR/ckpt" && ln "$DLCLOUD_CHECKPOINT_DIR/ckpt" '
        '"$DLCLOUD_CHECKPOINT_DIR/again" && head -c 5000 /dev/zero > "$DLCLOUD_OUTPUT_DIR/model.bin"'
        ' && ln -s "$DLCLOUD_CHECKPOINT_DIR/ckpt" "$DLCLOUD_OUTPUT_DIR/link" && ln -s / "$DLCLOUD_OUTPUT_DIR/root"'
    )
    job = alice.jobs.submit({"name": "trained", "command": command})
    assert _ended(alice, "trained").state == "SUCCEEDED"
    ckpt = env.settings.runs_dir / env.admin.tenants.get("acme").id / job.id / "checkpoints" / "ckpt"
    on_disk = ckpt.stat().st_blocks * 512  # as the executor measures it: the disk it takes, once for two names
    assert on_disk >= 300000
    # the links were neither followed nor counted: the outputs are model.bin alone
    assert alice.accounting.quota().usage.storage == 5000 + on_disk
    assert env.admin.accounting.quota("acme").usage.storage == 5000 + on_disk
    alice.jobs.delete("trained")
    assert alice.accounting.quota().usage.storage == 0


def test_a_new_attempts_outputs_replace_the_saved_ones_in_the_quota(small_env: Env) -> None:
    env = small_env
    alice = env.new_tenant_user("acme", "alice", quota={"storage": 64 * 1024})
    # attempt 1 keeps 40 KB; attempt 2 keeps 50 KB: it fits since it replaces the first's, which go
    twice = (
        'cd "$DLCLOUD_OUTPUT_DIR"; rm -f out; head -c $((30000 + 10000 * DLCLOUD_ATTEMPT)) /dev/zero > out;'
        ' [ "$DLCLOUD_ATTEMPT" = 2 ]'
    )
    job = alice.jobs.submit({"name": "twice", "command": twice, "restart": {"max_restarts": 1, "backoff_seconds": 0}})
    ended = _ended(alice, "twice")
    assert ended.state == "SUCCEEDED", ended.events
    assert not [e for e in ended.events if "were not saved" in e.reason], ended.events
    stored = [k.split("/outputs/")[1] for k in _stored(env, "acme", job.id) if not k.endswith(".json")]
    assert stored == ["attempt-2/out"]
    assert alice.accounting.quota().usage.storage == 50000
