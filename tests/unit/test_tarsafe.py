"""Safe extraction without the ``"data"`` filter (Python 3.11.0-3.11.3): dlcloud.tarsafe and the launcher's
own copy of the rules accept a normal archive and refuse every escape, the same way."""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from dlcloud import tarsafe
from dlcloud.executors.local import launcher


def _archive(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tf.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _file(name: str, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, b"data"


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


def _fifo(name: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.FIFOTYPE
    return info, b""


def _via_tarsafe(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tf:
        tarsafe.extractall(tf, dest)


def _via_launcher(archive: Path, dest: Path) -> None:
    launcher.extract_archive(str(archive), str(dest))


EXTRACTORS: dict[str, Callable[[Path, Path], None]] = {"tarsafe": _via_tarsafe, "launcher": _via_launcher}


@pytest.fixture(params=["data filter", "no data filter (3.11.0-3.11.3)"])
def python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param != "data filter":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return str(request.param)


@pytest.mark.parametrize("how", list(EXTRACTORS))
def test_a_normal_archive_unpacks_with_safe_modes(python: str, how: str, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "a.tar.gz", _file("pkg/train.py", 0o4777), _link("pkg/alias.py", "train.py"))
    EXTRACTORS[how](archive, tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "train.py").read_bytes() == b"data"
    assert (tmp_path / "out" / "pkg" / "alias.py").resolve() == (tmp_path / "out" / "pkg" / "train.py").resolve()
    assert (tmp_path / "out" / "pkg" / "train.py").stat().st_mode & 0o7022 == 0  # no set-id, no group/other write


@pytest.mark.parametrize("how", list(EXTRACTORS))
@pytest.mark.parametrize(
    "member",
    [_file("../escape.txt"), _link("ln", "../../etc"), _link("abs", "/etc/passwd"), _fifo("f")],
    ids=["dotdot", "link-out", "link-abs", "fifo"],
)
def test_escapes_are_refused(python: str, how: str, member: tuple[tarfile.TarInfo, bytes], tmp_path: Path) -> None:
    archive = _archive(tmp_path / "a.tar.gz", member)
    with pytest.raises((tarfile.TarError, launcher.PrepareError)):
        EXTRACTORS[how](archive, tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.parametrize("how", list(EXTRACTORS))
def test_an_absolute_name_never_lands_outside(python: str, how: str, tmp_path: Path) -> None:
    """The data filter strips the leading slash; the fallback refuses: either way nothing lands outside."""
    name = f"/{tmp_path.name}-abs.txt"
    archive = _archive(tmp_path / "a.tar.gz", _file(name))
    with contextlib.suppress(tarfile.TarError, launcher.PrepareError):
        EXTRACTORS[how](archive, tmp_path / "out")
    assert not Path(name).exists()
