"""A job row keeps the user's spec as given and what the platform decided at submit (datasets resolved to
versions, the id ``checkpoint_from`` resolved to, a trial's DLCLOUD_* variables) beside it, in
``jobs.platform_state``, read back typed (``JobPlatformState``) through the ORM and through the Core rows
``describe`` reads; reads show it as ``resolved``, the datasets without where they are stored. On SQLite and
PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from dlcloud.schemas.jobs import JobPlatformState, JobSpec, ResolvedDataset
from dlcloud.services import jobs
from dlcloud.store import jobs as job_store
from dlcloud.store.rows import JobRow
from tests.conftest import Env
from tests.integration.test_checkpoint_from import _admin_caller

PLATFORM_KEYS = {"resolved_datasets", "checkpoint_from_id"}


def _stored(env: Env, name: str) -> tuple[dict, JobPlatformState, str]:
    """The job's stored spec, its platform state as the ORM reads it, and its tenant's id."""
    with env.platform.db.read() as s:
        row = s.scalars(select(JobRow).where(JobRow.name == name)).one()
        return row.spec, row.platform_state, row.tenant_id


def _ran(env: Env, name: str) -> str:
    """Make job ``name`` one that ended after an attempt (it has checkpoints to start from); its id."""
    with env.platform.db.write() as s:
        row = s.scalars(select(JobRow).where(JobRow.name == name)).one()
        row.state, row.attempt = "CANCELLED", 1
        return row.id


def test_the_spec_stored_is_the_users_and_the_platforms_state_reads_back_typed(env: Env, tmp_path: Path) -> None:
    c = env.admin
    data = tmp_path / "train.csv"
    data.write_text("x,y\n1,0\n")
    c.datasets.push("clicks", path=data)
    c.jobs.submit({"name": "source", "command": "true"})
    source_id = _ran(env, "source")
    given = {
        "name": "reader",
        "command": "true",
        "env": {"PLAIN": "1"},
        "datasets": ["clicks"],
        "checkpoint_from": "source",
    }
    c.jobs.submit(given)

    spec, state, tenant_id = _stored(env, "reader")
    assert spec == {**JobSpec.model_validate(given).model_dump(mode="json"), "register_model": None}
    assert isinstance(state, JobPlatformState) and state.checkpoint_from_id == source_id and state.env == {}
    [d] = state.datasets
    assert isinstance(d, ResolvedDataset) and (d.ref, d.name, d.version) == ("clicks", "clicks", 1)
    assert d.storage_key.startswith("datasets/") and d.version_id
    with env.platform.db.read_connection() as conn:  # the Core row describe reads: typed alike
        core = job_store.describe_row(conn, tenant_id, "reader")
    assert core is not None and core.platform_state == state

    shown = c.jobs.get("reader")
    assert not PLATFORM_KEYS & set(shown.spec) and shown.spec["env"] == {"PLAIN": "1"}
    assert shown.resolved.checkpoint_from_id == source_id and shown.resolved.env == {}
    [seen] = shown.resolved.datasets
    assert seen.model_dump(mode="json") == {"ref": "clicks", "name": "clicks", "owner": "default", "version": 1} | {
        "sha256": d.sha256,
        "size_bytes": d.size_bytes,
    }


def test_a_trials_platform_variables_stay_out_of_its_spec(env: Env) -> None:
    """The study driver's path: ``create_job_row`` with the variables it gives a trial's job."""
    caller = _admin_caller(env)
    trial_env = {"DLCLOUD_HPARAMS": '{"lr": 0.1}', "DLCLOUD_STUDY": "s", "DLCLOUD_TRIAL": "3"}
    with env.platform.db.write() as s:
        spec = JobSpec(name="s-3", command="true", env={"MINE": "x"}, hparams={"lr": 0.1})
        jobs.create_job_row(s, env.platform, caller, spec, trial_env=trial_env)
    spec, state, _ = _stored(env, "s-3")
    assert spec["env"] == {"MINE": "x"} and not PLATFORM_KEYS & set(spec)
    assert state == JobPlatformState(env=trial_env)
    shown = env.admin.jobs.get("s-3")
    assert shown.spec["env"] == {"MINE": "x"}
    assert shown.resolved.model_dump(mode="json") == {
        "datasets": [],
        "checkpoint_from_id": None,
        "env": trial_env,
        "register_model": None,
    }
    with env.platform.db.read() as s:  # what its processes get: its own env and the trial's variables
        row = s.scalars(select(JobRow).where(JobRow.name == "s-3")).one()
        assert jobs.job_env(env.platform, row) == {"MINE": "x", **trial_env}
