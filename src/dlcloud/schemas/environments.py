"""Runtime environments on the wire: the create request, the states and the read models.

Vocabulary: an *environment* is a name a job gives in ``environment:``. A user environment is a spec (Python
version, pip requirements, uploaded wheels, pip index options, inheritance of the server's packages) that
the local executor materialises as a virtual environment; a *built-in* environment is one of the catalogue
every tenant sees. Environments with the same spec share one *build*, keyed by the spec's hash.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import AfterValidator, Field, model_validator

from dlcloud.schemas.common import Name, Request, Response

PYTHON_RE = r"^3\.[0-9]{1,2}$"
CODE_ID_RE = r"^c-[a-z0-9]{16}$"
MAX_REQUIREMENTS = 256
MAX_WHEELS = 32
MAX_EXTRA_INDEX_URLS = 4
URL_SCHEMES = ("https", "http", "git+https")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class EnvironmentState(StrEnum):
    NOT_BUILT = "NOT_BUILT"  # a built-in no job has used yet: the first job that names it builds it
    BUILDING = "BUILDING"
    READY = "READY"
    FAILED = "FAILED"
    UNAVAILABLE = "UNAVAILABLE"  # a built-in whose packages the server's Python environment lacks


def check_requirement(value: str) -> str:
    """One pip requirement (PEP 508): a name with optional extras, versions, markers or an http(s) URL."""
    value = value.strip()
    if not value:
        raise ValueError("a requirement must not be empty")
    if _CONTROL_RE.search(value):
        raise ValueError(f"requirement {value!r} contains a control character (a line break?); give one per entry")
    if value.startswith("-"):
        raise ValueError(
            f"{value!r} is a pip option, not a requirement; use the fields index_url, extra_index_urls and "
            "no_index, and upload local wheels with 'wheels'"
        )
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a pip requirement: {exc}") from None
    if req.url is not None and not req.url.startswith(tuple(f"{s}://" for s in URL_SCHEMES)):
        raise ValueError(
            f"requirement {value!r}: only {', '.join(URL_SCHEMES)} URLs are allowed; upload a local wheel with "
            "'wheels' instead"
        )
    return value


def check_index_url(value: str) -> str:
    if not value.startswith(("https://", "http://")) or _CONTROL_RE.search(value) or " " in value:
        raise ValueError(f"{value!r} is not an http(s) URL of a package index (e.g. https://pypi.org/simple)")
    return value


PythonVersion = Annotated[str, Field(pattern=PYTHON_RE, description="Major.minor, e.g. 3.11.")]
PipRequirement = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(check_requirement)]
IndexUrl = Annotated[
    str,
    Field(min_length=1, max_length=2048, json_schema_extra={"pattern": r"^https?://[^\s\x00-\x1f\x7f]+$"}),
    AfterValidator(check_index_url),
]
CodeId = Annotated[str, Field(pattern=CODE_ID_RE)]


class EnvironmentCreate(Request):
    """A user environment. ``wheels`` are code ids of wheels uploaded with ``POST /code?kind=wheel``."""

    name: Name
    python: PythonVersion | None = None  # default: the server's Python version
    requirements: Annotated[list[PipRequirement], Field(max_length=MAX_REQUIREMENTS)] = []
    wheels: Annotated[list[CodeId], Field(max_length=MAX_WHEELS)] = []
    inherit: bool = False
    index_url: IndexUrl | None = None
    extra_index_urls: Annotated[list[IndexUrl], Field(max_length=MAX_EXTRA_INDEX_URLS)] = []
    no_index: bool = False
    description: Annotated[str, Field(max_length=4096)] = ""
    image: Annotated[str, Field(min_length=1, max_length=512)] | None = None

    @model_validator(mode="after")
    def _index_options(self) -> EnvironmentCreate:
        if self.no_index and (self.index_url or self.extra_index_urls):
            raise ValueError("no_index excludes index_url and extra_index_urls")
        return self


class Environment(Response):
    name: str
    builtin: bool
    state: EnvironmentState
    error: str | None  # why it is FAILED or UNAVAILABLE
    python: str
    inherit: bool
    requirements: list[str]
    spec_hash: str | None  # None for ``default`` (the server's own environment, no venv)
    description: str
    image: str | None
    created_by: str | None
    created_at: datetime | None
    ready_at: datetime | None
    size_bytes: int | None


class EnvironmentDetail(Environment):
    wheels: list[str]  # file names
    index_url: str | None
    extra_index_urls: list[str]
    no_index: bool
    base_packages: dict[str, str]  # inherited from the server's environment: distribution -> version
    builds: int  # how many times its venv was built (a reused build is not built again)
    jobs: list[str]  # unfinished jobs of the caller's tenant that use it
    log_tail: list[str]
