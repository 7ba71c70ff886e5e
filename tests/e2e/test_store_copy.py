"""Moving an installation from its data dir to S3 (docs/storage.md, "Migration"): a real ``dlcloud up`` on the
default store gets code, a dataset, a model and a job's outputs and logs; ``python -m dlcloud.storage.copy``
copies its store to a real S3 server (SeaweedFS); with the data dir's copies removed, ``dlcloud up
--storage-url s3://...`` on the same data dir serves all of it from the bucket: the dataset and the model download
as they were pushed, a model registers from the old job's outputs, the job's archived log reads back."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, free_port
from tests.s3server import S3Server, s3_server_or_skip

pytestmark = pytest.mark.e2e

WRITE = r"""
import os, pathlib, joblib
from sklearn.linear_model import LogisticRegression
out = pathlib.Path(os.environ["DLCLOUD_OUTPUT_DIR"])
joblib.dump(LogisticRegression().fit([[0.0], [1.0], [2.0], [3.0]], [0, 0, 1, 1]), out / "model.joblib")
(out / "notes").mkdir()
(out / "notes" / "run.txt").write_text("written by the job\n")
print("the job ran")
"""


def _digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _copy(server: Server, url: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "dlcloud.storage.copy", "--data-dir", str(server.data_dir), "--to", url],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, (res.stdout, res.stderr)
    return res


def _bucket_keys(s3: S3Server, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix + "/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def _aws(s3: S3Server) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": s3.region,
        "DLCLOUD_S3_ADDRESSING_STYLE": "path",
    }


def test_a_data_dir_copied_to_s3_serves_everything_from_the_bucket(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    s3 = s3_server_or_skip(request)
    server = Server(tmp_path, free_port(), extra_env=_aws(s3))
    (tmp_path / "clicks").mkdir()
    (tmp_path / "clicks" / "train.csv").write_text("x,y\n1,0\n2,1\n")
    (tmp_path / "clicks" / "more").mkdir()
    (tmp_path / "clicks" / "more" / "b.bin").write_bytes(bytes(range(256)) * 99)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "write.py").write_text(WRITE)
    server.start()
    try:
        server.cli("datasets", "create", "clicks", "--from", str(tmp_path / "clicks"))
        server.cli("jobs", "submit", "--name", "w", "--code", str(tmp_path / "code"), "--command", "python write.py",
                   "--follow")  # fmt: skip
        server.cli("models", "register", "first", "--from-job", "w", "--path", "model.joblib")
    finally:
        server.stop()

    (output,) = server.data_dir.glob("jobs/*/*/outputs/attempt-1/model.joblib")
    job_model = hashlib.sha256(output.read_bytes()).hexdigest()
    prefix = f"copy-{secrets.token_hex(6)}"
    url = f"s3://{s3.bucket}/{prefix}"
    first = _copy(server, url)
    assert "copied" in first.stdout and " 0 already there" in first.stdout, first.stdout
    again = _copy(server, url)  # a second run finds everything there
    assert again.stdout.startswith("copied 0 objects and 0 trees (0 bytes)"), again.stdout
    keys = [k[len(prefix) + 1 :] for k in _bucket_keys(s3, prefix)]
    for part in (
        "code/",
        "datasets/",
        "models/",
        "/outputs/attempt-1/notes/run.txt",
        "/logs/attempt-1/main/output.log",
    ):
        assert any(part in "/" + k for k in keys), (part, keys)
    assert not [k for k in keys if ".dlcloud-sha256-" in k]  # the local store's bookkeeping is not copied
    for top in ("code", "datasets", "jobs", "models"):  # the bytes are the bucket's from now on
        shutil.rmtree(server.data_dir / top)

    moved = Server(tmp_path, free_port(), ["--storage-url", url], extra_env=_aws(s3))
    moved.start()
    try:
        got = Path(moved.cli("datasets", "download", "clicks", "--dest", str(tmp_path / "got")).stdout.strip())
        assert _digests(got) == _digests(tmp_path / "clicks")
        registered = moved.cli_json("models", "register", "second", "--from-job", "w", "--path", "model.joblib")
        first_version = moved.cli_json("models", "describe", "first", "--version", "1")
        assert isinstance(registered, dict) and isinstance(first_version, dict)
        assert registered["sha256"] == first_version["sha256"]  # the job's outputs, read from the bucket
        artifact = Path(moved.cli("models", "download", "first", "--dest", str(tmp_path / "m")).stdout.strip())
        assert hashlib.sha256(artifact.read_bytes()).hexdigest() == job_model
        logs = moved.cli("jobs", "logs", "w")
        assert "the job ran" in logs.stdout + logs.stderr
        listed = json.loads(moved.cli("jobs", "list", "-o", "json").stdout)
        assert [j["name"] for j in listed] == ["w"]
    finally:
        moved.stop()
