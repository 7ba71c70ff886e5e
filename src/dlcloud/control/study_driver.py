"""The study driver: runs the trials of every RUNNING study, in the leader's control loop (a step of its tick).

Optuna decides (samplers and pruners through ask-and-tell); the database remembers. Each pass, per study:
1. in one fenced transaction: every alive trial whose job ended, its metrics all in (``settled``: the last reading of
   its TensorBoard event files comes after the end), is told to Optuna (COMPLETE with the objective
   read from the job's metrics by the study's ``step`` rule; FAIL when the job failed or reported nothing;
   PRUNED when early stopping cancelled it); the objective's new points of a running trial are reported to
   Optuna step by step, and a trial the pruner stops has its job cancelled through the job's own cancel
   path (SIGTERM, then SIGKILL after its grace period); a stopping study (``stop``, a spent budget) cancels
   its trials;
2. while fewer than ``parallel_trials`` trials are alive and fewer than ``max_trials`` were started: ask
   Optuna for a trial and record it *with its job* in one fenced transaction;
3. a study with nothing left to start and no trial alive is COMPLETED (a stopping one STOPPED).

A pausing ASHA study (``StudySpec.pauses``; the algorithm in ``asha.py``) decides promotions itself: each trial
job trains to its rung (``DLCLOUD_STOP_AT_STEP``) and ends, the trial is PAUSED; a free slot first resumes the
paused trial that earned the next rung (a new job, ``checkpoint_from`` its previous one, recorded with the
trial's row in one fenced transaction), else starts a new trial. A job that runs past its rung is stopped there
(PAUSING). When nothing can start and nothing is promotable, its paused trials end PRUNED. Optuna samples the
configurations and is told each outcome; its pruner is not used.

Invariants:
- The database is the truth; the Optuna study in memory is a cache of it (an in-memory storage). It is
  rebuilt from ``study_trials`` (params, distributions, system attributes, intermediate values, outcome) when
  missing, when its trial count differs from the table's, and after any error: what Optuna was told in a
  transaction that did not commit is forgotten with it. So a control-plane kill -9 at any point loses no
  trial (a trial row exists exactly when its job does) and runs none twice (a trial's job is created once,
  with its row).
- Trial numbers are Optuna's: every ``ask`` becomes a row in the same transaction (a trial with a job, or a
  DUPLICATE: a configuration already run is never run again; Optuna is told the earlier trial's value).
- Reproducible: the sampler of trial ``n`` is seeded with the study's seed and ``n``, so a restarted driver
  asks what the first would have asked, given the same history.
- Fenced: every write goes through the control loop's fenced ``write`` (``LeadershipLost`` ends the pass).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from dlcloud.control import asha
from dlcloud.control.leader import LeadershipLost
from dlcloud.errors import DlcloudError, NotFound, QuotaExceeded
from dlcloud.schemas.jobs import TERMINAL_STATES, JobState
from dlcloud.schemas.studies import (
    ALIVE_TRIAL_STATES,
    Algorithm,
    Direction,
    EarlyStopping,
    ParamType,
    StudySpec,
    StudyState,
    TrialState,
)
from dlcloud.schemas.users import Role
from dlcloud.services import jobs, studies, study_states
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform
from dlcloud.store import metrics as metric_store
from dlcloud.store import studies as store
from dlcloud.store.rows import JobRow, StudyRow, StudyTrialRow, TenantRow, UserRow, utcnow

if TYPE_CHECKING:
    import optuna  # for annotations only: heavy (optuna, ~0.5 s): only where a study runs

log = logging.getLogger(__name__)
DUPLICATES_IN_A_ROW = 100  # proposals of configurations already run, in a row: the space is exhausted
MAX_ASKS_PER_PASS = 20


@dataclass
class _Live:
    """The Optuna study of one study, rebuilt from its rows."""

    study: optuna.Study
    spec: StudySpec
    n: int  # trials it holds (= rows)
    configs: dict[str, int] = field(default_factory=dict)  # canonical params -> first trial number


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


class _GridSampler:
    """Optuna's GridSampler without its ``study.stop()`` after the last point (which ask-and-tell outside
    ``optimize`` cannot take): the driver stops at the grid's size itself."""

    @staticmethod
    def make(search_space: dict[str, list[Any]], seed: int) -> optuna.samplers.BaseSampler:
        import optuna  # heavy (optuna, ~0.5 s): only where a study runs

        class GridSampler(optuna.samplers.GridSampler):
            def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
                return None

        return GridSampler(search_space, seed=seed)


def _sampler(spec: StudySpec, seed: int, number: int) -> optuna.samplers.BaseSampler:
    import optuna  # heavy (optuna, ~0.5 s): only where a study runs

    per_trial = (seed * 1_000_003 + number) % 2**32
    if spec.algorithm == Algorithm.GRID:
        return _GridSampler.make({n: p.grid_values() or [] for n, p in spec.search_space.items()}, seed)
    if spec.algorithm == Algorithm.TPE:
        return optuna.samplers.TPESampler(seed=per_trial)
    return optuna.samplers.RandomSampler(seed=per_trial)


def _pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    import optuna  # heavy (optuna, ~0.5 s): only where a study runs

    if spec.algorithm != Algorithm.ASHA or spec.pauses():
        return optuna.pruners.NopPruner()
    es = spec.early_stopping or EarlyStopping()
    if es.hyperband:
        return optuna.pruners.HyperbandPruner(
            min_resource=es.min_resource,
            max_resource=es.max_resource if es.max_resource is not None else "auto",
            reduction_factor=es.reduction_factor,
        )
    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=es.min_resource, reduction_factor=es.reduction_factor, min_early_stopping_rate=0
    )


def _suggest(trial: optuna.Trial, spec: StudySpec) -> dict[str, Any]:
    """Sample the search space in its order; a conditional parameter only where its ``when`` holds."""
    params: dict[str, Any] = {}
    for name, p in spec.search_space.items():
        if p.when and any(ref not in params or params[ref] != want for ref, want in p.when.items()):
            continue
        assert p.type == ParamType.CATEGORICAL or (p.low is not None and p.high is not None)
        if p.type == ParamType.CATEGORICAL:
            params[name] = trial.suggest_categorical(name, p.values or [])
        elif p.type == ParamType.INT:
            params[name] = trial.suggest_int(name, int(p.low or 0), int(p.high or 0), step=int(p.step or 1))
        else:
            low, high = float(p.low or 0), float(p.high or 0)
            log_scale = p.type == ParamType.LOGUNIFORM
            params[name] = trial.suggest_float(name, low, high, step=p.step, log=log_scale)
    return params


def _space_size(spec: StudySpec) -> int | None:
    """How many configurations the space has at most; None when a parameter is continuous."""
    size = 1
    for p in spec.search_space.values():
        values = p.grid_values()
        if values is None:
            return None
        size *= len(values) + (1 if p.when else 0)  # +1: left out
    return size


class StudyDriver:
    """Drives the RUNNING and STOPPING studies one pass at a time (``run``), with the loop's fenced ``write``."""

    def __init__(
        self,
        platform: Platform,
        write: Callable[[], contextlib.AbstractContextManager[Session]],
        settled: Callable[[str], bool] = lambda job_id: True,
    ):
        self.p = platform
        self.write = write
        # whether an ended job's metrics are all in (its event files' last reading comes after its end): a trial's
        # outcome is read from them once they are
        self.settled = settled
        self._live: dict[str, _Live] = {}

    def reset(self) -> None:
        """Forget the Optuna studies: at the start of a term of leadership (another leader may have driven
        them meanwhile), they are rebuilt from the database."""
        self._live.clear()

    def run(self) -> None:
        with self.p.db.read() as s:
            ids = store.driven_study_ids(s, [StudyState.RUNNING.value, StudyState.STOPPING.value])
        for gone in set(self._live) - set(ids):
            del self._live[gone]
        for study_id in ids:
            try:
                self._drive(study_id)
            except LeadershipLost:
                self._live.clear()
                raise
            except Exception:  # one study's failure must not stop the others (nor the loop)
                log.exception("study %s: the driver's pass failed; it is rebuilt from the database", study_id)
                self._live.pop(study_id, None)

    # -- one study ---------------------------------------------------------------------------------
    def _drive(self, study_id: str) -> None:
        try:
            more = self._update(study_id)
            for _ in range(MAX_ASKS_PER_PASS):
                if more <= 0 or not (self._resume_one(study_id) or self._start_one(study_id)):
                    break
                more -= 1
        except BaseException:
            self._live.pop(study_id, None)  # what Optuna was told may not have been committed
            raise

    def _load(self, s: Session, row: StudyRow, trials: list[StudyTrialRow]) -> _Live:
        live = self._live.get(row.id)
        if live is not None and live.n == len(trials):
            return live
        import optuna  # heavy (optuna, ~0.5 s): only where a study runs
        from optuna.distributions import json_to_distribution
        from optuna.trial import create_trial

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        spec = StudySpec.model_validate(studies.run_spec(row))
        study = optuna.create_study(
            direction="minimize" if spec.objective.direction == Direction.MINIMIZE else "maximize",
            sampler=_sampler(spec, row.seed, len(trials)),
            pruner=_pruner(spec),
        )
        live = _Live(study, spec, len(trials))
        for t in trials:
            state, value = self._optuna_outcome(t)
            study.add_trial(
                create_trial(
                    state=state,
                    value=value,
                    params=t.params,
                    distributions={k: json_to_distribution(v) for k, v in t.distributions.items()},
                    system_attrs=t.system_attrs,
                    intermediate_values={int(k): float(v) for k, v in t.intermediate.items()},
                )
            )
            live.configs.setdefault(_key(t.params), t.number)
        self._live[row.id] = live
        return live

    @staticmethod
    def _optuna_outcome(t: StudyTrialRow) -> tuple[Any, float | None]:
        from optuna.trial import TrialState as OT  # heavy (optuna, ~0.5 s): only where a study runs

        state = TrialState(t.state)
        if state in ALIVE_TRIAL_STATES or state == TrialState.PAUSED:
            return OT.RUNNING, None
        if state in (TrialState.COMPLETED, TrialState.DUPLICATE) and t.value is not None:
            return OT.COMPLETE, t.value
        if state == TrialState.PRUNED:
            return OT.PRUNED, None
        return OT.FAIL, None

    def _tell(self, live: _Live, t: StudyTrialRow) -> None:
        state, value = self._optuna_outcome(t)
        live.study.tell(t.number, value, state=state)

    def _update(self, study_id: str) -> int:
        """Apply what happened to the study's trials; returns how many trials may be started now."""
        with self.write() as s:
            row = s.get(StudyRow, study_id, with_for_update=True)
            if row is None or row.state not in (StudyState.RUNNING.value, StudyState.STOPPING.value):
                return 0
            trials = list(store.list_trials(s, study_id))
            live = self._load(s, row, trials)
            spec = live.spec
            job_state = store.job_states(s, [t.job_id for t in trials if t.job_id])
            spent = self._budget_spent(s, row, spec, trials)
            winding_down = row.state == StudyState.STOPPING.value or spent is not None
            for t in trials:
                if TrialState(t.state) not in ALIVE_TRIAL_STATES:
                    continue
                state = job_state.get(t.job_id or "")
                if state is None or JobState(state) in TERMINAL_STATES:
                    if state is None or self.settled(t.job_id or ""):
                        self._finish(s, live, t, state)
                    continue
                if t.state == TrialState.RUNNING.value and winding_down:
                    self._cancel(s, t, "the study is stopping" if spent is None else spent)
                    study_states.transition_trial(t, TrialState.STOPPING, f"cancelled: {spent or 'study stopped'}")
                    continue
                if t.state == TrialState.RUNNING.value:
                    self._report(s, live, t)
            alive = sum(1 for t in trials if TrialState(t.state) in ALIVE_TRIAL_STATES)
            if row.state == StudyState.STOPPING.value:
                if not alive:
                    study_states.transition_study(row, StudyState.STOPPED, row.reason)
                return 0
            started = sum(1 for t in trials if t.state != TrialState.DUPLICATE.value)
            done = spent or self._exhausted(spec, trials, started)
            if spec.pauses() and spent is None and self._promotion(spec, trials) is not None:
                return spec.parallel_trials - alive  # promotions go on after the last new trial
            if done is not None:
                if not alive:
                    self._prune_paused(live, trials, done)
                    study_states.transition_study(row, StudyState.COMPLETED, done)
                    log.info("study %s (%s) completed: %s", row.name, row.id, done)
                return 0
            return min(spec.parallel_trials - alive, spec.max_trials - started)

    # -- pausing ASHA ------------------------------------------------------------------------------
    @staticmethod
    def _candidates(trials: list[StudyTrialRow]) -> list[asha.Candidate]:
        return [
            asha.Candidate(
                number=t.number,
                points={int(k): float(v) for k, v in t.intermediate.items()},
                budget=t.budget,
                last=StudyDriver._trial_last_of(t),
                paused=t.state == TrialState.PAUSED.value,
            )
            for t in trials
            if t.segments
        ]

    @staticmethod
    def _trial_last_of(t: StudyTrialRow) -> int:
        """A pausing trial's last step (its final job trains to it)."""
        return int(t.segments[-1]["last"]) if t.segments else t.budget or 0

    @staticmethod
    def _rungs(spec: StudySpec) -> asha.Rungs:
        es = spec.early_stopping or EarlyStopping()
        return asha.Rungs(es.min_resource, es.reduction_factor)

    def _promotion(self, spec: StudySpec, trials: list[StudyTrialRow]) -> tuple[StudyTrialRow, int] | None:
        """The paused trial that earned the next rung and the step to resume it to, or None. At the end of a
        study in which no trial has trained to its last step yet, the best paused one of the highest rung."""
        candidates, rungs = self._candidates(trials), self._rungs(spec)
        best, direction = spec.objective.step == "best", spec.objective.direction
        pick = asha.promotion(candidates, rungs, direction, best=best)
        if pick is None and self._end_game(spec, trials):
            pick = asha.finishing(candidates, rungs, direction, best=best)
        if pick is None:
            return None
        candidate, budget = pick
        return next(t for t in trials if t.number == candidate.number), budget

    def _end_game(self, spec: StudySpec, trials: list[StudyTrialRow]) -> bool:
        """Nothing can start and nothing runs, and no trial has completed: without a promotion the study would
        end with no trial trained to its last step."""
        started = sum(1 for t in trials if t.state != TrialState.DUPLICATE.value)
        return (
            not any(TrialState(t.state) in ALIVE_TRIAL_STATES for t in trials)
            and not any(t.state == TrialState.COMPLETED.value for t in trials)
            and self._exhausted(spec, trials, started) is not None
        )

    def _prune_paused(self, live: _Live, trials: list[StudyTrialRow], done: str) -> None:
        """The study ends: its paused trials were not promoted (or the budget ran out before they were)."""
        spec = live.spec
        candidates = self._candidates(trials)
        for t in trials:
            if t.state != TrialState.PAUSED.value:
                continue
            c = next(c for c in candidates if c.number == t.number)
            where = asha.standing(
                c, candidates, self._rungs(spec), spec.objective.direction, best=spec.objective.step == "best"
            )
            why = f"not promoted ({spec.objective.metric} {where}); the study ended: {done}"
            study_states.transition_trial(t, TrialState.PRUNED, why, self._last_value(t))
            self._tell(live, t)

    def _resume_one(self, study_id: str) -> bool:
        """Resume the paused trial that earned the next rung, as a new job from its last job's checkpoints;
        False when none has (or the tenant's queue is full)."""
        number = -1
        try:
            with self.write() as s:
                row = s.get(StudyRow, study_id, with_for_update=True)
                if row is None or row.state != StudyState.RUNNING.value:
                    return False
                stored = studies.run_spec(row)
                spec = StudySpec.model_validate(stored)
                if not spec.pauses():
                    return False
                trials = list(store.list_trials(s, study_id))
                pick = self._promotion(spec, trials)
                if pick is None:
                    return False
                t, budget = pick
                segment = len(t.segments)
                previous, last = t.job_name, self._trial_last_of(t)
                number = t.number
                if t.job_id is None:
                    raise NotFound(f"its last job {previous} was deleted, and its checkpoints with it")
                job_spec, env = studies.trial_job_spec(
                    self.p,
                    stored,
                    row.name,
                    t.number,
                    t.params,
                    segment=segment,
                    checkpoint_from=t.job_id,  # the id: a job of that name made since cannot stand in for it
                    stop_at_step=budget,
                )
                job = jobs.create_job_row(s, self.p, self._caller(s, row), job_spec, trial_env=env)
                t.segments = [*t.segments, {"job_id": job.id, "job_name": job.name, "budget": budget, "last": last}]
                t.job_id, t.job_name, t.budget = job.id, job.name, budget
                why = f"promoted: resumed from {previous}'s checkpoint to step {budget}"
                study_states.transition_trial(t, TrialState.RUNNING, why)
        except QuotaExceeded as exc:  # the tenant's queue is full: promoted later
            log.info("study %s: a promotion waits: %s", study_id, exc.message)
            return False
        except DlcloudError as exc:  # its last job was deleted, its next name is taken...: this trial ends
            self._fail_trial(study_id, number, f"could not be resumed: {exc.message}")
            return True
        self.p.wake()
        return True

    def _fail_trial(self, study_id: str, number: int, why: str) -> None:
        with self.write() as s:
            row = s.get(StudyRow, study_id, with_for_update=True)
            if row is None:
                return
            trials = list(store.list_trials(s, study_id))
            t = next((x for x in trials if x.number == number), None)
            if t is None or t.state != TrialState.PAUSED.value:
                return
            live = self._load(s, row, trials)
            study_states.transition_trial(t, TrialState.FAILED, why)
            self._tell(live, t)

    def _budget_spent(self, s: Session, row: StudyRow, spec: StudySpec, trials: list[StudyTrialRow]) -> str | None:
        b = spec.budget
        if b is None:
            return None
        if b.seconds is not None and study_states.elapsed(row) >= b.seconds:
            return f"its time budget of {b.seconds:g} s is spent"
        if b.gpu_hours is not None and studies.gpu_hours(s, trials) >= b.gpu_hours:
            return f"its budget of {b.gpu_hours:g} GPU-hours is spent"
        return None

    @staticmethod
    def _exhausted(spec: StudySpec, trials: list[StudyTrialRow], started: int) -> str | None:
        if started >= spec.max_trials:
            return f"max_trials ({spec.max_trials}) reached"
        grid = spec.grid_size()
        if grid is not None and started >= grid:
            return f"the grid's {grid} configurations are covered"
        size = _space_size(spec)
        distinct = len({_key(t.params) for t in trials})
        if size is not None and distinct >= size:
            return f"the search space's {distinct} configurations are covered"
        tail = 0
        for t in reversed(trials):
            if t.state != TrialState.DUPLICATE.value:
                break
            tail += 1
        if tail >= DUPLICATES_IN_A_ROW:
            return f"the sampler proposed only configurations already run ({tail} in a row)"
        return None

    def _finish(self, s: Session, live: _Live, t: StudyTrialRow, job_state: str | None) -> None:
        """The trial's job ended (``job_state``; None: the job was deleted): record the outcome, tell Optuna."""
        if job_state is not None:
            self._report(s, live, t, judge=False)
        current = TrialState(t.state)
        if current == TrialState.PRUNING:
            study_states.transition_trial(t, TrialState.PRUNED, t.reason, self._last_value(t))
        elif self._paused_at_rung(live.spec, t, job_state):
            last = self._last_step(t)
            study_states.transition_trial(
                t, TrialState.PAUSED, f"paused at step {t.budget} (reported up to {last}); resumed if promoted"
            )
            return  # still running for Optuna
        elif job_state == JobState.SUCCEEDED.value:
            value, why = self._objective(s, live.spec, t)
            if value is None:
                study_states.transition_trial(t, TrialState.FAILED, why)
            else:
                study_states.transition_trial(t, TrialState.COMPLETED, why, value)
        elif current == TrialState.STOPPING:
            study_states.transition_trial(t, TrialState.STOPPED, t.reason)
        else:
            what = "was deleted" if job_state is None else f"ended {job_state}"
            study_states.transition_trial(t, TrialState.FAILED, f"its job {t.job_name} {what}")
        self._tell(live, t)

    @staticmethod
    def _last_step(t: StudyTrialRow) -> int | None:
        return max((int(k) for k in t.intermediate), default=None)

    def _paused_at_rung(self, spec: StudySpec, t: StudyTrialRow, job_state: str | None) -> bool:
        """A pausing trial's job ended at its rung, before the trial's last step: it waits for a promotion.
        (A job that ended short of its rung without being stopped there ended the trial: early stopping.)"""
        if not spec.pauses() or t.budget is None or job_state is None:
            return False
        last = self._last_step(t)
        if last is None or last < t.budget:
            return False
        if t.state == TrialState.PAUSING.value:
            return True
        return job_state == JobState.SUCCEEDED.value and t.budget < self._trial_last_of(t)

    @staticmethod
    def _last_value(t: StudyTrialRow) -> float | None:
        if not t.intermediate:
            return None
        return float(t.intermediate[str(max(int(k) for k in t.intermediate))])

    @staticmethod
    def _series(s: Session, metric: str, t: StudyTrialRow) -> list[tuple[int, float]]:
        """(step, value) of the objective metric in the trial job's last attempt (its main replica)."""
        if t.job_id is None:
            return []
        rows = metric_store.read_points(s, t.job_id, [metric], None, None)
        if not rows:
            return []
        attempt = max(r[1] for r in rows)
        replica = min(r[2] for r in rows if r[1] == attempt)
        return [(r[3], r[4]) for r in rows if r[1] == attempt and r[2] == replica]

    def _objective(self, s: Session, spec: StudySpec, t: StudyTrialRow) -> tuple[float | None, str]:
        o = spec.objective
        if spec.pauses():  # over all its jobs (each resumed one reports the steps after its checkpoint)
            points = sorted((int(k), float(v)) for k, v in t.intermediate.items())
        else:
            points = self._series(s, o.metric, t)
        if not points:
            return None, f"its job reported no {o.metric!r} (dlcloud.report({o.metric}=...))"
        if o.step == "last":
            return points[-1][1], f"{o.metric} at its last step ({points[-1][0]})"
        if o.step == "best":
            pick = min if o.direction == Direction.MINIMIZE else max
            step, value = pick(points, key=lambda p: p[1])
            return value, f"best {o.metric} (step {step})"
        at = dict(points)
        if o.step not in at:
            return None, f"its job reported no {o.metric!r} at step {o.step}"
        return at[o.step], f"{o.metric} at step {o.step}"

    def _report(self, s: Session, live: _Live, t: StudyTrialRow, *, judge: bool = True) -> None:
        """Report the objective's new points to Optuna, in step order; cancel the trial's job (PRUNING) when
        the pruner says so (``judge``)."""
        import optuna  # heavy (optuna, ~0.5 s): only where a study runs

        known = {int(k) for k in t.intermediate}
        new = [(step, v) for step, v in self._series(s, live.spec.objective.metric, t) if step not in known]
        if not new:
            return
        trial_id = live.study._storage.get_trial_id_from_study_id_trial_number(live.study._study_id, t.number)
        trial = optuna.Trial(live.study, trial_id)
        intermediate = dict(t.intermediate)
        prune = False
        for step, value in new:
            trial.report(value, step)
            intermediate[str(step)] = value
            if judge and live.spec.algorithm == Algorithm.ASHA and trial.should_prune():
                prune = True
                break
        t.intermediate = intermediate
        t.system_attrs = json.loads(json.dumps(live.study._storage.get_trial_system_attrs(trial_id)))
        last = max(int(k) for k in intermediate)
        rung = t.budget if live.spec.pauses() and t.budget is not None and t.budget < self._trial_last_of(t) else None
        if judge and rung is not None and last > rung:  # its code ignores DLCLOUD_STOP_AT_STEP: stop it there
            why = f"ran past its rung (step {t.budget}) to step {last}: stopped there"
            self._cancel(s, t, why)
            study_states.transition_trial(t, TrialState.PAUSING, why)
        elif prune:
            step = max(int(k) for k in intermediate)
            why = f"pruned at step {step} ({live.spec.objective.metric} {intermediate[str(step)]:g})"
            self._cancel(s, t, why)
            study_states.transition_trial(t, TrialState.PRUNING, why)

    def _cancel(self, s: Session, t: StudyTrialRow, why: str) -> None:
        job = s.get(JobRow, t.job_id, with_for_update=True) if t.job_id else None
        if job is not None:
            jobs.request_cancel(s, job, f"study driver ({why})")
            self.p.wake()

    # -- starting a trial --------------------------------------------------------------------------
    def _start_one(self, study_id: str) -> bool:
        """Ask Optuna for a trial and record it with its job (or as a DUPLICATE); False when none can start
        now (the study changed, the tenant's queue is full)."""
        try:
            with self.write() as s:
                row = s.get(StudyRow, study_id, with_for_update=True)
                if row is None or row.state != StudyState.RUNNING.value:
                    return False
                trials = list(store.list_trials(s, study_id))
                live = self._load(s, row, trials)
                started = sum(1 for t in trials if t.state != TrialState.DUPLICATE.value)
                if self._exhausted(live.spec, trials, started) is not None:
                    return False  # a pausing study's slot may be for promotions only
                number = live.n
                live.study.sampler = _sampler(live.spec, row.seed, number)
                trial = live.study.ask()
                assert trial.number == number, (trial.number, number)
                params = _suggest(trial, live.spec)
                frozen = live.study._storage.get_trial(trial._trial_id)
                t = StudyTrialRow(
                    study_id=row.id,
                    tenant_id=row.tenant_id,
                    number=number,
                    params=params,
                    distributions={k: _dist_json(d) for k, d in frozen.distributions.items()},
                    system_attrs=json.loads(json.dumps(frozen.system_attrs)),
                    intermediate={},
                    created_at=utcnow(),
                )
                live.n += 1
                earlier = live.configs.get(_key(params))
                if earlier is not None:
                    first = next(x for x in trials if x.number == earlier)
                    study_states.record_duplicate(
                        t, earlier, first.value if first.state == TrialState.COMPLETED.value else None
                    )
                    s.add(t)
                    self._tell(live, t)
                    return True
                caller = self._caller(s, row)
                budget = last = None
                stored = studies.run_spec(row)
                if live.spec.pauses():
                    last = studies.trial_last_step(stored, params)
                    budget = self._rungs(live.spec).first_budget(last)
                job_spec, env = studies.trial_job_spec(self.p, stored, row.name, number, params, stop_at_step=budget)
                job = jobs.create_job_row(s, self.p, caller, job_spec, trial_env=env)
                study_states.start_trial(t, job.id, job.name)
                if budget is not None:
                    t.budget = budget
                    t.segments = [{"job_id": job.id, "job_name": job.name, "budget": budget, "last": last}]
                s.add(t)
                live.configs[_key(params)] = number
        except QuotaExceeded as exc:  # the tenant's queue is full: the same trial is asked again later
            self._live.pop(study_id, None)
            log.info("study %s: trial waits: %s", study_id, exc.message)
            return False
        except DlcloudError as exc:  # its trial job cannot be created (name taken, no longer fits): it fails
            self._live.pop(study_id, None)
            with self.write() as s:
                row = s.get(StudyRow, study_id, with_for_update=True)
                if row is not None and row.state == StudyState.RUNNING.value:
                    study_states.transition_study(row, StudyState.FAILED, f"a trial job could not be created: {exc}")
            return False
        self.p.wake()
        return True

    @staticmethod
    def _caller(s: Session, row: StudyRow) -> Caller:
        """The study's user, as whom its trial jobs are submitted."""
        user = s.get(UserRow, row.user_id)
        tenant = s.get(TenantRow, row.tenant_id)
        if user is None or tenant is None:
            raise NotFound(f"the study's user {row.user_id} no longer exists")
        return Caller(tenant.id, tenant.name, user.id, user.name, Role(user.role), access_key="")


def _dist_json(d: Any) -> str:
    from optuna.distributions import distribution_to_json  # heavy (optuna, ~0.5 s): only where a study runs

    return distribution_to_json(d)
