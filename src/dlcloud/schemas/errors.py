"""The error body every API error has (ARCHITECTURE.md "Contracts"): ``{"error": {code, message, details}}``.

``dlcloud.errors`` raises and maps codes to statuses; these models only describe the body for the OpenAPI
document (``api/openapi.py``). The handlers in ``api/app.py`` build the same body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", title="ErrorInfo")

    code: str = Field(description="A stable error code (dlcloud.errors.HTTP_STATUS), e.g. not_found.")
    message: str = Field(description="What was wrong and what is allowed, for people.")
    details: dict[str, Any] = Field(
        description="Machine-readable extras; a validation_error lists {field, problem} in 'errors'."
    )


class ErrorResponse(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Error")

    error: ErrorInfo


def validation_problems(errors: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The message and details of a ``validation_error`` from pydantic's ``errors()``: the API answers a body it
    cannot validate with them, and the SDK raises the same for a spec it validates before sending it."""
    problems = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "extra_forbidden":
            msg = "unknown field (not allowed)"
        msg = msg.removeprefix("Value error, ")
        problems.append({"field": loc or "(body)", "problem": msg})
    summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems[:5])
    return f"invalid request: {summary}", {"errors": problems}
