"""Path and query parameters shared by the routers, with the rules of each name in the OpenAPI document.

The rules are published (``json_schema_extra``), not enforced here: a value that breaks one names nothing
that can exist, and the service answers it as it answers any unknown name (404, or 400 where the value is
being created, e.g. a label). Generated clients learn the rules and do not send such requests. Enforced
here: no NUL character (422), which PostgreSQL cannot compare.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query

from dlcloud.schemas.common import NAME_RE, Text
from dlcloud.schemas.datasets import DATASET_UPLOAD_ID_RE
from dlcloud.schemas.environments import CODE_ID_RE
from dlcloud.schemas.models import LABEL_RE, UPLOAD_ID_RE
from dlcloud.services.auth import KEY_ID_RE


def _rule(pattern: str, max_length: int | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"pattern": pattern}
    if max_length is not None:
        rule["maxLength"] = max_length
    return rule


_NAME = _rule(NAME_RE.pattern, 63)
_LABEL = LABEL_RE.pattern.removeprefix("^").removesuffix("$")

# ``Text`` refuses a NUL (422): PostgreSQL cannot even compare one, so it would be a 500 there
Name = Annotated[Text, Path(description="A DNS-1123 label (1-63 of a-z, 0-9, '-').", json_schema_extra=_NAME)]
JobName = Annotated[Text, Path(description="The job's name or id.", json_schema_extra=_NAME)]
StudyName = Annotated[Text, Path(description="The study's name or id.", json_schema_extra=_NAME)]
TenantName = Annotated[Text, Path(description="A tenant name.", json_schema_extra=_NAME)]
Label = Annotated[
    Text,
    Path(description="A label: a DNS-1123 label starting with a letter.", json_schema_extra=_rule(LABEL_RE.pattern)),
]
VersionRef = Annotated[
    Text,
    Path(
        description="A version number, a label or 'latest'.",
        json_schema_extra=_rule(rf"^([0-9]{{1,9}}|{_LABEL})$", 63),
    ),
]
KeyId = Annotated[Text, Path(description="An access key id.", json_schema_extra=_rule(KEY_ID_RE.pattern))]
CodeId = Annotated[Text, Path(description="A code upload id.", json_schema_extra=_rule(CODE_ID_RE))]
UploadId = Annotated[
    Text, Path(description="A model artifact upload id.", json_schema_extra=_rule(UPLOAD_ID_RE.pattern))
]
DatasetUploadId = Annotated[
    Text, Path(description="A dataset upload id.", json_schema_extra=_rule(DATASET_UPLOAD_ID_RE.pattern))
]
# the pattern of DeploymentName in schemas/models.py
Deployment = Annotated[
    Text,
    Path(description="A deployment lease name.", json_schema_extra=_rule(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", 128)),
]
Owner = Annotated[
    Text | None,
    Query(
        max_length=63,
        description="Tenant that owns a model or dataset shared with yours (default: your own).",
        json_schema_extra={"pattern": NAME_RE.pattern},
    ),
]

# a listing's page (jobs, studies): up to 1,000 rows from an offset under ten million; the defaults stay in
# each route's signature (100 rows from the first)
PageLimit = Annotated[int, Query(ge=1, le=1000)]
PageOffset = Annotated[int, Query(ge=0, le=10_000_000)]
# a log read (jobs, environment builds): whether to follow it as it grows, and how many of its last lines
Follow = Annotated[bool, Query()]
Tail = Annotated[int | None, Query(ge=0, le=1_000_000)]
