"""The platform on S3 storage (a real SeaweedFS), on SQLite and PostgreSQL: code uploads, jobs that run
them through this host's object cache, model versions registered, downloaded and deleted — and nothing of
the server's S3 credentials in a job."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcloud.checksums import artifact_digest
from dlcloud.executors.local.executor import LocalExecutor
from tests.conftest import Env, build_env, control_running, make_settings, wait_for
from tests.s3server import S3Server, s3_settings_in_env

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
SIG = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []}


@pytest.fixture
def s3_env(request: pytest.FixtureRequest, tmp_path: Path, db_url: str, monkeypatch) -> Iterator[tuple[Env, S3Server]]:
    server, url = s3_settings_in_env(request, monkeypatch)
    settings = make_settings(tmp_path, db_url, storage_url=url, s3_addressing_style="path")
    e = build_env(settings, LocalExecutor())
    assert e.platform.objects.url == url
    with control_running(e):
        yield e, server


def _bucket_keys(server: S3Server, prefix: str) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=server.bucket, Prefix=prefix + "/")
    return sorted(o["Key"][len(prefix) + 1 :] for o in listed.get("Contents", []))


def test_code_jobs_and_models_live_in_the_bucket(s3_env: tuple[Env, S3Server], tmp_path: Path) -> None:
    env, server = s3_env
    prefix = env.platform.objects.url.split("/", 3)[3]
    archive = tmp_path / "code.tar.gz"
    script = b"import os\nprint('hello from s3 code')\nprint(sorted(k for k in os.environ if k.startswith('AWS')))\n"
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("train.py")
        info.size = len(script)
        tf.addfile(info, io.BytesIO(script))
    code = env.admin.code.upload(archive)
    tenant = env.admin.tenants.get("default").id
    key = f"code/{tenant}/{code.id}/code.tar.gz"
    assert _bucket_keys(server, prefix) == [key]
    assert not (env.settings.data_dir / "code").exists()  # nothing of it on the server's disk

    for name in ("first", "second"):  # the second run uses the cached copy
        env.admin.jobs.submit({"name": name, "code": code.id, "command": "python train.py"})
        job = wait_for(lambda n=name: (j := env.admin.jobs.get(n)).state in TERMINAL and j, 60, what=name)
        lines = [line.text for line in env.admin.jobs.logs(name) if line.stream == "stdout"]
        assert job.state == "SUCCEEDED", (job.reason, lines)
        assert lines == ["hello from s3 code", "[]"]  # no AWS_* variable reached the job
    cached = list((env.settings.data_dir / "cache" / "objects").rglob("*"))
    assert [p.name for p in cached if p.is_file() and not p.name.startswith(".")] == [code.sha256]

    model = tmp_path / "src" / "export"
    (model / "variables").mkdir(parents=True)
    (model / "variables" / "data.bin").write_bytes(bytes(range(256)) * 64)
    (model / "predictor.py").write_text("class P: ...\n")
    (model / "assets").mkdir()  # an empty directory comes back too
    v1 = env.admin.models.register("m", "python", artifact=model, signature=SIG)
    assert v1.sha256 == artifact_digest(model).sha256
    version_prefix = f"models/{tenant}/"
    stored = [k for k in _bucket_keys(server, prefix) if k.startswith(version_prefix)]
    assert sorted(k.split("/", 4)[4] for k in stored) == [
        ".dlcloud-manifest.json",
        "export/predictor.py",
        "export/variables/data.bin",
    ]
    assert [k for k in _bucket_keys(server, prefix) if k.startswith("uploads/")] == []  # used and dropped
    got = env.admin.models.download("m", 1, dest=tmp_path / "out")
    assert artifact_digest(got).sha256 == v1.sha256 and (got / "assets").is_dir()

    # damaged in the bucket: the download is refused by its checksum
    data_key = next(k for k in stored if k.endswith("data.bin"))
    server.client().put_object(Bucket=server.bucket, Key=f"{prefix}/{data_key}", Body=b"tampered")
    with pytest.raises(Exception, match="checksum"):
        env.admin.models.download("m", 1, dest=tmp_path / "again")

    env.admin.models.delete("m")
    assert [k for k in _bucket_keys(server, prefix) if k.startswith("models/")] == []


def test_a_signature_is_inferred_from_the_copy_in_the_bucket(s3_env: tuple[Env, S3Server], tmp_path: Path) -> None:
    """Inference runs after the artifact is stored, on the stored tree: with S3 the executor fetches it into a
    scratch directory of its own (verified against the manifest) and removes it afterwards."""
    from tests.serving_models import make_onnx_mlp

    env, server = s3_env
    built = make_onnx_mlp(tmp_path / "onnx", in_features=6, out=3)
    version = env.admin.models.register("inferred", "onnx", artifact=built.path)
    assert version.signature is not None
    [given] = version.signature["inputs"]
    assert (given["name"], given["datatype"], given["shape"]) == ("input", "FP32", [-1, 6])
    assert version.signature["outputs"][0]["shape"] == [-1, 3]
    scratch = env.settings.data_dir / "tmp" / "uploads"  # where the executor fetched the tree to inspect it
    assert scratch.is_dir() and list(scratch.glob("inspect-*")) == []  # the fetched copy is gone
    assert not (env.settings.data_dir / "models").exists()  # the artifact lives in the bucket alone
    prefix = env.platform.objects.url.split("/", 3)[3]
    assert [k for k in _bucket_keys(server, prefix) if k.startswith("uploads/")] == []


def test_jobs_read_datasets_through_this_hosts_cache(s3_env: tuple[Env, S3Server], tmp_path: Path) -> None:
    env, _server = s3_env
    from tests.integration.test_datasets import FILES, READER, _push, _tar_gz

    _push(env, env.admin, "click-log", FILES)
    code = tmp_path / "code.tar.gz"
    code.write_bytes(_tar_gz({"reader.py": READER.encode()}))
    up = env.admin.code.upload(code)
    paths = []
    for name in ("r1", "r2"):
        spec = {"name": name, "code": up.id, "command": "python reader.py", "datasets": ["click-log"]}
        env.admin.jobs.submit(spec)
        job = wait_for(lambda n=name: (j := env.admin.jobs.get(n)).state in TERMINAL and j, 60, what=name)
        lines = [line.text for line in env.admin.jobs.logs(name) if line.stream == "stdout"]
        assert job.state == "SUCCEEDED", (job.reason, lines)
        seen = json.loads(lines[0])
        assert seen["files"] == sorted(FILES) and lines[1].startswith("read-only")
        paths.append(seen["datasets"]["click-log"])
    # one copy in this host's cache, shared by both jobs (in a sandbox bound at a neutral path), no pin left
    cache = env.settings.data_dir / "cache" / "datasets"
    assert len([p for p in (cache / "trees").iterdir() if p.is_dir()]) == 1
    sandboxed = env.control is not None and env.control.executor.isolation()[0]
    assert paths[0] == paths[1] and (
        paths[0] == "/datasets/click-log" if sandboxed else Path(paths[0]).is_relative_to(cache)
    )
    assert env.control is not None and env.control.executor.data_cache.holders() == set()


def test_an_unreachable_store_is_a_503_that_names_nothing_of_it(tmp_path: Path, db_url: str) -> None:
    settings = make_settings(
        tmp_path, db_url, storage_url="s3://hidden-bucket/secret-prefix", s3_endpoint_url="http://127.0.0.1:1",
        s3_access_key_id="AKIDEXAMPLE", s3_secret_access_key="wJalrXUtnFEMI-not-a-real-secret", s3_region="us-east-1",
    )  # fmt: skip
    env = build_env(settings)
    with env.http:
        archive = tmp_path / "code.tar.gz"
        with tarfile.open(archive, "w:gz") as tf:
            tf.addfile(tarfile.TarInfo("train.py"), io.BytesIO(b""))
        with pytest.raises(Exception) as err:
            env.admin.code.upload(archive)
    error = err.value
    assert getattr(error, "code", None) == "storage_unavailable"
    shown = f"{error} {getattr(error, 'details', {})}"
    for hidden in ("127.0.0.1", "hidden-bucket", "secret-prefix", "wJalrXUtnFEMI", "AKIDEXAMPLE"):
        assert hidden not in shown
    env.platform.db.dispose()


def test_outputs_and_logs_are_kept_in_the_bucket_and_outlive_the_host(
    s3_env: tuple[Env, S3Server], tmp_path: Path
) -> None:
    """When an attempt ends its outputs and logs go to the store: registering a model and reading the logs
    work after the host lost every file of the job; deleting the job removes them from the bucket."""
    env, server = s3_env
    prefix = env.platform.objects.url.split("/", 3)[3]
    c = env.admin
    command = 'echo "line $DLCLOUD_ATTEMPT"; printf weights > "$DLCLOUD_OUTPUT_DIR/model.onnx"'
    job = c.jobs.submit({"name": "keeps", "command": command})
    done = wait_for(lambda: (j := c.jobs.get("keeps")).state in TERMINAL and j, 60, what="the job to end")
    assert done.state == "SUCCEEDED", done
    tenant_id = c.tenants.get("default").id
    kept = _bucket_keys(server, f"{prefix}/jobs/{tenant_id}/{job.id}")
    assert "outputs/attempt-1/model.onnx" in kept and "logs/attempt-1/main/output.log" in kept, kept

    # the host loses the job's directories (a disk replaced, the job run elsewhere)
    import shutil

    shutil.rmtree(env.settings.runs_dir / tenant_id / job.id)
    assert [line.text for line in c.jobs.logs("keeps") if line.stream == "stdout"] == ["line 1"]
    v = c.models.register("kept", "onnx", from_job="keeps", path="model.onnx", signature=SIG)
    assert v.source_job == "keeps"

    c.jobs.delete("keeps")
    assert _bucket_keys(server, f"{prefix}/jobs/{tenant_id}/{job.id}") == []
