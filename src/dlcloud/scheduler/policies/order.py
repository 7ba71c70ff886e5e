"""Queue orders: effective priority (priority plus aging) and las queues by attained service.

priority-backfill and fair-share (inside a tenant) order by ``priority_order``; las by ``las_queue``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Iterable
from datetime import datetime, timedelta

from dlcloud.scheduler.contract import PlanConfig, QueuedJob


def effective_priority(job: QueuedJob, now: datetime, cfg: PlanConfig) -> int:
    """Priority plus aging: ``aging_step`` per ``aging_interval_s`` waited since submission, at most ``aging_max``."""
    if cfg.aging_step <= 0 or cfg.aging_interval_s <= 0 or job.submitted_at is None:
        return job.priority
    waited = (now - job.submitted_at).total_seconds()
    if waited <= 0:
        return job.priority
    return job.priority + min(cfg.aging_max, cfg.aging_step * int(waited // cfg.aging_interval_s))


def priority_order(jobs: Iterable[QueuedJob], now: datetime, cfg: PlanConfig) -> list[QueuedJob]:
    """``jobs`` by effective priority (highest first), then submit time, then id.

    Computing every job's aging is most of a pass on a long queue, and it is not needed: inside one priority an
    earlier submit has waited at least as long, so aging never reorders it. Each priority's jobs are sorted by
    (submit time, id) and cut into runs of one effective priority (bisecting, as it only falls along the run);
    only runs of equal effective priority from different priorities are merged."""

    def by_submit(j: QueuedJob) -> tuple[datetime, str]:
        return (j.submitted_at or now, j.id)

    def aged(j: QueuedJob) -> int:
        return -effective_priority(j, now, cfg)

    if cfg.aging_max < 0:  # a negative cap makes aging non-monotone: no shortcut
        return sorted(jobs, key=lambda j: (aged(j), *by_submit(j)))
    levels: dict[int, list[QueuedJob]] = {}
    for j in jobs:
        levels.setdefault(j.priority, []).append(j)
    step, interval = cfg.aging_step, cfg.aging_interval_s
    runs: dict[int, list[list[QueuedJob]]] = {}
    for level in levels.values():
        try:  # attrgetter keeps the key out of Python code; a submit time of None (now) needs by_submit
            level.sort(key=operator.attrgetter("submitted_at", "id"))
        except TypeError:
            level.sort(key=by_submit)
        submits = [j.submitted_at or now for j in level]
        i = 0
        while i < len(level):
            e = aged(level[i])
            bonus = -e - level[i].priority
            if bonus <= 0:
                end = len(level)  # no aging from here on: the rest waited less (aging never goes below 0)
            else:
                # a run of this bonus has waited at least ceil(bonus / step) intervals: guess its end from the
                # submit times, and check it against effective_priority itself (float rounding at a boundary)
                since = now - timedelta(seconds=math.ceil(bonus / step) * interval)
                end = bisect.bisect_right(submits, since, lo=i)
                if not (i < end and aged(level[end - 1]) == e and (end == len(level) or aged(level[end]) != e)):
                    end = bisect.bisect_right(level, e, lo=i, key=aged)
            runs.setdefault(e, []).append(level[i:end])
            i = end
    out: list[QueuedJob] = []
    for e in sorted(runs):
        parts = runs[e]
        out.extend(parts[0] if len(parts) == 1 else sorted(itertools.chain(*parts), key=by_submit))
    return out


def las_queue(attained_gpu_s: float, cfg: PlanConfig) -> int:
    """The las queue of an attained service: 0 below the first boundary, 1 below the second, ..."""
    return bisect.bisect_right(cfg.las_queues_gpu_s, attained_gpu_s)
