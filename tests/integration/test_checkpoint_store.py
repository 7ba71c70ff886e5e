"""Checkpoints in the object store on the local executor (docs/jobs.md#checkpoints-in-the-object-store), with a real
S3 server (SeaweedFS), on SQLite and PostgreSQL: a running job's checkpoint is saved once it is left alone; a job
preempted, whose checkpoint directory on this host is then deleted, resumes from the copy in the bucket; another
job's ``checkpoint_from`` reads the bucket when the named job's directory is gone from this host; with the store
off, the same deletion loses the checkpoint (the check that the test can fail)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlcloud.control import checkpoint_saves
from dlcloud.executors.local import executor as local_executor
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.services.job_keys import checkpoints_key
from dlcloud.settings import GpuSpec
from dlcloud.storage import checkpoint_store
from tests.conftest import Env, build_env, control_running, make_settings, release, wait_for
from tests.s3server import S3Server, s3_settings_in_env

H100 = "NVIDIA H100 80GB HBM3"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
# counts steps from the one its checkpoint holds; the first attempt holds after step 5 until it is preempted
STEPS = (
    'ck="$DLCLOUD_CHECKPOINT_DIR"; n=$(cat "$ck/step" 2>/dev/null || echo 0); '
    'echo "attempt=$DLCLOUD_ATTEMPT start=$n" >> "$DLCLOUD_OUTPUT_DIR/starts"; '
    'stat -c %a "$ck" "$ck/step" > "$DLCLOUD_OUTPUT_DIR/modes-$DLCLOUD_ATTEMPT" 2>/dev/null; '
    'while [ "$n" -lt 8 ]; do n=$((n+1)); echo $n > "$ck/.step"; mv "$ck/.step" "$ck/step"; '
    'if [ "$n" -eq 5 ] && [ "$DLCLOUD_ATTEMPT" = 1 ]; then while true; do sleep 0.05; done; fi; done'
)


@pytest.fixture(autouse=True)
def _look_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_executor, "CHECKPOINT_LOOK_SECONDS", 0.1)
    monkeypatch.setattr(checkpoint_saves, "QUIET_SECONDS", 0.3)


@contextmanager
def _platform(request, tmp_path: Path, db_url: str, monkeypatch, **overrides) -> Iterator[tuple[Env, S3Server]]:
    server, url = s3_settings_in_env(request, monkeypatch)
    settings = make_settings(
        tmp_path,
        db_url,
        storage_url=url,
        s3_addressing_style="path",
        gpu_inventory=[GpuSpec(index=0, name=H100)],
        checkpoint_save_interval_seconds=0,
        **overrides,
    )
    with control_running(build_env(settings, LocalExecutor())) as e:
        yield e, server


def _job_dir(env: Env, job_id: str) -> Path:
    (found,) = env.settings.runs_dir.glob(f"*/{job_id}")
    return found


def _starts(env: Env, job_id: str) -> list[str]:
    found = list(env.settings.runs_dir.glob(f"*/{job_id}/outputs/starts"))
    return found[0].read_text().splitlines() if found else []


def _saved_step(env: Env, tenant_id: str, job_id: str, tmp_path: Path) -> str | None:
    """The step the bucket's last saved checkpoint of the job holds, read back through the store."""
    out = tmp_path / f"read-{job_id}-{len(list(tmp_path.glob('read-*')))}"
    if checkpoint_store.restore(env.platform.objects, checkpoints_key(tenant_id, job_id), out) is None:
        return None
    return (out / "step").read_text().strip()


def _end(env: Env, name: str, timeout: float = 90.0):
    return wait_for(lambda: (j := env.admin.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=name)


def _preempt_and_lose_the_host_copy(env: Env) -> tuple[str, str]:
    """Run the counting job, preempt it at step 5, delete its checkpoint directory on this host while the urgent
    job holds the GPU, then let it resume: (tenant id, job id) of the counting job, ended."""
    c = env.admin
    low = c.jobs.submit({"name": "low", "command": STEPS, "priority_class": "low", "resources": {"gpus": 1}})
    wait_for(lambda: _starts(env, low.id), what="the first attempt to start")
    ckpt = _job_dir(env, low.id) / "checkpoints"
    wait_for(lambda: (ckpt / "step").exists() and (ckpt / "step").read_text().strip() == "5", what="step 5")
    urgent = c.jobs.submit(
        {
            "name": "urgent",
            "command": 'while [ ! -e "$DLCLOUD_OUTPUT_DIR/go" ]; do sleep 0.05; done',
            "priority_class": "high",
            "resources": {"gpus": 1},
        }
    )
    wait_for(lambda: c.jobs.get("urgent").state == "RUNNING", timeout=60, what="the urgent job to run")
    assert c.jobs.get("low").state in ("PREEMPTED", "QUEUED"), c.jobs.get("low")
    shutil.rmtree(ckpt)  # this host's copy lost, as with a host that died
    release(env.settings.data_dir, urgent.id)
    assert _end(env, "urgent").state == "SUCCEEDED"
    job = _end(env, "low")
    assert job.state == "SUCCEEDED" and job.preemptions == 1, job.events
    tenant_id = _job_dir(env, low.id).parent.name
    return tenant_id, low.id


def test_a_preempted_job_whose_host_copy_is_lost_resumes_from_the_bucket(
    request, tmp_path: Path, db_url: str, monkeypatch
) -> None:
    with _platform(request, tmp_path, db_url, monkeypatch) as (env, _server):
        tenant_id, job_id = _preempt_and_lose_the_host_copy(env)
        # attempt 2 started from step 5, the checkpoint the bucket kept, and counted on to 8
        assert _starts(env, job_id) == ["attempt=1 start=0", "attempt=2 start=5"]
        ckpt = _job_dir(env, job_id) / "checkpoints"
        assert (ckpt / "step").read_text().strip() == "8"
        sandbox = env.platform.executor.sandbox  # type: ignore[attr-defined]
        if sandbox.enabled:  # restored as the job's own: its sandbox uid, private
            assert ckpt.stat().st_uid == (ckpt / "step").stat().st_uid != 0
            # as attempt 2 found them before it wrote anything
            assert (_job_dir(env, job_id) / "outputs" / "modes-2").read_text().split() == ["700", "600"]
        # the end of attempt 2 saved its last checkpoint too
        assert _saved_step(env, tenant_id, job_id, tmp_path) == "8"

        # another job starts from it: the named job's directory is gone from this host, the bucket has it
        shutil.rmtree(ckpt)
        env.admin.jobs.submit(
            {
                "name": "next",
                "command": 'cat "$DLCLOUD_CHECKPOINT_DIR/step" > "$DLCLOUD_OUTPUT_DIR/from"',
                "checkpoint_from": "low",
            }
        )
        nxt = _end(env, "next")
        assert nxt.state == "SUCCEEDED", nxt.events
        assert (_job_dir(env, nxt.id) / "outputs" / "from").read_text().strip() == "8"


def test_a_running_jobs_checkpoint_is_saved_once_left_alone(request, tmp_path: Path, db_url: str, monkeypatch) -> None:
    with _platform(request, tmp_path, db_url, monkeypatch) as (env, _server):
        job = env.admin.jobs.submit(
            {
                "name": "saver",
                "command": 'echo 3 > "$DLCLOUD_CHECKPOINT_DIR/step"; '
                'while [ ! -e "$DLCLOUD_OUTPUT_DIR/go" ]; do sleep 0.05; done',
            }
        )
        wait_for(lambda: list(env.settings.runs_dir.glob(f"*/{job.id}/checkpoints/step")), what="its checkpoint")
        tenant_id = _job_dir(env, job.id).parent.name
        key = checkpoints_key(tenant_id, job.id)
        saved = wait_for(lambda: checkpoint_store.latest(env.platform.objects, key), what="the save while it runs")
        assert env.admin.jobs.get("saver").state == "RUNNING"
        assert (saved.files, saved.bytes) == (1, 2)
        release(env.settings.data_dir, job.id)
        assert _end(env, "saver").state == "SUCCEEDED"


def test_with_the_store_off_the_lost_host_copy_is_lost(request, tmp_path: Path, db_url: str, monkeypatch) -> None:
    with _platform(request, tmp_path, db_url, monkeypatch, checkpoint_store="off") as (env, _server):
        tenant_id, job_id = _preempt_and_lose_the_host_copy(env)
        assert _starts(env, job_id) == ["attempt=1 start=0", "attempt=2 start=0"]
        assert env.platform.objects.head(f"{checkpoints_key(tenant_id, job_id)}/{checkpoint_store.LATEST}") is None
