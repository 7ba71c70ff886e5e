"""Hyperparameter studies (docs/tuning.md) on the real control loop and local executor, SQLite and PostgreSQL:
one real study per algorithm (grid covers its grid once; random and TPE finish max_trials; ASHA prunes),
``parallel_trials`` never exceeded (from the trial jobs' attempt times), the best trial, stop and resume, a
control loop stopped mid-study and replaced by a fresh one (no trial lost, none run twice), validation."""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml

from dlcloud.control.loop import ControlLoop
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.schemas.studies import StudyDetail, Trial
from dlcloud.services import study_states
from tests.conftest import ShiftedClock, assert_api_error, build_env, make_settings, wait_for

API = "/api/v1"
ENDED = {"COMPLETED", "FAILED", "STOPPED"}

# a trial: its parameters from DLCLOUD_HPARAMS, the objective pushed at every step with the two variables
# every job gets (docs/metrics.md; what dlcloud.report does, without needing dlcloud in the job's interpreter)
# (a str.format template: its own braces doubled)
REPORTING = """
import json, os, time, urllib.request
def report(step, **metrics):
    body = json.dumps({{"points": [{{"step": step, "metrics": metrics}}]}}).encode()
    req = urllib.request.Request(os.environ["DLCLOUD_METRICS_URL"], data=body, method="POST", headers={{
        "Authorization": "Bearer " + os.environ["DLCLOUD_METRICS_TOKEN"], "Content-Type": "application/json"}})
    urllib.request.urlopen(req, timeout=30).close()
p = json.loads(os.environ["DLCLOUD_HPARAMS"])
"""
TRIAL = (
    REPORTING
    + """steps, pause = {steps}, {pause}
for step in range(steps):
    report(step, score={score})
    time.sleep(pause)
print("params", json.dumps(p, sort_keys=True))
"""
)


def trial(score: str, steps: int = 3, pause: float = 0.0) -> dict:
    script = TRIAL.format(score=score, steps=steps, pause=pause)
    return {"command": "python -c " + shlex.quote(script), "resources": {"cpu": 0.5, "memory": "256Mi"}}


@contextmanager
def api_server(env) -> Iterator[str]:
    """The env's app served on a free loopback port, where trial jobs push their metrics."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(env.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="dlcloud-api-test", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout=60, what="uvicorn to start")
        assert server.started, "uvicorn did not start"
        port = next(s.getsockname()[1] for srv in server.servers for s in (srv.sockets or ()))
        env.settings.job_api_url = f"http://127.0.0.1:{port}"
        yield env.settings.job_api_url
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def wait_study(c, name: str, timeout: float = 180.0) -> StudyDetail:
    return wait_for(
        lambda: (s := c.studies.get(name)).state in ENDED and s, timeout=timeout, what=f"study {name} to end"
    )


def max_overlap(c, trials: list[Trial]) -> int:
    """The most trial-job attempts that were alive at one time."""
    spans = []
    for t in trials:
        if t.job:
            for a in c.jobs.get(t.job).attempts:
                spans.append((a.started_at, a.finished_at))
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    alive = most = 0
    for _, d in events:
        alive += d
        most = max(most, alive)
    return most


def assert_each_trial_ran_once(c, study: str, trials: list[Trial]) -> None:
    jobs = [j for j in c.jobs.list(limit=1000) if j.name.startswith(f"{study}-")]
    ran = [t for t in trials if t.job]
    assert sorted(j.name for j in jobs) == sorted(t.job for t in ran)
    assert [t.number for t in trials] == list(range(len(trials)))
    for t in ran:
        job = c.jobs.get(t.job)
        assert len(job.attempts) == 1, job
    keys = [json.dumps(t.params, sort_keys=True) for t in ran]
    assert len(keys) == len(set(keys)), "a configuration ran twice"


@pytest.fixture
def served(running_env):
    with api_server(running_env):
        yield running_env


def cli(env, monkeypatch, *args: str) -> str:
    """``dlcloud ARGS`` as the admin, against the served API; its stdout."""
    from typer.testing import CliRunner

    from dlcloud.cli.main import app

    monkeypatch.setenv("DLCLOUD_ENDPOINT", env.settings.job_api_url)
    monkeypatch.setenv("DLCLOUD_ACCESS_KEY", env.admin_creds.access_key)
    monkeypatch.setenv("DLCLOUD_SECRET_KEY", env.admin_creds.secret_key)
    monkeypatch.delenv("DLCLOUD_PROFILE", raising=False)
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_grid_covers_its_grid_exactly_once(served, tmp_path, monkeypatch):
    c = served.admin
    study = {
        "name": "grid",
        "algorithm": "grid",
        "objective": {"metric": "score", "direction": "maximize"},
        "max_trials": 100,
        "parallel_trials": 2,
        "trial": trial("p['a'] * 10 + len(p['b']) + step"),
        "search_space": {
            "a": {"type": "int", "low": 0, "high": 4, "step": 2},
            "b": {"type": "categorical", "values": ["x", "yy"]},
        },
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert (
        json.loads(cli(served, monkeypatch, "tune", "submit", "-f", str(tmp_path / "study.yaml"), "-o", "json"))[
            "state"
        ]
        == "RUNNING"
    )
    s = wait_study(c, "grid")
    assert s.state == "COMPLETED", s
    assert "grid" in s.reason
    trials = c.studies.trials("grid")
    logs = [(t.reason, [x.text for x in c.jobs.logs(t.job)]) for t in trials if t.state != "COMPLETED"]
    assert not logs, "\n".join([line for _, lines in logs[:1] for line in lines][-6:])
    assert sorted((t.params["a"], t.params["b"]) for t in trials) == sorted(
        (a, b) for a in (0, 2, 4) for b in ("x", "yy")
    )
    assert s.trials_started == 6
    assert max_overlap(c, trials) <= 2
    assert_each_trial_ran_once(c, "grid", trials)
    best = c.studies.best("grid")
    assert best.params == {"a": 4, "b": "yy"} and best.value == 44.0  # at the last step (2)
    assert s.best.number == best.number
    assert json.loads(cli(served, monkeypatch, "tune", "best", "grid", "-o", "json")) == {"a": 4, "b": "yy"}
    described = cli(served, monkeypatch, "tune", "describe", "grid")
    assert "6/100 started: 0 running, 6 completed" in described and "a=4 b=yy" in described
    assert len(json.loads(cli(served, monkeypatch, "tune", "trials", "grid", "-o", "json"))) == 6
    assert "COMPLETED" in cli(served, monkeypatch, "tune", "list")


@pytest.mark.parametrize("algorithm", ["random", "tpe"])
def test_random_and_tpe_finish_max_trials_with_the_best_reported(served, algorithm):
    c = served.admin
    c.studies.submit(
        {
            "name": algorithm,
            "algorithm": algorithm,
            "objective": {"metric": "score", "direction": "minimize", "step": "best"},
            "max_trials": 5,
            "parallel_trials": 2,
            "seed": 7,
            "trial": trial("(p['x'] - 0.3) ** 2 + (0.1 if p['opt'] == 'sgd' else 0) + p.get('m', 0) + 1 / (step + 1)"),
            "search_space": {
                "x": {"type": "uniform", "low": 0, "high": 1},
                "lr": {"type": "loguniform", "low": 1e-4, "high": 0.3},
                "opt": {"type": "categorical", "values": ["sgd", "adam"]},
                "m": {"type": "uniform", "low": 0.0, "high": 0.5, "when": {"opt": "sgd"}},
            },
        }
    )
    s = wait_study(c, algorithm)
    assert s.state == "COMPLETED" and s.trials_started == 5, s
    trials = c.studies.trials(algorithm)
    assert [t.state for t in trials if t.job] == ["COMPLETED"] * 5
    for t in trials:
        assert 0 <= t.params["x"] <= 1 and 1e-4 <= t.params["lr"] <= 0.3
        assert ("m" in t.params) == (t.params["opt"] == "sgd")  # conditional parameter
        want = (t.params["x"] - 0.3) ** 2 + (0.1 if t.params["opt"] == "sgd" else 0) + t.params.get("m", 0)
        assert t.value == pytest.approx(want + 1 / 3)  # best step: the last of 3
    assert max_overlap(c, trials) <= 2
    assert_each_trial_ran_once(c, algorithm, trials)
    best = min((t for t in trials if t.state == "COMPLETED"), key=lambda t: t.value)
    assert c.studies.best(algorithm).model_dump(mode="json") == {
        "number": best.number,
        "value": best.value,
        "params": best.params,
        "job": best.job,
    }
    assert s.best.params == best.params


def test_asha_prunes_with_sigterm(served):
    c = served.admin
    c.studies.submit(
        {
            "name": "asha",
            "algorithm": "asha",
            "objective": {"metric": "score", "direction": "maximize"},
            "max_trials": 8,
            "parallel_trials": 2,
            "seed": 3,
            # rungs at steps 1 and 4 (then 16, past the last step): a pruned trial has at least 7 steps of 0.5 s
            # left, however slow the machine's way from its report to the SIGTERM
            "early_stopping": {"min_resource": 1, "reduction_factor": 4},
            "trial": trial("p['x'] * (step + 1)", steps=12, pause=0.5),
            "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
        }
    )
    s = wait_study(c, "asha", timeout=240)
    assert s.state == "COMPLETED", s
    trials = c.studies.trials("asha")
    pruned = [t for t in trials if t.state == "PRUNED"]
    assert pruned, trials
    for t in pruned:
        assert t.reason.startswith("pruned at step"), t
        job = c.jobs.get(t.job)
        assert job.state == "CANCELLED" and "exit code -15" in job.reason, job  # SIGTERM
        assert t.last_step is not None and t.last_step < 11
    assert s.trials.pruned == len(pruned)
    assert s.trials_started == 8
    assert max_overlap(c, trials) <= 2
    assert_each_trial_ran_once(c, "asha", trials)


def test_stop_cancels_running_trials_and_resume_continues(served):
    c = served.admin
    c.studies.submit(
        {
            "name": "halt",
            "algorithm": "random",
            "objective": {"metric": "score"},
            "max_trials": 3,
            "parallel_trials": 1,
            "trial": trial("p['x']", steps=200, pause=0.05),
            "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
        }
    )
    wait_for(lambda: c.studies.trials("halt") and c.jobs.get("halt-0").state == "RUNNING", what="trial 0 running")
    assert c.studies.stop("halt").state == "STOPPING"
    s = wait_study(c, "halt", timeout=60)
    assert s.state == "STOPPED"
    (t0,) = c.studies.trials("halt")
    assert t0.state == "STOPPED" and c.jobs.get("halt-0").state == "CANCELLED"
    assert_api_error(served.signed(served.admin_creds, "POST", f"{API}/studies/halt/stop"), 409, "invalid_state")
    assert c.studies.resume("halt").state == "RUNNING"
    wait_for(lambda: len(c.studies.trials("halt")) == 2, what="the next trial after resume")
    assert c.studies.trials("halt")[0].state == "STOPPED"  # not run again
    c.studies.stop("halt")
    assert wait_study(c, "halt", timeout=60).state == "STOPPED"


def test_a_spent_time_budget_stops_the_trials_and_completes_the_study(served, monkeypatch):
    # the studies' clock moves an hour on once both trials run: the budget is spent then, however slow the machine
    clock = ShiftedClock()
    monkeypatch.setattr(study_states, "utcnow", clock)
    c = served.admin
    c.studies.submit(
        {
            "name": "budget",
            "algorithm": "random",
            "objective": {"metric": "score"},
            "max_trials": 10,
            "parallel_trials": 2,
            "budget": {"seconds": 3600},
            "trial": trial("p['x']", steps=4000, pause=0.05),
            "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
        }
    )
    wait_for(
        lambda: (
            {c.jobs.get(t.job).state for t in c.studies.trials("budget")} == {"RUNNING"}
            and len(c.studies.trials("budget")) == 2
        ),
        timeout=120,
        what="both trials running",
    )
    assert c.studies.get("budget").state == "RUNNING"
    clock.advance(3600)
    s = wait_study(c, "budget", timeout=60)
    assert s.state == "COMPLETED" and "time budget of 3600 s is spent" in s.reason, s
    assert 3600 <= s.elapsed_seconds < 3600 + 120
    trials = c.studies.trials("budget")
    assert len(trials) == 2 and {t.state for t in trials} == {"STOPPED"}, trials
    assert {c.jobs.get(t.job).state for t in trials} == {"CANCELLED"}


def test_control_loop_restart_mid_study_loses_no_trial_and_runs_none_twice(tmp_path, db_url):
    env = build_env(make_settings(tmp_path, db_url), LocalExecutor())
    stop = threading.Event()
    thread = threading.Thread(target=env.control.run, args=(stop,), daemon=True)
    thread.start()
    fresh_stop = threading.Event()
    fresh_thread = None
    try:
        with env.http, api_server(env):
            c = env.admin
            c.studies.submit(
                {
                    "name": "phoenix",
                    "algorithm": "tpe",
                    "objective": {"metric": "score", "direction": "minimize"},
                    "max_trials": 6,
                    "parallel_trials": 2,
                    "seed": 11,
                    "trial": trial("(p['x'] - 0.5) ** 2", steps=4, pause=0.2),
                    "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
                }
            )
            wait_for(
                lambda: any(t.state == "COMPLETED" for t in c.studies.trials("phoenix")),
                timeout=120,
                what="a first completed trial",
            )
            stop.set()  # the control plane goes away mid-study, trial jobs still running
            env.control.wake()
            thread.join(timeout=10)
            before = c.studies.trials("phoenix")
            assert 2 <= len(before) < 6
            fresh = ControlLoop(env.platform, LocalExecutor())
            fresh_thread = threading.Thread(target=fresh.run, args=(fresh_stop,), daemon=True)
            fresh_thread.start()
            s = wait_study(c, "phoenix")
            assert s.state == "COMPLETED" and s.trials_started == 6, s
            trials = c.studies.trials("phoenix")
            assert len(trials) == 6 and all(t.state == "COMPLETED" for t in trials), trials
            for old in before:  # no trial lost nor redone: the same numbers, params and jobs
                new = trials[old.number]
                assert (new.params, new.job) == (old.params, old.job)
            for t in trials:
                assert t.value == pytest.approx((t.params["x"] - 0.5) ** 2)
            assert max_overlap(c, trials) <= 2
            assert_each_trial_ran_once(c, "phoenix", trials)
    finally:
        stop.set()
        fresh_stop.set()
        thread.join(timeout=10)
        if fresh_thread is not None:
            fresh_thread.join(timeout=10)
        env.platform.db.dispose()


def test_trial_gets_hparams_and_args_and_a_failed_trial_fails(served):
    c = served.admin
    script = TRIAL.format(steps=1, pause=0, score="p['k']").replace(
        "p = json.loads",
        "import sys; p = json.loads(os.environ['DLCLOUD_HPARAMS']); "
        "assert sys.argv[1:] == ['--k=%d' % p['k'], '--tag=' + p['tag']], sys.argv; "
        "assert os.environ['DLCLOUD_STUDY'] == 'argv' and p['fixed'] == 1; "
        "sys.exit(3) if p['k'] == 2 else None; p = json.loads",
    )
    c.studies.submit(
        {
            "name": "argv",
            "algorithm": "grid",
            "args": True,
            "objective": {"metric": "score", "direction": "maximize"},
            "max_trials": 3,
            "trial": {"command": "python -c " + shlex.quote(script), "hparams": {"fixed": 1}},
            "search_space": {
                "k": {"type": "int", "low": 1, "high": 3},
                "tag": {"type": "categorical", "values": ["a b"]},
            },
        }
    )
    s = wait_study(c, "argv")
    assert s.state == "COMPLETED", s
    by_k = {t.params["k"]: t for t in c.studies.trials("argv")}
    assert by_k[1].state == by_k[3].state == "COMPLETED", by_k
    assert by_k[2].state == "FAILED" and "FAILED" in by_k[2].reason
    assert c.studies.best("argv").params == {"k": 3, "tag": "a b"}


@pytest.mark.parametrize(
    ("change", "status", "fragment"),
    [
        ({"algorithm": "grid"}, 422, "algorithm grid needs categorical or int parameters"),
        ({"search_space": {"x": {"type": "uniform", "low": 1, "high": 0}}}, 422, "low must be < high"),
        ({"search_space": {"x": {"type": "loguniform", "low": 0, "high": 1}}}, 422, "low > 0"),
        ({"search_space": {"x": {"type": "categorical"}}}, 422, "needs values"),
        (
            {"search_space": {"x": {"type": "uniform", "low": 0, "high": 1, "when": {"y": 1}}}},
            422,
            "not a parameter listed before",
        ),
        ({"algorithm": "bayes"}, 422, "algorithm"),
        ({"objective": {"metric": "loss", "step": "first"}}, 422, "objective.step"),
        ({"early_stopping": {"min_resource": 2}}, 422, "asha only"),
        ({"max_trials": 0}, 422, "max_trials"),
        ({"trial": {"name": "x", "command": "true"}}, 400, "trial.name: leave it out"),
        ({"trial": {"command": "true", "resources": {"gpus": 9}}}, 400, "matching GPU"),
        ({"trial": {"command": "true", "nonsense": 1}}, 400, "trial.nonsense"),
        ({"trial": {"command": "true", "env": {"DLCLOUD_X": "1"}}}, 400, "trial.env"),
        (
            {"algorithm": "asha", "early_stopping": {"pause": True}},
            422,
            "early_stopping.pause needs max_resource (the last step a trial trains to)",
        ),
        (
            {"algorithm": "asha", "early_stopping": {"pause": True, "hyperband": True, "max_resource": 9}},
            422,
            "hyperband runs with pause: false",
        ),
        ({"trial": {"command": "true", "checkpoint_from": "nothing"}}, 404, "checkpoint_from: job 'nothing' not found"),
    ],
)
def test_bad_studies_are_refused_naming_the_problem(env, change, status, fragment):
    """The study file's own rules: 422 validation_error (as any request body); its trial's job spec: 400
    invalid_spec, the field named from ``trial``."""
    spec = {
        "name": "bad",
        "algorithm": "random",
        "objective": {"metric": "loss"},
        "max_trials": 3,
        "trial": {"command": "true"},
        "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
        **change,
    }
    resp = env.signed(env.admin_creds, "POST", f"{API}/studies", spec)
    code = {422: "validation_error", 400: "invalid_spec", 404: "not_found"}[status]
    err = assert_api_error(resp, status, code)
    assert fragment in err["message"], err
    assert env.admin.studies.list() == []


# a study that is only recorded (the tests using it run no control loop)
RECORDED = {
    "algorithm": "random",
    "objective": {"metric": "loss"},
    "max_trials": 2,
    "trial": {"command": "true"},
    "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
}


def test_studies_are_tenant_scoped(env):
    spec = {"name": "mine", **RECORDED}
    env.admin.studies.submit(spec)
    assert_api_error(env.signed(env.admin_creds, "POST", f"{API}/studies", spec), 409, "already_exists")
    other = env.new_tenant_user("other", "olga")
    assert other.studies.list() == []
    key = other.transport.creds
    for method, path in [
        ("GET", "/studies/mine"),
        ("GET", "/studies/mine/trials"),
        ("GET", "/studies/mine/best"),
        ("POST", "/studies/mine/stop"),
        ("POST", "/studies/mine/resume"),
    ]:
        assert_api_error(env.signed(key, method, API + path), 404, "not_found")
    assert_api_error(env.signed(env.admin_creds, "GET", f"{API}/studies/mine/best"), 404, "not_found", "no completed")
    detail = env.admin.studies.get("mine")
    assert detail.state == "RUNNING" and detail.trials_started == 0 and detail.best is None
    assert isinstance(detail.seed, int) and detail.spec["search_space"]["x"]["type"] == "uniform"


def test_a_studys_trial_job_names_are_kept_for_its_trials(env):
    """Another member cannot take the name of a study's next trial job (``<study>-<n>``, a resumed one's
    ``<study>-<n>-r<j>``) and so fail the trial or the study; other names, and other tenants, are not affected."""
    env.admin.studies.submit({"name": "sq", **RECORDED})
    teammate = env.new_tenant_user("default", "tara").transport.creds
    for name in ("sq-0", "sq-7", "sq-3-r1"):
        job = {"name": name, "command": "true", "resources": {"cpu": 0.5, "memory": "256Mi"}}
        err = assert_api_error(env.signed(teammate, "POST", f"{API}/jobs", job), 400, "invalid_spec")
        assert f"job name {name!r} is kept for the trials of study 'sq'" in err["message"], err
    assert env.admin.jobs.list() == []
    for name in ("sq-x", "sq-1-2", "sqa-0"):  # not a trial name of study sq ("sq-1-2" would be study sq-1's)
        env.admin.jobs.submit({"name": name, "command": "true", "resources": {"cpu": 0.5, "memory": "256Mi"}})
    other = env.new_tenant_user("other", "olga")
    other.jobs.submit({"name": "sq-0", "command": "true", "resources": {"cpu": 0.5, "memory": "256Mi"}})
