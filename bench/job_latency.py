"""Job start latency: submit -> first line of user code, next to a bare ``python -c`` spawn.

Starts ``dlcloud up`` on a free port with a temporary data dir, then, N times in sequence (each job is
waited to its end before the next is submitted, so the tail is start-up cost and not queueing):

* dlcloud: t0 = wall clock just before the SDK's submit call; the job's command prints
  ``time.time_ns()`` as the first line of user code; latency = printed - t0. The line is read back via
  the SDK logs API after the job ended.
* peer: t0 = wall clock just before ``subprocess.Popen`` of the same ``python -c`` command;
  latency = printed - t0. Interleaved with the jobs, so both see the same machine.

Several servers run side by side, each round submits one job to each (in an order that rotates from round to
round), then spawns the peer:

* ``private``: the bubblewrap sandbox (``--sandbox auto``, which must find it working) with each attempt in a
  network namespace of its own (``DLCLOUD_JOB_NETWORK=private``, the default): a holder, forked by the attempt's
  first launcher, makes the namespace and relays the API; the launcher waits for it and joins every phase to it;
* ``host``: the same sandbox in the host's network (``DLCLOUD_JOB_NETWORK=host``, the behaviour before the
  namespace);
* ``off``: no sandbox (``--sandbox off``);
* ``internet``: as ``private`` with ``DLCLOUD_JOB_EGRESS=internet``, added on its own where the server has that
  setting (``job_egress``).

``--modes`` picks some of them. Each job's attempt directory is checked after it ended: a ``private`` one must
hold the holder's ``network-ready.json``, a ``host`` one must not (the bench fails otherwise).

The breakdown splits a dlcloud start into stages from the job's events (STARTING: the scheduling pass
that placed it) and the attempt's system log lines (launcher started, command started); for a private network
also the holder: from the executor's writing of ``network.json`` (before the launcher is spawned, which forks
the holder first thing) to ``network-ready.json``'s ``ready_at``, and ``ready_at`` against the launcher's ``started_at``
(``launcher.json``; positive: the launcher may have waited that long for the namespace, at most).

Example:

    .venv/bin/python bench/job_latency.py --jobs 60
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from _common import DlcloudServer, load_average, machine, percentile

from dlcloud.client import Client, Credentials
from dlcloud.settings import Settings

USER_CODE = "import time; print(time.time_ns())"
COMMAND = f'python -c "{USER_CODE}"'
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
TARGET_P50_MS = 300.0
TARGET_P99_MS = 1000.0
TARGET_SANDBOX_COST_MS = 50.0  # p50 with the sandbox (host network) over p50 without
TARGET_NETNS_COST_MS = 30.0  # p50 with the private network over p50 with the host's, both sandboxed


@dataclass(frozen=True)
class Mode:
    """One server of the comparison: how it is started and what its attempts must show."""

    label: str
    sandbox: str  # dlcloud up --sandbox
    env: dict[str, str] = field(default_factory=dict)
    netns: bool | None = None  # a network namespace per attempt expected (None: not checked)


MODES = {
    "private": Mode("sandbox, private network", "auto", {"DLCLOUD_JOB_NETWORK": "private"}, True),
    "host": Mode("sandbox, host network", "auto", {"DLCLOUD_JOB_NETWORK": "host"}, False),
    "off": Mode("sandbox off", "off", {}, False),
    "internet": Mode(
        "sandbox, private, egress internet",
        "auto",
        {"DLCLOUD_JOB_NETWORK": "private", "DLCLOUD_JOB_EGRESS": "internet"},
        True,
    ),
}


def has_egress_setting() -> bool:
    """Whether this checkout's server knows ``job_egress`` (DLCLOUD_JOB_EGRESS)."""
    return "job_egress" in Settings.model_fields


# -- machine and numbers ---------------------------------------------------------------------------


def stats(values: list[float]) -> tuple[float, float, float, float]:
    return percentile(values, 50), percentile(values, 90), percentile(values, 99), max(values)


# -- one sample of each ----------------------------------------------------------------------------
def _iso(value: str) -> float:
    """An ISO time (from the API or a log line) as Unix seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def attempt_stages(data_dir: Path, job_id: str, netns: bool | None) -> dict[str, float]:
    """The network holder's stages (ms) from the job's first attempt directory on this host; checks that the
    attempt did (``netns`` True) or did not (False) run in a namespace of its own."""
    dirs = sorted(data_dir.glob(f"runs/*/{job_id}/attempt-1"))
    if not dirs:
        raise RuntimeError(f"no attempt directory of job {job_id} under {data_dir}/runs")
    attempt = dirs[0]
    ready_path = attempt / "network-ready.json"
    if netns is False and ready_path.exists():
        raise RuntimeError(f"{attempt}: a network namespace was made, though this server runs jobs in the host's")
    if not netns:
        return {}
    if not ready_path.exists():
        raise RuntimeError(f"{attempt}: no network-ready.json: the job did not run in a network namespace")
    ready_at = float(json.loads(ready_path.read_text())["ready_at"])
    holder_spawned = (attempt / "network.json").stat().st_mtime  # written just before the launcher is spawned
    launcher_started = _iso(json.loads((attempt / "launcher.json").read_text())["started_at"])
    return {
        "holder_ready": (ready_at - holder_spawned) * 1e3,
        "ready_vs_launcher": (ready_at - launcher_started) * 1e3,
    }


def run_job(
    client: Client,
    name: str,
    poll: float,
    timeout: float,
    command: str = COMMAND,
    datasets: list[str] | None = None,
    data_dir: Path | None = None,
    netns: bool | None = None,
) -> dict[str, float]:
    """One job run to its end; its latencies in ms. ``command`` must print ``time.time_ns()`` first. With
    ``data_dir`` (the server's) also the network holder's stages, see ``attempt_stages``."""
    spec: dict[str, object] = {"name": name, "command": command, "resources": {"cpu": 1, "memory": "256Mi"}}
    if datasets:
        spec["datasets"] = datasets
    t0 = time.time_ns()
    client.jobs.submit(spec)
    t_resp = time.time_ns()
    deadline = time.monotonic() + timeout
    while True:
        job = client.jobs.get(name)
        if job.state in TERMINAL:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {name} did not end in {timeout:g} s (state {job.state})")
        time.sleep(poll)
    if job.state != "SUCCEEDED":
        raise RuntimeError(f"job {name} ended {job.state}: {job.reason}")
    lines = list(client.jobs.logs(name))
    printed = next(int(line.text) for line in lines if line.stream == "stdout" and line.text.strip().isdigit())
    launcher = next(_iso(line.time) for line in lines if line.text.startswith("launcher started"))
    command = next(_iso(line.time) for line in lines if line.text.startswith("starting: "))
    placed = next(e.time.timestamp() for e in job.events if e.to_state == "STARTING")
    t0_s = t0 / 1e9
    sample = {
        "total": (printed - t0) / 1e6,
        "submit_rtt": (t_resp - t0) / 1e6,
        "to_placed": (placed - t0_s) * 1e3,
        "to_launcher": (launcher - placed) * 1e3,
        "to_command": (command - launcher) * 1e3,
        "to_user_code": (printed / 1e9 - command) * 1e3,
    }
    if data_dir is not None:
        sample.update(attempt_stages(data_dir, job.id, netns))
    return sample


def run_peer(python: str) -> float:
    t0 = time.time_ns()
    proc = subprocess.Popen([python, "-c", USER_CODE], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, _ = proc.communicate()
    return (int(out.strip()) - t0) / 1e6


# -- report ----------------------------------------------------------------------------------------
def _row(label: str, values: tuple[float, ...] | list[float], fmt: str = ">9.1f") -> str:
    return f"{label:<48}" + "".join(f"{v:{fmt}}" for v in values)


def _difference(samples: dict[str, list[dict[str, float]]], a: str, b: str, target: float, what: str) -> list[str]:
    """Lines comparing mode ``a`` with mode ``b`` (difference per percentile, ratio at p50, the target)."""
    sa, sb = stats([s["total"] for s in samples[a]]), stats([s["total"] for s in samples[b]])
    cost = sa[0] - sb[0]
    ok = "met" if cost <= target else "MISSED"
    return [
        _row(f"{what} ({a} - {b})", [x - y for x, y in zip(sa, sb, strict=True)], ">+9.1f"),
        _row(f"ratio ({a} / {b}), p50", [sa[0] / sb[0]], ">9.2f"),
        f"target: {what} at p50 <= {target:.0f} ms ({ok}: {cost:+.1f} ms)",
    ]


def print_report(
    args: argparse.Namespace,
    samples: dict[str, list[dict[str, float]]],
    peer: list[float],
    loads: tuple[str, str],
) -> None:
    print()
    print(f"machine: {machine()}")
    print(f"load average (1, 5, 15 min) at the start: {loads[0]}; at the end: {loads[1]}")
    print(f"jobs: {len(peer)} sequential per server (after {args.warmup} warm-up), job command: {COMMAND}")
    print("servers: " + "; ".join(f"{mode} = {MODES[mode].label}" for mode in samples))
    print()
    print("submit -> first line of user code (ms)")
    header = f"{'':<48}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}"
    print(header)
    print("-" * len(header))
    p50 = stats(peer)[0]
    for mode, rows in samples.items():
        print(_row(f"dlcloud job, {MODES[mode].label}", stats([s["total"] for s in rows])))
    print(_row("peer: bare Popen(python -c)", stats(peer)))
    for mode, rows in samples.items():
        print(_row(f"ratio ({mode} / peer), p50", [stats([s["total"] for s in rows])[0] / p50], ">9.2f"))
    lines: list[str] = []
    if "private" in samples and "host" in samples:
        lines += _difference(samples, "private", "host", TARGET_NETNS_COST_MS, "network namespace cost")
    if "internet" in samples and "private" in samples:
        d = stats([s["total"] for s in samples["internet"]])[0] - stats([s["total"] for s in samples["private"]])[0]
        lines.append(f"egress internet over none at p50: {d:+.1f} ms (no target)")
    if "host" in samples and "off" in samples:
        lines += _difference(samples, "host", "off", TARGET_SANDBOX_COST_MS, "sandbox cost")
    if "private" in samples and "off" in samples:
        lines += _difference(samples, "private", "off", TARGET_SANDBOX_COST_MS + TARGET_NETNS_COST_MS, "both")
    for line in lines:
        print(line)
    main_mode = next((m for m in ("private", "internet", "host", "off") if m in samples), "off")
    d50, _, d99, _ = stats([s["total"] for s in samples[main_mode]])
    ok50 = "met" if d50 <= TARGET_P50_MS else "MISSED"
    ok99 = "met" if d99 <= TARGET_P99_MS else "MISSED"
    print(
        f"target (2-core machine, {main_mode}): p50 <= {TARGET_P50_MS:.0f} ms ({ok50}), "
        f"p99 <= {TARGET_P99_MS:.0f} ms ({ok99})"
    )
    stages = [
        ("submit HTTP round trip", "submit_rtt"),
        ("submit -> scheduled (STARTING)", "to_placed"),
        ("scheduled -> launcher running", "to_launcher"),
        ("launcher -> command spawned", "to_command"),
        ("command -> first user line", "to_user_code"),
    ]
    holder = [
        ("holder: configured -> namespace ready", "holder_ready"),
        ("holder ready - launcher started", "ready_vs_launcher"),
    ]
    for mode, rows in samples.items():
        print()
        print(f"breakdown, {MODES[mode].label} (ms, percentiles per stage; the last four stages add up to the total)")
        print(header)
        print("-" * len(header))
        for label, key in stages + holder:
            if all(key in s for s in rows):
                print(_row(label, stats([s[key] for s in rows])))
        if all("ready_vs_launcher" in s for s in rows):
            waited = sum(1 for s in rows if s["ready_vs_launcher"] > 0)
            print(f"namespace ready after the launcher started (it may have waited) in {waited} of {len(rows)} jobs")
    print("(the submit round trip overlaps 'submit -> scheduled': the control loop is woken before the response)")
    print("(the holder starts in parallel with the launcher: its time counts only where it is ready after it)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=60, help="measured jobs (>= 50 for a meaningful p99; default 60)")
    ap.add_argument("--warmup", type=int, default=3, help="jobs run first and not measured (default 3)")
    ap.add_argument(
        "--modes",
        default="private,host,off",
        help="servers, comma-separated, of private, host, off, internet (default private,host,off, and internet "
        "where the server has the job_egress setting)",
    )
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between state checks while a job runs")
    ap.add_argument("--job-timeout", type=float, default=60.0, help="fail if one job takes longer (s)")
    ap.add_argument("--log-level", default="warning", help="server log level (default warning)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data dir (for the server log)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes: unknown {', '.join(unknown) or '(none given)'}; valid: {', '.join(MODES)}")
    if "internet" in modes and not has_egress_setting():
        ap.error("--modes internet: this server has no job_egress setting (DLCLOUD_JOB_EGRESS)")
    if args.modes == ap.get_default("modes") and has_egress_setting():
        modes.append("internet")

    root = Path(tempfile.mkdtemp(prefix="dlcloud-bench-latency-"))
    servers = {mode: DlcloudServer(root, mode) for mode in modes}
    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    peer: list[float] = []
    load_start = load_average()
    try:
        with ExitStack() as stack:
            clients = {}
            for mode, server in servers.items():
                m = MODES[mode]
                creds = Credentials(server.endpoint, *server.start(args.log_level, m.sandbox, extra_env=m.env))
                print(f"{mode}: {server.isolation}", file=sys.stderr)
                clients[mode] = stack.enter_context(Client(creds))
            for i in range(args.warmup + args.jobs):
                order = modes[i % len(modes) :] + modes[: i % len(modes)]  # no mode always first or last
                round_ = {
                    mode: run_job(
                        clients[mode],
                        f"lat-{i}",
                        args.poll,
                        args.job_timeout,
                        data_dir=servers[mode].data_dir,
                        netns=MODES[mode].netns,
                    )
                    for mode in order
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
    print_report(args, samples, peer, (load_start, load_average()))


if __name__ == "__main__":
    main()
