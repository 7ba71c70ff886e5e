"""Tables on an 80-column terminal, with the real server and CLI: no header or value is cut short ("…"); the
columns that fit make the table and each row's other values follow it whole."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from dlcloud.cli.output import short_time
from tests.e2e.conftest import DLCLOUD, Server

pytestmark = pytest.mark.e2e

WIDTH = 80


def _narrow(server: Server, *args: str) -> str:
    env = {**server.env, "COLUMNS": str(WIDTH)}
    res = subprocess.run([DLCLOUD, *args], env=env, capture_output=True, text=True, timeout=120, cwd=server.root)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _check(text: str, headers: list[str], values: list[str]) -> None:
    assert "…" not in text, text
    for header in headers:  # a column's header, or HEADER=value of a value stacked under its row
        assert re.search(rf"(^|\s){header}(=|\s|$)", text, re.MULTILINE), (header, text)
    for value in values:
        assert value in text, (value, text)
    for line in text.splitlines():
        assert len(line.rstrip()) <= WIDTH, line


def test_tables_at_80_columns_cut_nothing(server: Server, tmp_path: Path) -> None:
    model = tmp_path / "churn-classifier.onnx"
    model.write_bytes(b"\x08\x07 not really onnx " * 500)
    for _ in range(2):
        server.cli("models", "register", "churn-classifier", "--file", str(model), "--description", "weekly")
    server.cli("models", "label", "churn-classifier", "production", "1")
    data = tmp_path / "clicks"
    data.mkdir()
    (data / "train.csv").write_text("x,y\n1,0\n")
    for _ in range(2):
        server.cli("datasets", "create", "click-logs-weekly", "--from", str(data))
    server.cli("datasets", "label", "click-logs-weekly", "production", "2")
    server.cli("jobs", "submit", "--name", "narrow-tables-job", "--command", "exit 3", "--follow", check=False)

    described = server.cli_json("models", "describe", "churn-classifier")
    assert isinstance(described, dict)
    text = _narrow(server, "models", "describe", "churn-classifier")
    headers = ["VERSION", "FORMAT", "CODE", "ARTIFACT", "SIZE", "SHA256", "LABELS", "DEPLOYED", "SOURCE", "BY"]
    values = [short_time(v["created_at"]) for v in described["versions"]] + ["churn-classifier.onnx", "onnx"]
    _check(text, [*headers, "CREATED"], values)
    assert re.search(r"^  \S+=", text, re.MULTILINE), text  # the versions' table did not fit: values stacked

    jobs = server.cli_json("jobs", "list")
    assert isinstance(jobs, list)
    [job] = jobs
    headers = ["NAME", "STATE", "USER", "GPUS", "CPUS", "ATTEMPT", "EXIT", "CREATED", "REASON"]
    _check(_narrow(server, "jobs", "list"), headers, [job["name"], job["state"], job["reason"]])

    datasets = server.cli_json("datasets", "list")
    assert isinstance(datasets, list)
    headers = ["NAME", "LATEST", "VERSIONS", "SIZE", "LABELS", "SHARED", "BY", "CREATED"]
    values = ["click-logs-weekly", "production=2", short_time(datasets[0]["created_at"])]
    _check(_narrow(server, "datasets", "list"), headers, values)
