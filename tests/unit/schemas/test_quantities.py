"""Memory and duration quantities, and the job spec's own rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dlcloud.schemas.common import format_memory, parse_duration, parse_memory
from dlcloud.schemas.jobs import JobSpec


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4Gi", 4 * 1024**3), ("512Mi", 512 * 1024**2), ("2G", 2 * 10**9), (1024, 1024), ("1.5Gi", int(1.5 * 1024**3))],
)
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-1Gi", "17Ti", True, [], "4Gx"])
def test_parse_memory_rejects(bad):
    with pytest.raises(ValueError, match="memory"):
        parse_memory(bad)


@pytest.mark.parametrize(("text", "expected"), [("90s", 90), ("30m", 1800), ("1h30m", 5400), (12, 12), ("250ms", 0.25)])
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["forever", "0", "-5s", "31d", "1h junk", ""])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_format_memory():
    assert format_memory(4 * 1024**3) == "4Gi"
    assert format_memory(1536 * 1024**2) == "1536Mi"
    assert format_memory(None) == "-"


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"command": "a", "module": "b"}, "exactly one"),
        ({}, "exactly one"),
        ({"command": "a", "args": ["x"]}, "'args' goes with 'module'"),
        ({"command": "a", "env": {"DLCLOUD_X": "1"}}, "set by dlcloud"),
        ({"command": "a", "secret_env": {"CUDA_VISIBLE_DEVICES": "1"}}, "secret_env CUDA_VISIBLE_DEVICES is set by"),
        ({"command": "a", "secret_env": {"A-B": "1"}}, "secret_env.A-B"),
        ({"command": "a", "replicas": {"chief": 1}}, "framework none has no replica group chief"),
        ({"command": "a", "framework": "mpi", "replicas": {"worker": 2}}, r"mpi needs replicas \{launcher: 1"),
        ({"command": "a", "framework": "tensorflow", "replicas": {"chief": 2}}, "at most 1 chief"),
        ({"command": "a", "procs_per_worker": 2}, "procs_per_worker goes with framework pytorch"),
        ({"command": "a", "replica_resources": {"ps": {"cpu": 1}}}, "replica_resources names group"),
        ({"command": "a", "bogus": 1}, "Extra inputs"),
        ({"command": "a", "resources": {"memory": "1Mi"}}, "at least 16Mi"),
    ],
)
def test_job_spec_rules(fields, fragment):
    with pytest.raises(ValidationError, match=fragment):
        JobSpec(name="x", **fields)


def test_job_spec_never_shows_secret_env_in_its_repr():
    spec = JobSpec(name="x", command="a", secret_env={"TOKEN": "hunter2"})
    assert spec.secret_env == {"TOKEN": "hunter2"} and "hunter2" not in repr(spec)


def test_published_ports_are_distinct_ports_and_at_most_eight():
    assert JobSpec(name="x", command="a", publish=[8888, 6006]).publish == [8888, 6006]
    with pytest.raises(ValidationError, match="publish names port\\(s\\) 8888 more than once"):
        JobSpec(name="x", command="a", publish=[8888, 6006, 8888])
    for bad in (0, 65536, -1):
        with pytest.raises(ValidationError, match="publish"):
            JobSpec(name="x", command="a", publish=[bad])
    with pytest.raises(ValidationError, match="at most 8"):
        JobSpec(name="x", command="a", publish=list(range(8000, 8009)))
