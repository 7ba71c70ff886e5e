"""dlcloud simulate: JSON keys, the table, and bad input as a clear error with no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from dlcloud.cli.main import app
from dlcloud.scheduler.planner import PlanConfig

SLICE = Path(__file__).parents[2] / "data" / "philly_2017-10-02_first2000.csv"
JSON_KEYS = {"avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "gpu_allocation", "preemptions", "tenants"}


def test_json_output_has_the_documented_keys() -> None:
    args = ["simulate", "--trace", str(SLICE), "--gpus", "32", "--gpus-per-node", "8", "--policy", "fifo"]
    res = CliRunner().invoke(app, [*args, "--limit-jobs", "300", "--seed", "2", "-o", "json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert set(report) >= JSON_KEYS
    assert report["policy"] == "fifo" and report["jobs"]["total"] == 300
    assert isinstance(report["preemptions"], int)
    assert {"mean", "busy_when_contended", "hourly"} <= set(report["gpu_allocation"])
    tenant = next(iter(report["tenants"].values()))
    assert {"guarantee_gpus", "entitlement", "share", "windows_below_90pct"} <= set(tenant)
    again = CliRunner().invoke(app, [*args, "--limit-jobs", "300", "--seed", "2", "-o", "json"])
    assert {k: v for k, v in json.loads(again.stdout).items() if k != "timing"} == {
        k: v for k, v in report.items() if k != "timing"
    }


def test_table_output() -> None:
    args = ["simulate", "--trace", str(SLICE), "--gpus", "16", "--policy", "fifo", "--start-s", "0", "--end-s", "7200"]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "avg JCT:" in res.stdout and "TENANT" in res.stdout and "vc_" in res.stdout


def _dlcloud(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlcloud.cli.main", "simulate", *args], capture_output=True, text=True, timeout=60
    )


def test_bad_input_is_a_clear_error_without_a_traceback(tmp_path: Path) -> None:
    missing = _dlcloud("--trace", str(tmp_path / "nope.csv"), "--gpus", "8")
    assert missing.returncode == 1
    assert "error (invalid_argument): trace file not found" in missing.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("id,when,gpus\n1,0,1\n")
    columns = _dlcloud("--trace", str(bad), "--gpus", "8")
    assert columns.returncode == 1
    assert "missing column(s) job_id, submit_time_s, num_gpus, duration_s, user" in columns.stderr
    nodes = _dlcloud("--trace", str(SLICE), "--gpus", "10", "--gpus-per-node", "4")
    assert nodes.returncode == 1
    assert "--gpus-per-node must divide --gpus" in nodes.stderr
    policy = _dlcloud("--trace", str(SLICE), "--gpus", "8", "--policy", "random")
    assert policy.returncode == 2
    assert "fifo" in policy.stderr and "las" in policy.stderr
    for res in (missing, columns, nodes, policy):
        assert "Traceback" not in res.stderr + res.stdout


def test_fair_share_knobs_reach_the_planner_and_the_report() -> None:
    args = ["simulate", "--trace", str(SLICE), "--gpus", "32", "--limit-jobs", "300", "-o", "json"]
    on = json.loads(CliRunner().invoke(app, args, catch_exceptions=False).stdout)
    assert on["tenant_las_queues_gpu_s"] == list(PlanConfig.tenant_las_queues_gpu_s) and on["defragment"] is True
    res = CliRunner().invoke(app, [*args, "--tenant-las-queues", "none", "--no-defragment"], catch_exceptions=False)
    off = json.loads(res.stdout)
    assert off["tenant_las_queues_gpu_s"] == [] and off["defragment"] is False
    table = CliRunner().invoke(app, args[:-2] + ["--tenant-las-queues", "3600,36000"], catch_exceptions=False)
    assert "las boundaries 3600, 36000 GPU-s; defragment on; turns over 1.00 h" in table.stdout
    assert on["turn_window_s"] == 3600.0
    res = CliRunner().invoke(app, [*args, "--turn-window", "0"], catch_exceptions=False)
    assert json.loads(res.stdout)["turn_window_s"] == 0.0
    table = CliRunner().invoke(app, [*args[:-2], "--turn-window", "0"], catch_exceptions=False)
    assert "defragment on; turns off" in table.stdout


def test_a_turn_window_too_short_for_a_turn_is_a_clear_error() -> None:
    for value in ("600", "-1", "nan"):
        res = _dlcloud("--trace", str(SLICE), "--gpus", "8", "--turn-window", value)
        assert res.returncode == 1, res.stderr
        assert "--turn-window must be 0 (no turns) or at least 1800 seconds" in res.stderr
        assert "Traceback" not in res.stderr + res.stdout


def test_lend_after_reaches_the_report_and_bad_values_are_a_clear_error() -> None:
    args = ["simulate", "--trace", str(SLICE), "--gpus", "32", "--limit-jobs", "300"]
    on = json.loads(CliRunner().invoke(app, [*args, "-o", "json"], catch_exceptions=False).stdout)
    assert on["lend_after_s"] == 600.0
    off = CliRunner().invoke(app, [*args, "--lend-after", "0", "-o", "json"], catch_exceptions=False)
    assert json.loads(off.stdout)["lend_after_s"] == 0.0
    table = CliRunner().invoke(app, [*args, "--lend-after", "300"], catch_exceptions=False)
    assert "idle guaranteed GPUs lent after 5 min" in table.stdout
    for value in ("-1", "nan", "100000"):
        res = _dlcloud("--trace", str(SLICE), "--gpus", "8", "--lend-after", value)
        assert res.returncode == 1, res.stderr
        assert "--lend-after must be 0 (idle GPUs lent at once) to 86400 seconds" in res.stderr
        assert "Traceback" not in res.stderr + res.stdout


def test_bad_tenant_las_queues_are_a_clear_error() -> None:
    for value, says in (
        ("4h", "--tenant-las-queues takes GPU-second boundaries separated by commas"),
        ("36000,3600", "--tenant-las-queues must be increasing GPU-second boundaries above 0"),
        ("0,10", "--tenant-las-queues must be increasing GPU-second boundaries above 0"),
    ):
        res = _dlcloud("--trace", str(SLICE), "--gpus", "8", "--tenant-las-queues", value)
        assert res.returncode == 1, res.stderr
        assert says in res.stderr and "Traceback" not in res.stderr + res.stdout
