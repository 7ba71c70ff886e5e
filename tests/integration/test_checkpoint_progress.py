"""A running attempt's checkpoints, as the platform learns them: the local executor sees the job change its
checkpoint directory, the supervision records the time on the attempt (``job_attempts.checkpoint_at``), and the
scheduling pass reads it as the attempt's progress, so that a preemption picks the attempts that lose the least
work (docs/scheduling.md#preemption). On SQLite and PostgreSQL, with a real job."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import select

from dlcloud.control.planner_inputs import read_held
from dlcloud.executors.local import executor as local_executor
from dlcloud.store.rows import AttemptRow, utcnow
from tests.conftest import WAIT_FOR_GO, Env, release, wait_for
from tests.job_files import touch_for_job


@pytest.fixture(autouse=True)
def _look_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_executor, "CHECKPOINT_LOOK_SECONDS", 0.1)


def _attempt(env: Env, job_id: str) -> tuple[datetime, datetime | None] | None:
    """(started_at, checkpoint_at) of the job's one attempt, once it has one."""
    with env.platform.db.read() as s:
        q = select(AttemptRow.started_at, AttemptRow.checkpoint_at).where(AttemptRow.job_id == job_id)
        row = s.execute(q).one_or_none()
    return None if row is None else (row[0], row[1])


def test_a_checkpoint_written_by_a_running_job_is_recorded_on_its_attempt(running_env: Env) -> None:
    env = running_env
    job = env.admin.jobs.submit(
        {
            "name": "saves",
            "command": f'{WAIT_FOR_GO}; echo 1 > "$DLCLOUD_CHECKPOINT_DIR/step-1.pt"; '
            f'while [ ! -e "$DLCLOUD_OUTPUT_DIR/go2" ]; do sleep 0.05; done',
        }
    )
    started, checkpoint_at = wait_for(lambda: _attempt(env, job.id), what="its start")
    assert checkpoint_at is None  # nothing written yet: preempting it loses everything since its start
    release(env.settings.data_dir, job.id)
    seen = wait_for(lambda: (a := _attempt(env, job.id)) is not None and a[1], what="the checkpoint")
    assert seen > started
    with env.platform.db.read_connection() as conn:  # what the scheduling pass weighs: the work since it
        (held,) = [h for h in read_held(conn, utcnow()) if h.job_id == job.id]
    assert (held.started_at, held.progress_at) == (started, seen)
    (outputs,) = env.settings.runs_dir.glob(f"*/{job.id}/outputs")

    touch_for_job(outputs / "go2")
    ended = wait_for(lambda: (j := env.admin.jobs.get("saves")).state == "SUCCEEDED" and j, what="its end")
    assert ended.attempts[0].exit_code == 0
    assert ended.attempts[0].checkpoint_at == seen  # what describe shows
    assert _attempt(env, job.id) == (started, seen)  # kept on the usage record


def test_a_checkpoint_time_in_the_future_counts_as_now(running_env: Env) -> None:
    env = running_env
    job = env.admin.jobs.submit(
        {"name": "future", "command": f'touch -d @4102444800 "$DLCLOUD_CHECKPOINT_DIR/x"; {WAIT_FOR_GO}'}
    )
    started, _ = wait_for(lambda: _attempt(env, job.id), what="its start")
    seen = wait_for(lambda: (a := _attempt(env, job.id)) is not None and a[1], what="the checkpoint")
    assert started < seen <= utcnow()  # not 2100: the job's own clock is not the platform's
    release(env.settings.data_dir, job.id)
    wait_for(lambda: env.admin.jobs.get("future").state == "SUCCEEDED", what="its end")
