"""The first phase of ``jobs submit``: a job spec checked and derived on its own, before the database is read.

``plan`` turns a ``JobSpec`` into a ``JobDraft``: every check that needs nothing but the spec and the platform's
settings, and everything the job row derives from the spec alone (the stored spec, the shell command, the replica
groups, the gang's totals, the planned run time, the datasets it reads). ``services/jobs.py`` then reads what the
database says, checks the draft against it (``job_checks``) and writes the row from the draft.

Invariants:
- ``plan`` reads no database and writes nothing: a spec it refuses has cost no query.
- Its checks run in one fixed order, the order in which a submit reports what is wrong: the job's name, the
  template, the published ports, ``register_model`` (its format, its signature, its name), ``env`` given twice.
  Each refusal is InvalidSpec and says what is allowed.
- A draft is what the row keeps of the spec: the later phases take its fields and do not derive them again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dlcloud.errors import InvalidSpec
from dlcloud.schemas.jobs import JobSpec, ModelTarget
from dlcloud.schemas.models import FORMATS, format_from_name
from dlcloud.services import recipes
from dlcloud.services.model_signatures import check_signature
from dlcloud.services.platform import Platform
from dlcloud.store.ids import looks_like_id, reserved_name_message
from dlcloud.templates import catalog

# the names of a study's trial jobs: <study>-<number>, a resumed one <study>-<number>-r<j> (services/studies.py)
TRIAL_JOB_NAME = re.compile(r"^(?P<study>.+)-(?P<number>[0-9]+)(?:-r[0-9]+)?$")


@dataclass(frozen=True)
class JobDraft:
    """A job spec that passed every check of its own, with what its row derives from it."""

    spec: JobSpec
    stored: dict[str, Any]  # the spec as the row keeps it: the user's, its secrets encrypted
    register_model: ModelTarget | None  # the spec's register_model completed (JobPlatformState.register_model)
    dataset_refs: tuple[str, ...]  # the datasets it reads, a template's data among them
    command: str  # the main command as one shell string
    replica_groups: list[dict[str, Any]] | None  # per group its count and resources; None for one process
    gpus: int  # the whole gang's, as quotas and the scheduler count them
    cpus: float
    memory: int
    max_run_time_seconds: float | None  # what the scheduler plans with
    trial_study: str | None  # the study whose trials' names this name has the form of, if any


def plan(platform: Platform, spec: JobSpec) -> JobDraft:
    """Check ``spec`` on its own and derive its row's fields from it (InvalidSpec for the first thing wrong)."""
    if looks_like_id(spec.name):
        raise InvalidSpec(reserved_name_message("job", spec.name))
    _check_template(spec)
    _check_publish(platform, spec)
    register = _register_model_spec(spec)
    if register is not None and looks_like_id(register.name):
        raise InvalidSpec(reserved_name_message("model", register.name))
    refs = list(spec.datasets)
    template_data = spec.template.data if spec.template is not None else None
    if template_data is not None and catalog.dataset_name(template_data) not in {catalog.dataset_name(r) for r in refs}:
        refs.append(template_data)
    both = sorted(set(spec.env) & set(spec.secret_env))
    if both:
        raise InvalidSpec(f"{', '.join(both)} given in both env and secret_env; give each variable in one of them")
    stored = spec.model_dump(mode="json")
    stored["secret_env"] = {k: platform.box.encrypt(v).decode() for k, v in spec.secret_env.items()}
    groups = spec.groups()
    replica_groups = None
    if spec.process_count() > 1:
        replica_groups = recipes.replica_groups(stored, groups, {g: spec.group_resources(g) for g in groups})
    gpus, cpus, memory = spec.total_resources()
    trial_name = TRIAL_JOB_NAME.match(spec.name)
    return JobDraft(
        spec=spec,
        stored=stored,
        register_model=register,
        dataset_refs=tuple(refs),
        command=recipes.shell_command(spec),
        replica_groups=replica_groups,
        gpus=gpus,
        cpus=cpus,
        memory=memory,
        # the declaration, else the enforced timeout: the smaller of both
        max_run_time_seconds=min((t for t in (spec.max_run_time, spec.timeout) if t is not None), default=None),
        trial_study=trial_name.group("study") if trial_name is not None else None,
    )


def _check_template(spec: JobSpec) -> None:
    """A template job's template and hyperparameters, against the catalog (400 naming what is allowed)."""
    if spec.template is None:
        return
    try:
        catalog.get_template(spec.template.name).resolve(spec.hparams)
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None


def _check_publish(platform: Platform, spec: JobSpec) -> None:
    """A job may not publish the port at which it reaches the API on its own loopback (that would put the API,
    through the job, on ``job_publish_address``)."""
    api = urlsplit(platform.settings.resolved_job_api_url)
    if api.port in spec.publish:
        raise InvalidSpec(
            f"publish names port {api.port}, where jobs reach the platform's API inside their network; "
            "serve on another port"
        )


def _register_model_spec(spec: JobSpec) -> ModelTarget | None:
    """``register_model`` completed: path and format filled in (a template's export; else the path's suffix),
    the signature checked."""
    r = spec.register_model
    if r is None:
        return None
    path = r.path or catalog.EXPORT_DIR
    fmt = r.format.value if r.format is not None else None
    if fmt is None:
        fmt = catalog.EXPORT_FORMAT if spec.template is not None and r.path is None else format_from_name(path)
    if fmt is None:
        raise InvalidSpec(
            f"register_model.format is needed: the format of {path!r} cannot be told from its name; "
            f"give one of {', '.join(FORMATS)}"
        )
    signature = check_signature(r.signature) if r.signature is not None else None
    return ModelTarget(name=r.name, path=path, format=fmt, signature=signature, description=r.description)
