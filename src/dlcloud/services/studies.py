"""Studies as users see them: submit, list, describe, trials, best, stop, resume (docs/tuning.md).

The study driver (``control/study_driver.py``, in the leader) runs the trials; this module only records what users
ask. State changes go through ``study_states``. A trial's job spec is built here (``trial_job_spec``), for the
check at submit and for the driver alike.

Invariants:
- Trial jobs are ordinary jobs of the study's user, named ``<study>-<number>``: they count against the
  tenant's quotas and wait in the same queue.
- A trial's parameters reach its job as ``DLCLOUD_HPARAMS`` (JSON, set by the platform in the job's
  environment), as the job spec's ``hparams`` where the job spec has that field, and as ``--name=value``
  arguments when the study says ``args: true``.
- A no-code template trial (``trial.template``) is checked at submit against the template's catalog: every
  search-space parameter must be one of its hyperparameters, with values it allows. The datasets a trial reads
  (its template's data, its ``datasets``) are pinned at submit to the version they name then, so every trial
  reads the same data.
- The study row keeps the study file as submitted; what the platform decides at submit (those pinned versions,
  an ASHA study's ``early_stopping.pause``, a drawn seed) is kept beside it (``platform_state``, the ``seed``
  column), and trials run on ``run_spec``: the file with the decisions applied.
"""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from dlcloud.errors import AlreadyExists, InvalidSpec, InvalidState, NotFound
from dlcloud.schemas.datasets import DATASET_REF_RE, dataset_ref
from dlcloud.schemas.jobs import SECRET_MASK, JobSpec
from dlcloud.schemas.studies import (
    ALIVE_TRIAL_STATES,
    Algorithm,
    BestTrial,
    Direction,
    ParamType,
    Study,
    StudyDetail,
    StudyPlatformState,
    StudySpec,
    StudyState,
    Trial,
    TrialCounts,
    TrialState,
)
from dlcloud.services import datasets, job_checks, jobs, study_states
from dlcloud.services.auth import Caller
from dlcloud.services.isolation import require_isolation
from dlcloud.services.platform import Platform
from dlcloud.store import studies as store
from dlcloud.store import tenants as tenant_store
from dlcloud.store.ids import looks_like_id, new_id, reserved_name_message
from dlcloud.store.rows import StudyRow, StudyTrialRow, utcnow
from dlcloud.templates import catalog


def trial_job_name(study: str, number: int, segment: int = 0) -> str:
    """``<study>-<number>``; a pausing ASHA trial resumed for the ``segment``-th time: ``<study>-<number>-r<segment>``
    (the rung it resumes at; the ``r`` keeps these names apart from another study's ``<study>-<n>`` jobs)."""
    return f"{study}-{number}" if segment == 0 else f"{study}-{number}-r{segment}"


def trial_job_ids(t: StudyTrialRow) -> list[str]:
    """Every job the trial ran (one, or a pausing trial's segments); none for a duplicate."""
    if t.segments:
        return [str(seg["job_id"]) for seg in t.segments]
    return [t.job_id] if t.job_id else []


def _flag_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def trial_job_spec(
    platform: Platform,
    stored: dict[str, Any],
    study: str,
    number: int,
    params: dict[str, Any],
    *,
    segment: int = 0,
    checkpoint_from: str | None = None,
    stop_at_step: int | None = None,
) -> tuple[JobSpec, dict[str, str]]:
    """The job spec of trial ``number`` with ``params``, and the DLCLOUD_* variables the platform adds to it.
    ``stored``: the study spec as stored (the trial's ``secret_env`` encrypted). InvalidSpec names the field.
    A pausing ASHA trial's job trains to ``stop_at_step`` (``DLCLOUD_STOP_AT_STEP``); its ``segment``-th resumed
    job starts from the checkpoints of the job ``checkpoint_from`` (its previous one)."""
    trial = dict(stored["trial"])
    if "name" in trial:
        raise InvalidSpec(f"trial.name: leave it out; trial jobs are named {study}-<trial number>")
    if secret := trial.get("secret_env"):
        trial["secret_env"] = {k: platform.box.decrypt(str(v).encode()) for k, v in secret.items()}
    hparams = trial.pop("hparams", None) or {}
    if not isinstance(hparams, dict):
        raise InvalidSpec("trial.hparams must be a mapping of fixed hyperparameters")
    hparams = {**hparams, **params}
    if stored.get("args") and trial.get("template") is not None:
        raise InvalidSpec("args: a template trial reads its hparams; leave 'args' out")
    if "hparams" in JobSpec.model_fields:  # the job spec carries them itself (no-code templates)
        trial["hparams"] = hparams
    if stored.get("args"):
        flags = [f"--{k}={_flag_value(v)}" for k, v in params.items()]
        if isinstance(trial.get("command"), str):
            trial["command"] = " ".join([trial["command"], *map(shlex.quote, flags)])
        else:
            trial["args"] = [*(trial.get("args") or []), *flags]
    trial["name"] = trial_job_name(study, number, segment)
    if checkpoint_from is not None:
        trial["checkpoint_from"] = checkpoint_from
    try:
        spec = JobSpec.model_validate(trial)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidSpec(f"trial{'.' + where if where else ''}: {first['msg']}") from None
    env = {"DLCLOUD_HPARAMS": json.dumps(hparams, sort_keys=True), "DLCLOUD_STUDY": study, "DLCLOUD_TRIAL": str(number)}
    if stop_at_step is not None:
        env["DLCLOUD_STOP_AT_STEP"] = str(stop_at_step)
    return spec, env


def trial_last_step(stored: dict[str, Any], params: dict[str, Any]) -> int:
    """The last step a pausing ASHA trial trains to: ``early_stopping.max_resource``, else (a no-code template
    trial) its ``epochs``, fixed or sampled. InvalidSpec when neither is known."""
    es = stored.get("early_stopping") or {}
    if es.get("max_resource") is not None:
        return int(es["max_resource"])
    template = stored["trial"].get("template")
    if not isinstance(template, dict):
        raise InvalidSpec("early_stopping.max_resource: a pausing ASHA study needs it (the last step of a trial)")
    hparams = {**(stored["trial"].get("hparams") or {}), **params}
    try:
        return int(catalog.get_template(str(template["name"])).resolve(hparams)["epochs"])
    except (ValueError, KeyError) as exc:
        raise InvalidSpec(f"trial.hparams: {exc}") from None


def _example_params(spec: StudySpec) -> dict[str, Any]:
    """A value of every parameter, to check the trial's job spec at submit."""
    out: dict[str, Any] = {}
    for name, p in spec.search_space.items():
        if p.type == ParamType.CATEGORICAL:
            out[name] = (p.values or [""])[0]
        elif p.type == ParamType.INT:
            out[name] = int(p.low or 0)
        else:
            out[name] = p.low
    return out


def _check_template_space(spec: StudySpec, job_spec: JobSpec) -> None:
    """A template trial's search space against the template's hyperparameters: each parameter one of them,
    sampled as its type allows, every value (a range's ends) in its bounds. InvalidSpec names what is allowed."""
    if job_spec.template is None:
        return
    try:
        template = catalog.get_template(job_spec.template.name)
    except ValueError as exc:
        raise InvalidSpec(f"trial.template: {exc}") from None
    for name, p in spec.search_space.items():
        hp = template.hparam(name)
        if hp is None:
            allowed = ", ".join(h.name for h in template.hparams)
            raise InvalidSpec(
                f"search_space.{name}: template {template.name} has no hparam {name}; its hparams are: {allowed}"
            )
        if hp.kind is not float and p.type in (ParamType.UNIFORM, ParamType.LOGUNIFORM):
            kind = "int" if hp.kind is int else "categorical"
            raise InvalidSpec(f"search_space.{name}: hparam {name} must be {hp.allowed()}; sample it with type: {kind}")
        for value in (p.values or []) if p.type == ParamType.CATEGORICAL else (p.low, p.high):
            try:
                hp.check(value)
            except ValueError as exc:
                raise InvalidSpec(f"search_space.{name}: {exc}") from None
    try:
        template.resolve(job_spec.hparams)
    except ValueError as exc:
        raise InvalidSpec(f"trial.hparams: {exc}") from None


def _decide(s: Session, caller: Caller, spec: StudySpec, trial: dict[str, Any]) -> StudyPlatformState:
    """What the platform decides at submit (``StudyPlatformState``): each dataset reference of ``trial`` pinned
    to ``NAME@VERSION`` of the version it names now (a label or ``latest`` may move while the study runs; its
    trials must all read the same data), and an ASHA study's ``early_stopping.pause``."""

    def pin(ref: str) -> str:
        (resolved,) = datasets.resolve_for_job(s, caller, [ref])
        m = DATASET_REF_RE.match(ref)
        assert m is not None  # resolve_for_job refuses what does not match
        owner = f"{m.group('owner')}/" if m.group("owner") else ""
        return f"{owner}{m.group('name')}@{resolved.version}"

    pinned = tuple(pin(dataset_ref(r)) for r in trial["datasets"]) if trial.get("datasets") else None  # a mapping too
    template = trial.get("template")
    data = pin(str(template["data"])) if isinstance(template, dict) and template.get("data") else None
    pause = spec.pauses() if spec.algorithm == Algorithm.ASHA else None  # a later default cannot change it
    return StudyPlatformState(datasets=pinned, template_data=data, pause=pause)


def run_spec(row: StudyRow) -> dict[str, Any]:
    """The study file with the platform's decisions at submit applied (``row.platform_state``): what its trials
    run on. A row from before migration 0027 has its decisions in its spec and an empty state."""
    state = row.platform_state
    spec: dict[str, Any] = json.loads(json.dumps(row.spec))
    trial = spec["trial"]
    if state.datasets is not None:
        trial["datasets"] = list(state.datasets)
    if state.template_data is not None:
        trial["template"] = {**trial["template"], "data": state.template_data}
    if state.pause is not None:
        spec["early_stopping"] = {**(spec.get("early_stopping") or {}), "pause": state.pause}
    return spec


def submit_study(platform: Platform, caller: Caller, spec: StudySpec) -> Study:
    if looks_like_id(spec.name):
        raise InvalidSpec(reserved_name_message("study", spec.name))
    require_isolation(platform, caller, "running studies")
    stored = spec.model_dump(mode="json")
    if secret := stored["trial"].get("secret_env"):
        if not isinstance(secret, dict):
            raise InvalidSpec("trial.secret_env must be a mapping of NAME: value")
        stored["trial"]["secret_env"] = {k: platform.box.encrypt(str(v)).decode() for k, v in secret.items()}
    job_spec, _ = trial_job_spec(platform, stored, spec.name, 0, _example_params(spec))
    _check_template_space(spec, job_spec)
    if spec.pauses():
        trial_last_step(stored, _example_params(spec))
        metric = spec.objective.metric
        if job_spec.template is not None and metric.startswith("best_"):
            raise InvalidSpec(
                f"objective.metric: a template reports {metric} only when its training ends, and a pausing ASHA "
                f"study ranks trials at every rung: use {metric.removeprefix('best_')} with objective.step: best "
                "(or early_stopping.pause: false)"
            )
    seed = spec.seed if spec.seed is not None else secrets.randbelow(2**31)
    with platform.db.write() as s:
        tenant = tenant_store.get_tenant(s, caller.tenant_id, for_update=True)
        if tenant is None:
            raise NotFound("your tenant no longer exists")
        job_checks.check_fits(platform, tenant, job_spec)
        jobs.resolve_checkpoint_from(s, caller, job_spec)  # trial.checkpoint_from: a job of yours that ended
        decided = _decide(s, caller, spec, stored["trial"])
        if store.name_taken(s, tenant.id, spec.name):
            raise AlreadyExists(f"study {spec.name!r} already exists; choose another name")
        row = StudyRow(
            id=new_id("s-"),
            tenant_id=tenant.id,
            user_id=caller.user_id,
            name=spec.name,
            spec=stored,
            platform_state=decided,
            algorithm=spec.algorithm.value,
            seed=seed,
            elapsed_seconds=0.0,
            created_at=utcnow(),
        )
        study_states.start_study(row, f"submitted by {caller.user}")
        s.add(row)
        s.flush()
        study = _study_model(s, row, caller.tenant, caller.user)
    platform.wake()
    return study


def best_of(trials: Sequence[StudyTrialRow], direction: Direction) -> StudyTrialRow | None:
    """The completed trial with the best value (the earliest of equals)."""
    done = [t for t in trials if t.state == TrialState.COMPLETED.value and t.value is not None]
    if not done:
        return None
    sign = 1.0 if direction == Direction.MINIMIZE else -1.0
    return min(done, key=lambda t: (sign * (t.value or 0.0), t.number))


def gpu_hours(s: Session, trials: Sequence[StudyTrialRow]) -> float:
    """GPU-hours held by the attempts of the study's trial jobs so far."""
    now = utcnow()
    spans = store.job_spans(s, [j for t in trials for j in trial_job_ids(t)])
    return sum(g * ((end or now) - start).total_seconds() for _, g, start, end in spans) / 3600.0


def _public_spec(stored: dict[str, Any]) -> dict[str, Any]:
    shown = json.loads(json.dumps(stored))
    if secret := shown["trial"].get("secret_env"):
        shown["trial"]["secret_env"] = dict.fromkeys(secret, SECRET_MASK)
    return shown


def _study_model(s: Session, row: StudyRow, tenant: str, user: str, *, detail: bool = False) -> Study:
    trials = store.list_trials(s, row.id)
    counts = TrialCounts()
    for t in trials:
        state = TrialState(t.state)
        key = "running" if state in ALIVE_TRIAL_STATES else state.value.lower()
        setattr(counts, key, getattr(counts, key) + 1)
    objective = row.spec["objective"]
    best = best_of(trials, Direction(objective["direction"]))
    fields: dict[str, Any] = dict(
        id=row.id,
        name=row.name,
        tenant=tenant,
        user=user,
        state=StudyState(row.state),
        reason=row.reason,
        algorithm=row.algorithm,
        objective=objective,
        max_trials=row.spec["max_trials"],
        parallel_trials=row.spec["parallel_trials"],
        seed=row.seed,
        trials_started=sum(1 for t in trials if t.state != TrialState.DUPLICATE.value),
        trials=counts,
        best=None if best is None else _best_model(best),
        elapsed_seconds=round(study_states.elapsed(row), 3),
        gpu_hours=round(gpu_hours(s, trials), 6),
        created_at=row.created_at,
        finished_at=row.finished_at,
    )
    if detail:
        return StudyDetail(**fields, spec=_public_spec(row.spec), resolved=row.platform_state)
    return Study(**fields)


def _best_model(t: StudyTrialRow) -> BestTrial:
    assert t.value is not None
    return BestTrial(number=t.number, value=t.value, params=t.params, job=t.job_name)


def _trial_model(t: StudyTrialRow) -> Trial:
    steps = [int(k) for k in t.intermediate]
    return Trial(
        number=t.number,
        state=TrialState(t.state),
        params=t.params,
        value=t.value,
        job=t.job_name,
        jobs=[str(seg["job_name"]) for seg in t.segments] if t.segments else [t.job_name] if t.job_name else [],
        reason=t.reason,
        duplicate_of=t.duplicate_of,
        last_step=max(steps) if steps else None,
        budget=t.budget,
        created_at=t.created_at,
        finished_at=t.finished_at,
    )


def _get_row(s: Session, caller: Caller, name_or_id: str, *, for_update: bool = False) -> StudyRow:
    row = store.get_study(s, caller.tenant_id, name_or_id, for_update=for_update)
    if row is None:
        raise NotFound(f"study {name_or_id!r} not found")
    return row


def list_studies(platform: Platform, caller: Caller, *, limit: int = 100, offset: int = 0) -> list[Study]:
    with platform.db.read() as s:
        rows = store.list_studies(s, caller.tenant_id, limit, offset)
        return [_study_model(s, r, caller.tenant, tenant_store.user_name(s, r.user_id)) for r in rows]


def describe_study(platform: Platform, caller: Caller, name_or_id: str) -> StudyDetail:
    with platform.db.read() as s:
        row = _get_row(s, caller, name_or_id)
        study = _study_model(s, row, caller.tenant, tenant_store.user_name(s, row.user_id), detail=True)
    assert isinstance(study, StudyDetail)
    return study


def list_trials(platform: Platform, caller: Caller, name_or_id: str) -> list[Trial]:
    with platform.db.read() as s:
        row = _get_row(s, caller, name_or_id)
        return [_trial_model(t) for t in store.list_trials(s, row.id)]


def best_trial(platform: Platform, caller: Caller, name_or_id: str) -> BestTrial:
    """The best completed trial so far; NotFound while none has completed."""
    with platform.db.read() as s:
        row = _get_row(s, caller, name_or_id)
        best = best_of(store.list_trials(s, row.id), Direction(row.spec["objective"]["direction"]))
        if best is None:
            raise NotFound(f"study {row.name!r} has no completed trial yet")
        return _best_model(best)


def stop_study(platform: Platform, caller: Caller, name_or_id: str) -> Study:
    """RUNNING -> STOPPING: the driver cancels its running trials, then it is STOPPED."""
    with platform.db.write() as s:
        row = _get_row(s, caller, name_or_id, for_update=True)
        caller.require_owner_or_admin("study", row.user_id, row.name, "stop")
        if row.state != StudyState.RUNNING.value:
            raise InvalidState(f"study {row.name!r} is {row.state}; only a RUNNING study can be stopped")
        study_states.transition_study(row, StudyState.STOPPING, f"stopped by {caller.user}")
        study = _study_model(s, row, caller.tenant, tenant_store.user_name(s, row.user_id))
    platform.wake()
    return study


def resume_study(platform: Platform, caller: Caller, name_or_id: str) -> Study:
    """STOPPED -> RUNNING: it goes on where it stopped; its stopped trials are not run again."""
    require_isolation(platform, caller, "running studies")
    with platform.db.write() as s:
        row = _get_row(s, caller, name_or_id, for_update=True)
        caller.require_owner_or_admin("study", row.user_id, row.name, "resume")
        if row.state != StudyState.STOPPED.value:
            hint = "; wait until it is STOPPED" if row.state == StudyState.STOPPING.value else ""
            raise InvalidState(f"study {row.name!r} is {row.state}; only a STOPPED study can be resumed{hint}")
        study_states.transition_study(row, StudyState.RUNNING, f"resumed by {caller.user}")
        study = _study_model(s, row, caller.tenant, tenant_store.user_name(s, row.user_id))
    platform.wake()
    return study
