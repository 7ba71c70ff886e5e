"""The tar header scan walks archives exactly as tarfile does, in every format and compression tarfile reads,
and stops metadata bombs and sparse maps before anything big is read."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from dlcloud.errors import InvalidArchive, PayloadTooLarge
from dlcloud.storage.archives import ArchiveLimits, failure_text, scan_tar_headers, validate_tar

LIMITS = ArchiveLimits(max_unpacked_bytes=10 * 1024 * 1024, max_members=50)


def _write(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], mode: str = "w:gz", fmt: int = 2) -> Path:
    with tarfile.open(path, mode, format=fmt) as tf:
        for info, data in members:
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _member(name: str, data: bytes = b"x", **pax: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.pax_headers = dict(pax)
    return info, data


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_ordinary_archives_pass_in_every_format_and_compression(tmp_path, mode, fmt):
    # a name past ustar's 100 bytes needs the GNU or pax long-name records
    name = "d/" + "n" * 90 if fmt == tarfile.USTAR_FORMAT else "d/" + "/".join(["n" * 200] * 3)
    members = [_member("a.py", b"print(1)\n" * 100), _member(name, b"y" * 3000), _member("empty", b"")]
    path = _write(tmp_path / "a.tar", members, mode, fmt)
    assert validate_tar(path, LIMITS) == 900 + 3000


def test_a_pax_size_record_moves_the_next_header_as_tarfile_does(tmp_path):
    # the member's size comes from its pax header: a scan reading the ustar size would lose its place
    path = _write(tmp_path / "a.tar.gz", [_member("a", b"1" * 3000, size="3000", comment="c"), _member("b", b"2")])
    assert validate_tar(path, LIMITS) == 3001
    with tarfile.open(path) as tf:
        assert [(m.name, m.size) for m in tf] == [("a", 3000), ("b", 1)]


@pytest.mark.parametrize(
    "pax",
    [{"GNU.sparse.map": "0,1", "GNU.sparse.size": "1"}, {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}],
)
def test_gnu_sparse_files_are_refused(tmp_path, pax):
    path = _write(tmp_path / "a.tar.gz", [_member("s", b"1", **pax)])
    with pytest.raises(InvalidArchive, match="sparse files are not allowed"):
        scan_tar_headers(path, LIMITS)


def test_old_gnu_sparse_members_are_refused(tmp_path):
    info = tarfile.TarInfo("s")
    info.type = tarfile.GNUTYPE_SPARSE
    path = tmp_path / "a.tar"
    path.write_bytes(info.tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))
    with pytest.raises(InvalidArchive, match="sparse files are not allowed"):
        scan_tar_headers(path, LIMITS)


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, b"L", b"K"])
def test_metadata_over_the_bound_is_refused_from_its_header(tmp_path, kind):
    info = tarfile.TarInfo("meta")
    info.type, info.size = kind, 5 * 1024 * 1024  # declared only: the payload is not even there
    path = tmp_path / "a.tar"
    path.write_bytes(info.tobuf(format=tarfile.USTAR_FORMAT))
    with pytest.raises(InvalidArchive, match="at most 1048576 bytes") as exc:
        scan_tar_headers(path, LIMITS)
    assert exc.value.details == {"limit": 1024 * 1024, "size": 5 * 1024 * 1024}


def test_members_and_declared_sizes_are_counted_while_scanning(tmp_path):
    many = _write(tmp_path / "many.tar.gz", [_member(f"f{i}") for i in range(51)])
    with pytest.raises(InvalidArchive, match="more than 50 entries"):
        scan_tar_headers(many, LIMITS)
    info = tarfile.TarInfo("big")
    info.size = 11 * 1024 * 1024  # declared; the scan stops before reading it
    big = tmp_path / "big.tar"
    big.write_bytes(info.tobuf(format=tarfile.USTAR_FORMAT))
    with pytest.raises(PayloadTooLarge):
        scan_tar_headers(big, LIMITS)


def test_two_pax_headers_for_one_member_and_a_global_size_are_refused(tmp_path):
    def pax(kind: bytes, payload: bytes) -> bytes:
        info = tarfile.TarInfo("p")
        info.type, info.size = kind, len(payload)
        return info.tobuf(format=tarfile.USTAR_FORMAT) + payload + bytes(-len(payload) % 512)

    record = b"12 size=100\n"
    path = tmp_path / "a.tar"
    path.write_bytes(pax(tarfile.XHDTYPE, b"8 a=bcd\n") + pax(tarfile.XHDTYPE, b"8 a=bcd\n") + bytes(1024))
    with pytest.raises(InvalidArchive, match="two pax extended headers"):
        scan_tar_headers(path, LIMITS)
    path.write_bytes(pax(tarfile.XGLTYPE, record) + bytes(1024))
    with pytest.raises(InvalidArchive, match="invalid 'size' record"):
        scan_tar_headers(path, LIMITS)


def test_what_tarfile_cannot_read_is_left_to_it(tmp_path):
    path = tmp_path / "junk.tar.gz"
    path.write_bytes(b"not an archive at all" * 50)
    scan_tar_headers(path, LIMITS)  # no header: nothing to refuse here
    with pytest.raises(InvalidArchive, match="not a valid tar"):
        validate_tar(path, LIMITS)


def _tar_of(tmp_path: Path, names: list[str]) -> Path:
    return _write(tmp_path / "t.tar", [_member(n, b"") for n in names], "w", tarfile.PAX_FORMAT)


@pytest.mark.parametrize(
    ("names", "fragment"),
    [
        (["a/" * 40 + "f"], "levels deep"),
        (["x" * 300], "longer than 255 bytes"),
        (["/".join(["y" * 200] * 6)], "at most 1024"),
        (["a\\b"], "backslash"),
        (["ok/.dlcloud-manifest.json"], "reserved"),
        ([f"{i}/{'d/' * 30}f" for i in range(4)], "directories count"),
    ],
)
def test_deep_long_and_reserved_names_are_refused(tmp_path: Path, names: list[str], fragment: str) -> None:
    """A small archive of deep empty files would cost minutes of CPU and millions of inodes to unpack."""
    with pytest.raises(InvalidArchive, match=fragment):
        validate_tar(_tar_of(tmp_path, names), ArchiveLimits(1 << 20, 100))


def test_names_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        info = tarfile.TarInfo("caf\xe9.csv")
        tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(InvalidArchive, match="UTF-8"):
        validate_tar(path, LIMITS)


def test_failure_texts_name_an_entry_never_a_server_path(tmp_path: Path) -> None:
    inside = OSError(20, "Not a directory", str(tmp_path / "stage-1" / "model" / "a" / "b"))
    assert failure_text(inside, tmp_path / "stage-1") == "Not a directory: 'model/a/b'"
    assert failure_text(inside) == "Not a directory"  # no root to name it by: the reason alone
    elsewhere = FileNotFoundError(2, "No such file or directory", "/srv/dlcloud/data/tmp/uploads/.upload-x")
    assert failure_text(elsewhere, tmp_path) == "No such file or directory"
    assert failure_text(tarfile.ReadError("not a gzip file")) == "not a gzip file"
    with pytest.raises(InvalidArchive) as exc:
        validate_tar(tmp_path, LIMITS)  # a directory where an archive was expected
    assert str(tmp_path) not in exc.value.message
