"""The read and request models every versioned registry (models, datasets) has alike: a label, a label's move
and a share. Each registry names its own subclasses (``ModelLabel``, ``DatasetLabel``...), which are the
components of the OpenAPI document."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from dlcloud.schemas.common import Request, Response


class LabelMove(Request):
    version: Annotated[int, Field(ge=1)]


class LabelAnswer(Response):
    label: str
    version: int


class ShareAnswer(Response):
    tenant: str
    created_at: datetime
