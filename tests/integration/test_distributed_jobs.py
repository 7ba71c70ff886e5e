"""Distributed jobs through the real control loop and local executor: a 2-worker PyTorch gang that
all-reduces with gloo, whole-gang failure and restart, cancellation, per-replica logs and describe, ports."""

from __future__ import annotations

import shlex
import shutil

import pytest
from sqlalchemy import func, select

from dlcloud.errors import InvalidSpec
from dlcloud.store.rows import PortRow
from tests.conftest import wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}

ALL_REDUCE = """
import os, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert world == 2 and os.environ["LOCAL_RANK"] == "0" and os.environ["GROUP_RANK"] == str(rank)
dist.init_process_group("gloo")
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"rank {rank} of {world} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def _py(script: str) -> str:
    return "python -c " + shlex.quote(script)


def _wait_end(client, name, timeout=120.0):
    return wait_for(
        lambda: (j := client.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=f"job {name} to end"
    )


def _held_ports(env) -> int:
    with env.platform.db.read() as s:
        return s.scalar(select(func.count()).select_from(PortRow)) or 0


def test_two_worker_pytorch_job_all_reduces_and_succeeds(running_env):
    c = running_env.admin
    c.jobs.submit(
        {
            "name": "ddp",
            "framework": "pytorch",
            "replicas": {"worker": 2},
            "resources": {"cpu": 1, "memory": "2Gi"},
            "command": _py(ALL_REDUCE),
        }
    )
    job = _wait_end(c, "ddp")
    assert job.state == "SUCCEEDED", job.reason
    assert job.cpus == 2 and job.memory == 4 * 1024**3  # the gang's totals
    (attempt,) = job.attempts
    assert attempt.cpus == 2  # the usage record sums the replicas
    names = [r.name for r in attempt.replicas]
    assert names == ["worker-0", "worker-1"]
    assert all(r.state == "succeeded" and r.exit_code == 0 for r in attempt.replicas)
    port = attempt.ports[0]
    assert 29500 <= port <= 30499 and all(r.ports == [port] for r in attempt.replicas)
    assert _held_ports(running_env) == 0  # released when the attempt ended
    # default: all replicas interleaved, each line labelled with its replica
    lines = [(x.replica, x.text) for x in c.jobs.logs("ddp") if x.stream == "stdout"]
    assert ("worker-0", "rank 0 of 2 sum 3") in lines and ("worker-1", "rank 1 of 2 sum 3") in lines
    only = [(x.replica, x.text) for x in c.jobs.logs("ddp", replica="worker-1") if x.stream == "stdout"]
    assert only == [("", "rank 1 of 2 sum 3")]


def test_failing_replica_stops_the_gang_and_restarts_it_whole(running_env):
    c = running_env.admin
    # on attempt 1 worker-1 fails once worker-0 runs (a file in the shared checkpoint dir says so); worker-0
    # would run forever unless the gang is stopped
    script = (
        'ck="$DLCLOUD_CHECKPOINT_DIR/w0-$DLCLOUD_ATTEMPT"; '
        'if [ "$DLCLOUD_ATTEMPT" = 1 ] && [ "$DLCLOUD_REPLICA" = worker-1 ]; then '
        'while [ ! -e "$ck" ]; do sleep 0.05; done; echo boom-$RANK; exit 3; fi; '
        'if [ "$DLCLOUD_ATTEMPT" = 1 ]; then trap "echo got-sigterm; exit 143" TERM; touch "$ck"; '
        "while true; do sleep 0.1; done; fi; "
        'echo "ok $DLCLOUD_REPLICA $DLCLOUD_CHECKPOINT_DIR"'
    )
    c.jobs.submit(
        {
            "name": "gang-fail",
            "framework": "pytorch",
            "replicas": {"worker": 2},
            "command": script,
            "restart": {"max_restarts": 1, "backoff_seconds": 0.1},
        }
    )
    job = _wait_end(c, "gang-fail")
    assert job.state == "SUCCEEDED", job.reason
    assert job.attempt == 2 and job.restarts == 1
    first, second = job.attempts
    assert first.outcome == "failed" and first.exit_code == 3
    states = {r.name: (r.state, r.exit_code) for r in first.replicas}
    assert states["worker-1"] == ("failed", 3)
    assert states["worker-0"][0] == "stopped"
    assert [r.state for r in second.replicas] == ["succeeded", "succeeded"]
    restarting = [e for e in job.events if e.to_state == "RESTARTING"]
    assert len(restarting) == 1
    assert "worker-1 exited with code 3" in restarting[0].reason and "boom-1" in restarting[0].reason
    texts = [x.text for x in c.jobs.logs("gang-fail", replica="worker-0")]
    assert "got-sigterm" in texts
    ok = [t for t in (x.text for x in c.jobs.logs("gang-fail")) if t.startswith("ok ")]
    assert len(ok) == 2 and len({t.split()[2] for t in ok}) == 1  # one checkpoint dir for all replicas


def test_exit_code_not_in_restart_list_fails_without_restart(running_env):
    c = running_env.admin
    c.jobs.submit(
        {
            "name": "no-restart",
            "replicas": {"worker": 2},
            "command": '[ "$DLCLOUD_REPLICA" = worker-0 ] && exit 4; sleep 30',
            "restart": {"max_restarts": 3, "backoff_seconds": 0, "never_restart_on_exit_codes": [4]},
        }
    )
    job = _wait_end(c, "no-restart")
    assert job.state == "FAILED" and job.attempt == 1
    assert "worker-0 exited with code 4" in job.reason and "never_restart_on_exit_codes" in job.reason


def test_cancel_stops_every_replica(running_env):
    c = running_env.admin
    c.jobs.submit(
        {
            "name": "gang-cancel",
            "framework": "pytorch",
            "replicas": {"worker": 2},
            "grace_period": "5s",
            "command": "trap 'echo got-sigterm; exit 143' TERM; echo started; while true; do sleep 0.1; done",
        }
    )
    wait_for(
        lambda: sum(x.text == "started" for x in c.jobs.logs("gang-cancel")) == 2, timeout=60, what="both replicas"
    )
    assert _held_ports(running_env) == 1
    c.jobs.cancel("gang-cancel")
    job = _wait_end(c, "gang-cancel")
    assert job.state == "CANCELLED"
    assert [r.state for r in job.attempts[0].replicas] == ["stopped", "stopped"]
    labelled = [(x.replica, x.text) for x in c.jobs.logs("gang-cancel") if x.text == "got-sigterm"]
    assert sorted(labelled) == [("worker-0", "got-sigterm"), ("worker-1", "got-sigterm")]
    assert _held_ports(running_env) == 0


def test_gang_waits_whole_with_its_reason_then_starts_whole(running_env):
    c = running_env.admin
    c.jobs.submit({"name": "blocker", "resources": {"gpus": 1}, "command": "sleep 60"})
    wait_for(lambda: c.jobs.get("blocker").state == "RUNNING", what="the blocker to run")
    c.jobs.submit({"name": "gang", "replicas": {"worker": 2}, "resources": {"gpus": 1}, "command": "true"})
    # before the first pass looks at it the reason is the placeholder "waiting for the scheduler": poll for
    # the planner's own
    job = wait_for(
        lambda: "needs 2 GPU(s) for 2 worker(s), 1 free" in ((j := c.jobs.get("gang")).wait_reason or "") and j,
        what="the gang to wait for capacity",
    )
    assert job.state == "QUEUED" and job.attempts == []  # no replica started: all or nothing
    c.jobs.cancel("blocker")
    job = _wait_end(c, "gang")
    assert job.state == "SUCCEEDED"
    assert sorted(g for r in job.attempts[0].replicas for g in r.gpus) == [0, 1]


def test_a_gang_that_can_never_fit_is_refused(running_env):
    with pytest.raises(InvalidSpec, match=r"2 worker\(s\) x 2 GPU\(s\) but this platform has 2 matching"):
        running_env.admin.jobs.submit(
            {"name": "huge", "replicas": {"worker": 2}, "resources": {"gpus": 2}, "command": "true"}
        )


def test_tensorflow_chief_decides_and_ps_are_stopped(running_env):
    c = running_env.admin
    script = (
        'if [ "$DLCLOUD_REPLICA_ROLE" = chief ]; then echo "$TF_CONFIG"; exit 0; fi; '
        "trap 'echo ps-stopped; exit 143' TERM; while true; do sleep 0.1; done"
    )
    c.jobs.submit({"name": "tf", "framework": "tensorflow", "replicas": {"chief": 1, "ps": 1}, "command": script})
    job = _wait_end(c, "tf")
    assert job.state == "SUCCEEDED", job.reason
    states = {r.name: r.state for r in job.attempts[0].replicas}
    assert states == {"chief-0": "succeeded", "ps-0": "stopped"}
    chief = [x.text for x in c.jobs.logs("tf", replica="chief-0") if x.stream == "stdout"]
    assert '"task":{"type":"chief","index":0}' in chief[0]


def test_mpi_manual_launcher_reads_the_hostfile_and_decides(running_env):
    c = running_env.admin
    c.jobs.submit(
        {
            "name": "mpi",
            "framework": "mpi",
            "mpi_launch": "manual",
            "replicas": {"launcher": 1, "worker": 2},
            "slots_per_worker": 2,
            "command": 'cat "$DLCLOUD_MPI_HOSTFILE"; echo "np=$DLCLOUD_MPI_NP"',
        }
    )
    job = _wait_end(c, "mpi")
    assert job.state == "SUCCEEDED", job.reason
    states = [r.state for r in job.attempts[0].replicas]
    assert states == ["succeeded", "stopped", "stopped"]
    texts = [x.text for x in c.jobs.logs("mpi", replica="launcher-0") if x.stream == "stdout"]
    assert texts == ["localhost slots=4", "np=4"]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_mpi_launcher_runs_mpirun_over_the_workers_slots(running_env):
    c = running_env.admin
    c.jobs.submit(
        {
            "name": "mpirun",
            "framework": "mpi",
            "replicas": {"launcher": 1, "worker": 2},
            # quoted: mpirun's ranks expand the variables, not the launcher's shell
            "command": "sh -c 'echo rank-$OMPI_COMM_WORLD_RANK-of-$OMPI_COMM_WORLD_SIZE'",
        }
    )
    job = _wait_end(c, "mpirun")
    texts = sorted(x.text for x in c.jobs.logs("mpirun", replica="launcher-0") if x.stream == "stdout")
    assert job.state == "SUCCEEDED", (job.reason, texts)
    assert texts == ["rank-0-of-2", "rank-1-of-2"]
