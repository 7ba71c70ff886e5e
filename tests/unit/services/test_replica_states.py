"""The replica state machine: how each replica's end is read from the executor's report."""

from __future__ import annotations

import pytest

from dlcloud.executors.base import ReplicaReport
from dlcloud.schemas.jobs import ReplicaState
from dlcloud.services.replica_states import end_state


def report(state: str, exit_code: int | None = None, **flags: bool) -> ReplicaReport:
    return ReplicaReport(
        name="worker-0", role="worker", index=0, decides=True, state=state, exit_code=exit_code, **flags
    )


@pytest.mark.parametrize(
    ("r", "expected"),
    [
        (report("exited", 0), ReplicaState.SUCCEEDED),
        (report("exited", 3), ReplicaState.FAILED),
        (report("exited", -9, stopped=True), ReplicaState.STOPPED),
        (report("exited", 0, timed_out=True), ReplicaState.STOPPED),  # the platform ended it, whatever its code
        (report("lost"), ReplicaState.LOST),
        (report("lost", stopped=True), ReplicaState.LOST),  # lost wins: nobody knows how it ended
        (report("running"), ReplicaState.LOST),  # the attempt ended while this replica still ran: not seen again
    ],
)
def test_a_replica_s_end_is_read_from_its_report(r: ReplicaReport, expected: ReplicaState) -> None:
    assert end_state(r) is expected
