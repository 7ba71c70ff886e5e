"""Job logs past their size cap, through the real control loop, local executor and API: the end is kept and
read from the end, reads are bounded and say what they leave out, and a follower loses no line."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.schemas.jobs import JobDetail
from tests.conftest import Env, build_env, control_running, make_settings, wait_for
from tests.job_files import touch_for_job

CAP = 64 * 1024
RESPONSE = 16 * 1024
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}


@pytest.fixture
def capped_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """``running_env`` with job logs capped at 64 KiB and reads without --follow at 16 KiB."""
    settings = make_settings(tmp_path, db_url, job_log_max_bytes=CAP, job_log_response_max_bytes=RESPONSE)
    with control_running(build_env(settings, LocalExecutor())) as e:
        yield e


def _wait_end(env: Env, name: str) -> JobDetail:
    return wait_for(
        lambda: (j := env.admin.jobs.get(name)).state in TERMINAL and j, timeout=60, what=f"job {name} to end"
    )


def _attempt_dir(env: Env, name: str) -> Path:
    job_id = env.admin.jobs.get(name).id
    return next(env.settings.runs_dir.glob(f"*/{job_id}/attempt-1"))


def _numbers(lines) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(x.text.split()[1]) for x in lines if x.stream == "stdout" and x.text.startswith("line ")]


def test_a_job_past_the_cap_keeps_the_end_of_its_log(capped_env: Env):
    c = capped_env.admin
    c.jobs.submit(
        {"name": "chatty", "command": "python -c \"[print(f'line {i:05d} ' + 'x' * 90) for i in range(3000)]\""}
    )
    assert _wait_end(capped_env, "chatty").state == "SUCCEEDED"
    attempt_dir = _attempt_dir(capped_env, "chatty")
    files = [attempt_dir / "output.log.1", attempt_dir / "output.log"]
    assert sum(f.stat().st_size for f in files) <= CAP

    # a read without --follow: the end of the log, at most RESPONSE bytes, marked
    lines = list(c.jobs.logs("chatty"))
    assert lines[0].stream == "system" and lines[0].text.startswith("log truncated: earlier lines not shown")
    assert (lines[-2].text.split()[1], lines[-1].text) == ("02999", "command exited with code 0")
    kept = _numbers(lines)
    assert kept == list(range(kept[0], 3000)) and len(kept) < RESPONSE // 100
    # --tail from the end
    assert [x.text for x in c.jobs.logs("chatty", tail=1)] == ["command exited with code 0"]
    assert _numbers(c.jobs.logs("chatty", tail=4)) == [2997, 2998, 2999]
    # --follow streams everything kept: the launcher's marker first, then every line to the end
    followed = list(c.jobs.logs("chatty", follow=True))
    assert followed[0].stream == "system"
    assert followed[0].text.startswith("log truncated: ") and followed[0].text.endswith(
        "earlier bytes dropped (cap 64 KiB)"
    )
    kept = _numbers(followed)
    assert kept == list(range(kept[0], 3000)) and len(kept) > CAP // 2 // 110
    assert sum(x.stream == "system" and x.text.startswith("log truncated") for x in followed) == 1


def test_following_a_job_across_log_rotations_loses_no_line(capped_env: Env):
    c = capped_env.admin
    # once the follower is there: 137 KB in 10 s, half the cap (32 KiB) every 2.4 s, polls 0.25 s apart (a line is
    # lost only if the follower falls three rotations behind: a stall of ~7 s)
    script = (
        "import os, time\n"
        'print("waiting", flush=True)\n'
        'while not os.path.exists(os.path.join(os.environ["DLCLOUD_CHECKPOINT_DIR"], "go")): time.sleep(0.05)\n'
        "for i in range(1000):\n"
        '    print(f"line {i:05d} " + "x" * 90)\n'
        "    if i % 100 == 99: time.sleep(1.0)\n"
    )
    c.jobs.submit({"name": "steady", "command": f"python -c '{script}'"})
    followed: list = []
    attached = threading.Event()

    def follow() -> None:
        for line in c.jobs.logs("steady", follow=True):
            followed.append(line)
            if line.text == "waiting":
                attached.set()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert attached.wait(60), "the job's first line never reached the follower"
    touch_for_job(_attempt_dir(capped_env, "steady").parent / "checkpoints" / "go")
    follower.join(timeout=90)
    assert not follower.is_alive()
    assert _wait_end(capped_env, "steady").state == "SUCCEEDED"
    assert _numbers(followed) == list(range(1000))
    assert not [x.text for x in followed if x.text.startswith("log truncated")]
    older = _attempt_dir(capped_env, "steady") / "output.log.1"
    assert "earlier bytes dropped" in older.read_text().splitlines()[0]  # it did rotate, twice or more
