"""Pack a code directory into a .tar.gz, honouring .gitignore and .dlcloudignore."""

from __future__ import annotations

import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

ALWAYS_IGNORED = [".git/", "__pycache__/", "*.pyc", ".venv/", ".dlcloud/"]


@dataclass
class PackResult:
    archive: Path
    files: int
    bytes: int
    skipped_links: list[str] = field(default_factory=list)


def _spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines = list(ALWAYS_IGNORED)
    for name in (".gitignore", ".dlcloudignore"):
        f = root / name
        if f.is_file():
            lines.extend(f.read_text(errors="replace").splitlines())
    return pathspec.GitIgnoreSpec.from_lines(lines)


def pack_directory(root: Path) -> PackResult:
    """Create a temporary .tar.gz of ``root`` (caller deletes it). Links are skipped and reported."""
    root = root.resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    spec = _spec(root)
    fd, name = tempfile.mkstemp(prefix="dlcloud-code-", suffix=".tar.gz")
    os.close(fd)
    archive = Path(name)
    result = PackResult(archive, 0, 0)
    try:
        with tarfile.open(archive, "w:gz", compresslevel=6) as tf:
            for dirpath, dirnames, filenames in os.walk(root):
                rel_dir = Path(dirpath).relative_to(root)
                keep = []
                for d in sorted(dirnames):
                    rel = (rel_dir / d).as_posix()
                    if os.path.islink(os.path.join(dirpath, d)):
                        result.skipped_links.append(rel)
                    elif not spec.match_file(rel + "/"):
                        keep.append(d)
                dirnames[:] = keep
                for fname in sorted(filenames):
                    full = Path(dirpath) / fname
                    rel = (rel_dir / fname).as_posix()
                    if spec.match_file(rel):
                        continue
                    if full.is_symlink():
                        result.skipped_links.append(rel)
                        continue
                    if not full.is_file():
                        continue
                    info = tf.gettarinfo(str(full), arcname=rel)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with full.open("rb") as f:
                        tf.addfile(info, f)
                    result.files += 1
                    result.bytes += info.size
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    return result
