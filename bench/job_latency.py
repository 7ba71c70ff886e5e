"""Job start latency: submit -> first line of user code, next to a bare ``python -c`` spawn.

Starts ``dlcloud up`` on a free port with a temporary data dir, then, N times in sequence (each job is
waited to its end before the next is submitted, so the tail is start-up cost and not queueing):

* dlcloud: t0 = wall clock just before the SDK's submit call; the job's command prints
  ``time.time_ns()`` as the first line of user code; latency = printed - t0. The line is read back via
  the SDK logs API after the job ended.
* peer: t0 = wall clock just before ``subprocess.Popen`` of the same ``python -c`` command;
  latency = printed - t0. Interleaved with the jobs, so both see the same machine.

Two servers run side by side: one with the sandbox on (``--sandbox auto``, which must find bubblewrap
working) and one with it off (``--sandbox off``); each round submits one job to each, in turns, then
spawns the peer. ``--sandbox on`` or ``off`` measures only one of them.

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
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

from _common import DlcloudServer, machine, percentile

from dlcloud.client import Client, Credentials

USER_CODE = "import time; print(time.time_ns())"
COMMAND = f'python -c "{USER_CODE}"'
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
TARGET_P50_MS = 300.0
TARGET_P99_MS = 1000.0
TARGET_SANDBOX_COST_MS = 50.0  # p50 with the sandbox over p50 without


# -- machine and numbers ---------------------------------------------------------------------------


def stats(values: list[float]) -> tuple[float, float, float, float]:
    return percentile(values, 50), percentile(values, 90), percentile(values, 99), max(values)


# -- the server ------------------------------------------------------------------------------------
# -- one sample of each ----------------------------------------------------------------------------
def _iso(value: str) -> float:
    """An ISO time (from the API or a log line) as Unix seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def run_job(
    client: Client, name: str, poll: float, timeout: float, command: str = COMMAND, datasets: list[str] | None = None
) -> dict[str, float]:
    """One job run to its end; its latencies in ms. ``command`` must print ``time.time_ns()`` first."""
    spec: dict[str, object] = {"name": name, "command": command, "resources": {"cpu": 1, "memory": "256Mi"}}
    if datasets:
        spec["datasets"] = datasets
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
def print_report(args: argparse.Namespace, samples: dict[str, list[dict[str, float]]], peer: list[float]) -> None:
    print()
    print(f"machine: {machine()}")
    print(f"jobs: {len(peer)} sequential per server (after {args.warmup} warm-up), job command: {COMMAND}")
    print()
    print("submit -> first line of user code (ms)")
    header = f"{'':<36}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}"
    print(header)
    print("-" * len(header))
    p50, p90, p99, pmax = stats(peer)
    for mode, rows in samples.items():
        d50, d90, d99, dmax = stats([s["total"] for s in rows])
        print(f"{'dlcloud job, sandbox ' + mode:<36}{d50:>9.1f}{d90:>9.1f}{d99:>9.1f}{dmax:>9.1f}")
    print(f"{'peer: bare Popen(python -c)':<36}{p50:>9.1f}{p90:>9.1f}{p99:>9.1f}{pmax:>9.1f}")
    for mode, rows in samples.items():
        d50, _, d99, _ = stats([s["total"] for s in rows])
        print(f"{'ratio (sandbox ' + mode + ' / peer), p50':<36}{d50 / p50:>9.2f}")
    if len(samples) == 2:
        on = stats([s["total"] for s in samples["on"]])
        off = stats([s["total"] for s in samples["off"]])
        cost = on[0] - off[0]
        ok = "met" if cost <= TARGET_SANDBOX_COST_MS else "MISSED"
        diffs = "".join(f"{a - b:>9.1f}" for a, b in zip(on, off, strict=True))
        print(f"{'sandbox cost (on - off)':<36}{diffs}")
        print(f"target: sandbox cost at p50 <= {TARGET_SANDBOX_COST_MS:.0f} ms ({ok})")
    main_mode = "on" if "on" in samples else "off"
    d50, _, d99, _ = stats([s["total"] for s in samples[main_mode]])
    ok50 = "met" if d50 <= TARGET_P50_MS else "MISSED"
    ok99 = "met" if d99 <= TARGET_P99_MS else "MISSED"
    print(
        f"target (2-core machine, sandbox {main_mode}): p50 <= {TARGET_P50_MS:.0f} ms ({ok50}), "
        f"p99 <= {TARGET_P99_MS:.0f} ms ({ok99})"
    )
    stages = [
        ("submit HTTP round trip", "submit_rtt"),
        ("submit -> scheduled (STARTING)", "to_placed"),
        ("scheduled -> launcher running", "to_launcher"),
        ("launcher -> command spawned", "to_command"),
        ("command -> first user line", "to_user_code"),
    ]
    for mode, rows in samples.items():
        print()
        print(
            f"breakdown, sandbox {mode} (ms, percentiles per stage; the last four stages of a job add up to its total)"
        )
        print(header)
        print("-" * len(header))
        for label, key in stages:
            a, b, c, d = stats([s[key] for s in rows])
            print(f"{label:<36}{a:>9.1f}{b:>9.1f}{c:>9.1f}{d:>9.1f}")
    print("(the submit round trip overlaps 'submit -> scheduled': the control loop is woken before the response)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=60, help="measured jobs (>= 50 for a meaningful p99; default 60)")
    ap.add_argument("--warmup", type=int, default=3, help="jobs run first and not measured (default 3)")
    ap.add_argument("--sandbox", choices=["both", "on", "off"], default="both", help="which servers (default both)")
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between state checks while a job runs")
    ap.add_argument("--job-timeout", type=float, default=60.0, help="fail if one job takes longer (s)")
    ap.add_argument("--log-level", default="warning", help="server log level (default warning)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data dir (for the server log)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")

    modes = ["on", "off"] if args.sandbox == "both" else [args.sandbox]
    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-latency-"))
    servers = {mode: DlcloudServer(root, f"sandbox-{mode}") for mode in modes}
    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    peer: list[float] = []
    try:
        with ExitStack() as stack:
            clients = {}
            for mode, server in servers.items():
                creds = Credentials(server.endpoint, *server.start(args.log_level, "auto" if mode == "on" else "off"))
                print(f"sandbox {mode}: {server.isolation}", file=sys.stderr)
                clients[mode] = stack.enter_context(Client(creds))
            for i in range(args.warmup + args.jobs):
                round_ = {
                    mode: run_job(client, f"lat-{i}", args.poll, args.job_timeout) for mode, client in clients.items()
                }
                peer_ms = run_peer(sys.executable)
                if i >= args.warmup:
                    for mode, sample in round_.items():
                        samples[mode].append(sample)
                    peer.append(peer_ms)
                print(f"\r{i + 1}/{args.warmup + args.jobs} rounds", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
        if args.keep:
            print(f"data dir kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print_report(args, samples, peer)


if __name__ == "__main__":
    main()
