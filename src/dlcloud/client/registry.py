"""What the SDK's versioned registries (``client.models``, ``client.datasets``) do alike: names, reads of entries
and versions, labels, shares, deletion, uploads and checked downloads; each registry's own API adds what differs
(register and signatures for models; push, files and the cache for datasets).

An entry is named ``NAME`` in your tenant or ``OWNER/NAME`` for one another tenant shares with yours
(read-only). Versions are addressed by number, label, or ``latest``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import stat
import tarfile
import typing
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from dlcloud import tarsafe
from dlcloud.client.transport import API, Transport
from dlcloud.errors import DlcloudError, InvalidArchive, InvalidArgument
from dlcloud.schemas.common import Response
from dlcloud.schemas.models import ARTIFACT_SHA256_HEADER
from dlcloud.schemas.registry import LabelAnswer, ShareAnswer

EntryT = TypeVar("EntryT", bound=Response)
DetailT = TypeVar("DetailT", bound=Response)
VersionT = TypeVar("VersionT", bound=Response)
LabelT = TypeVar("LabelT", bound=LabelAnswer)
ShareT = TypeVar("ShareT", bound=ShareAnswer)
T = TypeVar("T")
# the read models a registry's routes answer with, in the order of RegistryAPI's type parameters
MODEL_ATTRIBUTES = ("entry_model", "detail_model", "version_model", "label_model", "share_model")


class Stored(Protocol):
    """A version as a download checks it: its number and its checksum."""

    @property
    def version(self) -> int: ...

    @property
    def sha256(self) -> str: ...


def split_name(name: str, noun: str) -> tuple[str, dict[str, Any]]:
    """``OWNER/NAME`` -> (NAME, {"owner": OWNER}); ``NAME`` -> (NAME, {}); ``noun`` ("model") names the entry
    in the error.

    Raises:
        InvalidArgument: more than one ``/`` or an empty part.
    """
    owner, sep, entry = name.partition("/")
    if not sep:
        return name, {}
    if not owner or not entry or "/" in entry:
        raise InvalidArgument(f"{noun} name {name!r} must be NAME or OWNER_TENANT/NAME")
    return entry, {"owner": owner}


def add_entry(tf: tarfile.TarFile, full: Path, arcname: str) -> tarfile.TarInfo:
    """Add the file or directory ``full`` to ``tf`` as ``arcname``, owned by no one (uid and gid 0, no names)."""
    info = tf.gettarinfo(str(full), arcname=arcname)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.isfile():
        with full.open("rb") as f:
            tf.addfile(info, f)
    else:
        tf.addfile(info)
    return info


def tree_entries(top: Path, arc_top: str, what: str) -> Iterator[tuple[Path, str]]:
    """Every directory and file under the directory ``top``, each directory's entries sorted, with its path in
    the archive (under ``arc_top`` when it is not empty). A link, device, FIFO or socket is refused: ``what``
    ("datasets") hold regular files only.

    Raises:
        InvalidArgument: a link, device, FIFO or socket under ``top``.
    """
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(top)
        for entry in [*dirnames, *sorted(filenames)]:
            full = Path(dirpath) / entry
            rel = (Path(arc_top) / rel_dir / entry).as_posix()
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                raise InvalidArgument(f"{rel} is a link; {what} hold regular files only (copy the file in its place)")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise InvalidArgument(f"{rel} is a device, FIFO or socket; {what} hold regular files")
            yield full, rel


class RegistryAPI(Generic[EntryT, DetailT, VersionT, LabelT, ShareT]):
    """The calls every registry has; ``noun`` ("model"), ``plural`` ("models", the path under the API) and
    ``uploads`` (the path of its uploads). The read models of its routes are the type arguments a registry's
    API gives (``RegistryAPI[Model, ...]``): ``entry_model`` (one of the list), ``detail_model`` (one
    described), ``version_model``, ``label_model``, ``share_model``."""

    noun: ClassVar[str] = ""
    plural: ClassVar[str] = ""
    uploads: ClassVar[str] = ""
    entry_model: type[EntryT]
    detail_model: type[DetailT]
    version_model: type[VersionT]
    label_model: type[LabelT]
    share_model: type[ShareT]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is RegistryAPI:
                for attribute, model in zip(MODEL_ATTRIBUTES, typing.get_args(base), strict=True):
                    setattr(cls, attribute, model)

    def __init__(self, t: Transport):
        self._t = t

    def _path(self, name: str, rest: str = "") -> tuple[str, dict[str, Any]]:
        """The path of the entry ``name`` (``NAME`` or ``OWNER/NAME``) with ``rest`` after it, and its params."""
        entry, params = split_name(name, self.noun)
        return f"{API}/{self.plural}/{entry}{rest}", params

    def list(self) -> builtins.list[EntryT]:
        """Your tenant's entries, then those shared with it (``shared`` true, named ``OWNER/NAME``)."""
        return self._t.read_list(self.entry_model, f"{API}/{self.plural}")

    def get(self, name: str) -> DetailT:
        """The entry (``NAME`` or ``OWNER/NAME``) with its versions, labels and (for the owner) shares.

        Raises:
            DlcloudError (code model_not_found, dataset_not_found): none, or one not shared with your tenant.
        """
        path, params = self._path(name)
        return self._t.read(self.detail_model, "GET", path, params=params)

    def versions(self, name: str) -> builtins.list[VersionT]:
        """The entry's versions, oldest first (``NAME`` or ``OWNER/NAME``)."""
        path, params = self._path(name, "/versions")
        return self._t.read_list(self.version_model, path, params=params)

    def version(self, name: str, ref: int | str = "latest") -> VersionT:
        """One version by number, label or ``latest``.

        Args:
            name: ``NAME`` or ``OWNER/NAME``.
            ref: a version number, a label or ``latest``.

        Raises:
            DlcloudError (code model_version_not_found, dataset_version_not_found): no such version or label.
        """
        path, params = self._path(name, f"/versions/{ref}")
        return self._t.read(self.version_model, "GET", path, params=params)

    def set_label(self, name: str, label: str, version: int) -> LabelT:
        """Point ``label`` at ``version`` (moving it off the version it was on).

        Returns:
            The label and the version it points at.

        Raises:
            DlcloudError (code model_version_not_found, dataset_version_not_found): no such version.
            InvalidArgument: a bad label name (``latest`` is reserved).
            PermissionDenied: the entry is another tenant's.
        """
        path, params = self._path(name, f"/labels/{label}")
        return self._t.read(self.label_model, "PUT", path, params=params, json_body={"version": version})

    def remove_label(self, name: str, label: str) -> None:
        """Remove ``label`` from the entry.

        Raises:
            NotFound: the entry has no such label.
            PermissionDenied: the entry is another tenant's.
        """
        path, params = self._path(name, f"/labels/{label}")
        self._t.request("DELETE", path, params=params)

    def share(self, name: str, tenant: str) -> ShareT:
        """Let ``tenant`` read the entry (list, describe, download; a dataset in jobs too), never change it.

        Returns:
            The share: the tenant and when it was shared.

        Raises:
            PermissionDenied: neither the entry's author nor a tenant admin.
            InvalidArgument: ``tenant`` is your own.
        """
        path, params = self._path(name, f"/shares/{tenant}")
        return self._t.read(self.share_model, "POST", path, params=params)

    def unshare(self, name: str, tenant: str) -> None:
        """Stop sharing the entry with ``tenant``; its users cannot read it any more.

        Raises:
            NotFound: the entry is not shared with ``tenant``.
            PermissionDenied: neither the entry's author nor a tenant admin.
        """
        path, params = self._path(name, f"/shares/{tenant}")
        self._t.request("DELETE", path, params=params)

    def delete(self, name: str) -> None:
        """Delete the entry with every version, label, share and stored file.

        Raises:
            DlcloudError (code model_deployed, dataset_in_use): a version is deployed, or read by a job that
                has not ended.
            PermissionDenied: neither its author nor a tenant admin, or another tenant's entry.
        """
        path, params = self._path(name)
        self._t.request("DELETE", path, params=params)

    def delete_version(self, name: str, version: int) -> None:
        """Delete one version and its files (its labels go with it; its number is never given again).

        Raises:
            DlcloudError (code model_deployed, dataset_in_use): it is deployed, or read by a job that has not
                ended.
            DlcloudError (code model_version_not_found, dataset_version_not_found): no such version.
        """
        path, params = self._path(name, f"/versions/{version}")
        self._t.request("DELETE", path, params=params)

    def delete_upload(self, upload_id: str) -> None:
        """Drop an upload that will not be used (registered, pushed).

        Args:
            upload_id: the ``id`` ``upload`` returned.

        Raises:
            NotFound: no such upload of your tenant (used, deleted or expired).
        """
        self._t.request("DELETE", f"{API}/{self.uploads}/{upload_id}")

    def _use_upload(self, upload_id: str, use: Callable[[], T]) -> T:
        """``use()`` the upload ``upload_id``: an upload is used once, by a call that succeeds, or deleted here
        when the call fails."""
        try:
            return use()
        except DlcloudError:
            with contextlib.suppress(DlcloudError):  # best effort: an upload left over expires on the server
                self.delete_upload(upload_id)
            raise

    def _download_checked(
        self,
        name: str,
        meta: Stored,
        work: Path,
        progress: Callable[[int], None] | None,
        checksum: Callable[[Path], str],
        what: tuple[str, str],
    ) -> Path:
        """Download ``meta``'s archive into the directory ``work``, unpack it into ``work/tree`` and return that,
        its ``checksum(tree)`` checked against the one the server sent and the one it recorded for ``meta``.
        ``what`` names what is downloaded (``artifact``: ``/versions/N/artifact``) and how its checksum was
        recorded (``registered``).

        Raises:
            InvalidArchive (code checksum_mismatch): what arrived is damaged or does not match.
        """
        shown = f"the downloaded {what[0]} of {name} version {meta.version}"
        archive, tree = work / f"{what[0]}.tar.gz", work / "tree"
        path, params = self._path(name, f"/versions/{meta.version}/{what[0]}")
        headers = self._t.download(path, archive, params=params, progress=progress)
        expected = headers.get(ARTIFACT_SHA256_HEADER) or meta.sha256
        tree.mkdir()
        try:
            with tarfile.open(archive, "r:gz") as tf:
                tarsafe.extractall(tf, tree)
            archive.unlink()
            got = checksum(tree)
        except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as exc:
            raise InvalidArchive(f"{shown} is damaged ({exc}); try again", code="checksum_mismatch") from None
        if got != expected or expected != meta.sha256:
            raise InvalidArchive(
                f"{shown} does not match its checksum ({what[1]} {meta.sha256}, received {got}); the stored copy "
                "may be damaged",
                code="checksum_mismatch",
            )
        return tree
