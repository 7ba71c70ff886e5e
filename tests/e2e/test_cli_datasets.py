"""Datasets with the real server and CLI: create from a directory and a file, read, download, labels, versions,
read-only sharing with another tenant, deletion, and refused input that stores nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from dlcloud.checksums import artifact_digest
from tests.e2e.conftest import DLCLOUD, Server

pytestmark = pytest.mark.e2e


def _tree(root: Path) -> Path:
    """Nested directories, a hidden file, an empty file and an empty directory."""
    (root / "train" / "nested" / "deep").mkdir(parents=True)
    (root / "train" / "part-0.csv").write_text("id,clicked\n1,0\n2,1\n")
    (root / "train" / "nested" / "deep" / "blob.bin").write_bytes(os.urandom(70_000))
    (root / ".meta").write_text("source: week 47\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "scratch").mkdir()
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _manifest_sha256(root: Path) -> str:
    """The checksum from its definition (dlcloud/checksums.py), paths relative to ``root``."""
    digest = hashlib.sha256(b"dlcloud-artifact-manifest-v1\n")
    for rel, data in sorted(_files(root).items(), key=lambda kv: kv[0].encode()):
        digest.update(f"{rel}\0{hashlib.sha256(data).hexdigest()}\0{len(data)}\n".encode())
    return digest.hexdigest()


def _stored_files(server: Server, area: str) -> list[Path]:
    return [p for p in (server.data_dir / area).rglob("*") if p.is_file()]


def _fails(server: Server, *args: str, cwd: Path | None = None) -> str:
    """Run a command that must fail cleanly; its stderr."""
    res = server.cli(*args, check=False, cwd=cwd)
    assert res.returncode == 1, (args, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    return res.stderr


def _member(server: Server, tenant: str, user: str) -> None:
    """A tenant with a member and a CLI profile named after the user (``configure`` makes it the current
    profile: the admin's commands name theirs)."""
    server.cli("--profile", "local", "tenants", "create", tenant)
    server.cli("--profile", "local", "users", "create", user, "--tenant", tenant, "--role", "member")
    key = server.cli_json("--profile", "local", "keys", "create", "--user", user, "--tenant", tenant)
    assert isinstance(key, dict)
    creds = ["--endpoint", server.endpoint, "--access-key", key["access_key"], "--secret-key", key["secret_key"]]
    server.cli("configure", "--profile", user, *creds, "--no-check")


def test_create_read_download_label_version_delete(server: Server, tmp_path: Path) -> None:
    src = _tree(tmp_path / "clicks-src")
    expected = _files(src)
    size = sum(len(b) for b in expected.values())

    res = server.cli("datasets", "create", "clicks", "--from", str(src), "--description", "week 47")
    assert f"dataset clicks version 1 created (4 files, {size} bytes)" in res.stderr
    v1 = server.cli_json("datasets", "describe", "clicks@1")
    assert (v1["version"], v1["file_count"], v1["size_bytes"], v1["description"]) == (1, 4, size, "week 47")
    assert v1["sha256"] == _manifest_sha256(src)

    # reads: json and tables
    [listed] = server.cli_json("datasets", "list")
    assert (listed["name"], listed["latest_version"], listed["version_count"], listed["shared"]) == (
        "clicks",
        1,
        1,
        False,
    )
    assert "clicks" in server.cli("datasets", "list").stdout
    files = server.cli_json("datasets", "files", "clicks")
    assert isinstance(files, list)
    assert [f["path"] for f in files] == [".meta", "empty.txt", "train/nested/deep/blob.bin", "train/part-0.csv"]
    assert {f["path"]: (f["size"], f["sha256"]) for f in files} == {
        rel: (len(data), hashlib.sha256(data).hexdigest()) for rel, data in expected.items()
    }
    table = server.cli("datasets", "files", "clicks", "--version", "1").stdout
    assert "train/nested/deep/blob.bin" in table and "PATH" in table.splitlines()[0]
    text = server.cli("datasets", "describe", "clicks").stdout
    assert "week 47" in text and "Versions" in text and v1["sha256"][:12] in text

    # download: the same bytes, the empty directory too, the checksum verified
    dest = tmp_path / "out" / "clicks"
    res = server.cli("datasets", "download", "clicks", "--version", "1", "--dest", str(dest))
    assert res.stdout.strip() == str(dest) and "checksum verified" in res.stderr
    assert _files(dest) == expected and (dest / "scratch").is_dir()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".dlcloud-")]
    # a non-empty destination is refused and left as it was; an empty one is filled; the default is ./NAME
    assert "error (already_exists)" in _fails(server, "datasets", "download", "clicks", "--dest", str(dest))
    assert _files(dest) == expected
    empty = tmp_path / "empty"
    empty.mkdir()
    server.cli("datasets", "download", "clicks@latest", "--dest", str(empty))
    assert _files(empty) == expected
    here = tmp_path / "cwd"
    here.mkdir()
    assert server.cli("datasets", "download", "clicks", cwd=here).stdout.strip() == "clicks"
    assert _files(here / "clicks") == expected

    # a second version from a single file
    single = tmp_path / "clicks.csv"
    single.write_text("id,clicked\n3,1\n")
    v2 = server.cli_json("datasets", "create", "clicks", "--from", str(single))
    assert (v2["version"], v2["file_count"], v2["size_bytes"]) == (2, 1, single.stat().st_size)
    assert v2["sha256"] == artifact_digest(single).sha256  # one file: its name is its path in the dataset
    assert [f["path"] for f in server.cli_json("datasets", "files", "clicks")] == ["clicks.csv"]
    server.cli("datasets", "download", "clicks", "--dest", str(tmp_path / "v2"))
    assert _files(tmp_path / "v2") == {"clicks.csv": single.read_bytes()}

    # labels move; unlabelled, a label names nothing
    assert "production -> version 1" in server.cli("datasets", "label", "clicks", "production", "1").stderr
    assert server.cli_json("datasets", "describe", "clicks")["labels"] == {"production": 1}
    assert server.cli_json("datasets", "label", "clicks", "production", "2") == {"label": "production", "version": 2}
    versions = server.cli_json("datasets", "versions", "clicks")
    assert isinstance(versions, list)
    assert [(v["version"], v["labels"]) for v in versions] == [(1, []), (2, ["production"])]
    assert "production" in server.cli("datasets", "versions", "clicks").stdout
    assert server.cli_json("datasets", "files", "clicks@production")[0]["path"] == "clicks.csv"
    server.cli("datasets", "unlabel", "clicks", "production")
    assert "error (dataset_version_not_found)" in _fails(server, "datasets", "describe", "clicks@production")

    # delete asks first; without a yes nothing happens
    refused = subprocess.run(
        [DLCLOUD, "datasets", "delete", "clicks"],
        env=server.env,
        input="n\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "Delete dataset clicks and all its versions?" in refused.stderr
    assert server.cli_json("datasets", "list")[0]["version_count"] == 2
    server.cli("datasets", "delete", "clicks", "--version", "1", "--yes")
    assert [v["version"] for v in server.cli_json("datasets", "versions", "clicks")] == [2]
    assert "error (dataset_version_not_found)" in _fails(server, "datasets", "files", "clicks@1")
    # a deleted version's number is not given again
    assert server.cli_json("datasets", "create", "clicks", "--from", str(single))["version"] == 3
    server.cli("datasets", "delete", "clicks", "--yes")
    assert server.cli_json("datasets", "list") == []
    assert "error (dataset_not_found)" in _fails(server, "datasets", "describe", "clicks")
    assert _stored_files(server, "datasets") == [] and _stored_files(server, "uploads") == []
    actions = {e["action"] for e in server.cli_json("audit")}
    assert {
        "datasets.upload",
        "datasets.push",
        "datasets.set_label",
        "datasets.remove_label",
        "datasets.delete_version",
        "datasets.delete",
    } <= actions


def test_share_read_only_with_another_tenant(server: Server, tmp_path: Path) -> None:
    _member(server, "acme", "alice")
    _member(server, "beta", "bob")
    src = _tree(tmp_path / "src")
    alice = ("--profile", "alice", "datasets")
    bob = ("--profile", "bob", "datasets")
    server.cli(*alice, "create", "clicks", "--from", str(src))
    server.cli(*alice, "label", "clicks", "production", "1")
    assert "error (dataset_not_found)" in _fails(server, *bob, "describe", "acme/clicks")

    assert "shared read-only with tenant beta" in server.cli(*alice, "share", "clicks", "--tenant", "beta").stderr
    assert server.cli_json(*alice, "describe", "clicks")["shared_with"] == ["beta"]
    # bob reads it as acme/clicks: list, describe, versions, files, download
    [listed] = server.cli_json(*bob, "list")
    assert (listed["name"], listed["owner"], listed["shared"], listed["shared_with"]) == (
        "acme/clicks",
        "acme",
        True,
        [],
    )
    assert "from acme" in server.cli(*bob, "list").stdout
    described = server.cli_json(*bob, "describe", "acme/clicks")
    assert described["labels"] == {"production": 1} and described["versions"][0]["dataset"] == "acme/clicks"
    assert "read-only" in server.cli(*bob, "describe", "acme/clicks").stdout
    assert [v["version"] for v in server.cli_json(*bob, "versions", "acme/clicks")] == [1]
    assert len(server.cli_json(*bob, "files", "acme/clicks@production")) == 4
    here = tmp_path / "bob"
    here.mkdir()
    assert server.cli(*bob, "download", "acme/clicks@production", cwd=here).stdout.strip() == "clicks"
    assert _files(here / "clicks") == _files(src)

    # ... and changes nothing
    for args in (
        ["delete", "acme/clicks", "--yes"],
        ["delete", "acme/clicks", "--version", "1", "--yes"],
        ["label", "acme/clicks", "production", "1"],
        ["unlabel", "acme/clicks", "production"],
        ["share", "acme/clicks", "--tenant", "beta"],
        ["create", "acme/clicks", "--from", str(src)],
    ):
        assert "error (permission_denied)" in _fails(server, *bob, *args), args
    assert [v["version"] for v in server.cli_json(*alice, "versions", "clicks")] == [1]
    assert _stored_files(server, "uploads") == []  # the refused push's upload was dropped
    # bob's own dataset of the same name is another one
    server.cli(*bob, "create", "clicks", "--from", str(src / "empty.txt"))
    assert [d["name"] for d in server.cli_json(*bob, "list")] == ["clicks", "acme/clicks"]

    server.cli(*alice, "unshare", "clicks", "--tenant", "beta")
    assert "error (dataset_not_found)" in _fails(server, *bob, "describe", "acme/clicks")
    assert "error (dataset_not_found)" in _fails(server, *bob, "download", "acme/clicks", "--dest", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    assert [d["name"] for d in server.cli_json(*bob, "list")] == ["clicks"]
    assert "error (not_found)" in _fails(server, *alice, "unshare", "clicks", "--tenant", "beta")


def test_bad_input_is_refused_and_stores_nothing(server: Server, tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "a.txt").write_text("a\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "a.txt").write_text("a\n")
    (linked / "link.txt").symlink_to(linked / "a.txt")
    reserved = tmp_path / "reserved"
    reserved.mkdir()
    (reserved / ".dlcloud-manifest.json").write_text("{}")
    server.cli("datasets", "create", "good", "--from", str(good))

    for args, message in (
        (["create", "ds-0123456789abcdef", "--from", str(good)], "error (invalid_argument): dataset name"),
        (["create", "clicks", "--from", str(tmp_path / "missing")], "error (invalid_argument): "),
        (
            ["create", "clicks", "--from", "s3://bucket/clicks/"],
            "error (source_not_allowed): registering datasets in place is off on this server: "
            "dataset_source_urls is empty",
        ),
        (["create", "clicks", "--from", str(empty)], "holds no file"),
        (["create", "clicks", "--from", str(linked)], "link.txt is a link"),
        (["create", "clicks", "--from", str(reserved)], "are reserved"),
        (["create", "a/b/c", "--from", str(good)], "must be NAME or OWNER_TENANT/NAME"),
        (["files", "good", "--version", "7"], "error (dataset_version_not_found): dataset 'good' has no version 7"),
        (["describe", "good@nolabel"], "error (dataset_version_not_found)"),
        (["files", "good@1", "--version", "2"], "error (invalid_argument)"),
        (["download", "good", "--version", "7", "--dest", str(tmp_path / "d7")], "error (dataset_version_not_found)"),
        (["describe", "ghost"], "error (dataset_not_found): dataset 'ghost' not found"),
        (["label", "good", "latest", "1"], "error (invalid_argument)"),
        (["label", "good", "production", "9"], "error (dataset_version_not_found)"),
        (["unlabel", "good", "production"], "error (not_found)"),
        (["delete", "good", "--version", "9", "--yes"], "error (dataset_version_not_found)"),
    ):
        stderr = _fails(server, "datasets", *args)
        assert message in stderr, (args, stderr)
    assert "does not exist" in _fails(server, "datasets", "create", "clicks", "--from", str(tmp_path / "missing"))
    assert not (tmp_path / "d7").exists()
    listed = server.cli_json("datasets", "list")
    assert [(d["name"], d["version_count"]) for d in listed] == [("good", 1)]
    assert _stored_files(server, "uploads") == []
    assert len(_stored_files(server, "datasets")) == 2  # good's one file and its manifest


def test_a_name_that_is_no_dns_label_is_refused(server: Server, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    for name in ("Clicks", "a.b", "x" * 64):
        stderr = _fails(server, "datasets", "create", name, "--from", str(tmp_path / "a.txt"))
        assert "error (invalid_argument)" in stderr and "DNS-1123" in stderr
    assert json.loads(server.cli("datasets", "list", "-o", "json").stdout) == []


def test_a_job_reads_a_dataset_named_on_the_command_line(server: Server, tmp_path: Path) -> None:
    data = tmp_path / "clicks"
    data.mkdir()
    (data / "train.csv").write_text("x,y\n1,0\n2,1\n")
    server.cli("datasets", "create", "clicks", "--from", str(data))
    server.cli("datasets", "label", "clicks", "production", "1")
    code = tmp_path / "trainer"
    code.mkdir()
    (code / "read.py").write_text(
        "import json, os\n"
        "print(open(os.environ['DLCLOUD_DATASET_CLICKS'] + '/train.csv').read().strip().replace('\\n', '|'))\n"
        "print(sorted(json.loads(os.environ['DLCLOUD_DATASETS'])))\n"
    )
    res = server.cli(
        "jobs", "submit", "--name", "read-clicks", "--code", str(code), "--command", "python read.py",
        "--dataset", "clicks@production", "--follow",
    )  # fmt: skip
    assert "x,y|1,0|2,1" in res.stdout and "['clicks']" in res.stdout
    described = server.cli_json("jobs", "describe", "read-clicks")
    assert isinstance(described, dict)
    [resolved] = described["resolved"]["datasets"]
    assert (resolved["name"], resolved["version"]) == ("clicks", 1)
    # the job ended: the version can go
    server.cli("datasets", "delete", "clicks", "--version", "1", "--yes")


def test_a_job_spec_file_names_datasets_as_mappings(server: Server, tmp_path: Path) -> None:
    """``datasets: [{name: clicks, version: 2}]`` in a YAML spec, with --dataset adding one in the string form; a
    mapping of another shape is refused with the forms there are."""
    for name, text in (("clicks", "old\n"), ("clicks", "new\n"), ("views", "seen\n")):
        (tmp_path / "part.txt").write_text(text)
        server.cli("datasets", "create", name, "--from", str(tmp_path / "part.txt"))
    code = tmp_path / "trainer"
    code.mkdir()
    (code / "read.py").write_text(
        "import os\n"
        "for name in ('CLICKS', 'VIEWS'):\n"
        "    print(name, open(os.environ['DLCLOUD_DATASET_' + name] + '/part.txt').read().strip())\n"
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: read-both\ncode: ./trainer\ncommand: python read.py\ndatasets: [{name: clicks, version: 1}]\n"
    )
    res = server.cli("jobs", "submit", "-f", str(spec), "--dataset", "views", "--follow")
    assert "CLICKS old" in res.stdout and "VIEWS seen" in res.stdout
    described = server.cli_json("jobs", "describe", "read-both")
    assert isinstance(described, dict)
    assert described["spec"]["datasets"] == ["clicks@1", "views"]
    spec.write_text("name: bad\ncommand: 'true'\ndatasets: [{name: clicks, versoin: 1}]\n")
    stderr = _fails(server, "jobs", "submit", "-f", str(spec))
    assert "error (validation_error)" in stderr
    assert "datasets.0: unknown key versoin: a dataset is NAME, NAME@VERSION" in stderr


def test_create_from_objects_already_in_a_bucket(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """--from s3://...: registered in place on a real S3 server, pending until the server's worker has read
    every object, then read and downloaded like any version; outside the allow-list refused cleanly."""
    import secrets

    from tests.e2e.conftest import free_port
    from tests.s3server import s3_server_or_skip

    s3 = s3_server_or_skip(request)
    area = f"src-{secrets.token_hex(4)}"
    objects = {"train/a.csv": b"x,y\n1,2\n", "labels.txt": b"no\nyes\n"}
    for rel, data in objects.items():
        s3.client().put_object(Bucket=s3.bucket, Key=f"{area}/images/{rel}", Body=data)
    env = {
        "DLCLOUD_DATASET_SOURCE_URLS": json.dumps([f"s3://{s3.bucket}/{area}"]),
        "DLCLOUD_S3_ADDRESSING_STYLE": "path",
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "AWS_REGION": s3.region,
    }
    server = Server(tmp_path / "srv", free_port(), extra_env=env)
    server.start()
    try:
        source = f"s3://{s3.bucket}/{area}/images"
        version = server.cli_json("datasets", "create", "images", "--from", source, "--wait")
        assert isinstance(version, dict)
        assert (version["state"], version["source"], version["file_count"]) == ("ready", source, 2)
        res = server.cli("datasets", "push", "images", "--from", source)
        assert "version 2 registered from" in res.stderr and "pending" in res.stderr
        shown = server.cli("datasets", "describe", "images@1").stdout
        assert "ready" in shown and source in shown
        dest = tmp_path / "dl"
        server.cli("datasets", "download", "images@1", "--dest", str(dest))
        assert _files(dest) == objects
        stderr = _fails(server, "datasets", "create", "other", "--from", f"s3://{s3.bucket}/elsewhere")
        assert f"error (source_not_allowed): s3://{s3.bucket}/elsewhere is not a dataset source" in stderr
        assert f"allowed: s3://{s3.bucket}/{area} (and below)" in stderr
        stderr = _fails(server, "datasets", "create", "other", "--from", f"s3://{s3.bucket}/{area}/../x")
        assert "error (invalid_argument)" in stderr
    finally:
        server.stop()
