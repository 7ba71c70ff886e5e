"""The second layer of isolation, tried from inside real jobs on a real ``dlcloud up`` (as root and as an
unprivileged user, on SQLite and PostgreSQL): a job's network is its own (no host loopback service, no other
job's port or abstract unix socket), the API stays reachable for ``dlcloud.report``, processes and disk are
bounded, and nothing a job can read names another job, a tenant or the data dir (docs/isolation.md)."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.security.conftest import JOB_PIDS_MAX, Platform
from tests.security.test_job_attacks import TERMINAL, _describe, _logs, _submit, _wait_state

pytestmark = pytest.mark.e2e

VICTIM = textwrap.dedent(
    """
    import os, socket, sys, threading, time
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", int(sys.argv[2])))  # its own network's loopback: the port is free there
    tcp.listen(8)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\\0" + sys.argv[1])
    abstract.listen(8)
    def serve(sock):
        while True:
            conn, _ = sock.accept()
            conn.sendall(b"victim-secret-data")
            conn.close()
    for sock in (tcp, abstract):
        threading.Thread(target=serve, args=(sock,), daemon=True).start()
    # the port is handed to the attacker through the test (worst case: the attacker knows it)
    print("VICTIM-PORT", tcp.getsockname()[1], flush=True)
    time.sleep(600)
    """
)

ATTACK = textwrap.dedent(
    """
    import json, os, socket, subprocess, sys, time
    targets = json.loads(open("targets.json").read())
    report = {}

    def tcp(port):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                s.settimeout(3)
                return "CONNECTED " + s.recv(64).decode(errors="replace")
        except OSError as exc:
            return type(exc).__name__

    def abstract(name):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(3)
                s.connect("\\0" + name)
                return "CONNECTED " + s.recv(64).decode(errors="replace")
        except OSError as exc:
            return type(exc).__name__

    report["host port"] = tcp(targets["host_port"])
    report["victim port"] = tcp(targets["victim_port"])
    report["victim published"] = tcp(targets["published_port"])
    report["postgres"] = tcp(5432)
    report["abstract"] = abstract(targets["abstract"])
    report["abstract listed"] = targets["abstract"] in open("/proc/net/unix").read()
    report["cmdline 1"] = open("/proc/1/cmdline", "rb").read().replace(b"\\0", b" ").decode()
    report["mountinfo"] = open("/proc/self/mountinfo").read()
    names = []
    for root, dirs, _files in os.walk("/sys/fs/cgroup"):
        names += dirs
        if root.count("/") > 6:
            dirs[:] = []
    report["cgroups"] = names
    report["unshare"] = subprocess.run(["unshare", "-Ur", "true"], capture_output=True).returncode
    # what dlcloud.report does, with the standard library alone
    import urllib.request
    body = json.dumps({"points": [{"step": 1, "metrics": {"reached": 1.0}}]}).encode()
    token = os.environ["DLCLOUD_METRICS_TOKEN"]
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    req = urllib.request.Request(os.environ["DLCLOUD_METRICS_URL"], data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        report["report flushed"] = resp.status == 204
    print("REPORT " + json.dumps(report), flush=True)
    """
)

FORKS = textwrap.dedent(
    """
    import os, sys, time
    n = 0
    error = ""
    try:
        for _ in range(int(sys.argv[1])):
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            n += 1
    except OSError as exc:
        error = type(exc).__name__
    print("FORKS", n, error, flush=True)
    """
)

DISK = textwrap.dedent(
    """
    import os, sys
    chunk = b"x" * (1 << 20)
    if sys.argv[1] == "one":  # one file past the limit: RLIMIT_FSIZE stops it at the limit
        with open(os.path.join(os.environ["DLCLOUD_OUTPUT_DIR"], "big.bin"), "wb") as f:
            for i in range(100000):
                f.write(chunk)
    for i in range(100000):  # many files, each under the limit, in /tmp and the outputs: the meter stops it
        where = "/tmp" if i % 2 else os.environ["DLCLOUD_OUTPUT_DIR"]
        with open(os.path.join(where, "part-%d.bin" % i), "wb") as f:
            for _ in range(4):
                f.write(chunk)
    """
)


def test_a_jobs_network_is_its_own_and_reaches_only_the_api(platform: Platform, tmp_path: Path):
    server = platform.server
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(8)
    abstract = "victim-abstract-sock-" + secrets.token_hex(4)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "victim.py").write_text(VICTIM)
    victim_port = 8765  # published: reached from the host at the endpoint the job shows, from nowhere else
    _submit(platform, "vera", "listener", victim, f"python victim.py {abstract} {victim_port}", "--publish", "8765")
    wait_for(lambda: "VICTIM-PORT" in _logs(platform, "vera", "listener"), timeout=180, what="victim")
    endpoints = wait_for(
        lambda: json.loads(platform.as_("vera", "jobs", "describe", "listener", "-o", "json").stdout)["endpoints"],
        what="the victim's published port",
    )
    published_host, published_port = endpoints[str(victim_port)].rsplit(":", 1)
    assert published_host == "127.0.0.1"
    with socket.create_connection((published_host, int(published_port)), timeout=10) as conn:
        conn.settimeout(10)
        assert conn.recv(64) == b"victim-secret-data"  # the host reaches what the job published
    shown = platform.as_("vera", "jobs", "describe", "listener").stdout
    assert f"{victim_port} -> {published_host}:{published_port}" in shown, shown

    attack = tmp_path / "attack"
    attack.mkdir()
    (attack / "attack.py").write_text(ATTACK)
    targets = {
        "host_port": host.getsockname()[1],
        "victim_port": victim_port,
        "published_port": int(published_port),
        "abstract": abstract,
    }
    (attack / "targets.json").write_text(json.dumps(targets))
    _submit(platform, "mallory", "prober", attack, "python attack.py")
    job = _wait_state(platform, "mallory", "prober", TERMINAL, timeout=240)
    out = _logs(platform, "mallory", "prober")
    assert job["state"] == "SUCCEEDED", out
    report = json.loads(out.split("REPORT ", 1)[1].splitlines()[0])
    host.close()
    platform.as_("vera", "jobs", "cancel", "listener")

    # nothing of the host's loopback, nothing of another job's network
    assert report["host port"] == "ConnectionRefusedError", report
    assert report["victim port"] == "ConnectionRefusedError", report
    assert report["victim published"] == "ConnectionRefusedError", report  # the host's side of it: not in reach
    assert report["postgres"] == "ConnectionRefusedError", report
    assert report["abstract"] == "ConnectionRefusedError", report
    assert report["abstract listed"] is False
    # the API, through the one path out: dlcloud.report's points arrived
    assert report["report flushed"] is True
    metrics = json.loads(platform.as_("mallory", "jobs", "metrics", "prober", "-o", "json").stdout)
    assert any(s["metric"] == "reached" for s in metrics["series"]), metrics
    # what a job can read names no job, tenant or data-dir path of anyone's
    jobs = [_describe(platform, p, n)["id"] for p, n in (("vera", "listener"), ("mallory", "prober"))]
    tenants = [t["id"] for t in json.loads(platform.as_("local", "tenants", "list", "-o", "json").stdout)]
    # no job id, tenant id or data-dir path of anyone's (its own included): its directories are overlays named
    # by descriptor, bound at neutral paths (executors/local/job_view.py)
    seen = report["cmdline 1"] + " ".join(report["cgroups"]) + report["mountinfo"]
    for secret in (*jobs, *tenants, str(server.data_dir), os.path.realpath(server.data_dir)):
        assert secret not in seen, (secret, seen)
    assert " /job/code " in report["mountinfo"] and " /job/checkpoints " in report["mountinfo"], report["mountinfo"]
    assert " --args " in report["cmdline 1"] and "--bind" not in report["cmdline 1"], report["cmdline 1"]
    # no user namespaces from inside a job, as root and unprivileged
    assert report["unshare"] != 0


@pytest.mark.sqlite_only  # the database plays no part: root and unprivileged on SQLite
def test_a_gang_still_rendezvous_on_its_own_loopback(platform: Platform, tmp_path: Path):
    code = tmp_path / "gang"
    code.mkdir()
    (code / "rdv.py").write_text(
        textwrap.dedent(
            """
            import json, os, torch.distributed as dist
            dist.init_process_group("gloo")
            t = __import__("torch").ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(t)
            print("SUM", int(t.item()), flush=True)
            # the replicas share the job's directories: what one writes, the other sees at once
            rank, ckpt = dist.get_rank(), os.environ["DLCLOUD_CHECKPOINT_DIR"]
            with open(os.path.join(ckpt, "from-%d" % rank), "w") as f:
                f.write(str(rank))
            dist.barrier()
            print("SEEN", rank, ",".join(sorted(n for n in os.listdir(ckpt) if n.startswith("from-"))), flush=True)
            if rank == 0:
                print("MOUNTINFO " + json.dumps(open("/proc/self/mountinfo").read()), flush=True)
            # as torch asks: a process that exits with its group alive may abort while the interpreter ends
            # (gloo's threads still hold Python objects), and then the gang fails after its work is done
            dist.destroy_process_group()
            """
        )
    )
    spec = {"name": "gang", "code": str(code), "command": "python rdv.py", "framework": "pytorch"}
    (tmp_path / "gang.json").write_text(json.dumps({**spec, "replicas": {"worker": 2}}))
    platform.as_("vera", "jobs", "submit", "-f", str(tmp_path / "gang.json"))
    job = _wait_state(platform, "vera", "gang", TERMINAL, timeout=300)
    out = _logs(platform, "vera", "gang")
    assert job["state"] == "SUCCEEDED", (out, json.dumps(job, indent=1))
    assert "SUM 3" in out
    assert "SEEN 0 from-0,from-1" in out and "SEEN 1 from-0,from-1" in out, out
    # a gang's volumes and its shared /dev/shm name no id and no host path either
    mountinfo = json.loads(out.split("MOUNTINFO ", 1)[1].splitlines()[0])
    for secret in (job["id"], str(platform.server.data_dir), os.path.realpath(platform.server.data_dir)):
        assert secret not in mountinfo, (secret, mountinfo)


@pytest.mark.sqlite_only  # the database plays no part: root and unprivileged on SQLite
def test_forks_past_the_pids_limit_are_refused_and_the_host_goes_on(platform: Platform, tmp_path: Path):
    code = tmp_path / "forks"
    code.mkdir()
    (code / "forks.py").write_text(FORKS)
    _submit(platform, "mallory", "forker", code, f"python forks.py {JOB_PIDS_MAX * 4}")
    job = _wait_state(platform, "mallory", "forker", TERMINAL, timeout=240)
    out = _logs(platform, "mallory", "forker")
    line = out.split("FORKS ", 1)[1].splitlines()[0].split()
    assert int(line[0]) < JOB_PIDS_MAX and line[1:] == ["BlockingIOError"], out
    assert job["state"] == "SUCCEEDED", out
    # the control plane still answers and still starts jobs
    _submit(platform, "vera", "after", code, "python forks.py 2")
    assert _wait_state(platform, "vera", "after", TERMINAL, timeout=240)["state"] == "SUCCEEDED"


@pytest.mark.sqlite_only  # the database plays no part: root and unprivileged on SQLite
def test_a_job_writing_past_its_disk_limit_is_stopped_with_the_reason(platform: Platform, tmp_path: Path):
    server = platform.server
    code = tmp_path / "disk"
    code.mkdir()
    (code / "disk.py").write_text(DISK)
    # one file past the limit (RLIMIT_FSIZE stops it at the limit); many files each under it (the meter stops it)
    limit = int(server.extra_env["DLCLOUD_JOB_DISK_MAX_BYTES"])
    for how, reasons in (
        # the file stops at the limit; the meter may measure it there (with its directory's blocks, just over)
        # before the process has exited on its EFBIG: either reason names the limit
        ("one", ("reached the job's disk limit", "over the job's disk limit")),
        ("many", ("over the job's disk limit",)),
    ):
        _submit(platform, "mallory", f"filler-{how}", code, f"python disk.py {how}")
        job = _wait_state(platform, "mallory", f"filler-{how}", TERMINAL, timeout=240)
        described = json.dumps(job)
        assert job["state"] == "FAILED", described
        assert any(reason in described for reason in reasons), described
        if how == "one":  # RLIMIT_FSIZE, not the meter, stopped the file: not a byte past the limit
            (big,) = server.data_dir.glob(f"runs/*/{job['id']}/outputs/big.bin")
            assert big.stat().st_size == limit, big.stat().st_size
    # the meter measures at intervals (docs/isolation.md): what the job wrote passes the limit by at most what it
    # wrote since the last measure; the control plane and its data are untouched
    assert os.path.exists(server.data_dir / "server.key")
    platform.as_("vera", "jobs", "list")


EGRESS = textwrap.dedent(
    """
    import json, socket, sys
    report = {}
    for name, host, port in json.loads(sys.argv[1]):
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
                report[name] = "REACHED " + s.recv(12).decode(errors="replace")
        except OSError as exc:
            report[name] = type(exc).__name__
    print("EGRESS " + json.dumps(report), flush=True)
    """
)


@pytest.fixture
def outside_host() -> Iterator[tuple[str, str, int]]:
    """A host outside, made by the test: a network namespace joined to this one by a veth pair, serving HTTP.
    Yields (its address, this host's address on the link, the port). Nothing leaves the machine."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the outside host needs root and iproute2 (CI has both)")
    tag = secrets.token_hex(3)
    ns, host_if, ns_if = f"dlct-{tag}", f"dlh{tag}", f"dln{tag}"
    net = f"10.231.{secrets.randbelow(250)}.{4 * secrets.randbelow(60)}"
    base = net.rsplit(".", 1)
    mine, theirs = f"{base[0]}.{int(base[1]) + 1}", f"{base[0]}.{int(base[1]) + 2}"
    ip = ["ip"]
    steps = [
        [*ip, "netns", "add", ns],
        [*ip, "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        [*ip, "link", "set", ns_if, "netns", ns],
        [*ip, "addr", "add", f"{mine}/30", "dev", host_if],
        [*ip, "link", "set", host_if, "up"],
        [*ip, "-n", ns, "addr", "add", f"{theirs}/30", "dev", ns_if],
        [*ip, "-n", ns, "link", "set", ns_if, "up"],
    ]
    server = None
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        server = subprocess.Popen(
            [*ip, "netns", "exec", ns, sys.executable, "-m", "http.server", "8080", "--bind", theirs],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _connects(theirs, 8080), timeout=30, what="the outside host's server")
        yield theirs, mine, 8080
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run([*ip, "netns", "del", ns], capture_output=True, check=False)
        subprocess.run([*ip, "link", "del", host_if], capture_output=True, check=False)


def _connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.sqlite_only
def test_egress_and_user_namespaces_follow_the_tenants_policy(
    platform: Platform, tmp_path: Path, outside_host: tuple[str, str, int]
):
    outside, host_side, port = outside_host
    on_host = socket.socket()  # a service of this host's, on every address (the link's included)
    on_host.bind(("0.0.0.0", 0))
    on_host.listen(8)
    targets = [("outside", outside, port), ("host link address", host_side, on_host.getsockname()[1])]
    code = tmp_path / "egress"
    code.mkdir()
    (code / "egress.py").write_text(EGRESS)

    def run(name: str) -> dict[str, str]:
        _submit(platform, "mallory", name, code, "python egress.py " + shlex.quote(json.dumps(targets)))
        job = _wait_state(platform, "mallory", name, TERMINAL, timeout=240)
        out = _logs(platform, "mallory", name)
        assert job["state"] == "SUCCEEDED", out
        return json.loads(out.split("EGRESS ", 1)[1].splitlines()[0])

    try:
        report = run("by-default")  # egress none: no route out at all
        assert not any(v.startswith("REACHED") for v in report.values()), report
        platform.as_("local", "tenants", "set-network", "attacker", "--egress", "internet")
        report = run("internet")
        assert report["outside"].startswith("REACHED HTTP/1.0"), report
        assert not report["host link address"].startswith("REACHED"), report  # the host's own: never
        platform.as_("local", "tenants", "set-network", "attacker", "--egress", "allow", "--allow", outside)
        report = run("allowed")
        assert report["outside"].startswith("REACHED HTTP/1.0"), report
        assert not report["host link address"].startswith("REACHED"), report
        platform.as_("local", "tenants", "set-network", "attacker", "--egress", "allow", "--allow", "10.9.9.9")
        assert not run("not-allowed")["outside"].startswith("REACHED")
        platform.as_("local", "tenants", "set-network", "attacker", "--egress", "none")
        assert not run("none")["outside"].startswith("REACHED")
    finally:
        on_host.close()
    # the sandbox's terms are the tenant's too: user namespaces only where an admin allowed them (this server is
    # reused for it: the database plays no part)
    userns = "unshare -Ur true && echo USERNS made || echo USERNS refused"
    platform.as_("local", "tenants", "set-sandbox", "attacker", "--user-namespaces", "allow")
    _submit(platform, "mallory", "userns-allowed", code, userns)
    assert _wait_state(platform, "mallory", "userns-allowed", TERMINAL, timeout=240)["state"] == "SUCCEEDED"
    assert "USERNS made" in _logs(platform, "mallory", "userns-allowed")
    platform.as_("local", "tenants", "set-sandbox", "attacker", "--user-namespaces", "deny")
    _submit(platform, "mallory", "userns-denied", code, userns)
    assert _wait_state(platform, "mallory", "userns-denied", TERMINAL, timeout=240)["state"] == "SUCCEEDED"
    assert "USERNS refused" in _logs(platform, "mallory", "userns-denied")
