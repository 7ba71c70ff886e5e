"""The network of a local attempt, piece by piece: the relay's addresses, the egress rules, the host's own
addresses, the seccomp filter and the allow-list's validation. The whole, from real jobs, is in
tests/security/test_network_and_limits.py."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from dlcloud.executors.base import Egress
from dlcloud.executors.local import netns_holder, network, seccomp
from dlcloud.schemas.tenants import NetworkSpec
from tests.conftest import python_for_nobody


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8420", ["127.0.0.1", 8420]),
        ("http://localhost:9000", ["127.0.0.1", 9000]),
        ("http://[::1]:9000", ["::1", 9000]),
        ("http://10.0.0.5:8420", None),  # not loopback: no relay
        ("http://api.example:8420", None),
        (None, None),
    ],
)
def test_the_relay_listens_inside_where_jobs_know_the_api(url, expected):
    listen, target = network.relay_addresses(url)
    assert listen == expected and target == expected


def test_internet_refuses_the_hosts_own_addresses_and_accepts_the_rest():
    rules = netns_holder.nft_rules("internet", [], ["192.0.2.2", "127.0.0.1", "fd00::2"])
    assert "policy accept" in rules
    assert "ip daddr { 192.0.2.2, 127.0.0.1 } reject" in rules
    assert "ip6 daddr { fd00::2 } reject" in rules
    assert rules.rstrip().splitlines()[-3].strip().startswith("ip daddr 10.0.2.3 tcp dport 53")  # no final reject


def test_an_allow_list_names_a_host_address_to_pass_it_and_refuses_the_rest():
    rules = netns_holder.nft_rules("allow", ["192.0.2.2/32", "10.0.0.0/8"], ["192.0.2.2", "127.0.0.1"]).splitlines()
    exact = rules.index("    ip daddr { 192.0.2.2 } accept")
    denied = rules.index("    ip daddr { 192.0.2.2, 127.0.0.1 } reject with icmpx type admin-prohibited")
    ranges = rules.index("    ip daddr { 10.0.0.0/8 } accept")
    assert exact < denied < ranges  # a range covering a host address does not pass it
    assert rules[-3] == "    reject with icmpx type admin-prohibited"


def test_host_addresses_come_from_the_local_routes_and_the_interfaces(tmp_path: Path):
    fib = tmp_path / "fib_trie"
    fib.write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 192.0.2.2\n        /32 host LOCAL\n"
        "     |-- 192.0.2.255\n        /32 link BROADCAST\n     |-- 127.0.0.1\n        /32 host LOCAL\n"
    )
    inet6 = tmp_path / "if_inet6"
    inet6.write_text("fd000000000000000000000000000002 04 40 00 82     eth0\n")
    assert netns_holder.host_addresses(str(fib), str(inet6)) == ["127.0.0.1", "192.0.2.2", "fd00::2"]


def test_an_allow_list_resolves_names_and_keeps_cidrs():
    assert network.resolve_allow(("10.1.0.0/16", "192.0.2.7", "localhost"))[:2] == ["10.1.0.0/16", "192.0.2.7/32"]
    assert network.resolve_allow(("no-such-host.invalid",)) == []


def test_a_policy_the_host_cannot_enforce_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(network, "egress_tools", lambda: None)
    why = network.egress_record(Egress("internet"))
    assert isinstance(why, str) and "slirp4netns" in why and "ask an administrator" in why
    assert network.egress_record(Egress("none")) == {"mode": "none"}


def test_allow_list_entries_are_addresses_cidrs_or_host_names():
    spec = NetworkSpec(egress="allow", allow=["10.1.2.3", "10.0.0.0/8", "PyPI.org"])
    assert spec.allow == ["10.1.2.3/32", "10.0.0.0/8", "pypi.org"]
    with pytest.raises(ValidationError, match="neither an IP address"):
        NetworkSpec(allow=["bad host!"])
    with pytest.raises(ValidationError):
        NetworkSpec(egress="everything")


def test_the_seccomp_program_is_well_formed():
    prog = seccomp.no_user_namespaces("x86_64")
    assert prog is not None and len(prog) % 8 == 0
    codes = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    assert codes[-1] == (0x06, 0, 0, 0x7FFF0000)  # the last instruction allows
    for index, (code, jt, jf, _k) in enumerate(codes):  # every jump lands inside the program
        if code & 0x07 == 0x05:
            assert index + 1 + max(jt, jf) < len(codes)
    assert seccomp.no_user_namespaces("sparc") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="bwrap as root")
def test_the_seccomp_filter_refuses_user_namespaces_and_keeps_threads():
    prog = seccomp.no_user_namespaces()
    if prog is None or not Path("/usr/bin/bwrap").exists():
        pytest.skip("bwrap or a known architecture is missing")
    fd = os.memfd_create("t", 0)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    script = (
        "import os, subprocess, threading\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "print('unshare', subprocess.run(['unshare', '-Ur', 'true'], capture_output=True).returncode)\n"
    )
    argv = ["bwrap", "--seccomp", str(fd), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--"]
    argv += ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", python_for_nobody(), "-c", script]
    out = subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True, check=True).stdout
    os.close(fd)
    assert "thread" in out and "unshare 1" in out


def _volumes_in_a_namespace(volumes: dict) -> dict:
    """Run the holder's mount_volumes in a child in new user, network and mount namespaces (as the holder does
    unprivileged); write through each volume, then report what the child's mountinfo says and what it wrote."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_fd)
            netns_holder.enter_new_namespace(userns=True, mounts=True)
            fallback = netns_holder.mount_volumes(volumes, userns=True)
            for item in volumes["items"]:
                if item.get("upper"):
                    Path(volumes["root"], item["name"], "written").write_text(item["name"])
            mountinfo = Path("/proc/self/mountinfo").read_text()
            os.write(write_fd, json.dumps({"fallback": fallback, "mountinfo": mountinfo}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data
    return json.loads(data)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_volumes_are_overlays_named_by_descriptor_else_the_directories_themselves(tmp_path: Path):
    root, empty, work = tmp_path / "volumes", tmp_path / "empty", tmp_path / "work"
    upper, data = tmp_path / "job-j-secret" / "checkpoints", tmp_path / "dataset"
    for d in (root, empty, work / "checkpoints", work / "elsewhere", upper, data):
        d.mkdir(parents=True)
    (data / "rows.csv").write_text("x\n")
    other_fs = Path(tempfile.mkdtemp(dir="/dev/shm"))  # its work directory on another file system: no overlay
    try:
        items = [
            {"name": "checkpoints", "lowers": [str(empty)], "upper": str(upper), "work": str(work / "checkpoints")},
            {"name": "dataset-0", "lowers": [str(data), str(empty)]},
            {"name": "elsewhere", "lowers": [str(empty)], "upper": str(other_fs), "work": str(work / "elsewhere")},
        ]
        if subprocess.run(["unshare", "-Urm", "true"], capture_output=True, check=False).returncode != 0:
            pytest.skip("this host lets no user namespace of ours mount (the holder needs that unprivileged)")
        got = _volumes_in_a_namespace({"root": str(root), "items": items, "files": {"resolv.conf": "ns\n"}})
        # what the job writes lands in the host's directory, through the overlay as through the bind
        assert (upper / "written").read_text() == "checkpoints"
        assert (other_fs / "written").read_text() == "elsewhere"
        lines = {line.split()[4]: line for line in got["mountinfo"].splitlines()}
        for name in ("checkpoints", "dataset-0"):
            line = lines[str(root / name)]
            assert " - overlay overlay " in line and "/proc/self/fd/" in line, line
            assert "job-j-secret" not in line and str(data) not in line, line
        assert "lowerdir" not in lines[str(root / "elsewhere")]  # a bind of the directory itself
        assert "overlays unavailable" in got["fallback"]
    finally:
        shutil.rmtree(other_fs, ignore_errors=True)


def test_the_banner_says_whether_job_directories_are_overlays_here(tmp_path: Path):
    userns = os.geteuid() != 0
    why = network.probe_volumes(tmp_path / "runs", userns=userns)
    assert list((tmp_path / "runs").iterdir()) == []  # the probe leaves nothing behind
    if subprocess.run(["unshare", "-Urm", "true"], capture_output=True, check=False).returncode == 0:
        assert why == "", why  # this host makes them (the holder's own code, run as it would run)
    assert network.describe("private", "none", "").endswith(
        "job directories as overlays (mountinfo names no host path)"
    )
    said = network.describe("private", "none", "Invalid argument")
    assert "bound as they are (no overlays here: Invalid argument; mountinfo names their host paths)" in said
    assert "bound as they are" in network.describe("host", "none")
    # a runs directory on a file system the kernel will not take as an overlay's upper layer: the reason, not a crash
    assert network.probe_volumes(Path("/proc/self"), userns=userns) != ""
