"""The model registry: register artifacts, read versions, move labels, share, download, deployment leases.

Models are named and versioned as every registry's entries are (``client.registry``): ``NAME`` or
``OWNER/NAME``; a version by number, label or ``latest``.

from dlcloud.client import Client
c = Client.from_env()
v = c.models.register("mnist", "torchscript", artifact=Path("model.pt"), metrics={"accuracy": 0.98})
c.models.set_label("mnist", "production", v.version)
c.models.download("mnist", "production", dest=Path("models/"))
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlcloud.checksums import artifact_digest
from dlcloud.client import registry
from dlcloud.client.registry import RegistryAPI
from dlcloud.client.transport import API
from dlcloud.errors import AlreadyExists, InvalidArgument, UnknownFormat
from dlcloud.schemas import models as schemas
from dlcloud.schemas.models import DIRECTORY_MARKERS, FORMATS, format_from_name


def infer_format(path: Path | str, *, local: bool = True) -> str | None:
    """The format a path's name (and, for a local directory, its content) stands for; None if unknown.

    ``.pt``/``.pth``/``.torchscript`` torchscript, ``.onnx`` onnx, ``.joblib``/``.pkl`` sklearn,
    ``.json``/``.ubj`` xgboost; a directory holding ``saved_model.pb`` savedmodel, one holding
    ``predictor.py`` python. ``local=False`` looks at the name only (a path inside a job's outputs).
    """
    p = Path(path)
    if local and p.is_dir():
        for marker, fmt in DIRECTORY_MARKERS.items():
            if (p / marker).is_file():
                return fmt
        return None
    return format_from_name(str(p))


def unknown_format_error(what: str) -> UnknownFormat:
    return UnknownFormat(
        f"cannot recognise the model format of {what}; give --format, one of {', '.join(FORMATS)} "
        "(recognised: .pt/.pth/.torchscript, .onnx, .joblib/.pkl, .json/.ubj, a directory with saved_model.pb "
        "or predictor.py)"
    )


def pack_artifact(path: Path) -> Path:
    """A temporary .tar.gz holding ``path`` (a file or a directory) under its own name; the caller deletes it.

    Everything in a directory is packed, hidden files included (no ignore files apply to models). Links
    and special files are refused rather than skipped, so an artifact never silently misses a file.

    Raises:
        InvalidArgument: the path does not exist, or holds a link or a special file.
    """
    top = Path(os.path.abspath(path))
    if not top.exists():
        raise InvalidArgument(f"{path} does not exist")
    fd, name = tempfile.mkstemp(prefix="dlcloud-model-", suffix=".tar.gz")
    os.close(fd)
    archive = Path(name)

    try:
        with tarfile.open(archive, "w:gz", compresslevel=6) as tf:
            if top.is_file():
                registry.add_entry(tf, top.resolve(), top.name)
                return archive
            if not top.is_dir():
                raise InvalidArgument(f"{path} is not a regular file or a directory")
            registry.add_entry(tf, top.resolve(), top.name)
            for full, rel in registry.tree_entries(top.resolve(), top.name, "model artifacts"):
                registry.add_entry(tf, full, rel)
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    return archive


_ARTIFACT = ("artifact", "registered")  # what a download checks, and how its checksum was recorded


def split_name(name: str) -> tuple[str, dict[str, Any]]:
    """``OWNER/NAME`` -> (NAME, {"owner": OWNER}); ``NAME`` -> (NAME, {})."""
    return registry.split_name(name, "model")


class ModelsAPI(
    RegistryAPI[schemas.Model, schemas.ModelDetail, schemas.ModelVersion, schemas.ModelLabel, schemas.ModelShare]
):
    noun, plural, uploads = "model", "models", "model-uploads"

    # -- register --------------------------------------------------------------------------------------
    def upload(self, archive: Path, progress: Callable[[int], None] | None = None) -> schemas.ModelUpload:
        """Upload a .tar.gz holding one file or directory (see ``pack_artifact``); ``id`` is its upload id.

        The upload waits for one ``register`` call (at most a day by default); ``delete_upload`` drops it.
        """
        return self._t.upload(schemas.ModelUpload, f"{API}/{self.uploads}", archive, progress=progress)

    def register(
        self,
        name: str,
        format: str | None = None,
        *,
        artifact: Path | None = None,
        upload: str | None = None,
        from_job: str | None = None,
        path: str | None = None,
        signature: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        description: str = "",
    ) -> schemas.ModelVersion:
        """Register a new version of ``name`` (the model is created with its first version).

        Args:
            name: the model name (DNS-1123 label).
            format: torchscript, onnx, sklearn, xgboost, savedmodel or python; recognised from the
                artifact's name (or a directory's content) when None.
            artifact: a local file or directory: packed, uploaded and registered.
            upload: an upload id from ``upload`` (instead of ``artifact``); deleted if the register fails.
            from_job, path: a file or directory inside a job's output directory (instead of ``artifact``).
            signature: {"inputs": [...], "outputs": [...]} of {name, datatype, shape}; inferred when None.
            metrics: name -> number.
            description: free text.

        Returns:
            The new version (``version``, ``sha256``, ``signature``, ...).

        Raises:
            UnknownFormat: the format is not one of the six, or cannot be recognised.
            InvalidSignature: the declared signature is invalid.
            InvalidArchive / InvalidArgument / PayloadTooLarge: the artifact or the job path is refused.
            NotFound: the job does not exist.
        """
        sources = sum(x is not None for x in (artifact, upload, from_job))
        if sources != 1 or (from_job is None) != (path is None):
            raise InvalidArgument("give exactly one of artifact, upload, or from_job with path")
        if format is None:
            guess = artifact if artifact is not None else path
            format = infer_format(guess, local=artifact is not None) if guess is not None else None
            if format is None:
                raise unknown_format_error(str(guess or "the upload"))
        body: dict[str, Any] = {
            "name": name,
            "format": format,
            "signature": signature,
            "metrics": metrics or {},
            "description": description,
        }
        model, params = split_name(name)
        body["name"] = model
        if from_job is not None:
            body["from_job"] = {"job": from_job, "path": path}
            return self._t.read(schemas.ModelVersion, "POST", f"{API}/models", params=params, json_body=body)
        if upload is None:
            assert artifact is not None
            if format not in FORMATS:  # before packing and uploading what the server would refuse
                raise UnknownFormat(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
            archive = pack_artifact(artifact)
            try:
                upload = self.upload(archive).id
            finally:
                archive.unlink(missing_ok=True)
        return self._register_upload(upload, body, params)

    def _register_upload(self, upload_id: str, body: dict[str, Any], params: dict[str, Any]) -> schemas.ModelVersion:
        body = {**body, "upload": upload_id}
        url = f"{API}/models"
        return self._use_upload(
            upload_id, lambda: self._t.read(schemas.ModelVersion, "POST", url, params=params, json_body=body)
        )

    # -- reads (the entries, their versions, labels, shares and deletion: RegistryAPI) ------------------------
    def download(
        self,
        name: str,
        version: int | str = "latest",
        dest: Path = Path("."),
        progress: Callable[[int], None] | None = None,
    ) -> Path:
        """Download a version's artifact into the directory ``dest`` and verify its checksum.

        Returns:
            The artifact's path: ``dest/<artifact name>`` (a file or a directory).

        Raises:
            AlreadyExists: ``dest/<artifact name>`` exists already.
            InvalidArchive (code checksum_mismatch): what arrived does not match the registered checksum;
                nothing is left in ``dest``.
        """
        meta = self.version(name, version)
        dest = Path(dest)
        target = dest / meta.artifact
        if os.path.lexists(target):
            raise AlreadyExists(f"{target} already exists; remove it or download into another directory")
        dest.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".dlcloud-download-", dir=dest))
        try:
            checked = self._download_checked(
                name, meta, work, progress, lambda tree: artifact_digest(tree / meta.artifact).sha256, _ARTIFACT
            )
            os.rename(checked / meta.artifact, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return target

    # -- deployment leases (used by the model server) ----------------------------------------------------
    def heartbeat_deployment(
        self, name: str, version: int, deployment: str, endpoint: str, ttl_seconds: float = 60.0
    ) -> schemas.ModelDeployment:
        """Create or renew the lease that marks ``version`` as deployed for ``ttl_seconds``.

        Works on your tenant's models and on models shared with it (``OWNER/NAME``). The lease belongs to
        you: another user's heartbeat or release of the same name is refused with PermissionDenied.

        Returns:
            The lease: name, endpoint, tenant, holder, created_at, last_seen, expires_at.
        """
        model, params = split_name(name)
        body = {"name": deployment, "endpoint": endpoint, "ttl_seconds": ttl_seconds}
        path = f"{API}/models/{model}/versions/{version}/deployments"
        return self._t.read(schemas.ModelDeployment, "POST", path, params=params, json_body=body)

    def release_deployment(self, name: str, version: int, deployment: str) -> None:
        """End your lease (no error if it expired or never existed; PermissionDenied if another user holds it)."""
        model, params = split_name(name)
        self._t.request("DELETE", f"{API}/models/{model}/versions/{version}/deployments/{deployment}", params=params)
