"""Launch recipes: each framework's variables per process, compared with what the real launchers set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlcloud.schemas.jobs import JobSpec
from dlcloud.services import recipes


def launch(spec_fields: dict, ports: list[int], gpus: list[tuple[int, ...]] | None = None, **kw):
    spec = JobSpec(name="x", command="python train.py", **spec_fields)
    groups = spec.groups()
    data = spec.model_dump(mode="json")
    rg = recipes.replica_groups(data, groups, {g: spec.group_resources(g) for g in groups})
    rg = rg if spec.process_count() > 1 else None
    slots = recipes.slots(rg) if rg else [None]
    return recipes.build(
        data,
        rg,
        command=recipes.shell_command(spec),
        job_id="j-abc",
        attempt=kw.get("attempt", 1),
        max_restarts=spec.restart.max_restarts,
        host="localhost",
        ports=ports,
        gpus=gpus or [() for _ in slots],
        as_root=kw.get("as_root", False),
    )


def test_pytorch_workers_get_torchrun_variables() -> None:
    out = launch({"framework": "pytorch", "replicas": {"worker": 2}, "procs_per_worker": 2}, [29500])
    assert [r.name for r in out.replicas] == ["worker-0.0", "worker-0.1", "worker-1.0", "worker-1.1"]
    r = out.replicas[3]
    assert r.env["RANK"] == "3" and r.env["LOCAL_RANK"] == "1" and r.env["GROUP_RANK"] == "1"
    assert r.env["WORLD_SIZE"] == "4" and r.env["LOCAL_WORLD_SIZE"] == "2" and r.env["GROUP_WORLD_SIZE"] == "2"
    assert r.env["MASTER_ADDR"] == "localhost" and r.env["MASTER_PORT"] == "29500"
    assert r.env["OMP_NUM_THREADS"] == "1"  # torchrun's default with more than one process per node
    assert all(p.decides for p in out.replicas)


def test_pytorch_omp_threads_left_to_the_user_and_to_single_process_workers() -> None:
    two = launch({"framework": "pytorch", "replicas": {"worker": 2}}, [29501])
    assert "OMP_NUM_THREADS" not in two.replicas[0].env
    mine = launch({"framework": "pytorch", "replicas": {"worker": 2}, "env": {"OMP_NUM_THREADS": "4"}}, [29501])
    assert mine.replicas[0].env["OMP_NUM_THREADS"] == "4"


def test_single_process_pytorch_job_gets_rank_zero_env_and_no_gang() -> None:
    out = launch({"framework": "pytorch"}, [29502])
    assert out.replicas == ()
    assert out.env["RANK"] == "0" and out.env["WORLD_SIZE"] == "1" and out.env["MASTER_PORT"] == "29502"
    assert launch({}, []).env == {}  # framework none, one process: nothing added


@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None, reason="no torchrun")
def test_pytorch_variables_match_what_torchrun_sets(tmp_path: Path) -> None:
    dump = tmp_path / "dump.py"
    dump.write_text(
        "import json, os, sys\n"
        f"open(os.path.join({str(tmp_path)!r}, 'env-' + os.environ['RANK'] + '.json'), 'w')"
        ".write(json.dumps(dict(os.environ)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    subprocess.run(
        [torchrun, "--nproc_per_node", "2", str(dump)],
        env=env,
        check=True,
        capture_output=True,
        timeout=240,
    )
    out = launch({"framework": "pytorch", "replicas": {"worker": 1}, "procs_per_worker": 2}, [29503])
    for rank in (0, 1):
        theirs = json.loads((tmp_path / f"env-{rank}.json").read_text())
        ours = out.replicas[rank].env
        torch_keys = {k for k in theirs if k not in os.environ}
        torch_keys.discard("TORCHELASTIC_ERROR_FILE")  # a file of torchrun's agent (no agent runs here)
        mine = {k for k in ours if not k.startswith("DLCLOUD_")}
        assert mine == torch_keys, sorted(mine ^ torch_keys)
        differ = {k for k in torch_keys if ours[k] != theirs[k]}
        # ports and run ids are per launch; no agent hosts a store here, so rank 0 creates it
        assert differ <= {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"}, differ


def test_tensorflow_tf_config_has_the_cluster_without_the_evaluator() -> None:
    out = launch(
        {"framework": "tensorflow", "replicas": {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}},
        [30000, 30001, 30002, 30003],
    )
    by = {r.name: r for r in out.replicas}
    assert sorted(by) == ["chief-0", "evaluator-0", "ps-0", "worker-0", "worker-1"]
    cfg = json.loads(by["worker-1"].env["TF_CONFIG"])
    assert cfg["cluster"] == {
        "chief": ["localhost:30000"],
        "worker": ["localhost:30001", "localhost:30002"],
        "ps": ["localhost:30003"],
    }
    assert cfg["task"] == {"type": "worker", "index": 1}
    assert json.loads(by["evaluator-0"].env["TF_CONFIG"])["task"] == {"type": "evaluator", "index": 0}
    assert [n for n, r in by.items() if r.decides] == ["chief-0"]
    assert recipes.ports_needed({"framework": "tensorflow"}, recipes.replica_groups({}, {}, {})) == 1


def test_tensorflow_without_chief_worker_zero_decides_and_flags_style() -> None:
    out = launch({"framework": "tensorflow", "replicas": {"worker": 2, "ps": 1}, "tf_config_style": "flags"}, [1, 2, 3])
    by = {r.name: r for r in out.replicas}
    assert [n for n, r in by.items() if r.decides] == ["worker-0"]
    assert by["ps-0"].command == (
        "python train.py --worker_hosts=localhost:1,localhost:2 --ps_hosts=localhost:3 --job_name=ps --task_index=0"
    )
    assert "TF_CONFIG" not in by["ps-0"].env


def test_mpi_launcher_runs_mpirun_over_a_hostfile_and_workers_hold() -> None:
    out = launch({"framework": "mpi", "replicas": {"launcher": 1, "worker": 2}, "slots_per_worker": 2}, [])
    launcher, *workers = out.replicas
    # the executor writes the file where it likes and replaces the reference with that directory
    assert launcher.env["DLCLOUD_MPI_HOSTFILE"] == "${DLCLOUD_REPLICA_FILES}/hostfile"
    assert launcher.files == (("hostfile", "localhost slots=4\n"),)
    assert launcher.command == (
        'mpirun --hostfile "$DLCLOUD_MPI_HOSTFILE" -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo python train.py'
    )
    assert launcher.decides and not any(w.decides for w in workers)
    assert all(w.command == recipes.HOLD_COMMAND for w in workers)
    root = launch({"framework": "mpi", "replicas": {"launcher": 1, "worker": 1}}, [], as_root=True)
    assert "--allow-run-as-root" in (root.replicas[0].command or "")
    manual = launch({"framework": "mpi", "replicas": {"launcher": 1, "worker": 1}, "mpi_launch": "manual"}, [])
    assert manual.replicas[0].command is None or manual.replicas[0].command == "python train.py"


def test_jax_processes_get_the_coordinator() -> None:
    out = launch({"framework": "jax", "replicas": {"worker": 3}}, [29600])
    r = out.replicas[2]
    assert r.env["JAX_COORDINATOR_ADDRESS"] == "localhost:29600"
    assert r.env["JAX_NUM_PROCESSES"] == "3" and r.env["JAX_PROCESS_ID"] == "2"
    assert r.env["DLCLOUD_PROCESS_ID"] == "2"


def test_every_replica_knows_its_name_and_gpus_follow_its_slot() -> None:
    out = launch(
        {"replicas": {"worker": 2}, "resources": {"gpus": 1, "cpu": 2, "memory": "1Gi"}}, [], gpus=[(0,), (1,)]
    )
    assert [(r.env["DLCLOUD_REPLICA"], r.gpus, r.cpus) for r in out.replicas] == [
        ("worker-0", (0,), 2.0),
        ("worker-1", (1,), 2.0),
    ]
    assert out.env["DLCLOUD_NUM_REPLICAS"] == "2"


def test_job_spec_module_runs_with_python_m():
    spec = JobSpec(name="pkg", module="trainer.task", args=["--lr", "0.1 x"])
    assert recipes.shell_command(spec) == "python -m trainer.task --lr '0.1 x'"
