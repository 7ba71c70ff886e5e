"""DDP throughput under dlcloud next to plain torchrun: the same 2-worker script, steps/s as it reports them.

The script is ``tests/distributed/scripts/ddp_train.py`` (DDP over gloo on CPU, an MLP on synthetic data,
a checkpoint per epoch), in a heavier setting that trains for about 20-30 s on a 2-core machine. Each
round runs it once with torchrun and once on each dlcloud server, one launch after the other, never two at once:

* torchrun: ``python -m torch.distributed.run --nproc_per_node 2 --master_port <free> ddp_train.py ...``
  (torchrun gives each process OMP_NUM_THREADS=1), checkpoints and outputs in fresh temporary dirs;
* dlcloud: a job with ``framework: pytorch``, ``replicas: {worker: 2}``, ``resources: {cpu: 1}`` per
  replica (so OMP_NUM_THREADS=1 as well), submitted through the SDK to ``dlcloud up`` (started here on a
  free port with a temporary data dir), its code uploaded as the CLI would. Servers run side by side
  (``--modes`` picks them):

  * ``private`` (always): the bubblewrap sandbox (``--sandbox auto``, which must find it working) with the
    gang in a network namespace of its own (``DLCLOUD_JOB_NETWORK=private``, the default): both replicas
    share its loopback, gloo's rendezvous and traffic included, and reach the API through the holder's relay;
  * ``host``: the same sandbox in the host's network (``DLCLOUD_JOB_NETWORK=host``, the behaviour before
    the namespace; ``--job-network host`` is a short way to ask for it);
  * ``off``: no sandbox (``--sandbox off``).

  Each job's attempt directory is checked after it ended: a ``private`` one must hold the namespace holder's
  ``network-ready.json``, the others must not (the bench fails otherwise).

steps/s is what rank 0 reports: optimizer steps divided by the time from the first step to the last
(start-up, data generation and the final evaluation are outside it; checkpoints are inside it for both).
The launches alternate (torchrun, each dlcloud server, torchrun, ...; the order rotates by one every round) so
that all see the same machine; the table gives each run and the median of each side. Target: dlcloud in the
sandbox with the private network >= 0.99 x torchrun.

Also printed, to explain a difference: the wall time (launch to exit, or submit to SUCCEEDED seen by a
``--poll`` s poll) and the CPU time of what runs beside the training processes — torchrun's agent process,
or dlcloud's server (API, control loop) plus the replicas' launchers and, with a private network, the
namespace holder (its relay carries the replicas' API calls). When the two training processes
fill every core, that CPU comes out of their share. This script's own polling of the job's state adds to
the server's CPU; it polls once a second by default.

Example:

    .venv/bin/python bench/ddp_overhead.py --runs 3
    .venv/bin/python bench/ddp_overhead.py --runs 5 --epochs 4 --modes private,host
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from _common import DlcloudServer, free_port, load_average, machine

from dlcloud.cli.packing import pack_directory
from dlcloud.client import Client, Credentials

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "distributed" / "scripts" / "ddp_train.py"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
TARGET_RATIO = 0.99
DONE_RE = re.compile(r"^rank 0 done: (\d+) steps, ([0-9.]+) steps/s")
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Mode:
    """One dlcloud server of the comparison: how it is started and whether its gangs get a namespace."""

    label: str
    sandbox: str  # dlcloud up --sandbox
    env: dict[str, str] = field(default_factory=dict)
    netns: bool = False


MODES = {
    "private": Mode("dlcloud, sandbox, private network", "auto", {"DLCLOUD_JOB_NETWORK": "private"}, True),
    "host": Mode("dlcloud, sandbox, host network", "auto", {"DLCLOUD_JOB_NETWORK": "host"}),
    "off": Mode("dlcloud, sandbox off", "off"),
}


@dataclass(frozen=True)
class Run:
    steps_per_sec: float
    wall: float  # seconds from launch (or submit) to the end seen
    steps: int
    side_cpu: float  # CPU seconds of the launching machinery beside the training processes


def train_args(args: argparse.Namespace) -> list[str]:
    return [
        "--samples", str(args.samples), "--features", "256", "--hidden", "1024",
        "--global-batch", "256", "--epochs", str(args.epochs), "--seed", "0",
    ]  # fmt: skip


def parse_done(text: str) -> tuple[int, float]:
    """(steps, steps/s) from rank 0's last line."""
    for line in text.splitlines():
        m = DONE_RE.match(line.strip())
        if m:
            return int(m.group(1)), float(m.group(2))
    raise RuntimeError(f"no 'rank 0 done' line in the output:\n{text[-3000:]}")


def cpu_seconds(pid: int) -> float | None:
    """user + system CPU of the process itself (not its children), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def launcher_pids(data_dir: Path) -> list[int]:
    """The local executor's launcher and namespace holder processes of this server (``launcher.py`` or
    ``netns_holder.py`` with an attempt dir under data_dir: the holder's two halves both carry its argv)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = any(a.endswith((b"launcher.py", b"netns_holder.py")) for a in argv)
        if ours and any(f"{data_dir}/".encode() in a for a in argv):
            pids.append(int(entry.name))
    return pids


def check_network(data_dir: Path, job_id: str, netns: bool) -> None:
    """Fail unless the gang's attempt ran in a network namespace of its own exactly when ``netns``."""
    dirs = sorted(data_dir.glob(f"runs/*/{job_id}/attempt-1"))
    if not dirs:
        raise RuntimeError(f"no attempt directory of job {job_id} under {data_dir}/runs")
    ready = dirs[0] / "network-ready.json"
    if ready.exists() != netns:
        state = "ran in a network namespace of its own" if ready.exists() else "ran in the host's network"
        raise RuntimeError(f"{dirs[0]}: the gang {state}, which this server should not do")
    if netns:
        for workload in sorted(dirs[0].glob("replicas/*/workload.json")):
            network = (json.loads(workload.read_text()).get("sandbox") or {}).get("network") or {}
            if Path(str(network.get("dir"))) != dirs[0]:
                raise RuntimeError(f"{workload}: the replica does not join the gang's namespace ({network})")


def run_torchrun(root: Path, index: int, args: argparse.Namespace) -> Run:
    work = root / f"torchrun-{index}"
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    argv += ["--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(SCRIPT)]
    argv += [*train_args(args), "--out", str(work / "out"), "--checkpoint-dir", str(work / "checkpoints")]
    out, err = work / "stdout.log", work / "stderr.log"
    t0 = time.perf_counter()
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(argv, env=env, cwd=work, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        agent_cpu = 0.0
        deadline = time.monotonic() + args.job_timeout
        while proc.poll() is None:
            agent_cpu = cpu_seconds(proc.pid) or agent_cpu  # the last reading before it exits
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"torchrun did not end in {args.job_timeout:g} s")
            time.sleep(args.poll)
    wall = time.perf_counter() - t0
    stdout = out.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited {proc.returncode}:\n{stdout[-3000:]}\n{err.read_text()[-3000:]}")
    steps, rate = parse_done(stdout)
    return Run(rate, wall, steps, agent_cpu)


def run_dlcloud(
    server: DlcloudServer, client: Client, code: str, index: int, args: argparse.Namespace, netns: bool
) -> Run:
    name = f"ddp-{index}"
    spec = {
        "name": name,
        "code": code,
        "command": "python ddp_train.py " + " ".join(train_args(args)),
        "framework": "pytorch",
        "replicas": {"worker": 2},
        "resources": {"cpu": 1, "memory": "2Gi"},
    }
    assert server.proc is not None
    server_cpu0 = cpu_seconds(server.proc.pid) or 0.0
    launchers: dict[int, float] = {}
    t0 = time.perf_counter()
    client.jobs.submit(spec)
    deadline = time.monotonic() + args.job_timeout
    while (job := client.jobs.get(name)).state not in TERMINAL:
        for pid in launcher_pids(server.data_dir):
            launchers[pid] = cpu_seconds(pid) or launchers.get(pid, 0.0)
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {name} did not end in {args.job_timeout:g} s (state {job.state})")
        time.sleep(args.poll)
    wall = time.perf_counter() - t0
    server_cpu = (cpu_seconds(server.proc.pid) or 0.0) - server_cpu0
    text = "\n".join(line.text for line in client.jobs.logs(name) if line.stream == "stdout")
    if job.state != "SUCCEEDED":
        raise RuntimeError(f"job {name} ended {job.state}: {job.reason}\n{text[-3000:]}")
    check_network(server.data_dir, job.id, netns)
    steps, rate = parse_done(text)
    return Run(rate, wall, steps, server_cpu + sum(launchers.values()))


def upload_script(client: Client, root: Path) -> str:
    code_dir = root / "code"
    code_dir.mkdir(parents=True)
    shutil.copy(SCRIPT, code_dir / SCRIPT.name)
    packed = pack_directory(code_dir)
    try:
        return client.code.upload(packed.archive, kind="archive", filename="code.tar.gz").id
    finally:
        packed.archive.unlink(missing_ok=True)


def print_report(args: argparse.Namespace, sides: dict[str, list[Run]]) -> None:
    torchrun = sides["torchrun"]
    print()
    print(f"machine: {machine()}")
    print(f"load average after the runs: {load_average()}")
    print(f"script: {SCRIPT.name} {' '.join(train_args(args))}")
    print(f"2 processes per run, DDP over gloo on CPU, {torchrun[0].steps} optimizer steps per run")
    for label in sides:
        if "private network" in label:
            print(f"{label}: each gang in a network namespace of its own (checked in every attempt directory)")
    print()
    header = f"{'run':<8}{'launcher':<36}{'steps/s':>10}{'wall s':>10}{'side CPU s':>12}"
    print(header)
    print("-" * len(header))
    for i in range(len(torchrun)):
        for label, rows in sides.items():
            if i < len(rows):
                r = rows[i]
                print(f"{i + 1:<8}{label:<36}{r.steps_per_sec:>10.2f}{r.wall:>10.2f}{r.side_cpu:>12.2f}")
    print("-" * len(header))
    medians: dict[str, tuple[float, float, float]] = {}
    for label, rows in sides.items():
        if rows:
            m = tuple(statistics.median(getattr(r, f) for r in rows) for f in ("steps_per_sec", "wall", "side_cpu"))
            medians[label] = (m[0], m[1], m[2])
            print(f"{'median':<8}{label:<36}{m[0]:>10.2f}{m[1]:>10.2f}{m[2]:>12.2f}")
    print("side CPU: torchrun's agent process; dlcloud's server process, the replicas' launchers, the namespace holder")
    print()
    for label in sides:
        if label == "torchrun" or label not in medians:
            continue
        ratio = medians[label][0] / medians["torchrun"][0]
        verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
        target = f"; target >= {TARGET_RATIO} ({verdict})" if "private network" in label else ""
        wall = medians[label][1] - medians["torchrun"][1]
        print(f"steps/s ratio {label} / torchrun (medians): {ratio:.3f}{target}; wall time {wall:+.2f} s")
    private, host = MODES["private"].label, MODES["host"].label
    if private in medians and host in medians:
        ratio = medians[private][0] / medians[host][0]
        print(f"steps/s ratio private / host network (medians): {ratio:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="launches of each kind, alternating (default 3)")
    ap.add_argument("--epochs", type=int, default=12, help="epochs per run (default 12: about 25 s on 2 cores)")
    ap.add_argument("--samples", type=int, default=65536, help="dataset size; 256 steps per epoch at 65536")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between checks of a running launch")
    ap.add_argument("--job-timeout", type=float, default=600.0, help="fail if one run takes longer (s)")
    ap.add_argument(
        "--modes",
        default="private,host",
        help="dlcloud servers, comma-separated, of private, host, off (default private,host; private is always run)",
    )
    ap.add_argument(
        "--job-network",
        choices=["private", "host"],
        action="append",
        help="the same as naming private or host in --modes (repeatable)",
    )
    ap.add_argument("--torchrun-only", action="store_true", help="skip dlcloud (e.g. to size --epochs)")
    ap.add_argument("--log-level", default="warning", help="server log level (default warning)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary dir (server log, torchrun outputs)")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    asked = ["private"] + [m.strip() for m in args.modes.split(",") if m.strip()] + (args.job_network or [])
    unknown = [m for m in asked if m not in MODES]
    if unknown:
        ap.error(f"--modes: unknown {', '.join(unknown)}; valid: {', '.join(MODES)}")
    modes = [] if args.torchrun_only else [m for m in MODES if m in asked]
    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-ddp-"))
    servers = {mode: DlcloudServer(root, mode) for mode in modes}
    sides: dict[str, list[Run]] = {"torchrun": []} | {MODES[mode].label: [] for mode in modes}
    try:
        with ExitStack() as stack:
            clients: dict[str, tuple[Client, str]] = {}
            for mode, server in servers.items():
                m = MODES[mode]
                creds = Credentials(server.endpoint, *server.start(args.log_level, m.sandbox, extra_env=m.env))
                print(f"{mode}: {server.isolation}", file=sys.stderr)
                client = stack.enter_context(Client(creds))
                clients[mode] = (client, upload_script(client, root / mode))
            kinds = ["torchrun", *clients]
            for i in range(args.runs):
                for kind in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:  # the order rotates every round
                    if kind == "torchrun":
                        label, run = kind, run_torchrun(root, i, args)
                    else:
                        client, code = clients[kind]
                        label = MODES[kind].label
                        run = run_dlcloud(servers[kind], client, code, i, args, MODES[kind].netns)
                    sides[label].append(run)
                    print(f"run {i + 1}: {label} {run.steps_per_sec:.2f} steps/s", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
        if args.keep:
            print(f"kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print_report(args, sides)


if __name__ == "__main__":
    main()
