"""DDP throughput under dlcloud next to plain torchrun: the same 2-worker script, steps/s as it reports them.

The script is ``tests/distributed/scripts/ddp_train.py`` (DDP over gloo on CPU, an MLP on synthetic data,
a checkpoint per epoch), in a heavier setting that trains for about 20-30 s on a 2-core machine. Each
round runs it twice, one launch after the other, never both at once:

* torchrun: ``python -m torch.distributed.run --nproc_per_node 2 --master_port <free> ddp_train.py ...``
  (torchrun gives each process OMP_NUM_THREADS=1), checkpoints and outputs in fresh temporary dirs;
* dlcloud: a job with ``framework: pytorch``, ``replicas: {worker: 2}``, ``resources: {cpu: 1}`` per
  replica (so OMP_NUM_THREADS=1 as well), submitted through the SDK to ``dlcloud up`` (started here on a
  free port with a temporary data dir), its code uploaded as the CLI would.

steps/s is what rank 0 reports: optimizer steps divided by the time from the first step to the last
(start-up, data generation and the final evaluation are outside it; checkpoints are inside it for both).
The launches alternate (torchrun, dlcloud, torchrun, dlcloud, ...) so that both see the same machine; the
table gives each run and the median of each side. Target: dlcloud >= 0.99 x torchrun. The wall time
(launch to exit, or submit to SUCCEEDED seen by a 0.1 s poll) is printed for information.

Example:

    .venv/bin/python bench/ddp_overhead.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from _common import DlcloudServer, free_port, load_average, machine

from dlcloud.cli.packing import pack_directory
from dlcloud.client import Client, Credentials

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "distributed" / "scripts" / "ddp_train.py"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
TARGET_RATIO = 0.99
DONE_RE = re.compile(r"^rank 0 done: (\d+) steps, ([0-9.]+) steps/s")


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


def run_torchrun(root: Path, index: int, args: argparse.Namespace) -> tuple[float, float, int]:
    """(steps/s, wall seconds, steps) of one plain torchrun launch."""
    work = root / f"torchrun-{index}"
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCLOUD_")}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    argv += ["--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(SCRIPT)]
    argv += [*train_args(args), "--out", str(work / "out"), "--checkpoint-dir", str(work / "checkpoints")]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=args.job_timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    steps, rate = parse_done(proc.stdout)
    return rate, wall, steps


def run_dlcloud(client: Client, code: str, index: int, args: argparse.Namespace) -> tuple[float, float, int]:
    """(steps/s, wall seconds, steps) of one dlcloud job."""
    name = f"ddp-{index}"
    spec = {
        "name": name,
        "code": code,
        "command": "python ddp_train.py " + " ".join(train_args(args)),
        "framework": "pytorch",
        "replicas": {"worker": 2},
        "resources": {"cpu": 1, "memory": "2Gi"},
    }
    t0 = time.perf_counter()
    client.jobs.submit(spec)
    deadline = time.monotonic() + args.job_timeout
    while (job := client.jobs.get(name))["state"] not in TERMINAL:
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {name} did not end in {args.job_timeout:g} s (state {job['state']})")
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    text = "\n".join(line.text for line in client.jobs.logs(name) if line.stream == "stdout")
    if job["state"] != "SUCCEEDED":
        raise RuntimeError(f"job {name} ended {job['state']}: {job['reason']}\n{text[-3000:]}")
    steps, rate = parse_done(text)
    return rate, wall, steps


def upload_script(client: Client, root: Path) -> str:
    code_dir = root / "code"
    code_dir.mkdir()
    shutil.copy(SCRIPT, code_dir / SCRIPT.name)
    packed = pack_directory(code_dir)
    try:
        return str(client.code.upload(packed.archive, kind="archive", filename="code.tar.gz")["id"])
    finally:
        packed.archive.unlink(missing_ok=True)


def print_report(
    args: argparse.Namespace, torchrun: list[tuple[float, float, int]], dlcloud: list[tuple[float, float, int]]
) -> None:
    print()
    print(f"machine: {machine()}")
    print(f"load average after the runs: {load_average()}")
    print(f"script: {SCRIPT.name} {' '.join(train_args(args))}")
    print(f"2 processes per run, DDP over gloo on CPU, {torchrun[0][2]} optimizer steps per run")
    print()
    header = f"{'run':<8}{'launcher':<12}{'steps/s':>10}{'wall s':>10}"
    print(header)
    print("-" * len(header))
    sides = [("torchrun", torchrun), ("dlcloud", dlcloud)]
    for i in range(len(torchrun)):
        for label, rows in sides:
            if i < len(rows):
                rate, wall, _ = rows[i]
                print(f"{i + 1:<8}{label:<12}{rate:>10.2f}{wall:>10.2f}")
    print("-" * len(header))
    medians = {}
    for label, rows in sides:
        if rows:
            medians[label] = (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))
            print(f"{'median':<8}{label:<12}{medians[label][0]:>10.2f}{medians[label][1]:>10.2f}")
    if "dlcloud" not in medians:
        return
    ratio = medians["dlcloud"][0] / medians["torchrun"][0]
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    print()
    print(f"steps/s ratio dlcloud / torchrun (medians): {ratio:.3f}; target >= {TARGET_RATIO} ({verdict})")
    print(f"wall time difference (medians, start-up included): {medians['dlcloud'][1] - medians['torchrun'][1]:+.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="launches of each kind, alternating (default 3)")
    ap.add_argument("--epochs", type=int, default=12, help="epochs per run (default 12: about 25 s on 2 cores)")
    ap.add_argument("--samples", type=int, default=65536, help="dataset size; 256 steps per epoch at 65536")
    ap.add_argument("--job-timeout", type=float, default=600.0, help="fail if one run takes longer (s)")
    ap.add_argument("--torchrun-only", action="store_true", help="skip dlcloud (e.g. to size --epochs)")
    ap.add_argument("--log-level", default="warning", help="server log level (default warning)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary dir (server log, torchrun outputs)")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-ddp-"))
    server = DlcloudServer(root)
    torchrun: list[tuple[float, float, int]] = []
    dlcloud: list[tuple[float, float, int]] = []
    try:
        with ExitStack() as stack:
            client = None
            if not args.torchrun_only:
                creds = Credentials(server.endpoint, *server.start(args.log_level))
                client = stack.enter_context(Client(creds))
                code = upload_script(client, root)
            for i in range(args.runs):
                torchrun.append(run_torchrun(root, i, args))
                print(f"run {i + 1}: torchrun {torchrun[-1][0]:.2f} steps/s", file=sys.stderr, flush=True)
                if client is not None:
                    dlcloud.append(run_dlcloud(client, code, i, args))
                    print(f"run {i + 1}: dlcloud {dlcloud[-1][0]:.2f} steps/s", file=sys.stderr, flush=True)
    finally:
        server.stop()
        if args.keep:
            print(f"kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print_report(args, torchrun, dlcloud)


if __name__ == "__main__":
    main()
