"""The study and trial state machines. Every change of ``studies.state`` and ``study_trials.state`` goes
through this module: a new row's first state (``start_study``; ``start_trial`` or ``record_duplicate``) and
every move after it (``transition_study`` / ``transition_trial``).

Study::

    RUNNING ──> COMPLETED      max_trials reached (or the grid covered, or the budget spent) and no trial alive
       │  └──> FAILED          a trial job could not be created (its spec no longer fits, its name is taken)
       └──> STOPPING ──> STOPPED ──> RUNNING   (stop: its alive trials are cancelled; resume)

Trial::

    RUNNING ──> COMPLETED | FAILED            its job ended (the objective read, or none: FAILED)
       ├──> PRUNING ──> PRUNED                early stopping cancelled its job
       ├──> STOPPING ──> STOPPED | COMPLETED | FAILED | PAUSED   the study stopped while it ran
       ├──> PAUSED                            pausing ASHA: its job trained to its rung and ended
       └──> PAUSING ──> PAUSED | FAILED       ... or ran past its rung: its job is stopped there
    PAUSED ──> RUNNING                        promoted: resumed from its checkpoint as a new job
       ├──> PRUNED                            the study ended without promoting it
       └──> FAILED                            its next job could not be created
    DUPLICATE                                 created ended: its configuration had been run already

A transition not in the tables is a programming error (InvalidState). RUNNING time is counted in
``elapsed_seconds`` (a time budget spends it): entering RUNNING sets ``running_since``, leaving adds to it.
"""

from __future__ import annotations

from datetime import datetime

from dlcloud.errors import InvalidState
from dlcloud.schemas.studies import StudyState, TrialState
from dlcloud.store.rows import StudyRow, StudyTrialRow, utcnow

S, T = StudyState, TrialState
STUDY_ALLOWED: dict[StudyState, frozenset[StudyState]] = {
    S.RUNNING: frozenset({S.STOPPING, S.COMPLETED, S.FAILED}),
    S.STOPPING: frozenset({S.STOPPED, S.FAILED}),
    S.STOPPED: frozenset({S.RUNNING}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
}
TRIAL_ALLOWED: dict[TrialState, frozenset[TrialState]] = {
    T.RUNNING: frozenset({T.COMPLETED, T.FAILED, T.PRUNING, T.STOPPING, T.PAUSED, T.PAUSING}),
    T.PRUNING: frozenset({T.PRUNED}),
    T.PAUSING: frozenset({T.PAUSED, T.FAILED}),
    T.PAUSED: frozenset({T.RUNNING, T.PRUNED, T.FAILED}),
    T.STOPPING: frozenset({T.STOPPED, T.COMPLETED, T.FAILED, T.PAUSED}),
    T.COMPLETED: frozenset(),
    T.PRUNED: frozenset(),
    T.FAILED: frozenset(),
    T.STOPPED: frozenset(),
    T.DUPLICATE: frozenset(),
}
STUDY_ENDED = frozenset({S.COMPLETED, S.FAILED})
TRIAL_ENDED = frozenset({T.COMPLETED, T.PRUNED, T.FAILED, T.STOPPED, T.DUPLICATE})


def elapsed(study: StudyRow, now: datetime | None = None) -> float:
    """Seconds the study has spent RUNNING, up to ``now``."""
    extra = 0.0
    if study.running_since is not None:
        extra = max(0.0, ((now or utcnow()) - study.running_since).total_seconds())
    return study.elapsed_seconds + extra


def start_study(study: StudyRow, reason: str) -> None:
    """A new study row's first state."""
    study.state, study.reason, study.running_since = S.RUNNING.value, reason, utcnow()


def transition_study(study: StudyRow, to: StudyState, reason: str) -> None:
    current = StudyState(study.state)
    if to not in STUDY_ALLOWED[current]:
        raise InvalidState(f"study {study.name!r} cannot go from {current.value} to {to.value}")
    now = utcnow()
    if current == S.RUNNING:
        study.elapsed_seconds, study.running_since = elapsed(study, now), None
    if to == S.RUNNING:
        study.running_since = now
    if to in STUDY_ENDED:
        study.finished_at = now
    study.state, study.reason = to.value, reason


def start_trial(trial: StudyTrialRow, job_id: str, job_name: str) -> None:
    """A new trial row's first state when its job was created: RUNNING, that job its own."""
    trial.state, trial.job_id, trial.job_name, trial.reason = T.RUNNING.value, job_id, job_name, "submitted"


def record_duplicate(trial: StudyTrialRow, earlier: int, value: float | None) -> None:
    """A new trial row's first (and last) state when trial ``earlier`` had the same configuration: DUPLICATE, no
    job, ``value`` the earlier trial's (None unless it completed)."""
    trial.state, trial.duplicate_of, trial.job_id, trial.job_name = T.DUPLICATE.value, earlier, None, None
    trial.reason = f"the same configuration as trial {earlier}: not run again"
    trial.value = value
    trial.finished_at = trial.created_at


def transition_trial(trial: StudyTrialRow, to: TrialState, reason: str, value: float | None = None) -> None:
    current = TrialState(trial.state)
    if to not in TRIAL_ALLOWED[current]:
        raise InvalidState(f"trial {trial.number} cannot go from {current.value} to {to.value}")
    trial.state, trial.reason = to.value, reason
    if to in TRIAL_ENDED:
        trial.finished_at = utcnow()
        trial.value = value
