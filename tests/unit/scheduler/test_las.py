"""las: least attained service first (Tiresias-style queues), work-conserving, preemption of jobs in a higher
queue, the most attained first."""

from __future__ import annotations

from datetime import timedelta

from dlcloud.scheduler.planner import PlanConfig, Policy, plan
from dlcloud.scheduler.policies import las_queue
from tests.unit.scheduler.scenarios import NOW, job, nodes, placed, running, victims

LAS = PlanConfig(policy=Policy.LAS, las_queues_gpu_s=(3600.0, 36_000.0))
HOUR = 3600.0


def test_queue_index_by_attained_service() -> None:
    assert [las_queue(s, LAS) for s in (0, 3599, 3600, 35_999, 36_000, 1e9)] == [0, 0, 1, 1, 2, 2]


def test_least_attained_queue_first_then_submit_time() -> None:
    queue = [
        job("veteran", gpus=2, attained_gpu_s=50 * HOUR, submitted_at=NOW - timedelta(days=2)),
        job("mid", gpus=2, attained_gpu_s=2 * HOUR, submitted_at=NOW - timedelta(days=1)),
        job("new-late", gpus=2, submitted_at=NOW - timedelta(minutes=1)),
        job("new-early", gpus=2, attained_gpu_s=100, submitted_at=NOW - timedelta(minutes=5)),
    ]
    p = plan(queue, [], {}, nodes(1, 4), NOW, LAS)
    assert placed(p) == ["new-early", "new-late"]
    assert p.wait_reasons["mid"] == "waiting for capacity: needs 2 GPU(s), 0 free (las queue 1)"


def test_work_conserving_a_big_job_does_not_block_smaller_ones() -> None:
    p = plan([job("big", gpus=4), job("small", gpus=1)], [running("r", "z", (0,), preemptible=False)], {},
             nodes(1, 4), NOW, LAS)  # fmt: skip
    assert placed(p) == ["small"] and p.blocked_by is None


def test_a_job_in_a_lower_queue_preempts_the_most_attained_first() -> None:
    held = [
        running("q1-small", "a", (0,), attained_gpu_s=2 * HOUR),
        running("q2-big", "b", (1,), attained_gpu_s=90 * HOUR),
        running("q2-bigger", "c", (2,), attained_gpu_s=99 * HOUR),
        running("q0", "d", (3,), attained_gpu_s=10),
    ]
    p = plan([job("fresh", "e", 1)], held, {}, nodes(1, 4), NOW, LAS)
    assert victims(p) == ["q2-bigger"]
    assert p.preemptions[0].reason == "las"
    assert p.wait_reasons["fresh"] == "preempting 1 job(s) with more attained service (las)"
    three = plan([job("fresh", "e", 3)], held, {}, nodes(1, 4), NOW, LAS)
    assert victims(three) == ["q2-bigger", "q2-big", "q1-small"]


def test_no_preemption_within_the_same_or_a_higher_queue() -> None:
    held = [running("q1", "a", (0, 1, 2, 3), attained_gpu_s=2 * HOUR)]
    same = plan([job("also-q1", "b", 1, attained_gpu_s=3 * HOUR)], held, {}, nodes(1, 4), NOW, LAS)
    higher = plan([job("q2", "b", 1, attained_gpu_s=40 * HOUR)], held, {}, nodes(1, 4), NOW, LAS)
    lower = plan([job("q0", "b", 1)], held, {}, nodes(1, 4), NOW, LAS)
    assert victims(same) == [] and victims(higher) == [] and victims(lower) == ["q1"]


def test_las_never_preempts_non_preemptible_or_stopping_attempts() -> None:
    held = [
        running("np", "a", (0, 1), attained_gpu_s=99 * HOUR, preemptible=False),
        running("going", "a", (2, 3), attained_gpu_s=99 * HOUR, stopping=True),
    ]
    p = plan([job("fresh", "b", 2)], held, {}, nodes(1, 4), NOW, LAS)
    assert victims(p) == []
    assert p.wait_reasons["fresh"] == "waiting for 1 stopping job(s) to free their resources"
    p4 = plan([job("fresh", "b", 4)], held, {}, nodes(1, 4), NOW, LAS)
    assert victims(p4) == [] and p4.wait_reasons["fresh"].startswith("waiting for capacity: ")


def test_each_victim_is_taken_once_per_pass() -> None:
    held = [running("old", "a", (0, 1, 2, 3), attained_gpu_s=99 * HOUR)]
    p = plan([job("x", "b", 2), job("y", "c", 2)], held, {}, nodes(1, 4), NOW, LAS)
    assert victims(p) == ["old"]
    assert p.wait_reasons["x"].startswith("preempting 1 job(s)")
    assert p.wait_reasons["y"] == "waiting for capacity: needs 2 GPU(s), 0 free (las queue 0)"


def test_next_pass_waits_for_the_victim_instead_of_picking_another() -> None:
    held = [
        running("v1", "a", (0, 1), attained_gpu_s=99 * HOUR),
        running("v2", "b", (2, 3), attained_gpu_s=98 * HOUR),
    ]
    first = plan([job("fresh", "c", 2)], held, {}, nodes(1, 4), NOW, LAS)
    assert victims(first) == ["v1"]
    held2 = [running("v1", "a", (0, 1), attained_gpu_s=99 * HOUR, stopping=True), held[1]]
    second = plan([job("fresh", "c", 2)], held2, {}, nodes(1, 4), NOW, LAS)
    assert victims(second) == []
    assert second.wait_reasons["fresh"] == "waiting for 1 stopping job(s) to free their resources"
