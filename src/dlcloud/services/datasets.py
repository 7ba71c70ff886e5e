"""The sample library: datasets with numbered immutable versions, labels, read-only sharing, and the versions
jobs read.

Rules (this module is the only writer of the dataset tables):
- Datasets are tenant-scoped. Another tenant's dataset is visible only when shared with the caller's tenant,
  and then only for reading (describe, versions, files, download, and reading it in a job); any change is 403.
  One not shared is 404 ``dataset_not_found``, exactly like one that does not exist; ``share`` answers the
  same whether or not the named tenant exists.
- Versions are numbered 1, 2, ... per dataset from ``datasets.last_version`` under the dataset row's lock; a
  deleted version's number is never given again. A version is a tree in the object store under
  ``datasets/<tenant>/<dataset>/<version>`` with its manifest (path, size, SHA-256 of every file); its
  checksum is the manifest's (``dlcloud.checksums``). A push that fails leaves no row and no stored tree.
  A version registered in place from a bucket (``source_url``) has only its manifest there, naming the source
  its files are read from; it is readable once ``ready`` (``services/dataset_sources.py`` owns that state).
- A job names the data it reads (``NAME``, ``NAME@VERSION``, ``NAME@LABEL``, ``OWNER/`` for a shared one);
  the reference is resolved to one version when the job is submitted and recorded (``job_datasets``). A
  version a job that has not ended reads cannot be deleted (409 ``dataset_in_use``), nor its dataset.
- Any member pushes versions and moves labels; deleting and sharing are for the dataset's author or a
  tenant admin.
"""

from __future__ import annotations

import logging
import re
import secrets
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from dlcloud import tarsafe
from dlcloud.errors import (
    DatasetInUse,
    DatasetNotFound,
    DatasetVersionNotFound,
    DatasetVersionNotReady,
    DlcloudError,
    InvalidArchive,
    InvalidArgument,
)
from dlcloud.schemas.common import NAME_RE
from dlcloud.schemas.datasets import (
    DATASET_REF_RE,
    DATASET_UPLOAD_ID_RE,
    Dataset,
    DatasetDetail,
    DatasetFile,
    DatasetLabel,
    DatasetPush,
    DatasetShare,
    DatasetUpload,
    DatasetVersion,
    DatasetVersionState,
)
from dlcloud.schemas.datasets import dataset_env_name as env_name
from dlcloud.schemas.jobs import JobState, ResolvedDataset
from dlcloud.services import job_states, registry, storage_quota, uploads
from dlcloud.services.auth import Caller
from dlcloud.services.code import upload_scratch_dir
from dlcloud.services.platform import Platform
from dlcloud.services.registry_access import Registry, shown_name
from dlcloud.storage.archives import ArchiveLimits, failure_text, validate_tar
from dlcloud.storage.artifacts import iter_stored_tree
from dlcloud.storage.objects import Manifest, ObjectStore, scan_tree
from dlcloud.store import datasets as store
from dlcloud.store import uploads as upload_store
from dlcloud.store.db import Database
from dlcloud.store.ids import looks_like_id, reserved_name_message
from dlcloud.store.rows import DatasetRow, DatasetVersionRow, UploadClaimRow, utcnow

log = logging.getLogger(__name__)
FILES_PAGE, FILES_PAGE_MAX = 1000, 10_000  # files listed per page of GET .../files: by default, at most
# the claim of a dataset upload (uploads.upload_key): tenant id, upload id
UPLOAD_KEY_RE = re.compile(r"^uploads/([A-Za-z0-9_-]{1,64})/(du-[a-z0-9]{16})\.tar\.gz$")


def version_key(tenant_id: str, dataset_id: str, version: int) -> str:
    """Where a version registered in place keeps its manifest (and where pushed versions were stored before
    pushes were named by their upload: rows keep the key they were given)."""
    return f"datasets/{tenant_id}/{dataset_id}/{version}"


def push_prefix(tenant_id: str, upload_id: str) -> str:
    """Below this prefix a push from upload ``upload_id`` stores its version (at a name of its own, so that two
    pushes of one upload never share files). Named by the upload, which the push holds claimed
    (``uploads.use_upload``) from before its files are stored until its row is committed: a claim left by a
    crash names the files that no version references (``sweep_abandoned_pushes``)."""
    return f"datasets/{tenant_id}/pushes/{upload_id}"


def sweep_abandoned_pushes(db: Database, objects: ObjectStore, max_age_seconds: float) -> int:
    """Remove what pushes killed mid-way stored (the files of no version) and their claims, once the claim is
    older than ``max_age_seconds`` (the uploads' time to live: a live push renews nothing, so the age must
    exceed the longest push). Returns how many were removed."""
    cutoff = utcnow() - timedelta(seconds=max_age_seconds)
    with db.read() as s:
        stale = upload_store.stale_claims(s, cutoff)
    removed = 0
    for claim in stale:
        m = UPLOAD_KEY_RE.match(claim)
        with db.write() as s:
            row = s.get(UploadClaimRow, claim, with_for_update=True)
            if row is None or row.claimed_at > cutoff:
                continue  # released or taken over meanwhile
            if m is not None:
                prefix = push_prefix(m.group(1), m.group(2))
                if not store.has_version_under(s, prefix):
                    objects.delete_prefix(prefix)  # before the claim goes: a failure retries next sweep
                    removed += 1
                else:  # a push of it committed (its upload's deletion failed): what else is there stays
                    log.warning("upload %s made a version; files of other pushes of it are left", m.group(2))
            s.delete(row)
    return removed


def _limits(platform: Platform) -> ArchiveLimits:
    return ArchiveLimits(platform.settings.max_unpacked_bytes, platform.settings.max_archive_members)


# -- uploads ---------------------------------------------------------------------------------------------


async def upload_data(platform: Platform, caller: Caller, incoming: uploads.Incoming) -> DatasetUpload:
    """Receive a .tar(.gz) of the dataset's files (paths inside it are the paths in the dataset)."""
    limits = _limits(platform)

    def check(tmp: Path) -> dict[str, Any]:
        validate_tar(tmp, limits)  # the files' paths and sizes: a dataset's upload answers nothing more
        return {}

    return await uploads.store_upload(platform, caller, incoming, "du-", check, DatasetUpload)


def delete_upload(platform: Platform, caller: Caller, upload_id: str) -> None:
    uploads.delete_upload(platform, caller, upload_id, DATASET_UPLOAD_ID_RE)


def _unpack(archive: Path, dest: Path, limits: ArchiveLimits) -> Manifest:
    """Unpack a validated archive into ``dest`` and return the manifest of its files."""
    validate_tar(archive, limits)
    try:
        with tarfile.open(archive, mode="r:*") as tf:
            tarsafe.extractall(tf, dest)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidArchive(f"cannot unpack the archive: {failure_text(exc, dest)}") from None
    try:
        manifest = scan_tree(dest)
    except ValueError as exc:
        raise InvalidArchive(str(exc)) from None
    if not manifest.entries:
        raise InvalidArchive("the archive holds no file: a dataset version needs at least one")
    return manifest


# -- resolving names ---------------------------------------------------------------------------------------


def _is_shared(s: Session, dataset: DatasetRow, tenant_id: str) -> bool:
    return store.is_shared(s, dataset.id, tenant_id)


DATASETS = Registry("dataset", store.get_dataset, _is_shared, DatasetNotFound)
_readable = DATASETS.readable


def _bad_ref(ref: str, shown: str) -> InvalidArgument:
    return InvalidArgument(f"{ref!r} is not a version: give a number, a label or 'latest'")


def _end_share(s: Session, caller: Caller, dataset: DatasetRow, name: str, tenant_id: str) -> None:
    _end_readers(s, dataset, tenant_id, f"dataset '{caller.tenant}/{name}' is no longer shared with it")


REGISTRY = registry.Versioned(
    DATASETS,
    store.TABLES,
    "storage_key",
    DatasetVersionNotFound,
    _bad_ref,
    ("moving labels", "moving labels"),
    _end_share,
    (DatasetLabel, DatasetShare),
)
_find_version = REGISTRY.find_version


def _readers_shown(readers: list[tuple[str, str]], tenant_id: str) -> list[str]:
    """The caller's own jobs by name; other tenants' jobs only counted (their names are theirs)."""
    own = [job for job, tenant in readers if tenant == tenant_id]
    others = len(readers) - len(own)
    return own + ([f"{others} job(s) of other tenants"] if others else [])


def _version_models(
    s: Session, caller: Caller, dataset: DatasetRow, shown: str, owner: str, rows: list[DatasetVersionRow]
) -> list[DatasetVersion]:
    fields = registry.VersionFields(s, store.TABLES, dataset.id, rows)
    in_use = store.readers(s, [r.id for r in rows])
    return [
        DatasetVersion(
            **fields.of(r),
            dataset=shown,
            owner=owner,
            file_count=r.file_count,
            in_use_by=_readers_shown(in_use[r.id], caller.tenant_id),
            state=DatasetVersionState(r.state),
            state_reason=r.state_reason,
            source=r.source_url,
        )
        for r in rows
    ]


# -- push ------------------------------------------------------------------------------------------------


def check_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise InvalidArgument(
            f"{name!r} is not a valid dataset name: use 1-63 lower-case letters, digits and '-', starting and "
            "ending with a letter or digit (a DNS-1123 label)"
        )
    if looks_like_id(name):
        raise InvalidArgument(reserved_name_message("dataset", name))


def push_upload(
    platform: Platform, caller: Caller, name: str, req: DatasetPush, owner: str | None = None
) -> DatasetVersion:
    """Add a version from the upload ``req.upload`` (creating the dataset with its first); a push from
    ``req.source`` is ``services/dataset_sources.py``'s (``push_version`` picks). Blocking: run it in a worker
    thread."""
    check_name(name)
    assert req.upload is not None
    REGISTRY.check_writable(platform, caller, name, owner, "pushing versions")
    scratch_root = upload_scratch_dir(platform.settings)
    with (
        tempfile.TemporaryDirectory(dir=scratch_root) as scratch,
        uploads.use_upload(platform, caller, req.upload, DATASET_UPLOAD_ID_RE, Path(scratch), "a push", "the data") as (
            upload,
            archive,
        ),
    ):
        # what it would unpack to must fit the storage quota before a byte of it is written
        declared = validate_tar(archive, _limits(platform))
        with platform.db.write() as s:
            storage_quota.check_fits(s, caller.tenant_id, caller.tenant, declared)
        tree = Path(scratch) / "tree"
        tree.mkdir()
        manifest = _unpack(archive, tree, _limits(platform))
        archive.unlink()
        version = _insert_version(platform, caller, name, req, tree, manifest, req.upload)
        try:
            platform.objects.delete(upload)
        except DlcloudError as exc:  # the version exists: the upload goes with the housekeeping instead
            log.error("dataset upload %s used but not deleted: %s", req.upload, exc.message)
    return version


def _insert_version(
    platform: Platform, caller: Caller, name: str, req: DatasetPush, tree: Path, manifest: Manifest, upload_id: str
) -> DatasetVersion:
    """Store the tree (under the upload's name, no write transaction open meanwhile: on SQLite it would stop
    every other write for that long), then add the version (``add_version``). Nothing of it is visible before
    that commit; a failure before it removes what was stored, a crash leaves it to ``sweep_abandoned_pushes``."""
    key = f"{push_prefix(caller.tenant_id, upload_id)}/{secrets.token_hex(8)}"

    def row(dataset: DatasetRow, number: int) -> DatasetVersionRow:
        return version_row(
            caller,
            req,
            dataset,
            number,
            storage_key=key,
            sha256=manifest.artifact_sha256(),
            size_bytes=manifest.size,
            file_count=len(manifest.entries),
        )

    try:
        platform.objects.put_tree(key, tree, manifest)
        return add_version(platform, caller, name, req, manifest.size, row)
    except BaseException:
        _remove_stored(platform, [key])
        raise


def version_row(caller: Caller, req: DatasetPush, dataset: DatasetRow, number: int, **fields: Any) -> DatasetVersionRow:
    """A new version row of ``dataset`` numbered ``number``, by the caller, with ``fields`` (key, checksum...)."""
    row: DatasetVersionRow = registry.new_version_row(
        store.TABLES, caller, dataset.id, number, req.description, "dv-", **fields
    )
    return row


def add_version(
    platform: Platform,
    caller: Caller,
    name: str,
    req: DatasetPush,
    size: int,
    make_row: Callable[[DatasetRow, int], DatasetVersionRow],
) -> DatasetVersion:
    """In one write transaction: the storage quota checked for ``size`` more bytes, the dataset created if it
    does not exist, the next number taken, and the row ``make_row(dataset, number)`` added."""

    def add() -> DatasetVersion:
        with platform.db.write() as s:
            dataset, number, _ = registry.take_number(s, caller, store.TABLES, name, req.description, size, "ds-")
            row = make_row(dataset, number)
            s.add(row)
            s.flush()
            [result] = _version_models(s, caller, dataset, name, caller.tenant, [row])
        return result

    return registry.retry_on_conflict(add)


# -- reads -----------------------------------------------------------------------------------------------


READS = registry.Reads(REGISTRY, Dataset, DatasetDetail, _version_models)
list_datasets = READS.list_entries
describe_dataset = READS.describe
list_versions = READS.list_versions
get_version = READS.get_version
_get_version = READS.version_and_key


def require_ready(version: DatasetVersion) -> None:
    """A version's files can be read only once it is ready (409 ``dataset_version_not_ready`` otherwise)."""
    if version.state == DatasetVersionState.READY:
        return
    shown = f"{version.dataset}@{version.version}"
    if version.state == DatasetVersionState.PENDING:
        raise DatasetVersionNotReady(
            f"version {version.version} of dataset {version.dataset!r} is being registered in place from "
            f"{version.source}: its manifest is computed by reading every object; wait until "
            f"'dlcloud datasets describe {shown}' shows it ready",
            details={"state": version.state.value},
        )
    raise DatasetVersionNotReady(
        f"version {version.version} of dataset {version.dataset!r} failed to register from {version.source} and "
        f"can never be read: {version.state_reason}; delete it and register the data again",
        details={"state": version.state.value, "reason": version.state_reason},
    )


def _manifest(objects: ObjectStore, key: str, version: DatasetVersion) -> Manifest:
    what = f"the files of version {version.version} of dataset {version.dataset!r}"
    return registry.stored_manifest(objects, key, what, "are")


def list_files(
    platform: Platform,
    caller: Caller,
    name: str,
    ref: str,
    owner: str | None = None,
    *,
    limit: int | None = None,
    after: str | None = None,
) -> tuple[DatasetVersion, list[DatasetFile]]:
    """The version's manifest: its files with their size and SHA-256, sorted by path (as the manifest keeps
    them: by the path's UTF-8 bytes); at most ``limit`` of them, those after the path ``after``."""
    version, key = _get_version(platform, caller, name, ref, owner)
    require_ready(version)
    manifest = _manifest(platform.objects, key, version)
    entries = manifest.entries
    if after is not None:
        start = after.encode("utf-8", "surrogateescape")
        lo, hi = 0, len(entries)
        while lo < hi:  # the first entry sorting after ``after``
            mid = (lo + hi) // 2
            if entries[mid].path.encode("utf-8", "surrogateescape") <= start:
                lo = mid + 1
            else:
                hi = mid
        entries = entries[lo:]
    if limit is not None:
        entries = entries[:limit]
    return version, [DatasetFile(path=e.path, size=e.size, sha256=e.sha256) for e in entries]


def open_version(
    platform: Platform, caller: Caller, name: str, ref: str, owner: str | None = None
) -> tuple[DatasetVersion, Iterator[bytes]]:
    """The version and its files as a .tar.gz stream (paths as in the dataset; checksum ``version.sha256``)."""
    version, key = _get_version(platform, caller, name, ref, owner)
    require_ready(version)
    objects = platform.objects
    manifest = _manifest(objects, key, version)
    return version, iter_stored_tree(objects, key, manifest)


# -- labels and shares -----------------------------------------------------------------------------------


set_label = REGISTRY.set_label
remove_label = REGISTRY.remove_label
share_dataset = REGISTRY.share
unshare_dataset = REGISTRY.unshare


def _end_readers(s: Session, dataset: DatasetRow, tenant_id: str, why: str) -> None:
    """The jobs of ``tenant_id`` that read ``dataset`` and have not ended lose it: queued ones fail, running
    ones are cancelled (their stop is sent by the control loop); they hold its versions no longer."""
    version_ids = [v.id for v in store.list_versions(s, dataset.tenant_id, dataset.id)]
    for job in store.reading_jobs(s, version_ids, tenant_id):
        if job.state in store.QUEUED_JOB_STATES:
            job_states.transition(s, job, JobState.FAILED, why)
        else:
            job.cancel_requested = True
            job.reason = f"cancellation requested: {why}"
        store.forget_job_reads(s, job.id)


# -- deletion --------------------------------------------------------------------------------------------


def _refuse_if_in_use(s: Session, caller: Caller, rows: list[DatasetVersionRow], what: str) -> None:
    readers = store.readers(s, [r.id for r in rows])
    held = [(r.version, job, tenant) for r in rows for job, tenant in readers[r.id]]
    if held:
        own = sorted({job for _v, job, tenant in held if tenant == caller.tenant_id})
        others = len({(job, tenant) for _v, job, tenant in held if tenant != caller.tenant_id})
        named = ", ".join([f"v{v} by job {job}" for v, job, tenant in held if tenant == caller.tenant_id][:5])
        parts = [p for p in (named, f"{others} job(s) of tenants it is shared with" if others else "") if p]
        raise DatasetInUse(
            f"{what} is read by jobs that have not ended ({'; '.join(parts)}); wait for them or cancel them",
            details={"jobs": own, "other_tenants_jobs": others},
        )


def _forget_ended_readers(s: Session, version_ids: list[str]) -> None:
    """Ended jobs' records of what they read go with the version (the job keeps its resolved spec)."""
    if version_ids:
        store.forget_version_reads(s, version_ids)
        s.flush()


def _release(s: Session, caller: Caller, rows: list[DatasetVersionRow], what: str) -> None:
    _refuse_if_in_use(s, caller, rows, what)
    _forget_ended_readers(s, [r.id for r in rows])


DELETION = registry.Deletion(REGISTRY, _release, "dataset version")
delete_version = DELETION.delete_version
_remove_stored = DELETION.remove_stored


def delete_dataset(platform: Platform, caller: Caller, name: str, owner: str | None = None) -> None:
    """Delete the dataset with all its versions, labels, shares and files."""
    dataset_id = DELETION.delete(platform, caller, name, owner)
    prefix = f"datasets/{caller.tenant_id}/{dataset_id}"
    try:  # whatever a crashed push left under the dataset's prefix
        platform.objects.delete_prefix(prefix)
    except Exception:
        log.exception("could not remove %s from %s", prefix, platform.objects.url)


# -- jobs ------------------------------------------------------------------------------------------------


def resolve_for_job(s: Session, caller: Caller, refs: list[str]) -> list[ResolvedDataset]:
    """Resolve a job's references (in its submit transaction): each to one readable version, no dataset twice.
    The job keeps them in its ``platform_state``."""
    out: list[ResolvedDataset] = []
    seen: dict[str, str] = {}
    for ref in refs:
        m = DATASET_REF_RE.match(ref)
        if m is None:
            raise InvalidArgument(
                f"dataset {ref!r} is not a reference: give NAME, NAME@VERSION or NAME@LABEL "
                "(OWNER/NAME for a shared one)"
            )
        owner, name, version_ref = m.group("owner"), m.group("name"), m.group("ref") or "latest"
        variable = env_name(name)
        if variable in seen:
            raise InvalidArgument(
                f"datasets {seen[variable]!r} and {ref!r} would both be {variable} in the job: give each dataset once"
            )
        seen[variable] = ref
        dataset, owner_name = _readable(s, caller, name, owner)
        shown = shown_name(name, owner_name, caller)
        row = _find_version(s, dataset, version_ref, shown)
        if row.state != DatasetVersionState.READY.value:
            [version] = _version_models(s, caller, dataset, shown, owner_name, [row])
            require_ready(version)
        kept = {
            "version": row.version,
            "storage_key": row.storage_key,
            "sha256": row.sha256,
            "size_bytes": row.size_bytes,
        }
        out.append(ResolvedDataset(ref=ref, name=name, owner=owner_name, version_id=row.id, **kept))
    return out
