"""Datasets, the sample library: push a directory or a file as a new version, read versions and their files,
download a version with its checksum verified, move labels, share read-only.

Datasets are named and versioned as every registry's entries are (``client.registry``). A version's checksum
is the canonical manifest checksum of ``dlcloud.checksums`` over its files, with paths relative to the
dataset's root.

from dlcloud.client import Client
c = Client.from_env()
v = c.datasets.push("clicks", path=Path("data/clicks"), description="week 47")
c.datasets.set_label("clicks", "production", v.version)
c.datasets.download("clicks", "production", dest=Path("clicks"))
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlcloud.checksums import artifact_digest
from dlcloud.client import registry
from dlcloud.client.registry import RegistryAPI
from dlcloud.client.transport import API
from dlcloud.errors import AlreadyExists, DlcloudError, InvalidArgument
from dlcloud.schemas import datasets as schemas

FILES_PAGE = 5000  # the files asked for per request of a version's listing (the server allows up to 10,000)

URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
RESERVED_PREFIX = ".dlcloud-"  # names the server keeps for itself inside a stored tree


@dataclass(frozen=True)
class PackedData:
    archive: Path  # a temporary .tar.gz; the caller deletes it
    files: int
    bytes: int  # in the files, before compression


def is_bucket_source(source: Path | str) -> bool:
    """Whether ``source`` names objects in a bucket (``s3://...``), registered in place, not packed."""
    return isinstance(source, str) and source.startswith("s3://")


def check_local_source(source: Path | str) -> Path:
    """``source`` as a local path; a URL is refused (``s3://...`` is registered in place: ``push(source=)``).

    Raises:
        InvalidArgument: ``source`` is a URL.
    """
    text = os.fspath(source)
    if text.startswith("s3://"):
        raise InvalidArgument(f"{text} is registered in place, not packed: push it with source={text!r}")
    if URL_RE.match(text):
        raise InvalidArgument(f"{text} is not a local path; give a local directory or file")
    return Path(text)


def pack_data(source: Path | str) -> PackedData:
    """A temporary .tar.gz of a directory's contents (paths relative to the directory) or of one file (under its
    own name); the caller deletes it.

    Everything in a directory is packed, hidden files and empty directories included (no ignore files apply
    to data). Links and special files are refused rather than skipped, so a version never silently misses a
    file.

    Args:
        source: a local directory or file; ``s3://...`` is refused (not supported yet).

    Returns:
        The archive with the number of files and their bytes.

    Raises:
        InvalidArgument: the source is a URL, does not exist, holds no file, a link, a special file, a name
            starting with ``.dlcloud-`` (reserved), or a file that cannot be read.
    """
    top = Path(os.path.abspath(check_local_source(source)))
    if not os.path.lexists(top):
        raise InvalidArgument(f"{source} does not exist")
    top_mode = os.lstat(top).st_mode
    if stat.S_ISLNK(top_mode):
        top = top.resolve()  # a link given by name is what the user means; links inside are refused below
        top_mode = os.lstat(top).st_mode
    if not (stat.S_ISREG(top_mode) or stat.S_ISDIR(top_mode)):
        raise InvalidArgument(f"{source} is not a regular file or a directory")
    fd, name = tempfile.mkstemp(prefix="dlcloud-data-", suffix=".tar.gz")
    os.close(fd)
    archive = Path(name)
    files = size = 0

    def add(tf: tarfile.TarFile, full: Path, rel: str) -> None:
        nonlocal files, size
        if any(part.startswith(RESERVED_PREFIX) for part in rel.split("/")):
            raise InvalidArgument(f"{rel}: names starting with {RESERVED_PREFIX!r} are reserved; rename it")
        try:
            info = registry.add_entry(tf, full, rel)
            if info.isfile():
                files += 1
                size += info.size
        except OSError as exc:
            raise InvalidArgument(f"cannot read {rel}: {exc.strerror or exc}") from None

    try:
        with tarfile.open(archive, "w:gz", compresslevel=6) as tf:
            if stat.S_ISREG(top_mode):
                add(tf, top, top.name)
            else:
                for full, rel in registry.tree_entries(top, "", "datasets"):
                    add(tf, full, rel)
        if files == 0:
            raise InvalidArgument(f"{source} holds no file; a dataset version needs at least one")
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    return PackedData(archive, files, size)


def tree_checksum(root: Path) -> str:
    """The checksum of the files under ``root``, paths relative to it (what the server records as a
    version's ``sha256``).

    Raises:
        ValueError: a link or a special file is under ``root``.
    """
    return artifact_digest(root, contents_only=True).sha256


def split_name(name: str) -> tuple[str, dict[str, Any]]:
    """``OWNER/NAME`` -> (NAME, {"owner": OWNER}); ``NAME`` -> (NAME, {})."""
    return registry.split_name(name, "dataset")


def _refuse_used_dest(dest: Path) -> None:
    if not os.path.lexists(dest):
        return
    if not dest.is_dir():
        raise AlreadyExists(f"{dest} exists and is not a directory; give a new or empty directory")
    if any(dest.iterdir()):
        raise AlreadyExists(f"{dest} is not empty; give a new or empty directory")


def _refuse_written_dest(dest: Path, work: Path) -> None:
    """``dest`` still holds nothing but the download's work directory (nothing else wrote into it meanwhile)."""
    others = [p for p in dest.iterdir() if p != work]
    if others:
        raise AlreadyExists(f"{dest} is not empty any more (something wrote {others[0].name}); nothing was moved")


class DatasetsAPI(
    RegistryAPI[
        schemas.Dataset, schemas.DatasetDetail, schemas.DatasetVersion, schemas.DatasetLabel, schemas.DatasetShare
    ]
):
    noun, plural, uploads = "dataset", "datasets", "dataset-uploads"

    # -- push ------------------------------------------------------------------------------------------
    def upload(self, archive: Path, progress: Callable[[int], None] | None = None) -> schemas.DatasetUpload:
        """Upload a .tar.gz of a dataset's files (see ``pack_data``); it waits for one ``push`` (``delete_upload``
        drops it).

        Args:
            archive: the .tar.gz; the paths in it are the paths in the dataset.
            progress: called with the number of bytes of each chunk sent.

        Returns:
            The upload: ``id``, ``sha256``, ``size``, ``expires_at``.

        Raises:
            InvalidArchive: not a tar(.gz), or it holds links, devices, ``..`` or absolute paths.
            PayloadTooLarge: over the server's upload or unpacked size limits.
        """
        return self._t.upload(schemas.DatasetUpload, f"{API}/{self.uploads}", archive, progress=progress)

    def push(
        self,
        name: str,
        path: Path | str | None = None,
        *,
        upload: str | None = None,
        source: str | None = None,
        description: str = "",
        progress: Callable[[int], None] | None = None,
    ) -> schemas.DatasetVersion:
        """Add a version to ``name`` (the dataset is created with version 1). The upload is used once: when the
        push fails it is deleted.

        Args:
            name: the dataset name (DNS-1123 label).
            path: a local directory (its contents, paths relative to it) or a file: packed, uploaded, pushed;
                or an ``s3://BUCKET/PREFIX`` string, as ``source``.
            upload: an upload id from ``upload`` (instead of ``path``).
            source: ``s3://BUCKET/PREFIX``: register the objects under it in place, without a copy (the server
                must allow the bucket). The version is ``pending`` until the server has read every object for
                its manifest; ``wait_ready`` waits for it.
            description: free text kept with the version.
            progress: called with the bytes of each chunk uploaded (with ``path``).

        Returns:
            The new version (``version``, ``state``, ``sha256``, ``file_count``, ``size_bytes``, ...).

        Raises:
            InvalidArgument: not exactly one of path, upload and source; a bad path (see ``pack_data``), URL
                or name.
            InvalidArchive / PayloadTooLarge: the data is refused.
            PermissionDenied: ``name`` is another tenant's dataset shared with yours (read-only); code
                source_not_allowed: the server does not allow registering from that location.
        """
        if path is not None and is_bucket_source(path):
            path, source = None, str(path)
        if sum(x is not None for x in (path, upload, source)) != 1:
            raise InvalidArgument("give exactly one of path, upload or source")
        dataset, params = split_name(name)
        url = f"{API}/datasets/{dataset}/versions"
        if source is not None:
            body = {"source": source, "description": description}
            return self._t.read(schemas.DatasetVersion, "POST", url, params=params, json_body=body)
        if upload is None:
            assert path is not None
            packed = pack_data(path)
            try:
                upload = self.upload(packed.archive, progress=progress).id
            finally:
                packed.archive.unlink(missing_ok=True)
        used = {"upload": upload, "description": description}
        return self._use_upload(
            upload, lambda: self._t.read(schemas.DatasetVersion, "POST", url, params=params, json_body=used)
        )

    def wait_ready(
        self, name: str, version: int, timeout: float = 3600.0, interval: float = 1.0
    ) -> schemas.DatasetVersion:
        """Wait until a version registered in place is no longer ``pending``.

        Args:
            name: ``NAME`` or ``OWNER/NAME``.
            version: its number.
            timeout: seconds to wait at most.
            interval: seconds between two looks.

        Returns:
            The version, ``ready`` or ``failed`` (``state_reason`` says why).

        Raises:
            DlcloudError (code timeout): still pending after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = self.version(name, version)
            if found.state != schemas.DatasetVersionState.PENDING:
                return found
            if time.monotonic() > deadline:
                raise DlcloudError(
                    f"version {version} of {name} is still being prepared after {timeout:.0f} s; "
                    f"'dlcloud datasets describe {name}@{version}' shows when it is ready",
                    code="timeout",
                )
            time.sleep(interval)

    # -- reads (the entries, their versions, labels, shares and deletion: RegistryAPI) ------------------------
    def files(self, name: str, ref: int | str = "latest") -> builtins.list[schemas.DatasetFile]:
        """A version's files.

        Args:
            name: ``NAME`` or ``OWNER/NAME``.
            ref: a version number, a label or ``latest``.

        Returns:
            One per file (``path``, ``size``, ``sha256``), ``path`` relative to the dataset's root, sorted by path.

        Raises:
            DlcloudError (code dataset_not_found / dataset_version_not_found): no such dataset or version.
        """
        dataset, params = split_name(name)
        out: builtins.list[schemas.DatasetFile] = []
        while True:  # the server answers a page at a time
            page = self._t.read_list(
                schemas.DatasetFile,
                f"{API}/datasets/{dataset}/versions/{ref}/files",
                params={**params, "limit": FILES_PAGE, **({"after": out[-1].path} if out else {})},
            )
            out += page
            if len(page) < FILES_PAGE:
                return out

    def download(
        self,
        name: str,
        ref: int | str,
        dest: Path | str,
        progress: Callable[[int], None] | None = None,
    ) -> Path:
        """Download a version's files into the directory ``dest`` and verify its checksum.

        Args:
            name: ``NAME`` or ``OWNER/NAME``.
            ref: a version number, a label or ``latest`` (resolved once, before the transfer).
            dest: a directory that does not exist yet or is empty; it receives the files (paths as in the
                dataset).
            progress: called with the bytes of each chunk received (compressed).

        Returns:
            ``dest``.

        Raises:
            AlreadyExists: ``dest`` exists and is not an empty directory.
            InvalidArchive (code checksum_mismatch): what arrived does not match the version's checksum;
                nothing is left in ``dest``.
        """
        split_name(name)  # a malformed OWNER/NAME fails before anything is made
        dest = Path(dest)
        _refuse_used_dest(dest)
        meta = self.version(name, ref)
        created: builtins.list[Path] = []  # directories made for ``dest``, removed again on failure
        if not dest.exists():
            for parent in reversed(dest.absolute().parents):
                if not parent.exists():
                    parent.mkdir()
                    created.append(parent)
        # next to (or, for an empty directory, inside) ``dest``: one filesystem, so the files move by rename
        work = Path(tempfile.mkdtemp(prefix=".dlcloud-download-", dir=dest if dest.exists() else dest.parent))
        try:
            tree = self._download_checked(name, meta, work, progress, tree_checksum, ("data", "recorded"))
            if dest.exists():
                _refuse_written_dest(dest, work)
                for child in tree.iterdir():
                    os.rename(child, dest / child.name)
            else:
                os.rename(tree, dest)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        shutil.rmtree(work, ignore_errors=True)
        return dest
