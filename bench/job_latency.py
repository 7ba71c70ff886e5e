"""Job start latency: submit -> first line of user code, next to a bare ``python -c`` spawn.

Starts ``dlcloud up`` on a free port with a temporary data dir, then, N times in sequence (each job is
waited to its end before the next is submitted, so the tail is start-up cost and not queueing):

* dlcloud: t0 = wall clock just before the SDK's submit call; the job's command prints
  ``time.time_ns()`` as the first line of user code; latency = printed - t0. The line is read back via
  the SDK logs API after the job ended.
* peer: t0 = wall clock just before ``subprocess.Popen`` of the same ``python -c`` command;
  latency = printed - t0. Interleaved with the jobs, so both see the same machine.

The breakdown splits a dlcloud start into stages from the job's events (STARTING: the scheduling pass
that placed it) and the attempt's system log lines (launcher started, command started).

Example:

    .venv/bin/python bench/job_latency.py --jobs 60
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _common import DlcloudServer, machine, percentile

from dlcloud.client import Client, Credentials

USER_CODE = "import time; print(time.time_ns())"
COMMAND = f'python -c "{USER_CODE}"'
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
TARGET_P50_MS = 300.0
TARGET_P99_MS = 1000.0


# -- machine and numbers ---------------------------------------------------------------------------


def stats(values: list[float]) -> tuple[float, float, float, float]:
    return percentile(values, 50), percentile(values, 90), percentile(values, 99), max(values)


# -- the server ------------------------------------------------------------------------------------
# -- one sample of each ----------------------------------------------------------------------------
def _iso(value: str) -> float:
    """An ISO time (from the API or a log line) as Unix seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def run_job(client: Client, name: str, poll: float, timeout: float) -> dict[str, float]:
    spec = {"name": name, "command": COMMAND, "resources": {"cpu": 1, "memory": "256Mi"}}
    t0 = time.time_ns()
    client.jobs.submit(spec)
    t_resp = time.time_ns()
    deadline = time.monotonic() + timeout
    while True:
        job = client.jobs.get(name)
        if job["state"] in TERMINAL:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {name} did not end in {timeout:g} s (state {job['state']})")
        time.sleep(poll)
    if job["state"] != "SUCCEEDED":
        raise RuntimeError(f"job {name} ended {job['state']}: {job.get('reason')}")
    lines = list(client.jobs.logs(name))
    printed = next(int(line.text) for line in lines if line.stream == "stdout" and line.text.strip().isdigit())
    launcher = next(_iso(line.time) for line in lines if line.text.startswith("launcher started"))
    command = next(_iso(line.time) for line in lines if line.text.startswith("starting: "))
    placed = next(_iso(e["time"]) for e in job["events"] if e["to_state"] == "STARTING")
    t0_s = t0 / 1e9
    return {
        "total": (printed - t0) / 1e6,
        "submit_rtt": (t_resp - t0) / 1e6,
        "to_placed": (placed - t0_s) * 1e3,
        "to_launcher": (launcher - placed) * 1e3,
        "to_command": (command - launcher) * 1e3,
        "to_user_code": (printed / 1e9 - command) * 1e3,
    }


def run_peer(python: str) -> float:
    t0 = time.time_ns()
    proc = subprocess.Popen([python, "-c", USER_CODE], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, _ = proc.communicate()
    return (int(out.strip()) - t0) / 1e6


# -- report ----------------------------------------------------------------------------------------
def print_report(args: argparse.Namespace, samples: list[dict[str, float]], peer: list[float]) -> None:
    total = [s["total"] for s in samples]
    d50, d90, d99, dmax = stats(total)
    p50, p90, p99, pmax = stats(peer)
    print()
    print(f"machine: {machine()}")
    print(f"jobs: {len(samples)} sequential (after {args.warmup} warm-up), job command: {COMMAND}")
    print()
    print("submit -> first line of user code (ms)")
    header = f"{'':<34}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}"
    print(header)
    print("-" * len(header))
    print(f"{'dlcloud job (SDK submit)':<34}{d50:>9.1f}{d90:>9.1f}{d99:>9.1f}{dmax:>9.1f}")
    print(f"{'peer: bare Popen(python -c)':<34}{p50:>9.1f}{p90:>9.1f}{p99:>9.1f}{pmax:>9.1f}")
    print(f"{'difference (dlcloud - peer)':<34}{d50 - p50:>9.1f}{d90 - p90:>9.1f}{d99 - p99:>9.1f}{dmax - pmax:>9.1f}")
    print(f"{'ratio (dlcloud / peer)':<34}{d50 / p50:>9.2f}{d90 / p90:>9.2f}{d99 / p99:>9.2f}{dmax / pmax:>9.2f}")
    ok50 = "met" if d50 <= TARGET_P50_MS else "MISSED"
    ok99 = "met" if d99 <= TARGET_P99_MS else "MISSED"
    print(f"target (2-core machine): p50 <= {TARGET_P50_MS:.0f} ms ({ok50}), p99 <= {TARGET_P99_MS:.0f} ms ({ok99})")
    print()
    print("dlcloud breakdown (ms, percentiles per stage; the last four stages of one job add up to its total)")
    print(header)
    print("-" * len(header))
    stages = [
        ("submit HTTP round trip", "submit_rtt"),
        ("submit -> scheduled (STARTING)", "to_placed"),
        ("scheduled -> launcher running", "to_launcher"),
        ("launcher -> command spawned", "to_command"),
        ("command -> first user line", "to_user_code"),
    ]
    for label, key in stages:
        a, b, c, d = stats([s[key] for s in samples])
        print(f"{label:<34}{a:>9.1f}{b:>9.1f}{c:>9.1f}{d:>9.1f}")
    print("(the submit round trip overlaps 'submit -> scheduled': the control loop is woken before the response)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=60, help="measured jobs (>= 50 for a meaningful p99; default 60)")
    ap.add_argument("--warmup", type=int, default=3, help="jobs run first and not measured (default 3)")
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between state checks while a job runs")
    ap.add_argument("--job-timeout", type=float, default=60.0, help="fail if one job takes longer (s)")
    ap.add_argument("--log-level", default="warning", help="server log level (default warning)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data dir (for the server log)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")

    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-latency-"))
    server = DlcloudServer(root)
    samples: list[dict[str, float]] = []
    peer: list[float] = []
    try:
        creds = Credentials(server.endpoint, *server.start(args.log_level))
        with Client(creds) as client:
            for i in range(args.warmup + args.jobs):
                sample = run_job(client, f"lat-{i}", args.poll, args.job_timeout)
                peer_ms = run_peer(sys.executable)
                if i >= args.warmup:
                    samples.append(sample)
                    peer.append(peer_ms)
                print(f"\r{i + 1}/{args.warmup + args.jobs} jobs", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        server.stop()
        if args.keep:
            print(f"data dir kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print_report(args, samples, peer)


if __name__ == "__main__":
    main()
