"""The priority order a pass computes without every job's aging is the plain sort by effective priority."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from dlcloud.scheduler.planner import PlanConfig
from dlcloud.scheduler.policies import effective_priority, priority_order
from tests.unit.scheduler.scenarios import NOW, job


@pytest.mark.parametrize("seed", range(30))
def test_priority_order_is_the_sort_by_effective_priority_submit_time_and_id(seed: int) -> None:
    rng = random.Random(seed)
    cfg = PlanConfig(
        aging_interval_s=rng.choice([60.0, 3600.0, 7.5]),
        aging_step=rng.choice([0, 1, 3]),
        aging_max=rng.choice([0, 2, 100, -5]),
    )
    queue = [
        job(
            f"j{i:03d}",
            priority=rng.choice([0, 0, 1, 5, -2]),
            submitted_at=rng.choice([None, NOW + timedelta(seconds=30)])
            if rng.random() < 0.1
            else NOW - timedelta(seconds=rng.randint(0, 3 * 86_400)),
        )
        for i in rng.sample(range(500), 200)
    ]
    if seed % 2:  # every job submitted at a time (the control plane's case): no None in the sort
        queue = [j for j in queue if j.submitted_at is not None]
    want = sorted(queue, key=lambda j: (-effective_priority(j, NOW, cfg), j.submitted_at or NOW, j.id))
    assert [j.id for j in priority_order(queue, NOW, cfg)] == [j.id for j in want]
