"""The managed port range: no port handed out twice, busy host ports skipped, ports released."""

from __future__ import annotations

import socket
from datetime import UTC, datetime

from dlcloud.control.ports import PortAllocator, attempt_ports, release_ports
from dlcloud.executors.local.network import host_port_is_free
from dlcloud.store.db import Database

NOW = datetime(2024, 1, 1, tzinfo=UTC)


def test_two_jobs_never_share_a_port_and_ports_come_back(db_url):
    db = Database(db_url)
    try:
        with db.write() as s:
            a = PortAllocator(s, 40000, 40003, is_free=lambda p: True).allocate("j-a", 1, 2, NOW)
        with db.write() as s:  # a later pass (another transaction) sees a's ports as held
            b = PortAllocator(s, 40000, 40003, is_free=lambda p: p != 40002).allocate("j-b", 1, 1, NOW)
            assert PortAllocator(s, 40000, 40003, is_free=lambda p: True).allocate("j-c", 1, 2, NOW) is None
        assert a == [40000, 40001]
        assert b == [40003]  # 40002 is busy on the host
        with db.write() as s:
            assert attempt_ports(s, "j-a", 1) == [40000, 40001]
            release_ports(s, "j-a", 1)
        with db.write() as s:
            assert PortAllocator(s, 40000, 40003, is_free=lambda p: True).allocate("j-c", 1, 2, NOW) == [40000, 40001]
    finally:
        db.dispose()


def test_a_bound_port_is_not_free():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not host_port_is_free(sock.getsockname()[1])
