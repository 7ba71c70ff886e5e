"""A spec given to the SDK as a mapping is validated into its model first and sent as ``model_dump(mode="json",
exclude_unset=True)``: the server reads the same spec (what it stores is its own ``model_dump`` of the model),
nothing the caller left out is added, and a wrong spec is the server's ``validation_error`` before any request."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from dlcloud.client import Client, Credentials
from dlcloud.errors import DlcloudError
from dlcloud.schemas.jobs import JobSpec

JOB = {
    "id": "j-1",
    "name": "train",
    "tenant": "t",
    "user": "u",
    "state": "QUEUED",
    "reason": "",
    "priority": 0,
    "gpus": 1,
    "cpus": 2.0,
    "memory": 4 * 2**30,
    "attempt": 0,
    "restarts": 0,
    "exit_code": None,
    "created_at": "2026-01-01T00:00:00Z",
    "started_at": None,
    "finished_at": None,
    "code": None,
    "command": "python train.py",
    "environment": "default",
}


@pytest.fixture
def sent() -> list[httpx.Request]:
    return []


@pytest.fixture
def client(sent: list[httpx.Request]) -> Client:
    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, json=JOB)

    http = httpx.Client(base_url="http://dlcloud.test", transport=httpx.MockTransport(answer))
    return Client(Credentials("http://dlcloud.test", "AKTEST", "secret"), http_client=http)


def test_a_mapping_is_sent_as_what_it_sets_and_the_server_reads_the_same_spec(client, sent) -> None:
    given: dict[str, Any] = {
        "name": "train",
        "command": "python train.py",
        "resources": {"gpus": 1, "memory": "4Gi"},
        "timeout": "2h",
        "datasets": [{"name": "clicks", "version": 3}],
    }
    job = client.jobs.submit(given)
    body = json.loads(sent[0].content)
    assert set(body) == set(given) and set(body["resources"]) == {"gpus", "memory"}
    assert JobSpec.model_validate(body) == JobSpec.model_validate(given)
    assert body["datasets"] == ["clicks@3"] and body["timeout"] == 7200.0
    assert job.name == "train" and job.memory == 4 * 2**30


def test_a_model_is_sent_as_it_was_set(client, sent) -> None:
    client.jobs.submit(JobSpec(name="train", module="pkg.train", args=["--lr", "0.1"]))
    assert json.loads(sent[0].content) == {"name": "train", "module": "pkg.train", "args": ["--lr", "0.1"]}


def test_a_wrong_mapping_is_the_servers_validation_error_and_sends_nothing(client, sent) -> None:
    with pytest.raises(DlcloudError, match=r"^invalid request: resources.memory: memory must be at most 16Ti") as exc:
        client.jobs.submit({"name": "train", "command": "true", "resources": {"memory": "100Ti"}})
    assert exc.value.code == "validation_error" and exc.value.http_status == 422
    assert exc.value.details["errors"][0]["field"] == "resources.memory"
    with pytest.raises(DlcloudError, match=r"colour: unknown field \(not allowed\)"):
        client.jobs.submit({"name": "train", "command": "true", "colour": "blue"})
    assert sent == []
