"""The token buckets of services/admission.py and the queued-jobs cap in force, without an API."""

from __future__ import annotations

import pytest

from dlcloud.errors import RateLimited, error_from_body
from dlcloud.services import admission
from dlcloud.services.admission import TokenBuckets, queued_jobs_cap
from dlcloud.settings import Settings


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    buckets = TokenBuckets(rate=2.0, burst=3)
    for _ in range(3):
        assert buckets.wait("k", 100.0) == 0
        buckets.take("k", 100.0)
    assert buckets.wait("k", 100.0) == 0.5
    assert buckets.wait("k", 100.25) == 0.25
    assert buckets.wait("k", 100.5) == 0
    assert buckets.wait("other", 100.5) == 0  # each key its own bucket
    buckets.take("k", 100.5)
    assert buckets.wait("k", 1000.0) == 0  # a long quiet spell refills only up to the burst
    for _ in range(3):
        buckets.take("k", 1000.0)
    assert buckets.wait("k", 1000.0) == 0.5


def test_past_max_buckets_full_ones_are_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "MAX_BUCKETS", 4)
    buckets = TokenBuckets(rate=1.0, burst=2)
    buckets.take("busy", 0.0)
    buckets.take("busy", 0.0)
    for key in ("a", "b", "c"):
        buckets.wait(key, 0.0)  # full buckets
    buckets.wait("d", 0.0)  # the fifth: the full ones go, the spent one stays
    assert set(buckets._buckets) == {"busy", "d"}
    assert buckets.wait("busy", 0.0) == 1.0


def test_the_queued_jobs_cap_in_force() -> None:
    settings = Settings(default_max_queued_jobs=1000)
    assert queued_jobs_cap(settings, None) == (1000, "platform default")
    assert queued_jobs_cap(settings, 5000) == (5000, "tenant quota")
    assert queued_jobs_cap(settings, 0) == (0, "tenant quota")  # a quota of 0 refuses every submit
    assert queued_jobs_cap(Settings(default_max_queued_jobs=0), None) == (None, "none")


def test_the_sdk_rebuilds_rate_limited_with_its_retry_after() -> None:
    body = {"error": {"code": "rate_limited", "message": "m", "details": {"retry_after_seconds": 7}}}
    err = error_from_body(429, body)
    assert isinstance(err, RateLimited)
    assert err.http_status == 429
    assert err.retry_after == 7
    assert RateLimited("m").retry_after == 1  # never 0: a client must wait at least a second
