"""Pausing ASHA (docs/tuning.md, control/asha.py) on the real control loop and local executor, SQLite and
PostgreSQL: trials train to their rung (DLCLOUD_STOP_AT_STEP), pause, and the ones that earn the next rung are
resumed as new jobs from their checkpoints (``checkpoint_from``): no step is run twice, the best of each rung go
on, the others end PRUNED, ``parallel_trials`` holds over every job; a trial whose code ignores its budget is
stopped at its rung."""

from __future__ import annotations

import json
import shlex

import pytest

from dlcloud.schemas.studies import Trial
from tests.integration.test_studies import REPORTING, api_server, wait_study

# a trial that honours the platform's contract for pausing: resume from its checkpoint, train to
# DLCLOUD_STOP_AT_STEP (else to its last step), save the step reached after each one
RESUMABLE = (
    REPORTING
    + """ck = os.path.join(os.environ["DLCLOUD_CHECKPOINT_DIR"], "step")
start = int(open(ck).read()) if os.path.exists(ck) else 0
rung = int(os.environ.get("DLCLOUD_STOP_AT_STEP", "{last}"))
stop = rung if {honour} else {last}
print("resumed at", start, "to", stop, flush=True)
for step in range(start + 1, stop + 1):
    report(step, score=p["x"] + 0.001 * step)
    print("step", step, flush=True)
    with open(ck + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(ck + ".tmp", ck)
    # past its rung (code that ignores it): a long step, so that the platform's SIGTERM comes before the next one
    # however slow the machine, and the step it stops at is known
    time.sleep({pause} if step <= rung else 120)
"""
)


@pytest.fixture
def served(running_env):
    with api_server(running_env):
        yield running_env


def resumable(last: int, *, honour: bool = True, pause: float = 0.0) -> dict:
    script = RESUMABLE.format(last=last, honour=honour, pause=pause)
    return {"command": "python -c " + shlex.quote(script), "resources": {"cpu": 0.5, "memory": "256Mi"}}


def steps_run(c, job: str) -> list[int]:
    return [int(x.text.split()[1]) for x in c.jobs.logs(job) if x.text.startswith("step ")]


def max_overlap_all(c, trials: list[Trial]) -> int:
    """The most jobs of the study (every segment of every trial) alive at one time."""
    spans = [(a.started_at, a.finished_at) for t in trials for job in t.jobs for a in c.jobs.get(job).attempts]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    alive = most = 0
    for _, d in events:
        alive += d
        most = max(most, alive)
    return most


def test_pausing_asha_resumes_the_best_from_their_checkpoints(served):
    c = served.admin
    c.studies.submit(
        {
            "name": "halving",
            "algorithm": "asha",
            "objective": {"metric": "score", "direction": "maximize", "step": "best"},
            "max_trials": 9,
            "parallel_trials": 2,
            "seed": 7,
            "early_stopping": {"pause": True, "min_resource": 1, "reduction_factor": 3, "max_resource": 9},
            "trial": resumable(9),
            "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
        }
    )
    s = wait_study(c, "halving", timeout=240)
    assert s.state == "COMPLETED", s
    trials = c.studies.trials("halving")
    assert len(trials) == 9 and s.trials_started == 9
    assert {t.state for t in trials} <= {"COMPLETED", "PRUNED"}, [(t.state, t.reason) for t in trials]
    for t in trials:
        # its jobs: <study>-<n>, then <study>-<n>-r1, -r2 as it was promoted; each ran once, each from the
        # step the one before stopped at: no step twice, none skipped
        assert t.jobs[0] == f"halving-{t.number}" and t.job == t.jobs[-1]
        assert t.jobs[1:] == [f"halving-{t.number}-r{k}" for k in range(1, len(t.jobs))]
        ran: list[int] = []
        previous = None
        for job in t.jobs:
            detail = c.jobs.get(job)
            assert detail.state == "SUCCEEDED" and len(detail.attempts) == 1, detail
            assert detail.spec.get("checkpoint_from") == previous  # by id: a job renamed since cannot stand in
            previous = detail.id
            ran += steps_run(c, job)
        assert ran == list(range(1, t.last_step + 1)), (t.number, ran)
        assert t.budget == t.last_step
        if t.state == "COMPLETED":
            assert t.last_step == 9 and t.value == pytest.approx(t.params["x"] + 0.009)
        else:
            assert t.last_step in (1, 3) and t.reason.startswith("not promoted (score "), t
    # rung 1 (9 trials): at least the best 3 went on; rung 3: at least the best of those reached 9
    by_x = sorted(trials, key=lambda t: -t.params["x"])
    assert all(t.last_step > 1 for t in by_x[:3]), [(t.params, t.last_step) for t in by_x]
    assert by_x[0].state == "COMPLETED"
    assert s.trials.pruned >= 4 and s.trials.completed >= 1
    assert s.best.number == by_x[0].number
    # ASHA's saving: far fewer steps than 9 trials x 9 steps
    assert sum(t.last_step for t in trials) < 9 * 9 / 2
    assert max_overlap_all(c, trials) <= 2
    names = sorted(j.name for j in c.jobs.list(limit=1000) if j.name.startswith("halving-"))
    assert names == sorted(job for t in trials for job in t.jobs)
    keys = [json.dumps(t.params, sort_keys=True) for t in trials]
    assert len(keys) == len(set(keys))


def test_a_trial_that_runs_past_its_rung_is_stopped_there_and_one_trial_always_finishes(served):
    """Code that ignores DLCLOUD_STOP_AT_STEP: its job is stopped (SIGTERM) once it reports past its rung, and the
    trial pauses there. Two trials at a rung of factor 3 earn no promotion; but a study does not end before one
    trial has trained to its last step: the better one is resumed rung by rung (its last job, whose budget is
    the last step, runs to its end), the other ends PRUNED."""
    c = served.admin
    c.studies.submit(
        {
            "name": "eager",
            "algorithm": "asha",
            "objective": {"metric": "score", "direction": "maximize"},
            "max_trials": 2,
            "parallel_trials": 2,
            "seed": 3,
            "early_stopping": {"pause": True, "min_resource": 2, "reduction_factor": 3, "max_resource": 8},
            "trial": resumable(8, honour=False, pause=0.2),
            "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
        }
    )
    s = wait_study(c, "eager", timeout=180)
    assert s.state == "COMPLETED", s
    trials = c.studies.trials("eager")
    best, other = sorted(trials, key=lambda t: -t.params["x"])
    assert (best.state, other.state) == ("COMPLETED", "PRUNED"), trials
    assert other.reason.startswith("not promoted (score ") and other.budget == 2, other
    assert other.jobs == [other.job] and other.last_step == 3
    job = c.jobs.get(other.job)
    assert job.state == "CANCELLED" and "exit code -15" in job.reason, job
    # the finisher: rungs 2 and 6, then its last step 8; stopped past each rung, the last job ran to its end
    assert best.budget == 8 and best.last_step == 8 and best.value == pytest.approx(best.params["x"] + 0.008)
    states = [c.jobs.get(j).state for j in best.jobs]
    assert states == ["CANCELLED", "CANCELLED", "SUCCEEDED"], (best.jobs, states)
    assert s.best.number == best.number
