"""The model registry on the wire: register requests, labels, deployment leases and the read models.

Vocabulary: a *model* is a name in a tenant; each registration adds an immutable *version* (1, 2, ...)
holding one *artifact* (a file or a directory tree) with its checksum, signature and metrics. A *label*
(``staging``, ``production``, ...) points at exactly one version of a model. A *share* lets another
tenant read a model. A *deployment lease* marks a version as served until it expires; it belongs to the
user (and tenant) whose model server holds it. A format *executes code* when loading an artifact of it runs
code its author wrote (a pickle, a Python predictor): such versions are flagged, and another tenant serves
them only after trusting the owner explicitly (``dlcloud serve --trust-code OWNER/NAME``).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from enum import StrEnum
from pathlib import PurePath
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from dlcloud.schemas.common import Name, Request, Response, exactly_one_of, require_one
from dlcloud.schemas.registry import LabelAnswer, LabelMove, ShareAnswer

LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
RESERVED_LABELS = frozenset({"latest"})
UPLOAD_ID_RE = re.compile(r"^mu-[a-z0-9]{16}$")
MAX_METRICS = 256
# response headers of an artifact download: the checksum (dlcloud.checksums) and what was sent
ARTIFACT_SHA256_HEADER = "X-Dlcloud-Artifact-Sha256"
ARTIFACT_NAME_HEADER = "X-Dlcloud-Artifact-Name"
VERSION_HEADER = "X-Dlcloud-Model-Version"


class ModelFormat(StrEnum):
    TORCHSCRIPT = "torchscript"
    ONNX = "onnx"
    SKLEARN = "sklearn"
    XGBOOST = "xgboost"
    SAVEDMODEL = "savedmodel"
    PYTHON = "python"


FORMATS: tuple[str, ...] = tuple(f.value for f in ModelFormat)
# formats whose loading runs code the artifact's author wrote: a pickle (joblib included) or Python modules.
# TorchScript, ONNX, XGBoost's JSON/UBJ and SavedModel graphs are data read by their runtimes.
CODE_FORMATS: frozenset[str] = frozenset({ModelFormat.SKLEARN.value, ModelFormat.PYTHON.value})


def executes_code(fmt: str) -> bool:
    """Whether loading an artifact of format ``fmt`` runs code its author wrote (an unknown format counts)."""
    return fmt in CODE_FORMATS or fmt not in FORMATS


# file suffix -> format; a directory is recognised by what it holds (DIRECTORY_MARKERS, client.models.infer_format)
SUFFIX_FORMATS = {
    ".pt": "torchscript",
    ".pth": "torchscript",
    ".torchscript": "torchscript",
    ".onnx": "onnx",
    ".joblib": "sklearn",
    ".pkl": "sklearn",
    ".json": "xgboost",
    ".ubj": "xgboost",
}
DIRECTORY_MARKERS = {"saved_model.pb": "savedmodel", "predictor.py": "python"}


def format_from_name(path: str) -> str | None:
    """The format a path's file name stands for (its suffix, SUFFIX_FORMATS); None if unknown."""
    return SUFFIX_FORMATS.get(PurePath(path).suffix.lower())


def check_label(value: str) -> str:
    if not LABEL_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid label: use 1-63 lower-case letters, digits and '-', starting with a "
            "letter and ending with a letter or digit (e.g. staging, production, canary-2)"
        )
    if value in RESERVED_LABELS:
        raise ValueError(f"{value!r} is reserved (it always means the newest version); choose another label")
    return value


Label = Annotated[str, Field(min_length=1, max_length=63), AfterValidator(check_label)]
MetricName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]+$")]
DeploymentName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class FromJob(Request):
    """A file or directory inside a job's output directory (``DLCLOUD_OUTPUT_DIR``)."""

    job: Annotated[str, Field(min_length=1, max_length=63)]
    path: Annotated[str, Field(min_length=1, max_length=1024)]


class ModelRegister(Request):
    """Register a new version of ``name`` (the model is created with its first version).

    Exactly one of ``upload`` (an artifact uploaded to ``/model-uploads``) and ``from_job``.
    ``format`` is checked by the service so an unknown name gets the ``unknown_format`` error.
    """

    model_config = exactly_one_of(upload="string", from_job="object")  # checked by _one_source

    name: Name
    format: Annotated[str, Field(min_length=1, max_length=32, json_schema_extra={"enum": list(FORMATS)})]
    upload: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    from_job: FromJob | None = None
    signature: dict[str, Any] | None = None
    metrics: Annotated[dict[MetricName, float], Field(max_length=MAX_METRICS)] = {}
    description: Annotated[str, Field(max_length=4096)] = ""

    @field_validator("metrics")
    @classmethod
    def _finite(cls, metrics: dict[str, float]) -> dict[str, float]:
        for key, value in metrics.items():
            if not math.isfinite(value):
                raise ValueError(f"metric {key!r} must be a finite number, got {value}")
        return metrics

    @model_validator(mode="after")
    def _one_source(self) -> ModelRegister:
        message = "give exactly one artifact source: 'upload' (an upload id) or 'from_job' (job and path)"
        return require_one(self, "upload", "from_job", message)


class LabelSet(LabelMove):  # a subclass without a docstring: the same component, named for models
    pass


class DeploymentLease(Request):
    """A heartbeat from a model server: the version is deployed until ``ttl_seconds`` from now."""

    name: DeploymentName
    endpoint: Annotated[str, Field(min_length=1, max_length=2048)]
    ttl_seconds: Annotated[float, Field(gt=0, le=86400)] = 60.0


class ModelUpload(Response):
    id: str
    sha256: str
    size: int
    artifact: str  # the top-level file or directory name in the archive
    expires_at: datetime


class ModelDeployment(Response):
    name: str
    endpoint: str
    tenant: str  # the tenant whose model server holds the lease
    holder: str | None  # the user holding it; shown to that user's tenant only
    created_at: datetime
    last_seen: datetime
    expires_at: datetime


class ModelVersion(Response):
    model: str
    owner: str
    version: int
    format: str
    executes_code: bool  # loading it runs code its author wrote (derived from the format)
    artifact: str
    sha256: str
    size_bytes: int
    signature: dict[str, Any] | None
    metrics: dict[str, float]
    source_job: str | None
    source_job_id: str | None
    source_path: str | None
    created_by: str
    created_at: datetime
    description: str
    labels: list[str]
    deployments: list[ModelDeployment]  # the owner sees every live lease; a tenant it is shared with its own
    deployed: bool  # some lease is live: the version cannot be deleted


class Model(Response):
    name: str
    owner: str
    shared: bool  # another tenant's model, shared read-only with the caller
    description: str
    created_by: str
    created_at: datetime
    latest_version: int | None
    version_count: int
    labels: dict[str, int]
    shared_with: list[str]  # tenants; only the owner sees them


class ModelDetail(Model):
    versions: list[ModelVersion]


class ModelLabel(LabelAnswer):
    pass


class ModelShare(ShareAnswer):
    pass
