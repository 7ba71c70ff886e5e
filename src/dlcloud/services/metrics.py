"""Job metrics: the token a job attempt pushes with, the push, and the owner's read (docs/metrics.md).

Vocabulary: a *point* is one metric's value at one step of one replica of one attempt; a *series* is the
points of one (metric, attempt, replica), ordered by step.

Invariants:
- A metrics token names one (tenant, job, attempt) and is an HMAC under a key derived from the server key for
  this purpose alone (``SecretBox.derive_key``): it cannot be forged, and nothing else accepts it (the
  signed-request routes never read ``Authorization: Bearer``). It is stateless: the database says whether it
  is still good, i.e. while its attempt has not ended and ``TOKEN_GRACE_SECONDS`` after (a last flush).
- Storing the same (job, attempt, replica, metric, step) again overwrites it: a retried push adds nothing.
- A push is all or nothing: one bad point refuses the whole request, and nothing of it is stored.
- Metrics live until their job is deleted (the foreign key cascades) and count against no quota.
- Scalars read from a job's TensorBoard event files (``control/tensorboard.py``) are stored by the same upsert
  as a push, after the same checks: a name the push API would refuse is mapped (``metric_name``) or dropped.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlcloud.errors import InvalidArgument, InvalidToken, NotFound
from dlcloud.executors.event_files import EventScalar
from dlcloud.schemas.metrics import MAX_STEP, METRIC_NAME_RE, JobMetrics, MetricSeries, MetricsPush, SeriesPoint
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform
from dlcloud.store import jobs as job_store
from dlcloud.store import metrics as store
from dlcloud.store.rows import utcnow

TOKEN_PREFIX = "dlm1"
TOKEN_GRACE_SECONDS = 60.0  # a token still works this long after its attempt ended: the job's last flush
_KEY_PURPOSE = "job-metrics-token"
_MAX_TOKEN_LENGTH = 512
INVALID_TOKEN = "the metrics token is invalid: use the DLCLOUD_METRICS_TOKEN given to this job attempt"
EXPIRED_TOKEN = "the metrics token has expired: the job attempt it was given to has ended"
P = TypeVar("P", bound=tuple)
_NAME = re.compile(METRIC_NAME_RE)
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_.\-/]")
_LATEST_TIME = datetime(2100, 1, 1, tzinfo=UTC).timestamp()  # a later event time is no time: the read's is used


@dataclass(frozen=True)
class JobToken:
    """What a valid metrics token names."""

    tenant_id: str
    job_id: str
    attempt: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(platform: Platform, payload: str) -> bytes:
    return hmac.new(platform.box.derive_key(_KEY_PURPOSE), payload.encode(), sha256).digest()


def issue_token(platform: Platform, tenant_id: str, job_id: str, attempt: int) -> str:
    """The DLCLOUD_METRICS_TOKEN of one job attempt."""
    payload = _b64(json.dumps({"t": tenant_id, "j": job_id, "a": attempt}, separators=(",", ":")).encode())
    return f"{TOKEN_PREFIX}.{payload}.{_b64(_mac(platform, payload))}"


def read_token(platform: Platform, token: str) -> JobToken:
    """What ``token`` names, when this server issued it (not whether it is still good); InvalidToken if not."""
    parts = token.split(".") if len(token) <= _MAX_TOKEN_LENGTH else []
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise InvalidToken(INVALID_TOKEN)
    _, payload, mac = parts
    try:
        ok = hmac.compare_digest(_unb64(mac), _mac(platform, payload))
        fields = json.loads(_unb64(payload)) if ok else None
    except (binascii.Error, ValueError):
        raise InvalidToken(INVALID_TOKEN) from None
    if not isinstance(fields, dict):
        raise InvalidToken(INVALID_TOKEN)
    tenant_id, job_id, attempt = fields.get("t"), fields.get("j"), fields.get("a")
    if not (isinstance(tenant_id, str) and isinstance(job_id, str) and type(attempt) is int):
        raise InvalidToken(INVALID_TOKEN)
    return JobToken(tenant_id, job_id, attempt)


def push_metrics(platform: Platform, token: JobToken, job_id: str, push: MetricsPush) -> int:
    """Store ``push`` for the job attempt of ``token``; ``job_id`` is the job the request names. Returns the
    number of values stored. Raises InvalidToken (another job, an ended attempt) or InvalidArgument."""
    if job_id != token.job_id:
        raise InvalidToken(INVALID_TOKEN)
    now = utcnow()
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}  # one per key: the last value sent wins
    for i, point in enumerate(push.points):
        for name, value in point.metrics.items():
            if not math.isfinite(value):
                raise InvalidArgument(
                    f"points[{i}].metrics.{name} is {value}: metric values must be finite numbers "
                    "(not NaN or infinite); nothing of this request was stored",
                    details={"point": i, "metric": name},
                )
            rows[(point.replica, name, point.step)] = {
                "job_id": token.job_id,
                "tenant_id": token.tenant_id,
                "attempt": token.attempt,
                "replica": point.replica,
                "metric": name,
                "step": point.step,
                "value": float(value),
                "time": point.time or now,
            }
    try:
        with platform.db.write() as s:
            _check_live(s, token)
            store.upsert_points(s, list(rows.values()))
    except IntegrityError:  # the job was deleted after the check (its metrics with it)
        raise InvalidToken(EXPIRED_TOKEN) from None
    return len(rows)


def metric_name(name: str) -> str | None:
    """The metric name of a TensorBoard tag with its run (``validation/epoch accuracy``): each character the push
    API refuses in a name becomes ``_`` (``validation/epoch_accuracy``); None when that is no name either
    (empty, or longer than 128 characters)."""
    mapped = _NOT_IN_NAMES.sub("_", name)
    return mapped if _NAME.match(mapped) else None


def store_event_scalars(
    write: Callable[[], contextlib.AbstractContextManager[Session]],
    tenant_id: str,
    job_id: str,
    attempt: int,
    scalars: Sequence[EventScalar],
) -> tuple[int, Counter[str]]:
    """Store scalars read from the event files of a running attempt as its metrics, with the checks of a push:
    names as ``metric_name`` maps them, steps 0..2^62, finite values, the event's wall time as the point's time
    (the time of this call when it is no plausible time). Returns (values stored, dropped by reason). ``write``
    opens the caller's write transaction (the control loop's, fenced)."""
    now = utcnow()
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    dropped: Counter[str] = Counter()
    for p in scalars:
        name = metric_name(p.metric)
        if name is None:
            dropped["a tag that is no metric name (longer than 128 characters with its run)"] += 1
            continue
        if not 0 <= p.step <= MAX_STEP:
            dropped["a step outside 0..2^62"] += 1
            continue
        if not math.isfinite(p.value):
            dropped["a value that is not finite"] += 1
            continue
        when = datetime.fromtimestamp(p.wall_time, UTC) if 0 < p.wall_time < _LATEST_TIME else now
        rows[(p.replica, name, p.step)] = {
            "job_id": job_id,
            "tenant_id": tenant_id,
            "attempt": attempt,
            "replica": p.replica,
            "metric": name,
            "step": p.step,
            "value": float(p.value),
            "time": when,
        }
    if not rows:
        return 0, dropped
    try:
        with write() as s:
            store.upsert_points(s, list(rows.values()))
    except IntegrityError:  # the job was deleted meanwhile, its metrics with it
        return 0, dropped
    return len(rows), dropped


def _check_live(s: Session, token: JobToken) -> None:
    exists, finished_at = store.attempt_end(s, token.tenant_id, token.job_id, token.attempt)
    if not exists:
        # issued by this server, so the attempt was placed: its job has since been deleted
        raise InvalidToken(EXPIRED_TOKEN)
    if finished_at is not None and utcnow() > finished_at + timedelta(seconds=TOKEN_GRACE_SECONDS):
        raise InvalidToken(EXPIRED_TOKEN)


def downsample(points: Sequence[P], max_points: int) -> tuple[list[P], bool]:
    """At most ``max_points`` of ``points`` ((step, ...) tuples sorted by step, steps distinct), and whether
    any was left out: the first point, then the last point of each of ``max_points - 1`` equal step ranges
    (the last range ends with the last point, so the first and the last point are always kept)."""
    if len(points) <= max_points:
        return list(points), False
    if max_points == 1:
        return [points[-1]], True
    buckets = max_points - 1
    first, span = points[0][0], points[-1][0] - points[0][0]
    chosen: dict[int, P] = {}
    for p in points[1:]:
        chosen[min((p[0] - first) * buckets // span, buckets - 1)] = p  # the last one of each range wins
    return [points[0], *(chosen[b] for b in sorted(chosen))], True


def get_job_metrics(
    platform: Platform,
    caller: Caller,
    name_or_id: str,
    *,
    metrics: Sequence[str] = (),
    attempt: int | None = None,
    replica: str | None = None,
    max_points: int = 1000,
) -> JobMetrics:
    """The series of the caller's tenant's job, one per (metric, attempt, replica), each downsampled to at most
    ``max_points``. NotFound for a job the tenant does not have."""
    with platform.db.read() as s:
        job = job_store.get_job(s, caller.tenant_id, name_or_id)
        if job is None:
            raise NotFound(f"job {name_or_id!r} not found")
        name = job.name
        rows = store.read_points(s, job.id, metrics, attempt, replica)
    grouped: dict[tuple[str, int, str], list[tuple[int, float, datetime]]] = {}
    for metric, att, rep, step, value, time in rows:
        grouped.setdefault((metric, att, rep), []).append((step, value, time))
    series = []
    for (metric, att, rep), points in sorted(grouped.items()):
        kept, cut = downsample(points, max_points)
        series.append(
            MetricSeries(
                metric=metric,
                attempt=att,
                replica=rep,
                points=[SeriesPoint(step=st, value=v, time=t) for st, v, t in kept],
                downsampled=cut,
            )
        )
    return JobMetrics(job=name, series=series)
