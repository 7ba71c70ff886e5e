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
from collections.abc import AsyncIterator, Callable, Iterator
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
    Unavailable,
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
from dlcloud.services import job_states, storage_quota, uploads
from dlcloud.services.auth import Caller
from dlcloud.services.code import upload_scratch_dir
from dlcloud.services.platform import Platform
from dlcloud.services.registry import Deletion, Versioned, retry_on_conflict, take_number
from dlcloud.services.registry_access import Registry, shown_name
from dlcloud.storage.archives import ArchiveLimits, failure_text, validate_tar
from dlcloud.storage.artifacts import iter_stored_tree
from dlcloud.storage.objects import Manifest, ObjectMissing, ObjectStore, scan_tree
from dlcloud.store import datasets as store
from dlcloud.store import uploads as upload_store
from dlcloud.store.db import Database
from dlcloud.store.ids import looks_like_id, new_id, reserved_name_message
from dlcloud.store.models import user_names
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


async def upload_data(
    platform: Platform,
    caller: Caller,
    *,
    declared_sha256: str,
    content_length: int | None,
    chunks: AsyncIterator[bytes],
) -> DatasetUpload:
    """Receive a .tar(.gz) of the dataset's files (paths inside it are the paths in the dataset)."""
    limits = _limits(platform)
    upload_id, size, _ = await uploads.store_upload(
        platform,
        caller,
        id_prefix="du-",
        declared_sha256=declared_sha256,
        content_length=content_length,
        chunks=chunks,
        check=lambda tmp: validate_tar(tmp, limits),
    )
    expires = utcnow() + timedelta(seconds=platform.settings.model_upload_ttl_seconds)
    return DatasetUpload(id=upload_id, sha256=declared_sha256, size=size, expires_at=expires)


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
_writable = DATASETS.writable


def _bad_ref(ref: str, shown: str) -> InvalidArgument:
    return InvalidArgument(f"{ref!r} is not a version: give a number, a label or 'latest'")


def _end_share(s: Session, caller: Caller, dataset: DatasetRow, name: str, tenant_id: str) -> None:
    _end_readers(s, dataset, tenant_id, f"dataset '{caller.tenant}/{name}' is no longer shared with it")


REGISTRY = Versioned(
    DATASETS,
    store.TABLES,
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
    s: Session, dataset: DatasetRow, shown: str, owner: str, rows: list[DatasetVersionRow], caller_tenant_id: str
) -> list[DatasetVersion]:
    labels = store.labels_of(s, [dataset.id])[dataset.id]
    by_version: dict[str, list[str]] = {}
    for label, (version_id, _n) in labels.items():
        by_version.setdefault(version_id, []).append(label)
    users = user_names(s, [r.created_by for r in rows])
    in_use = store.readers(s, [r.id for r in rows])
    return [
        DatasetVersion(
            dataset=shown,
            owner=owner,
            version=r.version,
            sha256=r.sha256,
            size_bytes=r.size_bytes,
            file_count=r.file_count,
            description=r.description,
            created_by=users.get(r.created_by, r.created_by),
            created_at=r.created_at,
            labels=sorted(by_version.get(r.id, [])),
            in_use_by=_readers_shown(in_use[r.id], caller_tenant_id),
            state=DatasetVersionState(r.state),
            state_reason=r.state_reason,
            source=r.source_url,
        )
        for r in rows
    ]


def _datasets(s: Session, caller: Caller, rows: list[tuple[DatasetRow, str]]) -> list[Dataset]:
    ids = [d.id for d, _ in rows]
    stats = store.version_stats(s, ids)
    labels = store.labels_of(s, ids)
    shares = store.shares_of(s, ids)
    users = user_names(s, [d.created_by for d, _ in rows])
    out = []
    for d, owner in rows:
        count, newest, size = stats[d.id]
        own = owner == caller.tenant
        out.append(
            Dataset(
                name=shown_name(d.name, owner, caller),
                owner=owner,
                shared=not own,
                description=d.description,
                created_by=users.get(d.created_by, d.created_by),
                created_at=d.created_at,
                latest_version=newest,
                version_count=count,
                size_bytes=size,
                labels={label: n for label, (_id, n) in labels[d.id].items()},
                shared_with=[t for t, _ in shares[d.id]] if own else [],
            )
        )
    return out


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
    if owner is not None and owner != caller.tenant:
        with platform.db.read() as s:
            _writable(s, caller, name, owner, "pushing versions")
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
    return DatasetVersionRow(
        id=new_id("dv-"),
        dataset_id=dataset.id,
        tenant_id=caller.tenant_id,
        version=number,
        description=req.description,
        created_by=caller.user_id,
        created_at=utcnow(),
        **fields,
    )


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
            dataset, number, _ = take_number(s, caller, store.TABLES, name, req.description, size, "ds-")
            row = make_row(dataset, number)
            s.add(row)
            s.flush()
            [result] = _version_models(s, dataset, name, caller.tenant, [row], caller.tenant_id)
        return result

    return retry_on_conflict(add)


# -- reads -----------------------------------------------------------------------------------------------


def list_datasets(platform: Platform, caller: Caller) -> list[Dataset]:
    """The tenant's datasets, then those other tenants share with it (``OWNER/NAME``)."""
    with platform.db.read() as s:
        rows = [(d, caller.tenant) for d in store.list_datasets(s, caller.tenant_id)]
        rows += store.shared_datasets(s, caller.tenant_id)
        return _datasets(s, caller, rows)


def describe_dataset(platform: Platform, caller: Caller, name: str, owner: str | None = None) -> DatasetDetail:
    with platform.db.read() as s:
        dataset, owner_name = _readable(s, caller, name, owner)
        [base] = _datasets(s, caller, [(dataset, owner_name)])
        versions = store.list_versions(s, dataset.tenant_id, dataset.id)
        detail = _version_models(s, dataset, base.name, owner_name, versions, caller.tenant_id)
        return DatasetDetail(**base.model_dump(), versions=detail)


def list_versions(platform: Platform, caller: Caller, name: str, owner: str | None = None) -> list[DatasetVersion]:
    with platform.db.read() as s:
        dataset, owner_name = _readable(s, caller, name, owner)
        versions = store.list_versions(s, dataset.tenant_id, dataset.id)
        return _version_models(s, dataset, shown_name(name, owner_name, caller), owner_name, versions, caller.tenant_id)


def _get_version(
    platform: Platform, caller: Caller, name: str, ref: str, owner: str | None
) -> tuple[DatasetVersion, str]:
    with platform.db.read() as s:
        dataset, owner_name = _readable(s, caller, name, owner)
        shown = shown_name(name, owner_name, caller)
        row = _find_version(s, dataset, ref, shown)
        [version] = _version_models(s, dataset, shown, owner_name, [row], caller.tenant_id)
        return version, row.storage_key


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


def get_version(platform: Platform, caller: Caller, name: str, ref: str, owner: str | None = None) -> DatasetVersion:
    return _get_version(platform, caller, name, ref, owner)[0]


def _manifest(objects: ObjectStore, key: str, version: DatasetVersion) -> Manifest:
    try:
        return objects.tree_manifest(key)
    except ObjectMissing:
        log.error("dataset %s version %d is missing at %s in %s", version.dataset, version.version, key, objects.url)
        raise Unavailable(
            f"the files of version {version.version} of dataset {version.dataset!r} are missing from the server's "
            "storage; ask an administrator"
        ) from None


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


DELETION = Deletion(REGISTRY, _release, "storage_key", "dataset version")
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
            [version] = _version_models(s, dataset, shown, owner_name, [row], caller.tenant_id)
            require_ready(version)
        out.append(
            ResolvedDataset(
                ref=ref,
                name=name,
                owner=owner_name,
                version=row.version,
                version_id=row.id,
                storage_key=row.storage_key,
                sha256=row.sha256,
                size_bytes=row.size_bytes,
            )
        )
    return out
