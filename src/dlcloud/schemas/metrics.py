"""Job metrics on the wire: what a job pushes with its metrics token, and the series an owner reads back
(docs/metrics.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from dlcloud.schemas.common import JSON_NUMBER, IsoTime, Request, Response

METRIC_NAME_RE = r"^[A-Za-z0-9_.\-/]{1,128}$"
# DLCLOUD_REPLICA of a gang replica (worker-1, worker-0.2), or '' for a job of one process
REPLICA_RE = r"^([a-z]+-[0-9]+(\.[0-9]+)?)?$"
MAX_POINTS_PER_PUSH = 1000
MAX_METRICS_PER_POINT = 100
MAX_STEP = 2**62
DEFAULT_MAX_POINTS = 1000
MAX_MAX_POINTS = 10_000

MetricName = Annotated[str, Field(pattern=METRIC_NAME_RE, description="1-128 of A-Z a-z 0-9 _ . - /")]
Replica = Annotated[str, Field(max_length=64, pattern=REPLICA_RE)]


class MetricPoint(Request):
    step: Annotated[int, Field(ge=0, le=MAX_STEP), JSON_NUMBER]
    # finite numbers only: NaN and infinities (which Python's JSON writes) are refused with a 400
    metrics: Annotated[dict[MetricName, Annotated[float, JSON_NUMBER]], Field(max_length=MAX_METRICS_PER_POINT)]
    time: IsoTime | None = Field(None, description="When the values were measured; default: when they arrive.")
    replica: Replica = Field("", description="DLCLOUD_REPLICA of a gang replica; '' for a job of one process.")


class MetricsPush(Request):
    points: Annotated[list[MetricPoint], Field(max_length=MAX_POINTS_PER_PUSH)]


class SeriesPoint(Response):
    step: int
    value: float
    time: datetime


class MetricSeries(Response):
    metric: str
    attempt: int
    replica: str
    points: list[SeriesPoint]
    downsampled: bool = Field(description="True when the series had more points than max_points.")


class JobMetrics(Response):
    job: str
    series: list[MetricSeries]
