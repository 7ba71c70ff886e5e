"""``dlcloud quota`` with the real server and CLI: a member sees their tenant's fair-share terms (guarantee,
borrowing limit, weight, priority range, the priority classes its jobs may use) next to its limits and usage."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e


def test_a_member_sees_the_tenants_fair_share_terms(server: Server) -> None:
    admin = ("--profile", "local")
    server.cli(*admin, "tenants", "create", "vision", "--gpus", "8", "--memory", "64Gi")
    server.cli(
        *admin, "tenants", "update", "vision", "--guarantee-gpus", "2", "--guarantee-memory", "16Gi",
        "--borrow-gpus", "4", "--weight", "2.5", "--priority-range", "-50:50",
    )  # fmt: skip
    server.cli(*admin, "users", "create", "alice", "--tenant", "vision", "--role", "member")
    key = server.cli_json(*admin, "keys", "create", "--user", "alice", "--tenant", "vision")
    assert isinstance(key, dict)
    creds = ["--endpoint", server.endpoint, "--access-key", key["access_key"], "--secret-key", key["secret_key"]]
    server.cli("configure", "--profile", "alice", *creds, "--no-check")

    report = server.cli_json("quota")
    assert isinstance(report, dict) and report["tenant"] == "vision"
    assert report["scheduling"] == {
        "policy": "fair-share",
        "guarantee": {"gpus": 2, "cpus": 0.0, "memory": 16 * 2**30},
        "borrow_limit": {"gpus": 4, "cpus": None, "memory": None},
        "weight": 2.5,
        "priority_min": -50,
        "priority_max": 50,
        "priority_classes": {"normal": 0},  # low (-100) and high (100) are outside the range
        "default_priority_class": "normal",
    }
    table = server.cli("quota").stdout
    lines = [" ".join(line.split()) for line in table.splitlines()]
    assert "Scheduling (policy fair-share)" in lines
    for line in (
        "Guarantee 2 GPU, 0 CPU, 16Gi",
        "Borrow limit 4 GPU, unlimited CPU, unlimited memory",
        "Weight 2.5",
        "Priority range -50..50",
        "Priority classes normal (0); default normal",
    ):
        assert line in lines, table
    # the limits are still there, above the terms
    assert "gpus 0 8" in lines and lines.index("gpus 0 8") < lines.index("Weight 2.5")
