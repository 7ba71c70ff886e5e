"""Datasets — the sample library — on the wire.

Vocabulary: a *dataset* is a name in a tenant; each push adds an immutable *version* (1, 2, ...) holding a
tree of files with a manifest (path, size, SHA-256 of each) and its checksum. A *label* (``production``,
``v2-clean``, ...) points at exactly one version. A *share* lets another tenant read a dataset (``OWNER/NAME``).
A job asks for data by reference: ``NAME``, ``NAME@VERSION`` or ``NAME@LABEL`` (``OWNER/`` in front for a
shared one); without ``@`` it means the newest version, resolved when the job is submitted. A job spec may give
the same as a mapping, ``{name: NAME, version: VERSION}`` (version optional), read as ``NAME@VERSION``.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from dlcloud.schemas.common import Request, Response, require_one
from dlcloud.schemas.models import Label
from dlcloud.schemas.registry import LabelAnswer, LabelMove, ShareAnswer

DATASET_UPLOAD_ID_RE = re.compile(r"^du-[a-z0-9]{16}$")


def dataset_env_name(name: str) -> str:
    """DLCLOUD_DATASET_<NAME>, where a job finds a dataset: upper case, '-' as '_'."""
    return "DLCLOUD_DATASET_" + name.upper().replace("-", "_")


# NAME, NAME@7, NAME@production, OWNER/NAME@...
DATASET_REF_RE = re.compile(
    r"^(?:(?P<owner>[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/)?(?P<name>[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)"
    r"(?:@(?P<ref>[0-9]{1,9}|[a-z]([-a-z0-9]{0,61}[a-z0-9])?))?$"
)


class DatasetVersionState(StrEnum):
    """A dataset version's state. ``services/dataset_sources.py`` is its one writer: a version pushed from an
    upload is ready at once; one registered in place is pending until a worker has read its objects, then ready
    or failed."""

    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


DatasetRef = Annotated[str, Field(min_length=1, max_length=140, pattern=DATASET_REF_RE.pattern)]
DATASET_FORMS = "NAME, NAME@VERSION, NAME@LABEL, OWNER/NAME@... or {name: NAME, version: VERSION}"


class DatasetSelector(Request):
    """The mapping form of a job's dataset: ``{name: clicks, version: 3}``; ``version`` a number or a label,
    left out for the newest version."""

    name: Annotated[str, Field(min_length=1, max_length=127)]
    version: int | str | None = None


def dataset_ref(value: object) -> str:
    """A job's dataset in its string form: a mapping ``{name: clicks, version: 3}`` becomes ``clicks@3``; a string
    is checked as it is. ValueError says which forms there are."""
    if isinstance(value, dict):
        unknown = sorted(str(k) for k in value if k not in ("name", "version"))
        if unknown:
            raise ValueError(f"unknown key {', '.join(unknown)}: a dataset is {DATASET_FORMS}")
        name, version = value.get("name"), value.get("version")
        if not isinstance(name, str) or "@" in name:
            raise ValueError(f"name must be a dataset's NAME or OWNER/NAME, without @VERSION; got {name!r}")
        if isinstance(version, bool) or not isinstance(version, int | str | None):
            raise ValueError(f"version must be a version number or a label; got {version!r}")
        value = name if version is None else f"{name}@{version}"
    if not isinstance(value, str) or len(value) > 140 or not DATASET_REF_RE.match(value):
        raise ValueError(f"{value!r} is not a dataset: give {DATASET_FORMS} (lowercase names)")
    return value


# a dataset a job reads, either form (``dataset_ref``), always held as the string
JobDataset = Annotated[DatasetRef, BeforeValidator(dataset_ref, json_schema_input_type=str | DatasetSelector)]


class DatasetPush(Request):
    """Add a version to ``name`` (the dataset is created with its first version): from an upload, or from
    objects already in a bucket (``source``, ``s3://BUCKET/PREFIX``), registered in place without a copy."""

    upload: Annotated[str, Field(pattern=DATASET_UPLOAD_ID_RE.pattern)] | None = None
    source: Annotated[str, Field(min_length=1, max_length=1100)] | None = None
    description: Annotated[str, Field(max_length=4096)] = ""

    @model_validator(mode="after")
    def _one_origin(self) -> DatasetPush:
        return require_one(
            self, "upload", "source", "give exactly one of upload (an uploaded .tar.gz) or source (s3://BUCKET/PREFIX)"
        )


class DatasetLabelSet(LabelMove):  # a subclass without a docstring: the same component, named for datasets
    pass


class DatasetUpload(Response):
    id: str
    sha256: str  # of the uploaded archive
    size: int
    expires_at: datetime


class DatasetVersion(Response):
    dataset: str  # as the caller names it: NAME, or OWNER/NAME for a shared one
    owner: str
    version: int
    sha256: str  # the tree's checksum (dlcloud.checksums over its manifest)
    size_bytes: int
    file_count: int
    description: str
    created_by: str
    created_at: datetime
    labels: list[str]
    in_use_by: list[str]  # jobs (of the owner's tenant, by name) not yet ended that read it: it cannot be deleted
    # ready: readable; pending: registered in place, its manifest being computed (sha256 "", sizes 0 until
    # then); failed: it never will be (state_reason says why)
    state: DatasetVersionState = DatasetVersionState.READY
    state_reason: str | None = None
    source: str | None = None  # s3://BUCKET/PREFIX of a version registered in place (its files stay there)


class Dataset(Response):
    name: str
    owner: str
    shared: bool
    description: str
    created_by: str
    created_at: datetime
    latest_version: int | None
    version_count: int
    size_bytes: int  # all versions
    labels: dict[str, int]
    shared_with: list[str]  # only the owner sees them


class DatasetDetail(Dataset):
    versions: list[DatasetVersion]


class DatasetFile(Response):
    path: str
    size: int
    sha256: str


class DatasetLabel(LabelAnswer):
    pass


class DatasetShare(ShareAnswer):
    pass


__all__ = [
    "DATASET_FORMS",
    "DATASET_REF_RE",
    "DATASET_UPLOAD_ID_RE",
    "Dataset",
    "DatasetDetail",
    "DatasetFile",
    "DatasetLabel",
    "DatasetLabelSet",
    "DatasetPush",
    "DatasetRef",
    "DatasetSelector",
    "DatasetShare",
    "DatasetUpload",
    "DatasetVersion",
    "JobDataset",
    "Label",
    "dataset_ref",
]
