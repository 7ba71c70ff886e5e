"""The error body every API error has (ARCHITECTURE.md "Contracts"): ``{"error": {code, message, details}}``.

``dlcloud.errors`` raises and maps codes to statuses; these models only describe the body for the OpenAPI
document (``api/openapi.py``). The handlers in ``api/app.py`` build the same body.
"""

from __future__ import annotations

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
