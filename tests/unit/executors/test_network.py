"""The network of a local attempt, piece by piece: the relay's addresses, the egress rules, the host's own
addresses, the seccomp filter and the allow-list's validation. The whole, from real jobs, is in
tests/security/test_network_and_limits.py."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from dlcloud.executors.base import Egress
from dlcloud.executors.local import netns_holder, network, seccomp
from dlcloud.schemas.tenants import NetworkSpec


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
    argv += ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "python3", "-c", script]
    out = subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True, check=True).stdout
    os.close(fd)
    assert "thread" in out and "unshare 1" in out
