"""How a preempted attempt moves its job: rules shared by the control plane and the trace simulator.

Both apply these pure functions, so the simulator (``scheduler/simulator.py``) replays the same rules the
control plane (``services/job_states.py``) enforces, instead of a second model of them.

Invariants:
- An attempt's end is decided in one order: a cancel wins, then a stop for a preemption, then any other stop
  (a cancel), then the timeout, then the exit code. An attempt asked to stop for a preemption that exits
  non-zero before or without the stop reaching it (a trainer that exits 1 on SIGTERM, say) was preempted, not
  failed: it must not burn a restart; one that exits 0 in its grace period succeeded.
- A preempted job goes back to the queue (PREEMPTED -> QUEUED) keeping its original submit time, so it keeps
  its queue position; its restart count is unchanged (preemptions never consume ``max_restarts``) and its
  preemption count grows by one; its next attempt has no restart backoff.
- The work an attempt keeps is what it saved at its last checkpoint; what it did since is lost.
- What an attempt counts towards its tenant's recent usage (fair-share turns) is its GPUs over the part of the window
  it held them; an attempt placed for a turn counts through the turn's end even if it ended sooner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class AttemptEnd(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    PREEMPTED = "preempted"


def attempt_end(
    *,
    exit_code: int | None,
    stopped: bool,
    timed_out: bool,
    cancel_requested: bool = False,
    preempt_requested: bool = False,
) -> AttemptEnd:
    """The outcome of an ended attempt. ``stopped``: ended by a stop the control plane sent."""
    if cancel_requested:
        return AttemptEnd.CANCELLED
    if preempt_requested and (stopped or exit_code != 0):
        return AttemptEnd.PREEMPTED
    if stopped:
        return AttemptEnd.CANCELLED
    if timed_out:
        return AttemptEnd.TIMED_OUT
    return AttemptEnd.SUCCEEDED if exit_code == 0 else AttemptEnd.FAILED


@dataclass(frozen=True)
class Requeue:
    """What a preempted job looks like when it is queued again."""

    submitted_at: datetime  # unchanged: its queue position
    restarts: int  # unchanged: preemptions do not consume restarts
    preemptions: int
    not_before: datetime | None = None  # no restart backoff after a preemption


def requeue_after_preemption(submitted_at: datetime, restarts: int, preemptions: int) -> Requeue:
    return Requeue(submitted_at=submitted_at, restarts=restarts, preemptions=preemptions + 1)


def last_checkpoint_s(ran_s: float, checkpoint_every_s: float | None) -> float:
    """Seconds of an attempt's own work saved at its last checkpoint, after it ran ``ran_s`` seconds and
    checkpointed every ``checkpoint_every_s`` (None or 0: never, so nothing is kept)."""
    if not checkpoint_every_s or ran_s <= 0:
        return 0.0
    return math.floor(ran_s / checkpoint_every_s) * checkpoint_every_s


def gpu_seconds_in_window(
    gpus: int, started: float, ended: float | None, turn_until: float | None, since: float, now: float
) -> float:
    """GPU-seconds an attempt of ``gpus`` GPUs counts towards its tenant's usage over the window [``since``,
    ``now``] (times in seconds on one clock; ``ended`` None: still running): from its start to its end, and for an
    attempt placed for a turn (``turn_until``) through the turn's end even if it ended sooner, so that a tenant
    cannot take turn after turn with jobs that fail or are cancelled at once."""
    end = now if ended is None else ended
    if turn_until is not None:
        end = max(end, turn_until)
    return gpus * max(0.0, min(end, now) - max(started, since))


def peak_gpus(attempts: Iterable[tuple[int, float, float | None]], since: float, now: float) -> int:
    """The most GPUs ``attempts`` (GPUs, start, end or None while running; seconds on one clock) held at once
    over [``since``, ``now``] (``Limits.recent_peak_gpus``): an attempt that ended by ``since`` or starts after
    ``now`` does not count; one that ends as another starts is not counted with it. Nor does an ended attempt
    that ran as long as the window or longer: a tenant of short jobs comes back within minutes, and the GPUs it
    used are kept for that; a job that ran for hours and ended says nothing of when its tenant returns, and
    keeping its GPUs idle for the window (tens of them for a large job) would cost more than the one grace
    period a reclaim takes from the long job that returns."""
    edges: list[tuple[float, int]] = []
    for gpus, started, ended in attempts:
        if gpus <= 0 or started > now or (ended is not None and (ended <= since or ended <= started)):
            continue
        if ended is not None and ended - started >= now - since:
            continue
        edges.append((max(started, since), gpus))
        if ended is not None:
            edges.append((ended, -gpus))
    peak = held = 0
    for _, delta in sorted(edges, key=lambda e: (e[0], e[1])):  # at one instant, ends before starts
        held += delta
        peak = max(peak, held)
    return peak
