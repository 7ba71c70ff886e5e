"""``dlcloud jobs metrics`` on a canned API answer served by a real local HTTP server: the query it sends, the
exact -o json and -o csv output, the table when stdout is not a terminal, the chart, errors and --follow."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from dlcloud.cli import metrics as view
from dlcloud.cli.main import app, main
from dlcloud.schemas.metrics import JobMetrics
from tests.metrics_stub import MetricsStub

METRICS_PATH = "/api/v1/jobs/train/metrics"
ANSWER = {
    "job": "train",
    "series": [
        {
            "metric": "loss",
            "attempt": 1,
            "replica": "",
            "points": [
                {"step": 0, "value": 1.5, "time": "2026-01-01T00:00:00Z"},
                {"step": 10, "value": 0.25, "time": "2026-01-01T00:00:10Z"},
                {"step": 20, "value": 0.5, "time": "2026-01-01T00:00:20Z"},
            ],
            "downsampled": False,
        },
        {
            "metric": "loss",
            "attempt": 2,
            "replica": "worker-1",
            "points": [{"step": 0, "value": 1.25, "time": "2026-01-01T01:00:00Z"}],
            "downsampled": True,
        },
        {
            "metric": "acc",
            "attempt": 1,
            "replica": "",
            "points": [{"step": 20, "value": 0.875, "time": "2026-01-01T00:00:20Z"}],
            "downsampled": False,
        },
    ],
}


def job(state: str) -> dict:
    """The job ``train`` as ``GET /jobs/train`` answers (a whole JobDetail: the SDK reads it into the model)."""
    times = {"created_at": "2026-01-01T00:00:00Z", "started_at": None, "finished_at": None}
    return {
        **{"id": "j-1", "name": "train", "tenant": "t", "user": "u", "state": state, "reason": "", "priority": 0},
        **{"gpus": 0, "cpus": 1.0, "memory": 2**30, "attempt": 1, "restarts": 0, "exit_code": None, **times},
        **{"code": None, "command": "python train.py", "environment": "default", "spec": {}},
        **{"environment_hash": None, "queue_position": None, "wait_reason": None, "events": [], "attempts": []},
    }


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[MetricsStub]:
    stub = MetricsStub(canned={METRICS_PATH: (200, ANSWER), "/api/v1/jobs/train": (200, job("RUNNING"))})
    stub.start()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("DLCLOUD_PROFILE", raising=False)
    monkeypatch.setenv("DLCLOUD_ENDPOINT", stub.url)
    monkeypatch.setenv("DLCLOUD_ACCESS_KEY", "AKTEST")
    monkeypatch.setenv("DLCLOUD_SECRET_KEY", "secret")
    monkeypatch.setenv("COLUMNS", "120")
    yield stub
    stub.stop()


def invoke(*args: str):
    return CliRunner().invoke(app, ["jobs", "metrics", *args], catch_exceptions=False)


def test_json_prints_the_api_answer_and_passes_the_filters(api):
    res = invoke(
        "train",
        "-m",
        "loss",
        "-m",
        "acc",
        "--attempt",
        "2",
        "--replica",
        "worker-1",
        "--max-points",
        "50",
        "-o",
        "json",
    )
    assert res.exit_code == 0, res.output
    assert res.stdout == json.dumps(ANSWER, indent=2) + "\n"
    (req,) = [r for r in api.requests if r.path == METRICS_PATH]
    assert req.query == {"metric": ["loss", "acc"], "attempt": ["2"], "replica": ["worker-1"], "max_points": ["50"]}
    assert req.headers["X-Dlcloud-Access-Key"] == "AKTEST" and "X-Dlcloud-Signature" in req.headers  # signed


def test_csv_prints_one_row_per_point(api):
    res = invoke("train", "-o", "csv")
    assert res.exit_code == 0, res.output
    assert res.stdout == (
        "metric,attempt,replica,step,value,time\n"
        "loss,1,,0,1.5,2026-01-01T00:00:00Z\n"
        "loss,1,,10,0.25,2026-01-01T00:00:10Z\n"
        "loss,1,,20,0.5,2026-01-01T00:00:20Z\n"
        "loss,2,worker-1,0,1.25,2026-01-01T01:00:00Z\n"
        "acc,1,,20,0.875,2026-01-01T00:00:20Z\n"
    )


def test_without_a_terminal_the_chart_gives_way_to_the_table(api):
    res = invoke("train")
    assert res.exit_code == 0, res.output
    rows = [line.split() for line in res.stdout.splitlines()]
    assert rows[0] == ["METRIC", "ATTEMPT", "REPLICA", "POINTS", "LAST", "STEP", "LAST", "MIN", "MAX"]
    assert rows[1:] == [
        ["loss", "1", "-", "3", "20", "0.5", "0.25", "1.5"],
        ["loss", "2", "worker-1", "1", "(downsampled)", "0", "1.25", "1.25", "1.25"],
        ["acc", "1", "-", "1", "20", "0.875", "0.875", "0.875"],
    ]
    assert "┌" not in res.stdout and "\x1b[" not in res.stdout


def test_the_chart_draws_each_series_of_a_metric_with_its_label():
    loss = view.by_metric(JobMetrics.model_validate(ANSWER))["loss"]
    text = view.chart("loss", loss, width=80)
    from plotext import uncolorize

    plain = uncolorize(text)
    lines = plain.splitlines()
    assert len(lines) == view.CHART_HEIGHT
    assert max(len(line) for line in lines) == 80
    assert lines[0].strip() == "loss"
    assert "attempt 1" in plain and "attempt 2 worker-1" in plain
    assert "1.50" in plain  # the y axis reaches the largest value


def test_a_job_without_metrics_says_so(api):
    api.canned[METRICS_PATH] = (200, {"job": "train", "series": []})
    res = invoke("train")
    assert res.exit_code == 0
    assert res.stdout == "no metrics for job train yet\n"


def test_follow_stops_when_the_job_has_ended(api):
    api.canned["/api/v1/jobs/train"] = (200, job("SUCCEEDED"))
    res = invoke("train", "--follow")
    assert res.exit_code == 0, res.output
    assert res.stdout.count("METRIC") == 1
    assert "job train: SUCCEEDED" in res.stderr


def test_follow_refuses_json_and_csv(api):
    res = CliRunner().invoke(app, ["jobs", "metrics", "train", "--follow", "-o", "csv"])
    assert res.exit_code == 2
    assert "--follow redraws the chart" in res.stderr


def test_an_unknown_job_is_a_clean_error(api, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dlcloud", "jobs", "metrics", "nope"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "error (not_found): job nope not found" in err
    assert "Traceback" not in err
