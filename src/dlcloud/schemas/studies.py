"""Hyperparameter studies (docs/tuning.md): the study file, and what reads show of a study and its trials."""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dlcloud.schemas.common import Name, Request, Response
from dlcloud.schemas.jobs import TemplateSpec
from dlcloud.schemas.metrics import MetricName

ParamName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]
Scalar = str | int | float | bool
MAX_STUDY_NAME = 56  # trial jobs are named <study>-<number>, a job name is at most 63
# a pausing ASHA study's resumed trials run as <study>-<number>-r<rung> (rung < 100)
MAX_PAUSING_STUDY_NAME = MAX_STUDY_NAME - 4
MAX_GRID = 10_000


class Algorithm(StrEnum):
    GRID = "grid"
    RANDOM = "random"
    TPE = "tpe"
    ASHA = "asha"


class Direction(StrEnum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


class ParamType(StrEnum):
    UNIFORM = "uniform"
    LOGUNIFORM = "loguniform"
    INT = "int"
    CATEGORICAL = "categorical"


class ParamSpec(Request):
    """One hyperparameter: a range (uniform, loguniform, int with an optional step) or a list (categorical);
    ``when``: sampled only in trials where the named earlier parameters have these values."""

    type: ParamType
    low: float | None = None
    high: float | None = None
    step: Annotated[float, Field(gt=0)] | None = None
    values: Annotated[list[Scalar], Field(min_length=1, max_length=1000)] | None = None
    when: Annotated[dict[ParamName, Scalar], Field(min_length=1, max_length=16)] | None = None

    @model_validator(mode="after")
    def _check(self) -> ParamSpec:
        t = self.type
        if t == ParamType.CATEGORICAL:
            if self.values is None:
                raise ValueError("a categorical parameter needs values: [...]")
            if self.low is not None or self.high is not None or self.step is not None:
                raise ValueError("a categorical parameter takes values, not low/high/step")
            if len({repr(v) for v in self.values}) != len(self.values):
                raise ValueError("the values of a categorical parameter must be distinct")
            return self
        if self.values is not None:
            raise ValueError(f"a {t.value} parameter takes low and high, not values")
        if self.low is None or self.high is None:
            raise ValueError(f"a {t.value} parameter needs low and high")
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low >= self.high:
            raise ValueError(f"low must be < high, got low={self.low:g} high={self.high:g}")
        if t == ParamType.LOGUNIFORM:
            if self.low <= 0:
                raise ValueError(f"a loguniform parameter needs low > 0, got {self.low:g}")
            if self.step is not None:
                raise ValueError("a loguniform parameter takes no step")
        if t == ParamType.INT:
            step = self.step if self.step is not None else 1
            if self.low != int(self.low) or self.high != int(self.high) or step != int(step):
                raise ValueError("an int parameter needs integer low, high and step")
        return self

    def grid_values(self) -> list[Scalar] | None:
        """Every value of a finite parameter (categorical, int); None for a continuous range."""
        if self.type == ParamType.CATEGORICAL:
            return list(self.values or [])
        if self.type == ParamType.INT:
            assert self.low is not None and self.high is not None
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        return None


class Objective(Request):
    """The metric a trial reports with ``dlcloud.report``, its direction, and which step's value counts:
    ``last`` (the last step reported), ``best`` (the best of all steps) or a step number."""

    metric: MetricName
    direction: Direction = Direction.MINIMIZE
    step: Literal["last", "best"] | Annotated[int, Field(ge=0)] = "last"


class Budget(Request):
    """Stop the study after this much wall-clock time running, or this many GPU-hours used by its trials."""

    seconds: Annotated[float, Field(gt=0, le=365 * 86400)] | None = None
    gpu_hours: Annotated[float, Field(gt=0, le=1_000_000)] | None = None

    @model_validator(mode="after")
    def _one(self) -> Budget:
        if self.seconds is None and self.gpu_hours is None:
            raise ValueError("a budget needs seconds or gpu_hours")
        return self


class EarlyStopping(Request):
    """ASHA's rungs: a trial is judged at steps min_resource * reduction_factor^k, up to ``max_resource``.

    ``pause: true`` (the default for a no-code template trial): asynchronous successive halving that pauses. A
    trial trains only to its rung (``DLCLOUD_STOP_AT_STEP``), saves a checkpoint and waits (PAUSED); whenever a
    slot is free the best paused trial of the highest rung that is in its rung's top 1/reduction_factor is
    resumed from its checkpoint as a new job to the next rung, else a new trial starts. ``max_resource`` is the
    last step (default for a template trial: its ``epochs``). Its trial code must honour the budget and resume
    from ``DLCLOUD_CHECKPOINT_DIR`` (the templates do; a trial that runs past its budget is stopped there).

    ``pause: false`` (the default otherwise): Optuna's pruner judges a running trial at each rung against the
    trials that reached it before and stops it when it falls behind; ``hyperband`` runs several brackets of that
    (then ``max_resource`` defaults to the longest a trial reported)."""

    min_resource: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    reduction_factor: Annotated[int, Field(ge=2, le=100)] = 3
    hyperband: bool = False
    max_resource: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    pause: bool | None = None  # None: true for a no-code template trial, false otherwise

    @model_validator(mode="after")
    def _check(self) -> EarlyStopping:
        if self.hyperband and self.pause:
            raise ValueError("hyperband runs with pause: false (Optuna's pruner); leave one of them out")
        if self.max_resource is not None and self.max_resource < self.min_resource:
            raise ValueError(f"max_resource ({self.max_resource}) must be at least min_resource ({self.min_resource})")
        return self


TEMPLATE_TRIAL_FIELDS = tuple(f for f in TemplateSpec.model_fields if f != "name")


def template_trial(trial: dict[str, Any]) -> dict[str, Any]:
    """A study's ``trial`` as a job spec: the short form of a no-code template trial (``template: mlp`` with
    ``data``, ``label``, ... beside it) becomes the job spec's ``template`` section (``{name: mlp, data: ...}``);
    any other trial is returned as it is. The CLI and the server both read a trial through this."""
    name = trial.get("template")
    if not isinstance(name, str):
        return trial
    out = {k: v for k, v in trial.items() if k not in TEMPLATE_TRIAL_FIELDS}
    out["template"] = {"name": name, **{k: trial[k] for k in TEMPLATE_TRIAL_FIELDS if k in trial}}
    return out


class StudySpec(Request):
    """A study file (``dlcloud tune submit -f study.yaml``)."""

    name: Annotated[Name, Field(max_length=MAX_STUDY_NAME)]
    algorithm: Algorithm
    objective: Objective
    max_trials: Annotated[int, Field(ge=1, le=10_000)]
    parallel_trials: Annotated[int, Field(ge=1, le=64)] = 1
    budget: Budget | None = None
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None  # None: one is drawn at submit and kept
    args: bool = False  # also pass each parameter as --name=value to the trial's command (or module args)
    early_stopping: EarlyStopping | None = None  # asha only
    # a job spec without a name; a no-code template's short form (template: mlp, data: ..., label: ...) is
    # made its template section by ``template_trial``
    trial: Annotated[dict[str, Any], Field(min_length=1)]
    search_space: Annotated[dict[ParamName, ParamSpec], Field(min_length=1, max_length=64)]

    @field_validator("trial")
    @classmethod
    def _template_section(cls, v: dict[str, Any]) -> dict[str, Any]:
        return template_trial(v)

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        names = list(self.search_space)
        for i, (name, p) in enumerate(self.search_space.items()):
            for ref in p.when or {}:
                if ref not in names[:i]:
                    raise ValueError(
                        f"search_space.{name}.when names {ref!r}, which is not a parameter listed before {name!r}"
                    )
        if self.early_stopping is not None and self.algorithm != Algorithm.ASHA:
            raise ValueError("early_stopping is for algorithm: asha only")
        if self.pauses():
            es = self.early_stopping or EarlyStopping()
            if es.max_resource is None and not self.template_trial():
                raise ValueError(
                    "early_stopping.pause needs max_resource (the last step a trial trains to) unless the trial is "
                    "a no-code template (then it is the trial's epochs)"
                )
            if len(self.name) > MAX_PAUSING_STUDY_NAME:
                raise ValueError(
                    f"a pausing ASHA study's name is at most {MAX_PAUSING_STUDY_NAME} characters (its resumed "
                    f"trials run as <study>-<number>-r<rung>); {self.name!r} has {len(self.name)}"
                )
        if self.algorithm == Algorithm.GRID:
            size = 1
            for name, p in self.search_space.items():
                if p.when:
                    raise ValueError(f"search_space.{name}: algorithm grid takes no conditional parameters (when:)")
                values = p.grid_values()
                if values is None:
                    raise ValueError(
                        f"search_space.{name} is {p.type.value}: algorithm grid needs categorical or int parameters"
                    )
                size *= len(values)
            if size > MAX_GRID:
                raise ValueError(f"the grid has {size} points; at most {MAX_GRID}")
        return self

    def template_trial(self) -> bool:
        return isinstance(self.trial.get("template"), dict)

    def pauses(self) -> bool:
        """Whether its trials pause at ASHA's rungs (EarlyStopping.pause, its default decided here)."""
        if self.algorithm != Algorithm.ASHA:
            return False
        es = self.early_stopping or EarlyStopping()
        return es.pause if es.pause is not None else (self.template_trial() and not es.hyperband)

    def grid_size(self) -> int | None:
        """How many configurations a grid has; None for other algorithms."""
        if self.algorithm != Algorithm.GRID:
            return None
        return math.prod(len(p.grid_values() or []) for p in self.search_space.values())


class StudyState(StrEnum):
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # `stop` asked: its running trials are being cancelled
    STOPPED = "STOPPED"  # `resume` continues it
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class TrialState(StrEnum):
    RUNNING = "RUNNING"  # its job is queued or running
    PRUNING = "PRUNING"  # early stopping judged it: its job is being cancelled
    PAUSING = "PAUSING"  # a pausing ASHA trial ran past its rung: its job is being stopped there
    PAUSED = "PAUSED"  # a pausing ASHA trial at its rung, its checkpoint saved: resumed if it is promoted
    STOPPING = "STOPPING"  # the study stops (stop, budget): its job is being cancelled
    COMPLETED = "COMPLETED"
    PRUNED = "PRUNED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    DUPLICATE = "DUPLICATE"  # the sampler proposed a configuration already run: not run again, no job


# a trial with a job that has not ended (a PAUSED trial has none: it takes no slot of parallel_trials)
ALIVE_TRIAL_STATES = frozenset({TrialState.RUNNING, TrialState.PRUNING, TrialState.PAUSING, TrialState.STOPPING})


class Trial(Response):
    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None
    job: str | None  # the trial job's name (a pausing ASHA trial's last one); None for a duplicate
    jobs: list[str]  # every job it ran, in order: more than one for a pausing ASHA trial that was resumed
    reason: str
    duplicate_of: int | None
    last_step: int | None  # the last step of the objective metric it reported
    budget: int | None  # a pausing ASHA trial: the step its last job trains to (its rung)
    created_at: datetime
    finished_at: datetime | None


class BestTrial(Response):
    number: int
    value: float
    params: dict[str, Any]
    job: str | None


class TrialCounts(Response):
    running: int = 0
    paused: int = 0
    completed: int = 0
    pruned: int = 0
    failed: int = 0
    stopped: int = 0
    duplicate: int = 0


class Study(Response):
    id: str
    name: str
    tenant: str
    user: str
    state: StudyState
    reason: str
    algorithm: Algorithm
    objective: dict[str, Any]
    max_trials: int
    parallel_trials: int
    seed: int
    trials_started: int  # trials that got a job (duplicates are not)
    trials: TrialCounts
    best: BestTrial | None
    elapsed_seconds: float  # time spent RUNNING (a time budget counts it)
    gpu_hours: float  # used by its trials' attempts so far (a GPU-hour budget counts it)
    created_at: datetime
    finished_at: datetime | None


class StudyPlatformState(BaseModel):
    """What the platform decided for a study at submit, kept beside the study file (``studies.platform_state``),
    never inside it: the spec a study row keeps is the file as submitted, and its trials run on the spec with
    these applied (``services/studies.run_spec``).

    - ``datasets``: ``trial.datasets``, each pinned ``NAME@VERSION`` to the version it named at submit (a label
      or ``latest`` may move while the study runs; its trials all read the same data); None: the trial names
      none.
    - ``template_data``: ``trial.template.data`` pinned the same way; None: no template trial.
    - ``pause``: ``early_stopping.pause`` as decided for an ASHA study (its default depends on the trial), so a
      later default cannot change a running study; None for other algorithms.

    The seed the platform draws when the file gives none is the ``seed`` column (and the read's ``seed``).
    """

    model_config = ConfigDict(frozen=True)

    datasets: tuple[str, ...] | None = None
    template_data: str | None = None
    pause: bool | None = None


class StudyDetail(Study):
    spec: dict[str, Any]  # the study file as submitted (secret_env values masked)
    resolved: StudyPlatformState = StudyPlatformState()  # the platform's decisions at submit: pinned datasets, pause
