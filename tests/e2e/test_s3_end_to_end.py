"""A whole job on the S3 backend with the real server and CLI (a real SeaweedFS behind ``dlcloud up
--storage-url s3://...``): a tenant member's code and dataset go to the bucket, the job reads the dataset
through this host's cache (read-only), writes a checkpoint and a model, the model is registered from the
job's output and served by ``dlcloud serve --registry``; another tenant can neither mount the dataset nor
read its cached copy by path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import Server, bucket_keys, dlcloud_serve, s3_storage_server
from tests.e2e.test_cli_datasets import _member
from tests.s3server import s3_server_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TRAIN = r"""
import hashlib, json, os, pathlib, sys

import joblib
import numpy as np
from sklearn.linear_model import LogisticRegression

root = pathlib.Path(os.environ["DLCLOUD_DATASET_CLICKS"])
raw = (root / "train.csv").read_bytes()
if hashlib.sha256(raw).hexdigest() != json.loads(pathlib.Path("expected.json").read_text())["sha256"]:
    sys.exit("the dataset's bytes are not the ones pushed")
data = np.loadtxt(root / "train.csv", delimiter=",")
x, y = data[:, :-1], data[:, -1].astype(int)
pathlib.Path(os.environ["DLCLOUD_CHECKPOINT_DIR"], "epoch-1.json").write_text(json.dumps({"rows": len(x)}))
model = LogisticRegression(max_iter=1000).fit(x, y)
joblib.dump(model, pathlib.Path(os.environ["DLCLOUD_OUTPUT_DIR"]) / "model.joblib")

refused = {}
for what, attempt in {
    "create": lambda: (root / "new.csv").write_text("x"),
    "append": lambda: open(root / "train.csv", "ab").write(b"1,2\n"),
    "truncate": lambda: os.truncate(root / "train.csv", 0),
    "chmod": lambda: os.chmod(root / "train.csv", 0o666),
    "unlink": lambda: os.unlink(root / "train.csv"),
    "rename": lambda: os.rename(root / "train.csv", root / "moved.csv"),
    "mkdir": lambda: os.mkdir(root / "sub"),
}.items():
    try:
        attempt()
        refused[what] = False
    except OSError:
        refused[what] = True
print(json.dumps({
    "dataset": str(root),
    "rows": len(x),
    "refused": refused,
    "server_env": sorted(k for k in os.environ if k.startswith(("AWS_", "DLCLOUD_S3"))),
}))
"""


def _stdout(server: Server, job: str, *profile: str) -> list[str]:
    return server.cli(*profile, "jobs", "logs", job).stdout.splitlines()


def _infer(url: str, x: np.ndarray) -> tuple[str, np.ndarray]:
    body = {"inputs": [{"name": "input", "datatype": "FP64", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    answer = httpx.post(f"{url}/v2/models/clf/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    probabilities = next(o for o in doc["outputs"] if o["name"] == "probabilities")
    return doc["model_version"], np.asarray(probabilities["data"]).reshape(probabilities["shape"])


def _local_store_files(server: Server) -> list[Path]:
    """Files the local backend would have kept in the data dir (none may be there on S3)."""
    return [p for area in ("code", "models", "datasets", "uploads") for p in (server.data_dir / area).rglob("*")]


def test_a_whole_job_on_s3_code_dataset_checkpoint_model_registered_and_served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    s3 = s3_server_or_skip(request)
    server = s3_storage_server(tmp_path, s3)
    server.start()
    try:
        _member(server, "acme", "alice")
        alice = ("--profile", "alice")
        x, y = make_classification(n_samples=200, n_features=8, n_informative=4, n_classes=3, random_state=7)
        data = tmp_path / "clicks"
        data.mkdir()
        np.savetxt(data / "train.csv", np.column_stack([x, y]), delimiter=",", fmt="%.17g")
        csv_sha = hashlib.sha256((data / "train.csv").read_bytes()).hexdigest()
        server.cli(*alice, "datasets", "create", "clicks", "--from", str(data))
        code = tmp_path / "trainer"
        code.mkdir()
        (code / "train.py").write_text(TRAIN)
        (code / "expected.json").write_text(json.dumps({"sha256": csv_sha}))

        server.cli(
            *alice, "jobs", "submit", "--name", "train", "--code", str(code), "--command", "python train.py",
            "--dataset", "clicks", "--follow",
        )  # fmt: skip
        job = server.cli_json(*alice, "jobs", "describe", "train")
        assert isinstance(job, dict)
        assert job["state"] == "SUCCEEDED", (job.get("reason"), _stdout(server, "train", *alice))
        seen = json.loads(next(line for line in _stdout(server, "train", *alice) if line.startswith("{")))
        assert seen["rows"] == 200
        # the job read this host's cached copy, bound at a neutral path, which it could not change in any way
        assert seen["dataset"] == "/datasets/clicks"
        cache = (server.data_dir / "cache" / "datasets").resolve()
        (entry,) = (p for p in (cache / "trees").iterdir() if p.is_dir())
        writes = ("create", "append", "truncate", "chmod", "unlink", "rename", "mkdir")
        assert seen["refused"] == dict.fromkeys(writes, True)
        assert sorted(p.name for p in entry.iterdir()) == ["train.csv"]
        assert hashlib.sha256((entry / "train.csv").read_bytes()).hexdigest() == csv_sha
        assert seen["server_env"] == []  # the server's S3 credentials never reach a job
        # the checkpoint is in the job's directory on this host
        (checkpoint,) = (server.data_dir / "runs").glob(f"*/{job['id']}/checkpoints/epoch-1.json")
        assert json.loads(checkpoint.read_text()) == {"rows": 200}

        server.cli(*alice, "models", "register", "clf", "--from-job", "train", "--path", "model.joblib")
        version = server.cli_json(*alice, "models", "describe", "clf", "--version", "1")
        assert isinstance(version, dict) and version["format"] == "sklearn"

        # code, dataset and model live in the bucket, and nowhere in the data dir
        keys = bucket_keys(s3, server)
        code_keys = [k for k in keys if k.startswith("code/") and k.endswith("/code.tar.gz")]
        # datasets/<tenant>/pushes/<upload>/<push>/<file>
        dataset_keys = [k.split("/", 5)[-1] for k in keys if k.startswith("datasets/")]
        model_keys = [k.split("/", 4)[-1] for k in keys if k.startswith("models/")]
        assert len(code_keys) == 1, keys
        assert sorted(dataset_keys) == [".dlcloud-manifest.json", "train.csv"], keys
        assert sorted(model_keys) == [".dlcloud-manifest.json", "model.joblib"], keys
        assert [k for k in keys if k.startswith("uploads/")] == []  # used uploads are gone
        assert len({k.split("/")[1] for k in keys}) == 1  # all of them alice's tenant's
        assert _local_store_files(server) == []

        reference = LogisticRegression(max_iter=1000).fit(*_loaded(data / "train.csv"))
        args = ["--registry", "clf", "--cache-dir", str(tmp_path / "serve-cache"), "--registry-interval", "0.3"]
        with dlcloud_serve(args, server.env | {"DLCLOUD_PROFILE": "alice"}, tmp_path / "serve.log") as serve:
            served_version, got = _infer(serve.url, x[:5])
        assert served_version == "1"
        np.testing.assert_allclose(got, reference.predict_proba(x[:5]), rtol=1e-6)
    finally:
        server.stop()


def _loaded(csv: Path) -> tuple[np.ndarray, np.ndarray]:
    """The rows as the job reads them."""
    data = np.loadtxt(csv, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


PEEK = r"""
import json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        if os.path.isfile(path):
            out[path] = open(path, "rb").read(64).decode(errors="replace")
        else:
            out[path] = sorted(os.listdir(path))
    except OSError as exc:
        out[path] = type(exc).__name__
print(json.dumps(out))
"""


def test_another_tenant_cannot_mount_a_dataset_or_read_its_cached_copy(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    s3 = s3_server_or_skip(request)
    server = s3_storage_server(tmp_path, s3)
    server.start()
    try:
        _member(server, "acme", "alice")
        _member(server, "beta", "bob")
        data = tmp_path / "private"
        data.mkdir()
        (data / "secret.csv").write_text("acme-private-rows\n")
        server.cli("--profile", "alice", "datasets", "create", "private", "--from", str(data))
        code = tmp_path / "peek"
        code.mkdir()
        (code / "peek.py").write_text(PEEK)
        # alice's job puts the version in this host's cache
        server.cli(
            "--profile", "alice", "jobs", "submit", "--name", "own", "--code", str(code),
            "--command", "python peek.py $DLCLOUD_DATASET_PRIVATE/secret.csv", "--dataset", "private", "--follow",
        )  # fmt: skip
        own = json.loads(next(li for li in _stdout(server, "own", "--profile", "alice") if li.startswith("{")))
        (seen,) = (p for p in own if p.endswith("/secret.csv"))
        assert own[seen].startswith("acme-private-rows")
        assert seen == "/datasets/private/secret.csv"  # where the host keeps it is not the job's business
        cache = server.data_dir / "cache" / "datasets"
        (cached,) = (str(p) for p in cache.glob("trees/*/secret.csv"))  # where it is on this host

        # bob's tenant has no share: the reference is 404 and no job is made
        refused = server.cli(
            "--profile", "bob", "jobs", "submit", "--name", "borrow", "--command", "true",
            "--dataset", "acme/private", check=False,
        )  # fmt: skip
        assert refused.returncode == 1 and "error (dataset_not_found)" in refused.stderr, refused.stderr
        assert server.cli_json("--profile", "bob", "jobs", "list") == []
        # ... and a job of his that knows where the cached copy is on this host cannot read it
        targets = [cached, str(Path(cached).parent), str(cache), str(server.data_dir / "datasets")]
        server.cli(
            "--profile", "bob", "jobs", "submit", "--name", "peek", "--code", str(code),
            "--command", "python peek.py " + " ".join(targets), "--follow",
        )  # fmt: skip
        job = server.cli_json("--profile", "bob", "jobs", "describe", "peek")
        lines = _stdout(server, "peek", "--profile", "bob")
        assert isinstance(job, dict) and job["state"] == "SUCCEEDED", (job.get("reason"), lines)
        seen = json.loads(next(li for li in lines if li.startswith("{")))
        assert set(seen.values()) <= {"FileNotFoundError", "PermissionError"}, seen
        assert "acme-private-rows" not in "\n".join(lines)
    finally:
        server.stop()
