"""Launch recipes: what each replica of a distributed job runs and sees, per framework. Pure functions.

ARCHITECTURE.md decision 3: the variables of a distributed launch are decided here, above the executor,
so every executor runs the same gang the same way; the executor only materialises the Replicas.

Vocabulary:
- *group*: a role of the spec's ``replicas`` (``worker``, ``chief``, ``ps``, ``evaluator``, ``launcher``)
  with a count and per-replica resources; a *slot* is one replica of a group (what the scheduler places:
  GPUs, CPUs, memory);
- *process*: what the executor starts; one per slot, except PyTorch with ``procs_per_worker`` P > 1 where
  each worker slot runs P processes (``worker-<i>.<local rank>``), which share the slot's GPUs (like torchrun
  on one node) and split its CPUs and memory.

Recipes:
- ``pytorch``: exactly the variables torchrun's elastic agent gives each worker process (RANK, LOCAL_RANK,
  WORLD_SIZE, MASTER_ADDR/PORT, ...), with TORCHELASTIC_USE_AGENT_STORE=False (no agent hosts a store: rank
  0's ``init_process_group`` does) and OMP_NUM_THREADS=1 when P > 1 and the job's env does not set it.
- ``tensorflow``: TF_CONFIG with the cluster (chief, worker, ps; never the evaluator) and the task, or
  TF1-style ``--ps_hosts --worker_hosts --job_name --task_index`` flags (``tf_config_style: flags``).
  The chief (else worker 0) decides success; the other replicas are stopped when it is done.
- ``mpi``: the launcher replica runs ``mpirun --hostfile <file> -np <workers x slots> <command>`` (or the
  command itself with ``mpi_launch: manual``); worker replicas hold their resources until the gang stops.
- ``jax``: JAX_COORDINATOR_ADDRESS (process 0's host:port), JAX_NUM_PROCESSES, JAX_PROCESS_ID.
- ``none``: every replica runs the command with DLCLOUD_REPLICA* variables only.
Every process also gets DLCLOUD_REPLICA (its name), DLCLOUD_REPLICA_ROLE, DLCLOUD_REPLICA_INDEX,
DLCLOUD_NUM_REPLICAS and, where ports were allocated, DLCLOUD_PORTS.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dlcloud.executors.base import REPLICA_FILES_REF, Replica
from dlcloud.schemas.jobs import JobSpec
from dlcloud.templates.catalog import command_for

TORCH_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
HOLD_COMMAND = "exec sleep 2147483647"  # an MPI worker on one host: holds its slot until the gang stops
TF_CLUSTER_ROLES = ("chief", "worker", "ps")


@dataclass(frozen=True)
class Slot:
    """One replica to place: what it holds."""

    role: str
    index: int
    gpus: int
    cpus: float
    memory: int
    gpu_type: str | None = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


def shell_command(spec: JobSpec) -> str:
    """The main command as one shell string: a template's trainer, the command, or ``python -m MODULE``."""
    if spec.template is not None:
        return command_for(spec.template.model_dump())
    extra = spec.hparam_args()
    if spec.command:
        return spec.command + (" " + shlex.join(extra) if extra else "")
    return shlex.join(["python", "-m", str(spec.module), *spec.args, *extra])


def replica_groups(spec: Mapping[str, Any], groups: Mapping[str, int], resources: Mapping[str, Any]) -> list[dict]:
    """The ``jobs.replica_groups`` column: per group its count and per-replica resources."""
    out = []
    for role, count in groups.items():
        r = resources[role]
        out.append(
            {"role": role, "count": count, "gpus": r.gpus, "cpus": r.cpu, "memory": r.memory, "gpu_type": r.gpu_type}
        )
    return out


def slots(groups: Sequence[Mapping[str, Any]]) -> list[Slot]:
    """The replicas of ``replica_groups`` in placement order."""
    return [
        Slot(g["role"], i, int(g["gpus"]), float(g["cpus"]), int(g["memory"]), g.get("gpu_type"))
        for g in groups
        for i in range(int(g["count"]))
    ]


def ports_needed(spec: Mapping[str, Any], groups: Sequence[Mapping[str, Any]] | None) -> int:
    """How many ports of the managed range one attempt needs."""
    framework = spec.get("framework") or "none"
    if framework in ("pytorch", "jax"):
        return 1
    if framework == "tensorflow":
        counts = {g["role"]: int(g["count"]) for g in groups or []} or {"worker": 1}
        return sum(counts.get(r, 0) for r in TF_CLUSTER_ROLES)
    return 0


@dataclass(frozen=True)
class Launch:
    """What a recipe decides for one attempt: env added to every process, and the processes of a gang
    (empty for a single-process attempt, which then runs the command as it is)."""

    env: dict[str, str]
    replicas: tuple[Replica, ...]


def build(
    spec: Mapping[str, Any],
    groups: Sequence[Mapping[str, Any]] | None,
    *,
    command: str,
    job_id: str,
    attempt: int,
    max_restarts: int,
    host: str,
    ports: Sequence[int],
    gpus: Sequence[tuple[int, ...]],
    as_root: bool = False,
) -> Launch:
    """The launch of one attempt.

    Args:
        spec: the job spec (JSON form). groups: ``replica_groups`` (None: a single process).
        host: the address other replicas reach this host's replicas at.
        ports: the attempt's ports (``ports_needed`` of them). gpus: per slot, the GPUs it was given.
        as_root: the processes run as root (mpirun then needs --allow-run-as-root).
    """
    framework = spec.get("framework") or "none"
    user_env = spec.get("env") or {}
    layout = slots(groups) if groups else [Slot("worker", 0, len(gpus[0]) if gpus else 0, 1.0, 0)]
    slot_gpus = list(gpus) + [()] * (len(layout) - len(gpus))
    procs = int(spec.get("procs_per_worker") or 1) if framework == "pytorch" else 1
    processes: list[Replica] = []
    for slot, sg in zip(layout, slot_gpus, strict=True):
        n = procs if slot.role == "worker" else 1
        for local in range(n):
            name = slot.name if n == 1 else f"{slot.name}.{local}"
            processes.append(
                Replica(
                    name=name,
                    role=slot.role,
                    index=slot.index,
                    gpus=tuple(sg),
                    cpus=slot.cpus / n,
                    memory_bytes=slot.memory // n,
                    ports=tuple(ports),
                )
            )
    ctx = _Context(spec, framework, command, job_id, attempt, max_restarts, host, list(ports), user_env, as_root)
    recipe = _RECIPES[framework]
    built = [recipe(ctx, r, i, processes) for i, r in enumerate(processes)]
    common = {"DLCLOUD_NUM_REPLICAS": str(len(built))}
    if ports:
        common["DLCLOUD_PORTS"] = ",".join(map(str, ports))
    if len(built) == 1 and not groups:
        only = built[0]
        env = {**common, **only.env}
        for k in ("DLCLOUD_REPLICA", "DLCLOUD_REPLICA_ROLE", "DLCLOUD_REPLICA_INDEX"):
            env.pop(k, None)  # a single process is no replica of anything
        return Launch(env if framework != "none" else {}, ())
    return Launch(common, tuple(built))


@dataclass(frozen=True)
class _Context:
    spec: Mapping[str, Any]
    framework: str
    command: str
    job_id: str
    attempt: int
    max_restarts: int
    host: str
    ports: list[int]
    user_env: Mapping[str, str]
    as_root: bool


def _base_env(r: Replica) -> dict[str, str]:
    return {"DLCLOUD_REPLICA": r.name, "DLCLOUD_REPLICA_ROLE": r.role, "DLCLOUD_REPLICA_INDEX": str(r.index)}


def _with(r: Replica, env: dict[str, str], **changes: Any) -> Replica:
    return replace(r, env={**_base_env(r), **env}, **changes)


def _none(ctx: _Context, r: Replica, rank: int, all_: list[Replica]) -> Replica:
    return _with(r, {})


def torchrun_env(
    *,
    rank: int,
    local_rank: int,
    local_world_size: int,
    group_rank: int,
    group_world_size: int,
    master_addr: str,
    master_port: int,
    run_id: str,
    restart_count: int,
    max_restarts: int,
    user_env: Mapping[str, str],
) -> dict[str, str]:
    """The variables torchrun's elastic agent sets for one worker process (torch/distributed/elastic/agent/
    server/local_elastic_agent.py ``_start_workers``; torch/distributed/run.py for OMP_NUM_THREADS)."""
    world = group_world_size * local_world_size
    env = {
        "RANK": str(rank),
        "GROUP_RANK": str(group_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": str(group_world_size),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        # no agent hosts a TCPStore here: rank 0's init_process_group creates it, as without torchrun
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": TORCH_SIGNALS,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": user_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if "OMP_NUM_THREADS" in user_env:
        env["OMP_NUM_THREADS"] = user_env["OMP_NUM_THREADS"]
    elif local_world_size > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env


def _pytorch(ctx: _Context, r: Replica, rank: int, all_: list[Replica]) -> Replica:
    workers = sorted({p.index for p in all_})
    local_world = sum(1 for p in all_ if p.index == r.index)
    local_rank = int(r.name.rpartition(".")[2]) if "." in r.name else 0
    env = torchrun_env(
        rank=rank,
        local_rank=local_rank,
        local_world_size=local_world,
        group_rank=r.index,
        group_world_size=len(workers),
        master_addr=ctx.host,
        master_port=ctx.ports[0],
        run_id=ctx.job_id,
        restart_count=ctx.attempt - 1,
        max_restarts=ctx.max_restarts,
        user_env=ctx.user_env,
    )
    return _with(r, env)


def tf_cluster(all_: list[Replica], host: str, ports: list[int]) -> dict[str, list[str]]:
    """The TF cluster spec: chief, worker and ps tasks with their host:port (never the evaluator)."""
    cluster: dict[str, list[str]] = {}
    it = iter(ports)
    for role in TF_CLUSTER_ROLES:
        members = sorted((p for p in all_ if p.role == role), key=lambda p: p.index)
        if members:
            cluster[role] = [f"{host}:{next(it)}" for _ in members]
    return cluster


def _tensorflow(ctx: _Context, r: Replica, rank: int, all_: list[Replica]) -> Replica:
    cluster = tf_cluster(all_, ctx.host, ctx.ports)
    has_chief = any(p.role == "chief" for p in all_)
    decides = r.role == "chief" or (not has_chief and r.role == "worker" and r.index == 0)
    if ctx.spec.get("tf_config_style") == "flags":
        flags = []
        for role in TF_CLUSTER_ROLES:
            if role in cluster:
                flags.append(f"--{role}_hosts={','.join(cluster[role])}")
        flags += [f"--job_name={r.role}", f"--task_index={r.index}"]
        return _with(r, {}, command=f"{ctx.command} {shlex.join(flags)}", decides=decides)
    tf_config = {"cluster": cluster, "task": {"type": r.role, "index": r.index}}
    return _with(r, {"TF_CONFIG": json.dumps(tf_config, separators=(",", ":"))}, decides=decides)


def mpirun_command(command: str, np: int, *, as_root: bool) -> str:
    """The launcher's command: OpenMPI's mpirun over the hostfile in ``$DLCLOUD_MPI_HOSTFILE`` (expanded by
    the shell that runs the command), on the loopback interface."""
    argv = ["mpirun", "--hostfile", '"$DLCLOUD_MPI_HOSTFILE"', "-np", str(np)]
    if as_root:
        argv.append("--allow-run-as-root")
    argv += ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]
    return f"{' '.join(argv)} {command}"


def _mpi(ctx: _Context, r: Replica, rank: int, all_: list[Replica]) -> Replica:
    if r.role != "launcher":
        return _with(r, {}, command=HOLD_COMMAND, decides=False)
    slots_per_worker = int(ctx.spec.get("slots_per_worker") or 1)
    workers = [p for p in all_ if p.role == "worker"]
    np = len(workers) * slots_per_worker
    hostfile = f"{REPLICA_FILES_REF}/hostfile"  # the executor writes it and says where
    # one line per host: on one machine every worker's slots are this host's (a cluster lists each worker)
    content = f"{ctx.host} slots={np}\n"
    env = {"DLCLOUD_MPI_HOSTFILE": hostfile, "DLCLOUD_MPI_NP": str(np)}
    command = ctx.command
    if (ctx.spec.get("mpi_launch") or "mpirun") == "mpirun":
        command = mpirun_command(ctx.command, np, as_root=ctx.as_root)
    return _with(r, env, command=command, files=(("hostfile", content),))


def _jax(ctx: _Context, r: Replica, rank: int, all_: list[Replica]) -> Replica:
    coordinator = f"{ctx.host}:{ctx.ports[0]}"
    env = {
        "JAX_COORDINATOR_ADDRESS": coordinator,
        "JAX_NUM_PROCESSES": str(len(all_)),
        "JAX_PROCESS_ID": str(rank),
        "DLCLOUD_COORDINATOR_ADDRESS": coordinator,
        "DLCLOUD_NUM_PROCESSES": str(len(all_)),
        "DLCLOUD_PROCESS_ID": str(rank),
    }
    return _with(r, env)


_RECIPES = {"none": _none, "pytorch": _pytorch, "tensorflow": _tensorflow, "mpi": _mpi, "jax": _jax}
