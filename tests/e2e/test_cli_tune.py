"""Studies end to end (docs/tuning.md): a study submitted with ``dlcloud tune submit`` to the real ``dlcloud up``,
whose control plane is killed (kill -9) while trials run and started again: the study completes with
``max_trials`` trials, each trial job ran exactly one attempt, no configuration ran twice, and ``dlcloud tune
best -o json`` prints the best parameters."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import pytest

import dlcloud
from tests.conftest import WAIT_FOR_GO, wait_for
from tests.e2e.conftest import Server
from tests.job_files import touch_for_job

pytestmark = pytest.mark.e2e

# a trial waits for the test's go (a file in its outputs), then reports its objective once from
# DLCLOUD_HPARAMS; flush waits for an API that may be down still, and a metric not delivered fails the trial
REPORT = (
    "import json, os, sys, dlcloud; p = json.loads(os.environ['DLCLOUD_HPARAMS']); "
    "dlcloud.report(step=0, score=p['x'] * 10 + len(p['y'])); sys.exit(0 if dlcloud.flush(60) else 5)"
)
# the jobs import the dlcloud the server runs (the one these tests import): a worktree's when PYTHONPATH names it
SOURCE = str(Path(dlcloud.__file__).resolve().parents[1])
STUDY = textwrap.dedent(
    f"""
    name: phoenix
    algorithm: random
    objective: {{metric: score, direction: maximize}}
    max_trials: 4
    parallel_trials: 2
    seed: 13
    trial:
      command: {json.dumps(f"{WAIT_FOR_GO}; python -c {shlex.quote(REPORT)}")}
      resources: {{cpu: 0.5, memory: 256Mi}}
      env: {{PYTHONPATH: {json.dumps(SOURCE)}}}
    search_space:
      x: {{type: int, low: 0, high: 9}}
      y: {{type: categorical, values: [a, bb]}}
    """
)


def _outputs(server: Server) -> list[Path]:
    return sorted(server.data_dir.glob("runs/*/*/outputs"))


def _trials(server: Server) -> list[dict]:
    got = server.cli_json("tune", "trials", "phoenix")
    assert isinstance(got, list)
    return got


def test_kill9_mid_study_then_restart_completes_it_with_every_trial_run_once(server: Server) -> None:
    (server.root / "study.yaml").write_text(STUDY)
    submitted = server.cli_json("tune", "submit", "-f", str(server.root / "study.yaml"))
    assert isinstance(submitted, dict) and submitted["state"] == "RUNNING"

    def two_running() -> bool:
        trials = _trials(server)
        jobs = [server.cli_json("jobs", "describe", t["job"]) for t in trials if t["job"]]
        return len(jobs) == 2 and all(isinstance(j, dict) and j["state"] == "RUNNING" for j in jobs)

    wait_for(two_running, timeout=120, interval=0.3, what="two trials running")
    wait_for(lambda: len(_outputs(server)) == 2, timeout=30, what="their run directories")
    before = _trials(server)
    server.kill9()  # the trial jobs keep running without a control plane
    touch_for_job(_outputs(server)[0] / "go")  # one of them finishes meanwhile (its metric waits for the API)
    server.start()

    def ended() -> dict | None:
        for out in _outputs(server):  # every trial started from now on may go on at once
            touch_for_job(out / "go")
        s = server.cli_json("tune", "describe", "phoenix")
        assert isinstance(s, dict)
        return s if s["state"] in ("COMPLETED", "FAILED", "STOPPED") else None

    study = wait_for(ended, timeout=180, interval=0.5, what="the study to end")
    trials = _trials(server)
    assert study["state"] == "COMPLETED" and study["trials_started"] == 4, (study, trials, server.log())
    ran = [t for t in trials if t["job"]]
    failed = [t for t in ran if t["state"] != "COMPLETED"]
    logs = [(t["reason"], server.cli("jobs", "logs", t["job"]).stderr[-1500:]) for t in failed]
    assert len(ran) == 4 and all(t["state"] == "COMPLETED" for t in ran), (trials, logs)
    assert [t["number"] for t in trials] == list(range(len(trials)))
    for old in before:  # the trials alive at the kill are the same trials, not run again
        new = trials[old["number"]]
        assert (new["params"], new["job"]) == (old["params"], old["job"])
    configs = [json.dumps(t["params"], sort_keys=True) for t in ran]
    assert len(set(configs)) == len(configs), "a configuration ran twice"
    for t in ran:
        job = server.cli_json("jobs", "describe", t["job"])
        assert isinstance(job, dict) and job["state"] == "SUCCEEDED" and len(job["attempts"]) == 1, job
        assert t["value"] == t["params"]["x"] * 10 + len(t["params"]["y"])
    jobs = server.cli_json("jobs", "list")
    assert isinstance(jobs, list) and sorted(j["name"] for j in jobs) == sorted(t["job"] for t in ran)

    best = json.loads(server.cli("tune", "best", "phoenix", "-o", "json").stdout)
    top = max(ran, key=lambda t: (t["value"], -t["number"]))
    assert best == top["params"] and set(best) == {"x", "y"}
