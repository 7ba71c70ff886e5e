"""The Alembic migrations produce exactly the schema the ORM models describe, on both databases, and carry
the data of older versions over."""

from __future__ import annotations

import io
import os
import tarfile
from datetime import UTC, datetime

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, select
from sqlalchemy.pool import NullPool

from dlcloud.store.rows import Base


def test_migrations_match_models(db_url):
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == []


def _alembic(url: str, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    from dlcloud.store.db import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("postgresql://", "postgresql+psycopg://", 1).replace("%", "%%"))
    getattr(command, action)(cfg, revision)


def test_0008_names_the_files_an_older_data_dir_already_has(env, db_url, tmp_path):
    """Rows of 0007 named host paths; 0008 gives them the keys under which the data dir's own files are."""
    from sqlalchemy import text

    from dlcloud.store.rows import CodeRow, ModelVersionRow

    archive = tmp_path / "code.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("train.py")
        tf.addfile(info, io.BytesIO(b""))
    code = env.admin.code.upload(archive)
    model_file = tmp_path / "src" / "model.onnx"
    model_file.parent.mkdir()
    model_file.write_bytes(b"weights" * 100)
    sig = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}], "outputs": []}
    env.admin.models.register("m", "onnx", artifact=model_file, signature=sig)
    with env.platform.db.read() as s:
        code_key = s.get(CodeRow, code.id).storage_key
        model_key = s.scalars(select(ModelVersionRow.artifact_key)).one()
    env.platform.db.dispose()

    _alembic(db_url, "downgrade", "0007")
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    with engine.begin() as conn:  # as 0007 wrote them: absolute paths in the data dir
        data = str(env.settings.data_dir)
        conn.execute(text("UPDATE code_uploads SET path = :p"), {"p": f"{data}/{code_key}"})
        conn.execute(text("UPDATE model_versions SET artifact_path = :p"), {"p": f"{data}/{model_key}/model.onnx"})
    engine.dispose()
    _alembic(db_url, "upgrade", "head")

    with env.platform.db.read() as s:
        tenant_id = env.admin.tenants.get("default").id
        assert s.get(CodeRow, code.id).storage_key == code_key == f"code/{tenant_id}/{code.id}/code.tar.gz"
        assert s.scalars(select(ModelVersionRow.artifact_key)).one() == model_key
    assert env.platform.objects.head(code_key).size == code.size
    got = env.admin.models.download("m", 1, dest=tmp_path / "out")
    assert got.read_bytes() == model_file.read_bytes()


def test_0014_keeps_optunas_pruner_for_asha_studies_submitted_before_pausing(env, db_url):
    """Pausing became the default for template trials in 0014; a study submitted before keeps running as it was."""
    from dlcloud.schemas.studies import StudyPlatformState
    from dlcloud.store.rows import StudyRow
    from tests.integration.test_studies import RECORDED

    base = {**RECORDED, "algorithm": "asha", "objective": {"metric": "m"}}
    env.admin.studies.submit({**base, "name": "older"})
    env.admin.studies.submit({**base, "name": "pausing", "early_stopping": {"pause": True, "max_resource": 9}})
    env.admin.studies.submit(
        {**base, "name": "grid", "algorithm": "grid", "search_space": {"x": {"type": "int", "low": 0, "high": 1}}}
    )
    with env.platform.db.write() as s:  # as an older server stored it: no pause, perhaps no early_stopping
        older = s.scalars(select(StudyRow).where(StudyRow.name == "older")).one()
        assert older.platform_state.pause is False and older.spec["early_stopping"] is None  # decided at submit
        older.platform_state = StudyPlatformState()
    env.platform.db.dispose()

    _alembic(db_url, "downgrade", "0013")
    _alembic(db_url, "upgrade", "head")

    with env.platform.db.read() as s:
        specs = {r.name: r.spec for r in s.scalars(select(StudyRow))}
    assert specs["older"]["early_stopping"] == {"pause": False}
    assert specs["pausing"]["early_stopping"]["pause"] is True
    assert specs["grid"].get("early_stopping") is None


def test_0015_keeps_the_wait_reasons_of_queued_jobs_and_0014_gets_them_back(env, db_url):
    """0015 moves the wait reasons and estimated starts of queued jobs from their rows to shared rows, one per
    tenant and text; going back to 0014 puts them in the jobs' rows again."""

    from sqlalchemy import text

    from tests.integration.test_quotas import enqueue

    enqueue(env, "default", "admin", 3, gpus=0)
    env.platform.db.dispose()
    _alembic(db_url, "downgrade", "0014")
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    start = datetime(2027, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
    with engine.begin() as conn:  # as 0014 wrote them
        for name, reason in (("bulk-0", "waiting for capacity"), ("bulk-1", "waiting for capacity")):
            conn.execute(
                text("UPDATE jobs SET wait_reason = :r, estimated_start = :s WHERE name = :n"),
                {
                    "r": reason,
                    "s": start if db_url.startswith("postgresql") else "2027-01-02 03:04:05.600000",
                    "n": name,
                },
            )
    _alembic(db_url, "upgrade", "head")

    for name in ("bulk-0", "bulk-1"):
        job = env.admin.jobs.get(name)
        want = ("waiting for capacity", datetime(2027, 1, 2, 3, 4, 5, 600000, tzinfo=UTC))
        assert (job.wait_reason, job.estimated_start) == want
    assert env.admin.jobs.get("bulk-2").wait_reason == "waiting behind 2 earlier job(s) in the queue"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM wait_reasons")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM job_waits")).scalar() == 2
    env.platform.db.dispose()

    _alembic(db_url, "downgrade", "0014")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT name, wait_reason FROM jobs ORDER BY name")).all()
    assert [tuple(r) for r in rows] == [
        ("bulk-0", "waiting for capacity"),
        ("bulk-1", "waiting for capacity"),
        ("bulk-2", None),
    ]
    _alembic(db_url, "upgrade", "head")
    engine.dispose()


def test_0024_takes_the_host_out_of_build_specs_and_names_wheels_by_key(env, db_url, tmp_path):
    """Rows of 0023 named this host's interpreter, site directories and wheel files; 0024 keeps the content and
    names each wheel by an upload's storage key; going back fills the host fields in as this host has them."""
    import sys

    from sqlalchemy import text

    from dlcloud.executors.environments import BuildSpec
    from dlcloud.store.rows import CodeRow, EnvironmentBuildRow
    from tests.wheels import make_wheel

    upload = env.admin.code.upload(make_wheel(tmp_path / "dist"), kind="wheel", filename="tinypkg-0.1-py3-none-any.whl")
    with env.platform.db.read() as s:
        key = s.get(CodeRow, upload.id).storage_key
    env.platform.db.dispose()
    _alembic(db_url, "downgrade", "0023")
    old = {
        "python": "3.11",
        "interpreter": "/usr/bin/python3.11",
        "inherit": True,
        "base_prefix": "/opt/venv",
        "base_site": ["/opt/venv/lib/python3.11/site-packages"],
        "base_packages": "ab" * 32,
        "requirements": ["x==1"],
        "wheels": [[upload.sha256, f"{env.settings.data_dir}/{key}"], ["f" * 64, "/gone/y.whl"]],
        "index_url": None,
        "extra_index_urls": [],
        "no_index": True,
    }
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    with engine.begin() as conn:  # as 0023 wrote it
        conn.execute(
            EnvironmentBuildRow.__table__.insert().values(
                spec_hash="e" * 64, state="READY", spec=old, builds=1, created_at=text("CURRENT_TIMESTAMP")
            )
        )
    _alembic(db_url, "upgrade", "head")

    with env.platform.db.read() as s:
        spec = s.get(EnvironmentBuildRow, "e" * 64).spec
    assert spec == {
        **{k: v for k, v in old.items() if k not in ("interpreter", "base_prefix", "base_site")},
        "wheels": [[upload.sha256, key], ["f" * 64, ""]],
    }
    assert str(env.settings.data_dir) not in str(spec)
    assert BuildSpec.from_json(spec).wheels == ((upload.sha256, key), ("f" * 64, ""))
    env.platform.db.dispose()

    _alembic(db_url, "downgrade", "0023")
    with engine.connect() as conn:
        back = conn.execute(select(EnvironmentBuildRow.__table__.c.spec)).scalar_one()
    engine.dispose()
    assert back["interpreter"] and back["base_prefix"] == os.path.abspath(sys.prefix) and back["base_site"]
    assert back["wheels"] == [[upload.sha256, key], ["f" * 64, ""]]
    _alembic(db_url, "upgrade", "head")


def test_0025_moves_the_platforms_keys_out_of_older_specs_and_0024_gets_them_back(env, db_url):
    """Rows of 0024 kept the platform's state inside the user's spec (``resolved_datasets``,
    ``checkpoint_from_id``, a trial's DLCLOUD_* variables merged into ``env``); 0025 moves it into
    ``platform_state``, and going back to 0024 puts it in the spec again."""
    import json

    from sqlalchemy import text

    from dlcloud.schemas.jobs import JobPlatformState
    from dlcloud.store.rows import JobRow

    env.admin.jobs.submit({"name": "plain", "command": "true", "env": {"MINE": "x"}})
    env.admin.jobs.cancel("plain")
    env.admin.jobs.submit({"name": "trial-3", "command": "true", "checkpoint_from": "plain"})  # never ran: no id
    env.platform.db.dispose()
    _alembic(db_url, "downgrade", "0024")

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    with engine.begin() as conn:
        specs = {
            n: json.loads(s) if isinstance(s, str) else s for n, s in conn.execute(text("SELECT name, spec FROM jobs"))
        }
        # what 0025's downgrade wrote is what 0024 wrote at submit
        assert specs["plain"]["resolved_datasets"] == [] and "checkpoint_from_id" not in specs["plain"]
        assert specs["trial-3"]["checkpoint_from_id"] is None
        # an older row as 0024's server stored it: a dataset resolved, the source's id, a trial's variables
        dataset = {"ref": "clicks@prod", "name": "clicks", "owner": "default", "version": 2, "version_id": "dv-1"}
        dataset |= {"storage_key": "datasets/t/d/2", "sha256": "ab" * 32, "size_bytes": 10}
        trial_env = {"DLCLOUD_HPARAMS": '{"lr": 0.1}', "DLCLOUD_STUDY": "trial", "DLCLOUD_TRIAL": "3"}
        older = {**specs["trial-3"], "resolved_datasets": [dataset], "checkpoint_from_id": "j-source"}
        older["env"] = {"MINE": "y", **trial_env}
        conn.execute(text("UPDATE jobs SET spec = :s WHERE name = 'trial-3'"), {"s": json.dumps(older)})
    _alembic(db_url, "upgrade", "head")

    with env.platform.db.read() as s:
        rows = {r.name: (r.spec, r.platform_state) for r in s.scalars(select(JobRow))}
    assert rows["plain"][1] == JobPlatformState()
    assert rows["plain"][0] == {k: v for k, v in specs["plain"].items() if k != "resolved_datasets"}
    spec, state = rows["trial-3"]
    assert "resolved_datasets" not in spec and "checkpoint_from_id" not in spec and spec["env"] == {"MINE": "y"}
    assert state.checkpoint_from_id == "j-source" and state.env == trial_env
    assert [d.model_dump() for d in state.datasets] == [dataset]
    shown = env.admin.jobs.get("trial-3")
    shown_datasets = [d.model_dump(mode="json") for d in shown.resolved.datasets]
    assert shown_datasets == [{k: v for k, v in dataset.items() if k not in ("version_id", "storage_key")}]
    env.platform.db.dispose()

    _alembic(db_url, "downgrade", "0024")
    with engine.connect() as conn:
        back = {
            n: json.loads(s) if isinstance(s, str) else s for n, s in conn.execute(text("SELECT name, spec FROM jobs"))
        }
    assert back["trial-3"] == older and back["plain"] == specs["plain"]
    _alembic(db_url, "upgrade", "head")
    engine.dispose()


def test_0026_moves_the_completed_register_model_into_the_platform_state_and_0025_gets_it_back(env, db_url):
    """0025 kept ``register_model`` completed at submit (path, format decided) in the user's spec; 0026 copies
    it into ``platform_state.register_model``, which registration reads, and going back to 0025 puts the
    completed form in the spec again (a row submitted after 0026 keeps the user's form in its spec)."""
    import json

    from sqlalchemy import text

    from dlcloud.schemas.jobs import ModelTarget
    from dlcloud.store.rows import JobRow

    env.admin.jobs.submit({"name": "plain", "command": "true"})
    env.admin.jobs.submit({"name": "exports", "command": "true", "register_model": {"name": "m", "path": "a.onnx"}})
    completed = {"name": "m", "path": "a.onnx", "format": "onnx", "signature": None, "description": ""}
    with env.platform.db.read() as s:
        rows = {r.name: (r.spec, r.platform_state) for r in s.scalars(select(JobRow))}
    assert rows["exports"][0]["register_model"] == {**completed, "format": None}  # the user's, as given
    assert rows["exports"][1].register_model == ModelTarget(**completed)
    env.platform.db.dispose()
    _alembic(db_url, "downgrade", "0025")

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    with engine.connect() as conn:
        found = conn.execute(text("SELECT name, spec, platform_state FROM jobs")).all()
    older = {
        n: (json.loads(s) if isinstance(s, str) else s, json.loads(p) if isinstance(p, str) else p) for n, s, p in found
    }
    assert older["exports"][0]["register_model"] == completed and "register_model" not in older["exports"][1]
    assert older["plain"][0]["register_model"] is None and "register_model" not in older["plain"][1]
    _alembic(db_url, "upgrade", "head")

    with env.platform.db.read() as s:
        rows = {r.name: (r.spec, r.platform_state) for r in s.scalars(select(JobRow))}
    assert rows["exports"][1].register_model == ModelTarget(**completed)
    assert rows["exports"][0]["register_model"] == completed  # an older row's spec keeps what 0025 stored
    assert rows["plain"][1].register_model is None
    assert env.admin.jobs.get("exports").resolved.register_model == ModelTarget(**completed)
    engine.dispose()


def test_0027_keeps_a_studys_file_as_submitted_and_0026_gets_the_decisions_back_in_it(env, db_url, tmp_path):
    """From 0027 a study row keeps its file as submitted and the platform's decisions at submit (pinned dataset
    versions, ASHA's pause) in ``platform_state``; going back to 0026 writes them (and the drawn seed) into the
    spec, where 0026 kept them, and an older row read at head runs on the same spec as before."""
    import json

    from sqlalchemy import text

    from dlcloud.schemas.studies import StudyPlatformState
    from dlcloud.services.studies import run_spec
    from dlcloud.store.rows import StudyRow
    from tests.integration.test_studies import RECORDED

    data = tmp_path / "clicks.csv"
    data.write_text("x,y\n1,0\n")
    for _ in range(2):
        env.admin.datasets.push("clicks", path=data)
    trial = {"command": "true", "datasets": ["clicks"]}
    env.admin.studies.submit({**RECORDED, "name": "asha", "algorithm": "asha", "trial": trial})
    with env.platform.db.read() as s:
        row = s.scalars(select(StudyRow).where(StudyRow.name == "asha")).one()
        assert row.spec["trial"]["datasets"] == ["clicks"] and row.spec["seed"] is None  # as submitted
        assert row.platform_state == StudyPlatformState(datasets=("clicks@2",), pause=False)
        ran_on, seed = run_spec(row), row.seed
    assert ran_on["trial"]["datasets"] == ["clicks@2"] and ran_on["early_stopping"]["pause"] is False
    env.platform.db.dispose()
    _alembic(db_url, "downgrade", "0026")

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)
    with engine.connect() as conn:
        [raw] = conn.execute(text("SELECT spec FROM studies")).scalars().all()
    older = json.loads(raw) if isinstance(raw, str) else raw
    assert older == {**ran_on, "seed": seed}
    _alembic(db_url, "upgrade", "head")
    engine.dispose()

    with env.platform.db.read() as s:
        row = s.scalars(select(StudyRow)).one()
        assert row.platform_state == StudyPlatformState() and run_spec(row) == older
    detail = env.admin.studies.get("asha")
    assert detail.resolved == StudyPlatformState() and detail.spec["trial"]["datasets"] == ["clicks@2"]
