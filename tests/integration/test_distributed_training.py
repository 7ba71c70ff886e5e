"""Distributed jobs for real: PyTorch DDP, TensorFlow parameter-server and MPI jobs through the control loop
and the local executor, running the unmodified scripts of ``tests/distributed/scripts`` (each also runs
under plain ``torchrun`` / ``mpirun`` / hand-made ``TF_CONFIG``, see their docstrings).

What is checked: the gang succeeds and its ranks agree; DDP over 2 workers reaches the loss of one process
on the same data (see LOSS_RTOL); a worker killed mid-training restarts the whole gang, which resumes from
its checkpoint without re-running finished epochs; two gangs at once get different MASTER_PORTs; a gang
that does not fit waits whole, with a reason, and starts when capacity frees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlcloud.cli.packing import pack_directory
from dlcloud.client import Client
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.schemas.jobs import Job, JobDetail
from tests.conftest import WAIT_FOR_GO, Env, build_env, control_running, make_settings, release, wait_for

pytestmark = pytest.mark.distributed

SCRIPTS = Path(__file__).resolve().parent.parent / "distributed" / "scripts"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
# 512 samples, 8 steps of 64 per epoch (32 per rank), reshuffled each epoch: several steps per epoch, so a
# crash can land mid-epoch
DDP_ARGS = ["--epochs", "4", "--samples", "512", "--global-batch", "64", "--shuffle", "--seed", "7"]
STEPS_PER_EPOCH = 8
# DDP (2 ranks x 32 samples, gradients averaged by allreduce) and one process (64 samples per step, same
# samples per step by construction, see ddp_train.py) follow the same SGD trajectory; only float32
# summation order differs. Measured here: 1.5e-7 relative on the loss after 40 steps; 1e-5 leaves 60x room
# and still catches any real difference (a wrong split or a missing allreduce changes the loss by > 1e-3).
LOSS_RTOL = 1e-5
WEIGHTS_ATOL = 1e-5
PER_REPLICA = {"cpu": 1, "memory": "1Gi"}


# -- the platform ----------------------------------------------------------------------------------------------


@contextmanager
def _platform(tmp_path: Path, db_url: str, **overrides: object) -> Iterator[Env]:
    """The in-process API, control loop and local executor (as ``running_env``), with settings overrides."""
    with control_running(build_env(make_settings(tmp_path, db_url, **overrides), LocalExecutor())) as e:
        yield e


@pytest.fixture
def dist_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    with _platform(tmp_path, db_url) as e:
        yield e


def _upload_scripts(c: Client, directory: Path = SCRIPTS) -> str:
    """A scripts directory as a code upload, packed as the CLI packs ``--code ./dir``."""
    packed = pack_directory(directory)
    try:
        return str(c.code.upload(packed.archive, kind="archive", filename="code.tar.gz").id)
    finally:
        packed.archive.unlink(missing_ok=True)


def _explain(c: Client, name: str) -> str:
    """The job's events and last log lines, for a failure message."""
    job = c.jobs.get(name)
    events = "\n".join(f"  {e.from_state} -> {e.to_state}: {e.reason}" for e in job.events)
    lines = list(c.jobs.logs(name))[-40:]
    logs = "\n".join(f"  [{getattr(x, 'replica', '') or '-'}] {x.stream}: {x.text}" for x in lines)
    return f"job {name}: {job.state} ({job.reason})\nevents:\n{events}\nlast log lines:\n{logs}"


def _wait_end(c: Client, name: str, timeout: float = 180.0) -> JobDetail:
    return wait_for(lambda: (j := c.jobs.get(name)).state in TERMINAL and j, timeout=timeout, what=f"job {name} to end")


def _succeeded(c: Client, name: str, timeout: float = 180.0) -> JobDetail:
    job = _wait_end(c, name, timeout)
    assert job.state == "SUCCEEDED", _explain(c, name)
    return job


def _outputs(env: Env, job: Job) -> Path:
    """The job's DLCLOUD_OUTPUT_DIR: runs/<tenant-id>/<job-id>/outputs."""
    found = list(env.settings.runs_dir.glob(f"*/{job.id}/outputs"))
    assert len(found) == 1, found
    return found[0]


def _checkpoints(env: Env, job: JobDetail) -> Path:
    found = list(env.settings.runs_dir.glob(f"*/{job.id}/checkpoints"))
    assert len(found) == 1, found
    return found[0]


def _rank_results(out: Path, world: int) -> list[dict]:
    results = [json.loads((out / f"result-rank{r}.json").read_text()) for r in range(world)]
    assert [r["rank"] for r in results] == list(range(world))
    assert {r["world_size"] for r in results} == {world}
    return results


def _single_process(tmp_path: Path, args: list[str]) -> dict:
    """The reference: ddp_train.py --single, one process on the full data with the same global batch."""
    out = tmp_path / "single-out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "ddp_train.py"), "--single", *args, "--out", str(out), "--checkpoint-dir", ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "result-rank0.json").read_text())


def _epoch_log(out: Path, rank: int) -> list[tuple[int, int, str]]:
    """(attempt, epoch, start|end) per line of ddp_train.py's epoch log of one rank."""
    rows = []
    for line in (out / f"epochs-rank{rank}.log").read_text().splitlines():
        attempt, epoch, what = line.split()
        rows.append((int(attempt.removeprefix("attempt=")), int(epoch.removeprefix("epoch=")), what))
    return rows


def _ddp_spec(name: str, code: str, command: str, **extra: object) -> dict:
    spec = {
        "name": name,
        "code": code,
        "command": command,
        "framework": "pytorch",
        "replicas": {"worker": 2},
        "resources": PER_REPLICA,
    }
    spec.update(extra)
    return spec


# -- PyTorch ---------------------------------------------------------------------------------------------------


def test_pytorch_ddp_two_workers_match_a_single_process(dist_env, tmp_path):
    c = dist_env.admin
    code = _upload_scripts(c)
    c.jobs.submit(_ddp_spec("ddp", code, "python ddp_train.py " + " ".join(DDP_ARGS)))
    job = _succeeded(c, "ddp")

    assert job.attempt == 1 and [a.outcome for a in job.attempts] == ["succeeded"]
    assert job.cpus == 2  # the job counts the whole gang
    ranks = _rank_results(_outputs(dist_env, job), 2)
    for r in ranks:
        assert r["steps"] == 4 * STEPS_PER_EPOCH
        assert r["master_addr"] and r["master_port"]
    assert ranks[0]["master_port"] == ranks[1]["master_port"]
    # DDP keeps replicas bitwise identical: same initial broadcast, same averaged gradients
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]

    single = _single_process(tmp_path, DDP_ARGS)
    assert ranks[0]["final_loss"] == pytest.approx(single["final_loss"], rel=LOSS_RTOL)
    assert ranks[0]["epoch_losses"] == pytest.approx(single["epoch_losses"], rel=LOSS_RTOL)
    assert ranks[0]["weights"] == pytest.approx(single["weights"], abs=WEIGHTS_ATOL)
    assert ranks[0]["final_loss"] < single["epoch_losses"][0]  # it trained

    replicas = {line.replica for line in c.jobs.logs("ddp") if line.stream == "stdout"}
    assert {"worker-0", "worker-1"} <= replicas, replicas


def test_killed_worker_restarts_the_whole_gang_from_its_checkpoint(dist_env, tmp_path):
    """Rank 1 exits with code 3 halfway through epoch 2 of attempt 1 (after the checkpoint of epoch 1)."""
    c = dist_env.admin
    code = _upload_scripts(c)
    args = [*DDP_ARGS, "--crash-rank", "1", "--crash-epoch", "2"]
    c.jobs.submit(
        _ddp_spec(
            "resume", code, "python ddp_train.py " + " ".join(args), restart={"max_restarts": 2, "backoff_seconds": 1}
        )
    )
    job = _succeeded(c, "resume", timeout=240)

    assert job.attempt == 2 and job.restarts == 1, _explain(c, "resume")
    assert [a.outcome for a in job.attempts] == ["failed", "succeeded"]
    restarting = [e for e in job.events if e.to_state == "RESTARTING"]
    assert len(restarting) == 1
    # the replica that failed first is named, with its code (rank 0 only fails after it, on the lost peer)
    assert "worker-1" in restarting[0].reason and "code 3" in restarting[0].reason, restarting[0].reason
    assert (_checkpoints(dist_env, job) / "crashed-rank1").read_text().strip() == "attempt 1"

    out = _outputs(dist_env, job)
    ranks = _rank_results(out, 2)
    for r in ranks:
        assert r["attempt"] == 2
        assert r["start_epoch"] == 2  # resumed after the checkpoint of epoch 1
        assert r["steps"] == 4 * STEPS_PER_EPOCH  # the half epoch of attempt 1 was thrown away with its weights
        assert r["steps_this_run"] == 2 * STEPS_PER_EPOCH
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    for rank in (0, 1):
        log = _epoch_log(out, rank)
        assert [(a, e) for a, e, what in log if what == "start"] == [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3)]
        # each epoch finished exactly once; nothing after the resume point ran twice
        assert [(a, e) for a, e, what in log if what == "end"] == [(1, 0), (1, 1), (2, 2), (2, 3)]

    # resuming (model, optimizer momentum, epoch, step) loses nothing: the same result as one clean run
    single = _single_process(tmp_path, DDP_ARGS)
    assert ranks[0]["final_loss"] == pytest.approx(single["final_loss"], rel=LOSS_RTOL)
    assert ranks[0]["weights"] == pytest.approx(single["weights"], abs=WEIGHTS_ATOL)


def test_two_distributed_jobs_at_once_get_different_master_ports(dist_env):
    c = dist_env.admin
    code = _upload_scripts(c)
    # slow epochs keep both gangs up together, with room for four ranks importing torch on a loaded 2-core machine
    command = "python ddp_train.py --epochs 3 --epoch-sleep 4"
    for name in ("pair-a", "pair-b"):
        c.jobs.submit(_ddp_spec(name, code, command))
    wait_for(
        lambda: {c.jobs.get(n).state for n in ("pair-a", "pair-b")} == {"RUNNING"},
        timeout=60,
        what="both gangs running at the same time",
    )
    jobs = [_succeeded(c, n) for n in ("pair-a", "pair-b")]

    results = [_rank_results(_outputs(dist_env, j), 2) for j in jobs]
    ports = [{r["master_port"] for r in ranks} for ranks in results]
    assert all(len(p) == 1 for p in ports), ports  # one rendezvous per gang
    assert ports[0] != ports[1], ports
    # they really overlapped: each started training before the other finished
    starts = [min(r["started_at"] for r in ranks) for ranks in results]
    ends = [max(r["finished_at"] for r in ranks) for ranks in results]
    assert starts[0] < ends[1] and starts[1] < ends[0], (starts, ends)


def test_gang_that_does_not_fit_waits_whole_and_starts_when_capacity_frees(tmp_path, db_url):
    """3 CPUs: a running 2-worker gang holds 2, so a second one (2 x 1 CPU) waits; none of its replicas starts."""
    with _platform(tmp_path, db_url, cpu_capacity=3) as env:
        c = env.admin
        code = _upload_scripts(c)
        holder = f"{WAIT_FOR_GO}; python ddp_train.py --epochs 1"
        c.jobs.submit(_ddp_spec("holder", code, holder))
        wait_for(lambda: c.jobs.get("holder").state == "RUNNING", timeout=60, what="holder running")
        c.jobs.submit(_ddp_spec("waiter", code, "python ddp_train.py --epochs 1"))

        # before the next scheduling pass the reason is "waiting for the scheduler"; after it, capacity
        reason = wait_for(
            lambda: (r := c.jobs.get("waiter").wait_reason or "").startswith("waiting for capacity") and r,
            timeout=30,
            what="waiter to wait for capacity",
        )
        assert "worker" in reason and "CPU" in reason, reason  # says it is the gang that does not fit
        for _ in range(10):  # one replica would fit: a gang scheduler still starts none of them
            job = c.jobs.get("waiter")
            assert job.state == "QUEUED" and job.attempts == [], job
            time.sleep(0.1)

        release(env.settings.data_dir, c.jobs.get("holder").id)
        _succeeded(c, "holder")
        waiter = _succeeded(c, "waiter")
        holder_end = c.jobs.get("holder").finished_at
        assert waiter.started_at >= holder_end
        assert _rank_results(_outputs(env, waiter), 2)[0]["steps"] == 1


# -- TensorFlow ------------------------------------------------------------------------------------------------


def test_tensorflow_parameter_server_job(dist_env):
    """chief (the coordinator) + 2 workers + 1 ps from TF_CONFIG; the chief's success ends the job."""
    c = dist_env.admin
    code = _upload_scripts(c)
    c.jobs.submit(
        {
            "name": "tf-ps",
            "code": code,
            "command": "python tf_ps_train.py --steps 40",
            "framework": "tensorflow",
            "replicas": {"chief": 1, "worker": 2, "ps": 1},
            # TensorFlow's gRPC thread pools need more than 1Gi of RLIMIT_DATA (the local executor's
            # memory limit without cgroups): thread stacks count as data
            "resources": {"cpu": 1, "memory": "4Gi"},
            # TensorFlow's chief crashed once in CI (SIGSEGV inside ParameterServerStrategy, 2026-11-26, the
            # workers' "RecvTensor cancelled" just before; it passed in every other run): a whole-gang restart,
            # as a user would ask for, runs it again from the start
            "restart": {"max_restarts": 1, "backoff_seconds": 0},
        }
    )
    job = _succeeded(c, "tf-ps", timeout=360)
    assert job.restarts <= 1

    result = json.loads((_outputs(dist_env, job) / "tf-result.json").read_text())
    assert result["workers"] == 2 and result["ps"] == 1
    assert result["steps"] == 40
    assert result["last_loss"] < 0.01 * result["first_loss"], result
    assert all("/job:ps/" in d for d in result["variable_devices"]), result
    served = {line.replica for line in c.jobs.logs("tf-ps") if "serving at" in line.text}
    assert served == {"worker-0", "worker-1", "ps-0"}, served


# -- MPI -------------------------------------------------------------------------------------------------------


def test_mpi_job_allreduces_over_two_ranks(dist_env):
    c = dist_env.admin
    code = _upload_scripts(c)
    c.jobs.submit(
        {
            "name": "mpi",
            "code": code,
            "command": "python mpi_allreduce.py",
            "framework": "mpi",
            "replicas": {"launcher": 1, "worker": 2},
            "resources": PER_REPLICA,
        }
    )
    job = _succeeded(c, "mpi")

    result = json.loads((_outputs(dist_env, job) / "mpi-result.json").read_text())
    assert result["size"] == 2 and result["sum"] == 3, result
    assert result["library"].startswith("Open MPI"), result
    texts = [line.text for line in c.jobs.logs("mpi") if line.stream == "stdout"]
    assert sorted(t for t in texts if "allreduce sum" in t) == [
        "rank 0/2: allreduce sum 3 (expected 3)",
        "rank 1/2: allreduce sum 3 (expected 3)",
    ]
