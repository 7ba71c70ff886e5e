"""The local-directory object store (``file:///path``; by default the data dir itself).

Layout under the root: an object is the file ``<root>/<key>``; a tree is the directory ``<root>/<prefix>``
holding its files and, as ``.dlcloud-manifest.json``, its manifest. Keys under the data dir are exactly
where earlier versions kept the same files (``code/<tenant>/<id>/<file>``, ``models/<tenant>/<model>/
<version>/<artifact>``), so an existing data dir keeps working as it is.

How the invariants of ``objects.py`` hold here:
- An object is written to a temporary file (``.dlcloud-tmp-*``) in its final directory, then renamed into
  place; its SHA-256 goes into ``.dlcloud-sha256-<name>`` beside it first.
- A tree is assembled in ``<root>/.dlcloud-staging/`` (same file system), manifest included, and renamed
  into place in one step; its files are read-only (0444, directories 0555).
- Names starting with ``.dlcloud-`` are this backend's own; ``list`` never shows them, and no key or path
  inside a tree may use them.
- A tree stored before manifests existed (a model version of an older data dir) gets its manifest, from its
  files, the first time it is read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dlcloud.storage.objects import (
    CHUNK,
    Manifest,
    ObjectDamaged,
    ObjectInfo,
    ObjectMissing,
    ObjectStore,
    TreeEntry,
    file_sha256,
    scan_tree,
)

INTERNAL = ".dlcloud-"
MANIFEST_NAME = ".dlcloud-manifest.json"
SHA_PREFIX = ".dlcloud-sha256-"
STAGING = ".dlcloud-staging"


def make_read_only(path: Path) -> None:
    """Files 0444, directories 0555 (bottom-up, so every directory is still writable while its content changes)."""
    if not path.is_dir():
        path.chmod(0o444)
        return
    for dirpath, _dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        os.chmod(dirpath, 0o555)


def remove_tree(path: Path) -> None:
    """Delete a file or a (read-only) tree; a missing path is fine."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    path.chmod(0o700)
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    shutil.rmtree(path)


def _copy_verified(src: Path, dest: Path, entry: TreeEntry, key: str) -> None:
    """Copy one tree file, checking its size and SHA-256 against the manifest entry on the way."""
    digest = hashlib.sha256()
    size = 0
    with src.open("rb") as fi, dest.open("wb") as fo:
        while chunk := fi.read(CHUNK):
            size += len(chunk)
            if size > entry.size:  # grew since it was measured: nothing past its size is written
                raise ObjectDamaged(key, "does not match its manifest entry")
            digest.update(chunk)
            fo.write(chunk)
    if size != entry.size or digest.hexdigest() != entry.sha256:
        raise ObjectDamaged(key, "does not match its manifest entry")


class LocalObjectStore(ObjectStore):
    on_this_host = True

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()
        self.url = self.root.as_uri()

    # -- helpers -----------------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.root / key

    def _private_dirs(self, path: Path) -> None:
        """Create ``path`` and its missing parents under the root, mode 0700."""
        missing = [p for p in (path, *path.parents) if p.is_relative_to(self.root) and not p.exists()]
        for p in reversed(missing):
            p.mkdir(mode=0o700, exist_ok=True)

    def _staging(self) -> Path:
        parent = self.root / STAGING
        self._private_dirs(parent)
        return Path(tempfile.mkdtemp(prefix="tree-", dir=parent))

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def tree_local_path(self, prefix: str) -> Path | None:
        return self._path(prefix)

    # -- objects -----------------------------------------------------------------------------------------
    def _put_file(self, key: str, src: Path, sha256: str) -> ObjectInfo:
        dest = self._path(key)
        self._private_dirs(dest.parent)
        fd, tmp_name = tempfile.mkstemp(prefix=INTERNAL + "tmp-", dir=dest.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as fo, src.open("rb") as fi:
                shutil.copyfileobj(fi, fo, CHUNK)
            if file_sha256(tmp) != sha256:  # the source changed while it was copied
                raise ObjectDamaged(key, "changed while it was stored")
            tmp.chmod(0o444)
            sidecar = dest.parent / (SHA_PREFIX + dest.name)
            sidecar.write_text(sha256)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        st = dest.stat()
        return ObjectInfo(key, st.st_size, sha256, st.st_mtime)

    def _stored_sha256(self, path: Path) -> str | None:
        try:
            return (path.parent / (SHA_PREFIX + path.name)).read_text().strip() or None
        except OSError:
            return None

    def _get_file(self, key: str, dest: Path) -> ObjectInfo:
        src = self._path(key)
        if not src.is_file():
            raise ObjectMissing(key)
        fd, tmp_name = tempfile.mkstemp(prefix=".part-", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as fo, src.open("rb") as fi:
                shutil.copyfileobj(fi, fo, CHUNK)
            os.replace(tmp_name, dest)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        return ObjectInfo(key, dest.stat().st_size, self._stored_sha256(src))

    def _iter_bytes(self, key: str, chunk: int) -> Iterator[bytes]:
        try:
            f = self._path(key).open("rb")
        except FileNotFoundError:
            raise ObjectMissing(key) from None
        with f:
            while data := f.read(chunk):
                yield data

    def _head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not path.is_file():
            return None
        return ObjectInfo(key, st.st_size, self._stored_sha256(path), st.st_mtime)

    def _delete(self, key: str) -> None:
        path = self._path(key)
        (path.parent / (SHA_PREFIX + path.name)).unlink(missing_ok=True)
        if path.is_file():
            path.unlink()

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self._path(prefix)
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(INTERNAL)]
            for name in filenames:
                if not name.startswith(INTERNAL):
                    found.append((Path(dirpath) / name).relative_to(self.root).as_posix())
        for key in sorted(found):
            info = self._head(key)
            if info is not None:
                yield info

    def _delete_prefix(self, prefix: str) -> int:
        base = self._path(prefix)
        count = sum(1 for _ in self._list(prefix))
        remove_tree(base)
        return count

    # -- trees -------------------------------------------------------------------------------------------
    def _put_tree(self, prefix: str, src: Path, manifest: Manifest) -> Manifest:
        for e in manifest.entries:
            if e.path.split("/")[0].startswith(INTERNAL):
                raise ValueError(f"{e.path!r}: names starting with {INTERNAL!r} are reserved")

        def fill(tree: Path) -> None:
            for e in manifest.entries:
                dest = tree / e.path
                dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                _copy_verified(src / e.path, dest, e, f"{prefix}/{e.path}")
            for d in manifest.empty_dirs:
                (tree / d).mkdir(parents=True, exist_ok=True, mode=0o700)

        self._install_tree(prefix, manifest, fill)
        return manifest

    def _put_tree_manifest(self, prefix: str, manifest: Manifest) -> None:
        self._install_tree(prefix, manifest, lambda tree: None)  # the files stay at manifest.source

    def _install_tree(self, prefix: str, manifest: Manifest, fill: Callable[[Path], None]) -> None:
        """Build the tree in a staging directory (``fill`` writes its files), its manifest last, and rename it
        into place: visible whole or not at all."""
        staging = self._staging()
        try:
            tree = staging / "tree"
            tree.mkdir(mode=0o700)
            fill(tree)
            (tree / MANIFEST_NAME).write_bytes(manifest.to_json())
            make_read_only(tree)
            # a directory moved to another parent needs write permission on itself (its '..' changes):
            # root has it anyway, an unprivileged server does not, so the top is sealed after the move
            tree.chmod(0o755)
            target = self._path(prefix)
            self._private_dirs(target.parent)
            remove_tree(target)  # only a crash can leave one behind: tree prefixes are never reused
            os.rename(tree, target)
            target.chmod(0o555)
        finally:
            remove_tree(staging)

    def _tree_manifest(self, prefix: str) -> Manifest:
        tree = self._path(prefix)
        try:
            return Manifest.from_json((tree / MANIFEST_NAME).read_bytes())
        except FileNotFoundError:
            pass
        if not tree.is_dir():
            raise ObjectMissing(prefix)
        # a tree of an older data dir: its manifest from its files, kept for the next read
        try:
            manifest = scan_tree(tree)
        except ValueError as exc:
            raise ObjectDamaged(prefix, str(exc)) from None
        mode = tree.stat().st_mode & 0o777
        tree.chmod(0o700)
        try:
            tmp = tree / (INTERNAL + "tmp-manifest")
            tmp.write_bytes(manifest.to_json())
            tmp.chmod(0o444)
            os.replace(tmp, tree / MANIFEST_NAME)
        finally:
            tree.chmod(mode)
        return manifest

    def _get_tree(self, prefix: str, manifest: Manifest, dest: Path) -> None:
        tree = self._path(prefix)
        dest.mkdir(parents=True, exist_ok=True)
        for e in manifest.entries:
            target = dest / e.path
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                _copy_verified(tree / e.path, target, e, f"{prefix}/{e.path}")
            except FileNotFoundError:
                raise ObjectMissing(f"{prefix}/{e.path}") from None
        for d in manifest.empty_dirs:
            (dest / d).mkdir(parents=True, exist_ok=True)

    def _delete_tree(self, prefix: str) -> None:
        tree = self._path(prefix)
        if not tree.exists():
            return
        tree.chmod(0o700)
        (tree / MANIFEST_NAME).unlink(missing_ok=True)
        remove_tree(tree)

    # -- upkeep ------------------------------------------------------------------------------------------
    def sweep(self, max_age_seconds: float) -> None:
        """Delete staging directories older than ``max_age_seconds`` (left by crashes)."""
        cutoff = time.time() - max_age_seconds
        staging = self.root / STAGING
        if not staging.is_dir():
            return
        for entry in staging.iterdir():
            try:
                if entry.lstat().st_mtime < cutoff:
                    remove_tree(entry)
            except OSError:
                continue
