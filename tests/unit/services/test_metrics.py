"""Metrics tokens (what they name, that they cannot be forged or moved between servers) and downsampling
(services/metrics.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from cryptography.fernet import Fernet

from dlcloud.errors import InvalidToken
from dlcloud.services.metrics import JobToken, downsample, issue_token, read_token
from dlcloud.services.secrets import SecretBox


def _platform(key: bytes | None = None) -> SimpleNamespace:
    return SimpleNamespace(box=SecretBox(key or Fernet.generate_key()))


def test_a_token_names_its_tenant_job_and_attempt_and_nothing_else_reads_as_one():
    p = _platform()
    token = issue_token(p, "t-1", "j-abc", 3)
    assert read_token(p, token) == JobToken("t-1", "j-abc", 3)
    assert issue_token(p, "t-1", "j-abc", 4) != token
    with pytest.raises(InvalidToken, match="invalid"):
        read_token(_platform(), token)  # another server's key
    prefix, payload, mac = token.split(".")
    other = issue_token(p, "t-1", "j-other", 3).split(".")[1]
    for bad in (f"{prefix}.{other}.{mac}", f"dlm2.{payload}.{mac}", f"{prefix}.{payload}", token[:-2], "", "..."):
        with pytest.raises(InvalidToken, match="invalid"):
            read_token(p, bad)
    # the server key's own ciphertexts (access-key secrets) are no tokens
    with pytest.raises(InvalidToken):
        read_token(p, p.box.encrypt("secret").decode())


def _points(steps):
    return [(s, float(s)) for s in steps]


@pytest.mark.parametrize("max_points", [1, 2, 3, 10, 99])
def test_downsampling_keeps_the_ends_and_the_last_point_of_each_step_range(max_points):
    rng = random.Random(max_points)
    steps = sorted(rng.sample(range(100_000), 500)) + list(range(100_000, 100_300))  # uneven: a dense tail
    kept, cut = downsample(_points(steps), max_points)
    assert cut and 1 <= len(kept) <= max_points
    assert kept[-1] == (steps[-1], float(steps[-1]))
    if max_points > 1:
        assert kept[0] == (steps[0], float(steps[0]))
        buckets = max_points - 1
        span = steps[-1] - steps[0]

        def bucket(s: int) -> int:
            return min((s - steps[0]) * buckets // span, buckets - 1)

        for s, _ in kept[1:]:  # each kept point is the last of its range
            assert max(t for t in steps[1:] if bucket(t) == bucket(s)) == s
    assert [s for s, _ in kept] == sorted({s for s, _ in kept})


def test_a_short_series_is_not_downsampled():
    assert downsample(_points([0, 5, 9]), 3) == (_points([0, 5, 9]), False)
    assert downsample([], 5) == ([], False)
