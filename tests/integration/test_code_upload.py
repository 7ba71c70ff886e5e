"""Code uploads: a good archive is stored with its checksum; every unsafe, oversized, corrupt or mislabelled
upload is refused with its own error and leaves neither a file nor a row behind."""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dlcloud import signing
from dlcloud.client import Credentials
from dlcloud.errors import DlcloudError
from dlcloud.store.rows import CodeRow
from tests.conftest import Env, assert_api_error, build_env, make_settings

API = "/api/v1"
MAX_UPLOAD = 512 * 1024
MAX_UNPACKED = 1024 * 1024
MAX_MEMBERS = 20
WHEEL = "pkg-1.0-py3-none-any.whl"


@pytest.fixture
def small_env(tmp_path: Path, db_url: str) -> Iterator[Env]:
    """The in-process API with small upload limits, so limit checks need only small test files."""
    settings = make_settings(
        tmp_path,
        db_url,
        max_upload_bytes=MAX_UPLOAD,
        max_unpacked_bytes=MAX_UNPACKED,
        max_archive_members=MAX_MEMBERS,
    )
    e = build_env(settings)
    with e.http:
        yield e
    e.platform.db.dispose()


# --- archive builders --------------------------------------------------------------------------------------


def _file(name: str, data: bytes = b"print('hi')\n") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, None


def _tar_gz(members: list, level: int = 6) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=level) as tf:
        dirinfo = tarfile.TarInfo("src")
        dirinfo.type = tarfile.DIRTYPE
        dirinfo.mode = 0o755
        tf.addfile(dirinfo)
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, read in chunks, so the bomb is built without holding it in memory."""

    def __init__(self, size: int):
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


@functools.cache
def _bomb() -> bytes:
    """A ~64 KiB gzip that declares one 64 MiB member of zeros."""
    size = 64 * 1024 * 1024
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tf:
        info = tarfile.TarInfo("zeros.bin")
        info.size = size
        tf.addfile(info, io.BufferedReader(_Zeros(size), buffer_size=1024 * 1024))
    return buf.getvalue()


def _zip(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return buf.getvalue()


def _zip_symlink(name: str, target: str) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name)
    info.external_attr = (0o120777 << 16) | 0o20
    return info, target.encode()


def _good_archive() -> bytes:
    return _tar_gz([_file("src/train.py"), _file("requirements.txt", b"numpy\n")])


def _sdist_without_metadata() -> bytes:
    return _tar_gz([_file("pkg-1.0/pkg/__init__.py", b"")])


# case -> (kind, filename, archive bytes builder, status, error code, message fragment)
BAD_ARCHIVES = {
    "dotdot": ("archive", "code.tar.gz", lambda: _tar_gz([_file("../evil.py")]), 400, "invalid_archive", "'..'"),
    "dotdot-nested": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_file("src/../../evil.py")]),
        400,
        "invalid_archive",
        "'src/../../evil.py' contains '..'",
    ),
    "absolute": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_file("/etc/cron.d/evil")]),
        400,
        "invalid_archive",
        "absolute path",
    ),
    "symlink": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_special("src/passwd", tarfile.SYMTYPE, "/etc/passwd")]),
        400,
        "invalid_archive",
        "'src/passwd' is a link",
    ),
    "hardlink": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_file("src/train.py"), _special("src/copy.py", tarfile.LNKTYPE, "src/train.py")]),
        400,
        "invalid_archive",
        "'src/copy.py' is a link",
    ),
    "char-device": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_special("src/null", tarfile.CHRTYPE)]),
        400,
        "invalid_archive",
        "'src/null' is a device, FIFO or other special file",
    ),
    "block-device": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_special("src/disk", tarfile.BLKTYPE)]),
        400,
        "invalid_archive",
        "is a device, FIFO or other special file",
    ),
    "fifo": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_special("src/pipe", tarfile.FIFOTYPE)]),
        400,
        "invalid_archive",
        "'src/pipe' is a device, FIFO or other special file",
    ),
    "bomb": ("archive", "code.tar.gz", _bomb, 413, "payload_too_large", f"more than {MAX_UNPACKED} bytes"),
    "bomb-spread": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_file(f"src/part{i}.bin", bytes(400 * 1024)) for i in range(3)]),
        413,
        "payload_too_large",
        f"more than {MAX_UNPACKED} bytes",
    ),
    "too-many-members": (
        "archive",
        "code.tar.gz",
        lambda: _tar_gz([_file(f"src/f{i}.py") for i in range(MAX_MEMBERS + 1)]),
        400,
        "invalid_archive",
        f"more than {MAX_MEMBERS} entries",
    ),
    "garbage": (
        "archive",
        "code.tar.gz",
        lambda: b"this is not an archive\n" * 100,
        400,
        "invalid_archive",
        "not a valid tar",
    ),
    "truncated": (
        "archive",
        "code.tar.gz",
        lambda: _good_archive()[: len(_good_archive()) // 2],
        400,
        "invalid_archive",
        "not a valid tar",
    ),
    "empty": ("archive", "code.tar.gz", lambda: b"", 400, "invalid_archive", "not a valid tar"),
    "wheel-dotdot": (
        "wheel",
        WHEEL,
        lambda: _zip([("pkg/__init__.py", b""), ("../evil.py", b"x")]),
        400,
        "invalid_archive",
        "'../evil.py' contains '..'",
    ),
    "wheel-absolute": (
        "wheel",
        WHEEL,
        lambda: _zip([("/usr/lib/evil.py", b"x")]),
        400,
        "invalid_archive",
        "absolute path",
    ),
    "wheel-symlink": (
        "wheel",
        WHEEL,
        lambda: _zip([_zip_symlink("pkg/link", "/etc/passwd")]),
        400,
        "invalid_archive",
        "'pkg/link' is a link or special file",
    ),
    "wheel-too-many-members": (
        "wheel",
        WHEEL,
        lambda: _zip([(f"pkg/m{i}.py", b"") for i in range(MAX_MEMBERS + 1)]),
        400,
        "invalid_archive",
        f"more than {MAX_MEMBERS} entries",
    ),
    "wheel-garbage": ("wheel", WHEEL, lambda: b"PK\x03\x04 nope" * 50, 400, "invalid_archive", "not a valid zip"),
    "wheel-is-a-tar": ("wheel", WHEEL, _good_archive, 400, "invalid_archive", "not a valid zip"),
    "sdist-without-metadata": (
        "sdist",
        "pkg-1.0.tar.gz",
        _sdist_without_metadata,
        400,
        "invalid_archive",
        "pyproject.toml or setup.py",
    ),
    "unknown-kind": ("egg", "code.egg", _good_archive, 400, "invalid_argument", "kind must be one of"),
    "filename-traversal": ("archive", "../code.tar.gz", _good_archive, 400, "invalid_argument", "filename must be"),
    "wheel-filename": ("wheel", "code.tar.gz", _good_archive, 400, "invalid_argument", "must end in .whl"),
}


# --- helpers -------------------------------------------------------------------------------------------------


def _upload_raw(
    env: Env,
    data: bytes,
    *,
    kind: str = "archive",
    filename: str = "code.tar.gz",
    declared: str | None = None,
    chunked: bool = False,
    creds: Credentials | None = None,
):
    creds = creds or env.admin_creds
    query = f"kind={kind}&filename={filename}"
    declared = declared or hashlib.sha256(data).hexdigest()
    headers = signing.sign_request(creds.access_key, creds.secret_key, "POST", f"{API}/code", query, declared).headers
    headers = {**headers, "Content-Type": "application/octet-stream"}

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), 64 * 1024):
            yield data[i : i + 64 * 1024]

    return env.http.post(f"{API}/code?{query}", content=chunks() if chunked else data, headers=headers)


def _stored_files(env: Env) -> list[Path]:
    """The code objects in the (local) object store, as files; nothing else may be left under code/."""
    objects = env.platform.objects
    stored = [objects.local_path(info.key) for info in objects.list("code")]
    code_dir = env.settings.code_dir
    on_disk = [p for p in code_dir.rglob("*") if p.is_file() and not p.name.startswith(".dlcloud-sha256-")]
    assert sorted(on_disk) == sorted(p for p in stored if p is not None)
    return sorted(p for p in stored if p is not None)


def _code_rows(env: Env) -> int:
    with env.platform.db.read() as s:
        return int(s.scalar(select(func.count()).select_from(CodeRow)) or 0)


def _assert_nothing_stored(env: Env) -> None:
    assert _stored_files(env) == []
    assert _code_rows(env) == 0


# --- good uploads --------------------------------------------------------------------------------------------


def test_valid_archive_uploads_through_the_sdk(small_env, tmp_path):
    data = _good_archive()
    path = tmp_path / "trainer.tar.gz"
    path.write_bytes(data)
    up = small_env.admin.code.upload(path)
    assert up.sha256 == hashlib.sha256(data).hexdigest()
    assert up.size == len(data)
    assert up.kind == "archive"
    assert up.filename == "trainer.tar.gz"
    tenant_id = small_env.admin.tenants.get("default").id
    [stored] = _stored_files(small_env)
    assert stored.is_relative_to(small_env.settings.code_dir / tenant_id)
    assert up.id in str(stored.relative_to(small_env.settings.code_dir))
    assert stored.read_bytes() == data
    assert _code_rows(small_env) == 1
    got = small_env.admin.transport.request("GET", f"{API}/code/{up.id}")
    assert got == up.model_dump(mode="json")
    job = small_env.admin.jobs.submit({"name": "uses-code", "code": up.id, "command": "python src/train.py"})
    assert job.code == up.id


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_valid_archive_uploads_through_a_raw_signed_request(small_env, chunked):
    data = _good_archive()
    resp = _upload_raw(small_env, data, chunked=chunked)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["size"] == len(data)
    [stored] = _stored_files(small_env)
    assert body["id"] in str(stored) and stored.read_bytes() == data


def test_valid_wheel_uploads(small_env, tmp_path):
    data = _zip([("pkg/__init__.py", b""), ("pkg/task.py", b"print(1)\n")])
    path = tmp_path / WHEEL
    path.write_bytes(data)
    up = small_env.admin.code.upload(path, kind="wheel")
    assert up.kind == "wheel"
    assert up.sha256 == hashlib.sha256(data).hexdigest()
    [stored] = _stored_files(small_env)
    assert up.id in str(stored) and stored.name.endswith(".whl")
    assert stored.read_bytes() == data


# --- rejected uploads ----------------------------------------------------------------------------------------


def test_bad_archives_are_refused_through_raw_requests(small_env, subtests):
    for case, (kind, filename, build, status, code, fragment) in BAD_ARCHIVES.items():
        with subtests.test(case=case):
            assert_api_error(_upload_raw(small_env, build(), kind=kind, filename=filename), status, code, fragment)
            _assert_nothing_stored(small_env)


def test_bad_archives_are_refused_through_the_sdk(small_env, subtests, tmp_path):
    for case, (kind, filename, build, status, code, fragment) in BAD_ARCHIVES.items():
        with subtests.test(case=case):
            path = tmp_path / f"{case}.bin"
            path.write_bytes(build())
            with pytest.raises(DlcloudError, match=fragment.replace("(", r"\(").replace(")", r"\)")) as exc:
                small_env.admin.code.upload(path, kind=kind, filename=filename)
            assert exc.value.code == code
            assert exc.value.http_status == status
            _assert_nothing_stored(small_env)


def test_oversize_upload_with_content_length_is_refused(small_env, tmp_path):
    path = tmp_path / "big.tar.gz"
    path.write_bytes(b"x" * (MAX_UPLOAD + 1))
    with pytest.raises(DlcloudError, match=f"upload is {MAX_UPLOAD + 1} bytes; the limit is {MAX_UPLOAD} bytes") as e:
        small_env.admin.code.upload(path)
    assert e.value.code == "payload_too_large"
    assert e.value.http_status == 413
    assert e.value.details["limit"] == MAX_UPLOAD
    _assert_nothing_stored(small_env)


def test_oversize_streamed_upload_is_refused(small_env):
    resp = _upload_raw(small_env, b"x" * (MAX_UPLOAD + 1), chunked=True)
    err = assert_api_error(resp, 413, "payload_too_large", f"exceeds the limit of {MAX_UPLOAD} bytes")
    assert err["details"]["limit"] == MAX_UPLOAD
    _assert_nothing_stored(small_env)


def test_upload_at_the_limit_is_accepted(small_env):
    # an archive padded to exactly the limit: the limit is inclusive
    data = _good_archive()
    padded = data + bytes(MAX_UPLOAD - len(data))  # gzip ignores trailing zero padding after the stream
    resp = _upload_raw(small_env, padded)
    assert resp.status_code == 201, resp.text
    assert resp.json()["size"] == MAX_UPLOAD


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_wrong_declared_checksum_is_refused(small_env, chunked):
    data = _good_archive()
    resp = _upload_raw(small_env, data, declared=hashlib.sha256(b"something else").hexdigest(), chunked=chunked)
    assert_api_error(resp, 400, "checksum_mismatch", "do not match the declared SHA-256")
    _assert_nothing_stored(small_env)


def test_malformed_declared_checksum_is_refused(small_env):
    creds = small_env.admin_creds
    data = _good_archive()
    query = "kind=archive&filename=code.tar.gz"
    headers = signing.sign_request(
        creds.access_key, creds.secret_key, "POST", f"{API}/code", query, "not-a-hash"
    ).headers
    resp = small_env.http.post(f"{API}/code?{query}", content=data, headers=headers)
    assert_api_error(resp, 401, "bad_signature", signing.HEADER_CONTENT_SHA256)
    _assert_nothing_stored(small_env)


def test_upload_needs_a_valid_signature(small_env):
    bad = Credentials("http://testserver", small_env.admin_creds.access_key, "wrong-secret")
    assert_api_error(_upload_raw(small_env, _good_archive(), creds=bad), 401, "bad_signature", "signature")
    _assert_nothing_stored(small_env)


def test_job_with_a_made_up_code_id_is_refused(small_env):
    with pytest.raises(DlcloudError, match="code 'c-madeup123' not found; upload it first") as exc:
        small_env.admin.jobs.submit({"name": "ghost", "code": "c-madeup123", "command": "python train.py"})
    assert exc.value.code == "invalid_spec"
    assert small_env.admin.jobs.list() == []
    with pytest.raises(DlcloudError, match="not found") as exc:
        small_env.admin.transport.request("GET", f"{API}/code/c-madeup123")
    assert exc.value.code == "not_found"


def test_rejection_after_a_good_upload_leaves_only_the_good_one(small_env):
    good = _upload_raw(small_env, _good_archive())
    assert good.status_code == 201, good.text
    assert_api_error(_upload_raw(small_env, _tar_gz([_file("../evil.py")])), 400, "invalid_archive", "'..'")
    assert_api_error(_upload_raw(small_env, _bomb()), 413, "payload_too_large", "more than")
    [stored] = _stored_files(small_env)
    assert good.json()["id"] in str(stored)
    assert _code_rows(small_env) == 1
