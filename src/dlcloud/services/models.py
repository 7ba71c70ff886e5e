"""The model registry: register versions, read them, move labels, share, delete.

The registry is four modules: this one (versions, labels, shares, deletion), ``model_access`` (names resolved
to rows: who may read and who may change a model), ``model_signatures`` (declared signatures validated, missing
ones inferred by a process the executor runs: ``Executor.inspect_model``) and ``model_leases`` (deployment
leases, which stop a served version from being deleted).

Rules (these modules are the only writers of the registry tables):
- Models are tenant-scoped; a model shared with another tenant is read-only there (``model_access``).
- Versions are numbered 1, 2, ... per model from ``models.last_version``, under the model row's lock; a
  deleted version's number is never given again. Artifacts are immutable trees in the object store
  (``storage/objects.py``) under ``models/<tenant>/<model>/<version>``; uploads wait for their register
  under ``uploads/<tenant>/<id>.tar.gz`` (at most ``model_upload_ttl_seconds``).
- Any member registers versions and moves labels; deleting a model or a version is for its author or a
  tenant admin; sharing is for the model's author or a tenant admin.
- A deployed version or its model cannot be deleted (409 ``model_deployed``, ``model_leases``). Unsharing a
  model ends the leases of the tenant it was shared with.
- A declared signature is validated (400 ``invalid_signature``); without one it is inferred in a process of
  its own, and a register whose inference fails stores the version without a signature (``model_signatures``).
- A version's ``executes_code`` is derived from its format (``schemas.models.CODE_FORMATS``), never stored.
- A register that fails leaves no rows and no stored artifact.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import anyio
from sqlalchemy.orm import Session

from dlcloud.errors import InvalidArgument, ModelNotFound, NotFound
from dlcloud.executors.outputs import BAD_NAME, LINK, load_left_out
from dlcloud.schemas.models import (
    UPLOAD_ID_RE,
    FromJob,
    Model,
    ModelDetail,
    ModelRegister,
    ModelUpload,
    ModelVersion,
    executes_code,
)
from dlcloud.services import registry, storage_quota, uploads
from dlcloud.services.auth import Caller
from dlcloud.services.code import upload_scratch_dir
from dlcloud.services.isolation import require_isolation
from dlcloud.services.job_keys import outputs_key
from dlcloud.services.model_access import MODEL_REGISTRY
from dlcloud.services.model_leases import deployment_model, live_leases, refuse_if_deployed
from dlcloud.services.model_signatures import check_format, check_signature, infer_signature
from dlcloud.services.platform import Platform
from dlcloud.storage.archives import ArchiveLimits, validate_tar
from dlcloud.storage.artifacts import ArtifactStore, StagedArtifact, archive_top_level, iter_stored_tree
from dlcloud.storage.objects import ObjectMissing
from dlcloud.store import jobs as job_store
from dlcloud.store import models as store
from dlcloud.store.ids import looks_like_id, reserved_name_message
from dlcloud.store.rows import (
    JobRow,
    ModelDeploymentRow,
    ModelRow,
    ModelVersionRow,
)

log = logging.getLogger(__name__)


def artifact_store(platform: Platform) -> ArtifactStore:
    """Where artifacts are received and checked on this host before they are stored."""
    s = platform.settings
    return ArtifactStore(s.data_dir / "tmp" / "models", ArchiveLimits(s.max_unpacked_bytes, s.max_archive_members))


def version_key(tenant_id: str, model_id: str, version: int) -> str:
    return f"models/{tenant_id}/{model_id}/{version}"


def _check_output_path(path: str) -> PurePosixPath:
    if "\x00" in path or "\\" in path:
        raise InvalidArgument("path must not contain NUL or backslash characters")
    rel = PurePosixPath(path)
    if rel.is_absolute():
        raise InvalidArgument(f"path {path!r} must be relative to the job's output directory, not absolute")
    if ".." in rel.parts:
        raise InvalidArgument(f"path {path!r} must stay inside the job's output directory; '..' is not allowed")
    if not rel.parts:
        raise InvalidArgument("path must name a file or directory inside the job's output directory")
    return rel


# -- uploads ---------------------------------------------------------------------------------------------


async def upload_artifact(platform: Platform, caller: Caller, incoming: uploads.Incoming) -> ModelUpload:
    """Receive a .tar.gz holding one file or directory; it waits (at most the upload TTL) for a register."""
    artifacts = artifact_store(platform)
    await anyio.to_thread.run_sync(artifacts.sweep, platform.settings.model_upload_ttl_seconds)

    def check(tmp: Path) -> dict[str, Any]:
        validate_tar(tmp, artifacts.limits)
        return {"artifact": archive_top_level(tmp)}

    return await uploads.store_upload(platform, caller, incoming, "mu-", check, ModelUpload)


def delete_upload(platform: Platform, caller: Caller, upload_id: str) -> None:
    uploads.delete_upload(platform, caller, upload_id, UPLOAD_ID_RE)


# -- read models -----------------------------------------------------------------------------------------


def _version_models(
    s: Session, viewer: Caller, model: ModelRow, shown: str, owner: str, rows: list[ModelVersionRow]
) -> list[ModelVersion]:
    """Read models of versions as ``viewer`` sees them: the owner sees every lease, another tenant its own."""
    deployments = live_leases(s, [r.id for r in rows])
    own = viewer.tenant_id == model.tenant_id
    shown_leases = {
        version_id: [(d, t) for d, t in leases if own or d.tenant_id == viewer.tenant_id]
        for version_id, leases in deployments.items()
    }
    holders = [d.holder_id for leases in shown_leases.values() for d, _ in leases if d.tenant_id == viewer.tenant_id]
    fields = registry.VersionFields(s, store.TABLES, model.id, rows, holders)

    def holder(d: ModelDeploymentRow) -> str | None:
        if d.tenant_id != viewer.tenant_id or not d.holder_id:
            return None
        return fields.users.get(d.holder_id, d.holder_id)

    return [
        ModelVersion(
            **fields.of(r),
            model=shown,
            owner=owner,
            format=r.format,
            executes_code=executes_code(r.format),
            artifact=r.artifact_name,
            signature=r.signature,
            metrics=r.metrics or {},
            source_job=r.source_job_name,
            source_job_id=r.source_job_id,
            source_path=r.source_path,
            deployments=[deployment_model(d, t, holder(d)) for d, t in shown_leases[r.id]],
            deployed=bool(deployments[r.id]),
        )
        for r in rows
    ]


# -- register --------------------------------------------------------------------------------------------


def _stage_from_job(
    platform: Platform, artifacts: ArtifactStore, caller: Caller, src: FromJob
) -> tuple[StagedArtifact, JobRow]:
    """The file or directory ``src.path`` of the job's outputs as its latest ended attempt left them (saved
    into the object store by the executor when the attempt ended)."""
    rel = _check_output_path(src.path)
    with platform.db.read() as s:
        job = job_store.get_job(s, caller.tenant_id, src.job)
        if job is None:
            raise NotFound(f"job {src.job!r} not found")
        s.expunge(job)
        ended = job_store.ended_attempts(s, job.id)
    for number in reversed(ended):
        key = outputs_key(job.tenant_id, job.id, number)
        try:
            manifest = platform.objects.tree_manifest(key)
        except ObjectMissing:
            continue
        _refuse_left_out(load_left_out(platform.objects, key), rel, job.name)
        try:
            return artifacts.stage_stored(platform.objects, key, manifest, rel.as_posix(), src.path), job
        except InvalidArgument as exc:
            if exc.message.startswith("no file or directory"):
                raise InvalidArgument(f"no file or directory {src.path!r} in the outputs of job {job.name!r}") from None
            raise
    when = "" if ended else " (outputs are saved when an attempt ends)"
    raise InvalidArgument(f"job {job.name!r} has no saved outputs (state {job.state}){when}; nothing to register")


def _refuse_left_out(left_out: dict[str, str], rel: PurePosixPath, job_name: str) -> None:
    """A path that is, goes through or holds something the saved outputs left out (a link, a FIFO...) is
    refused with what it was: links are never followed out of the outputs nor copied into an artifact."""
    for i in range(1, len(rel.parts) + 1):
        part = PurePosixPath(*rel.parts[:i]).as_posix()
        kind = left_out.get(part)
        if kind == LINK:
            raise InvalidArgument(
                f"{part!r} in the outputs of job {job_name!r} is a symbolic link; register the file or directory itself"
            )
        if kind is not None:
            raise InvalidArgument(_left_out_message(part, kind))
    inside = sorted(p for p in left_out if p.startswith(rel.as_posix() + "/"))
    if inside and left_out[inside[0]] == LINK:
        raise InvalidArgument(
            f"{inside[0]} is a symbolic link; links are not copied into a model artifact (write the file itself)"
        )
    if inside:
        raise InvalidArgument(_left_out_message(inside[0], left_out[inside[0]]))


def _left_out_message(path: str, kind: str) -> str:
    if kind == BAD_NAME:
        return (
            f"{path!r} was not saved with the job's outputs: its name is not UTF-8, too long or too deep, or "
            "reserved (.dlcloud-*); rename it"
        )
    return f"{path} is a device, FIFO or socket; only regular files and directories"


def _insert_version(
    platform: Platform,
    caller: Caller,
    req: ModelRegister,
    signature: dict[str, Any] | None,
    staged: StagedArtifact,
    job: JobRow | None,
) -> ModelVersion:
    """Three steps, so that no write transaction is open while the artifact is stored and inspected (on SQLite
    it would stop every other write for that long): take the next number (creating the model), store the tree
    under it (and infer a signature not declared, from the stored tree), then add the version's row. A failure
    after the first step removes what it stored and a model it created; the number it took is not given again
    (numbers are never reused anyway)."""
    model_id, number, created = _take_number(platform, caller, req, staged.digest.size)
    key = version_key(caller.tenant_id, model_id, number)
    try:
        platform.objects.put_tree(key, staged.dir)
        artifact_store(platform).discard(staged)  # stored: its staged copy is not kept while it is inspected
        if signature is None and platform.executor is not None:
            # inferred from the stored tree, where the executor runs it (no file of this host crosses to it)
            timeout = platform.settings.model_inspect_timeout_seconds
            signature = infer_signature(platform.executor, key, staged.name, req.format, timeout)
        with platform.db.write() as s:
            storage_quota.check_fits(s, caller.tenant_id, caller.tenant, staged.digest.size)
            model = s.get(ModelRow, model_id, with_for_update=True)
            if model is None:
                raise ModelNotFound(f"model {req.name!r} was deleted while this version was stored")
            row = registry.new_version_row(
                store.TABLES,
                caller,
                model_id,
                number,
                req.description,
                "mv-",
                format=req.format,
                artifact_name=staged.name,
                artifact_key=key,
                sha256=staged.digest.sha256,
                size_bytes=staged.digest.size,
                signature=signature,
                metrics=dict(req.metrics),
                source_job_id=job.id if job else None,
                source_job_name=job.name if job else None,
                source_path=req.from_job.path if req.from_job else None,
            )
            s.add(row)
            s.flush()
            [result] = _version_models(s, caller, model, req.name, caller.tenant, [row])
        return result
    except BaseException:
        _remove_stored(platform, [key])
        if created:
            with platform.db.write() as s:
                model = s.get(ModelRow, model_id, with_for_update=True)
                if model is not None and not store.list_versions(s, caller.tenant_id, model_id):
                    s.delete(model)
        raise


def _take_number(platform: Platform, caller: Caller, req: ModelRegister, size: int) -> tuple[str, int, bool]:
    """(model id, the version number taken, whether the model was created now)."""

    def take() -> tuple[str, int, bool]:
        with platform.db.write() as s:
            model, number, created = registry.take_number(
                s, caller, store.TABLES, req.name, req.description, size, "m-"
            )
            return model.id, number, created

    return registry.retry_on_conflict(take)


def register_model(platform: Platform, caller: Caller, req: ModelRegister, owner: str | None = None) -> ModelVersion:
    """Add a version (creating the model with its first version). Blocking: run it in a worker thread."""
    if looks_like_id(req.name):
        raise InvalidArgument(reserved_name_message("model", req.name))
    check_format(req.format)
    signature = check_signature(req.signature) if req.signature is not None else None
    MODEL_REGISTRY.check_writable(platform, caller, req.name, owner, "registering versions")
    artifacts = artifact_store(platform)
    with contextlib.ExitStack() as stack:
        upload = None
        job = None
        if req.upload is not None:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(dir=upload_scratch_dir(platform.settings)))
            upload, local = stack.enter_context(
                uploads.use_upload(
                    platform, caller, req.upload, UPLOAD_ID_RE, Path(scratch), "a register", "the artifact"
                )
            )
            # what it would unpack to must fit the storage quota before a byte of it is written
            declared = validate_tar(local, artifacts.limits)
            with platform.db.write() as s:
                storage_quota.check_fits(s, caller.tenant_id, caller.tenant, declared)
            staged = artifacts.stage_archive(local)
        else:
            assert req.from_job is not None  # the request model requires one source
            staged, job = _stage_from_job(platform, artifacts, caller, req.from_job)
        try:
            executor = platform.executor
            if signature is None and executes_code(req.format) and not (executor and executor.inspects_sandboxed):
                # inspecting it would run its author's code bare: only where that harms no other tenant
                require_isolation(platform, caller, "inferring the signature of a model whose loading runs code")
            version = _insert_version(platform, caller, req, signature, staged, job)
        finally:
            artifacts.discard(staged)
        if upload is not None:
            platform.objects.delete(upload)
    return version


# -- reads -----------------------------------------------------------------------------------------------


READS = registry.Reads(MODEL_REGISTRY, Model, ModelDetail, _version_models)
list_models = READS.list_entries
describe_model = READS.describe
list_versions = READS.list_versions
get_version = READS.get_version


def open_artifact(
    platform: Platform, caller: Caller, name: str, ref: str, owner: str | None = None
) -> tuple[ModelVersion, Iterator[bytes]]:
    """The version and its artifact as a .tar.gz stream (the checksum is ``version.sha256``)."""
    version, key = READS.version_and_key(platform, caller, name, ref, owner)
    objects = platform.objects
    manifest = registry.stored_manifest(
        objects, key, f"the artifact of version {version.version} of model {version.model!r}"
    )
    return version, iter_stored_tree(objects, key, manifest)


# -- labels and shares -----------------------------------------------------------------------------------


set_label = MODEL_REGISTRY.set_label
remove_label = MODEL_REGISTRY.remove_label
share_model = MODEL_REGISTRY.share
unshare_model = MODEL_REGISTRY.unshare


# -- deletion --------------------------------------------------------------------------------------------


def _release(s: Session, caller: Caller, rows: list[ModelVersionRow], what: str) -> None:
    refuse_if_deployed(s, rows, what)  # the leases go with the rows (ON DELETE CASCADE)


DELETION = registry.Deletion(MODEL_REGISTRY, _release, "model artifact")
delete_version = DELETION.delete_version
_remove_stored = DELETION.remove_stored


def delete_model(platform: Platform, caller: Caller, name: str, owner: str | None = None) -> None:
    """Delete the model with all its versions, labels, shares, leases and artifacts."""
    DELETION.delete(platform, caller, name, owner)
