"""The executor's errors about a job's data answer with their own status and code, not 500 (SQLite and PostgreSQL):
``inputs_unavailable`` (a workload's code, dataset or checkpoints gone from storage) is 409, ``outputs_too_large``
(a job's outputs over what is saved) is 413, each with its message, and the SDK rebuilds the same class.

No route raises them today (a job's attempt meets them in the control loop, which ends the attempt and tells the
job the message): each test mounts one route on the real app that raises the executor's own error, and goes
through the app's middleware and error handlers as any request does."""

from __future__ import annotations

import pytest

from dlcloud.errors import DlcloudError, InputsUnavailable, OutputsTooLarge, error_from_body
from dlcloud.executors.base import CheckpointsUnavailable, StoredCode, Workload, check_inputs
from dlcloud.executors.outputs import scan_outputs
from tests.conftest import Env, assert_api_error


def _raising(env: Env, path: str, raise_it) -> None:
    def route() -> None:
        raise_it()

    env.app.add_api_route(path, route, methods=["GET"])  # type: ignore[attr-defined]


def test_a_workload_whose_code_is_gone_answers_409_inputs_unavailable(env: Env) -> None:
    workload = Workload(
        job_id="j-0000000000000000",
        tenant_id="t-0000000000000000",
        attempt=1,
        command="true",
        code=StoredCode("code/t-0000000000000000/gone.tar.gz", "0" * 64, "archive"),
    )
    _raising(env, "/api/v1/test-inputs", lambda: check_inputs(env.platform.objects, workload))
    err = assert_api_error(env.http.get("/api/v1/test-inputs"), 409, "inputs_unavailable", "its code is missing")
    assert "gone.tar.gz" not in err["message"]  # no storage key in what a user reads
    rebuilt = error_from_body(409, {"error": err})
    assert type(rebuilt) is InputsUnavailable and rebuilt.http_status == 409


def test_checkpoints_that_are_gone_answer_409_inputs_unavailable(env: Env) -> None:
    def gone() -> None:
        raise CheckpointsUnavailable("the job its checkpoint_from names was deleted; submit it again without it")

    _raising(env, "/api/v1/test-checkpoints", gone)
    resp = env.http.get("/api/v1/test-checkpoints")
    assert_api_error(resp, 409, "inputs_unavailable", "was deleted")


def test_outputs_over_the_limit_answer_413_outputs_too_large(env: Env, tmp_path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    for i in range(3):
        (outputs / f"f{i}").write_bytes(b"x")
    _raising(env, "/api/v1/test-outputs", lambda: scan_outputs(outputs, 2, 1 << 20))
    err = assert_api_error(env.http.get("/api/v1/test-outputs"), 413, "outputs_too_large", "more than 2 files")
    assert str(tmp_path) not in err["message"]
    rebuilt = error_from_body(413, {"error": err})
    assert type(rebuilt) is OutputsTooLarge and rebuilt.http_status == 413


@pytest.mark.parametrize(("cls", "status"), [(InputsUnavailable, 409), (OutputsTooLarge, 413)])
def test_the_error_table_gives_each_its_status(cls: type[DlcloudError], status: int) -> None:
    assert cls("m").http_status == status
