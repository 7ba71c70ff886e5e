"""Trace-driven simulator: replays a job trace through the control plane's scheduling pass on a simulated clock.

No database and no processes: jobs are records, the clock is an event heap (arrivals, attempt ends, the
end of a preemption's grace period, LAS queue changes, the end of a turn or of the time idle GPUs are kept for
their tenant). After something changed, a scheduling pass runs: at once for a submit (it wakes the control
loop), an attempt's end and the end of a preemption's grace period (the real loop polls the attempts and passes
every ``supervisor_interval_seconds``, 0.2 s); the timed looks (aging, a turn's end, idle GPUs kept for a tenant
lent, a las queue crossed) at the next tick (at most one every ``tick_s`` simulated seconds, coarser than the real
loop's 0.2 s, for speed). Before 2026-11-27's fourth stop an attempt's end waited for the tick too
(docs/scheduling.md, "Results": what that changed).

A pass is the control plane's pure core (``scheduler/pass_core.py``), fed from the simulated attempts where the
control plane reads the database: each tenant's ``Limits`` from its terms and recent usage (``tenant_limits``,
``recent_usage``), the live attempts as ``Held`` with their last checkpoint (``held_attempt``), the queue in the
control plane's order (priority, submit time), the cluster as an ``Inventory`` of nodes of ``gpus_per_node`` GPUs,
and the planner's configuration as the server's settings give it (the grace period included); ``decide`` calls
the production planner. Its placements start attempts; its preemptions stop them after the grace period
(``Held.stopping`` meanwhile), a moved job keeping the hold ``pass_core.moved`` gives it. How an attempt's end moves
its job (preempted -> queued with its original submit time, work kept up to the last checkpoint, restarts
untouched) is ``scheduler/attempts.py``, the rules the control plane applies too. What the control plane does and
the simulator does not model: wait reasons and estimated starts written for users, environment builds holding jobs,
ports, restarts of failed attempts, quotas beyond the guarantees (no trace has them).

The model:
- each trace ``user`` (a Philly virtual cluster) is a tenant guaranteed GPUs in proportion to its share of the
  replayed jobs' GPU-time, floored (so the guarantees sum to at most the cluster), borrowing unlimited,
  weight 1, no hard caps; jobs ask for GPUs only (CPU and memory never bind);
- a job of more than ``gpus_per_node`` GPUs is a gang of ``gpus_per_node``-GPU replicas (plus one smaller
  replica for a remainder); jobs larger than the cluster are skipped and counted;
- every job is preemptible and declares ``max_run_time_s`` = its duration when estimates are on;
- a job checkpoints every ``checkpoint_every_s`` of an attempt's run; a preempted attempt keeps running for
  ``grace_s`` and then loses the work since its last checkpoint.

Determinism: the seed orders equal-time events and jobs submitted at the same instant (as a database's
random ids would); everything but ``timing`` in the result is identical for a trace, configuration and seed.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dlcloud.errors import InvalidArgument
from dlcloud.scheduler import attempts, pass_core
from dlcloud.scheduler.contract import MAX_LEND_AFTER_S, MIN_TURN_WINDOW_S, TURN_MIN_S
from dlcloud.scheduler.inventory import Gpu, Inventory
from dlcloud.scheduler.pass_core import AttemptSpan, TenantTerms
from dlcloud.scheduler.planner import GroupDemand, Held, Plan, PlanConfig, Policy, QueuedJob, plan
from dlcloud.scheduler.trace import TraceJob

EPOCH = datetime(2017, 1, 1, tzinfo=UTC)  # simulated second 0; the planner only sees differences
WINDOW_S = 3600.0  # fairness is judged per one-hour window
FAIR_FRACTION = 0.9  # a tenant with demand gets at least this share of min(its demand, its entitlement)
BUSY_FRACTION = 0.9  # allocation target whenever queued demand exceeds free capacity

# event kinds, in the order they apply at one instant: capacity frees before new work arrives
# _LOOK: a pass, no aging wake (a turn's end; GPUs kept for a tenant's return lent)
_END, _STOP, _ARRIVE, _WAKE, _LOOK = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class SimConfig:
    gpus: int
    gpus_per_node: int
    policy: Policy = Policy.FAIR_SHARE
    seed: int = 0
    tick_s: float = 60.0
    grace_s: float = 30.0
    checkpoint_every_s: float = 900.0
    estimates: bool | None = None  # declare max_run_time_s = duration; None: on unless the policy is las
    # fair-share's knobs, as the server's settings (PlanConfig): las inside tenants (() = off), defragmentation,
    # the turn window (0 = no turns), how long idle guaranteed GPUs stay unlent (0 = lent at once)
    tenant_las_queues_gpu_s: tuple[float, ...] = PlanConfig.tenant_las_queues_gpu_s
    defragment: bool = PlanConfig.defragment
    turn_window_s: float = PlanConfig.turn_window_s
    lend_after_s: float = PlanConfig.lend_after_s

    def validate(self) -> None:
        if self.gpus < 1:
            raise InvalidArgument(f"--gpus must be at least 1, got {self.gpus}")
        if self.gpus_per_node < 1:
            raise InvalidArgument(f"--gpus-per-node must be at least 1, got {self.gpus_per_node}")
        if self.gpus % self.gpus_per_node:
            raise InvalidArgument(
                f"--gpus-per-node must divide --gpus: {self.gpus} GPUs are not whole nodes of {self.gpus_per_node}"
            )
        if self.tick_s <= 0:
            raise InvalidArgument(f"--tick must be > 0 seconds, got {self.tick_s:g}")
        if self.grace_s < 0:
            raise InvalidArgument(f"--grace must be >= 0 seconds, got {self.grace_s:g}")
        if self.checkpoint_every_s < 0:
            raise InvalidArgument(
                f"--checkpoint-every must be >= 0 seconds (0: never), got {self.checkpoint_every_s:g}"
            )
        w = self.turn_window_s
        if not math.isfinite(w) or w < 0 or 0 < w < MIN_TURN_WINDOW_S:
            raise InvalidArgument(
                f"--turn-window must be 0 (no turns) or at least {MIN_TURN_WINDOW_S:g} seconds (a turn lasts "
                f"{TURN_MIN_S:g} s to half the window), got {w:g}"
            )
        if not math.isfinite(self.lend_after_s) or not 0 <= self.lend_after_s <= MAX_LEND_AFTER_S:
            raise InvalidArgument(
                f"--lend-after must be 0 (idle GPUs lent at once) to {MAX_LEND_AFTER_S:g} seconds, got "
                f"{self.lend_after_s:g}"
            )
        q = self.tenant_las_queues_gpu_s
        if any(not math.isfinite(x) or x <= 0 for x in q) or list(q) != sorted(set(q)):
            raise InvalidArgument(
                "--tenant-las-queues must be increasing GPU-second boundaries above 0 (e.g. 7200,72000; none: "
                f"off), got {','.join(f'{x:g}' for x in q)}"
            )

    @property
    def uses_estimates(self) -> bool:
        return self.policy != Policy.LAS if self.estimates is None else self.estimates and self.policy != Policy.LAS

    @property
    def planner(self) -> PlanConfig:
        """The planner's configuration, as the control plane's ``plan_config`` builds it from the server's settings:
        the aging and las queues at their defaults, the grace period a preempted attempt takes (the server's
        ``stop_grace_seconds``) as the one the planner expects it to take."""
        return PlanConfig(
            policy=self.policy,
            preemption_grace_s=self.grace_s,
            tenant_las_queues_gpu_s=self.tenant_las_queues_gpu_s,
            defragment=self.defragment,
            turn_window_s=self.turn_window_s,
            lend_after_s=self.lend_after_s,
        )


def parse_boundaries(text: str) -> tuple[float, ...]:
    """``--tenant-las-queues``: "7200,72000" -> (7200.0, 72000.0); "none" or "" -> () (off)."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise InvalidArgument(
            f"--tenant-las-queues takes GPU-second boundaries separated by commas (e.g. 7200,72000) or none, "
            f"got {text!r}"
        ) from None


class _Job:
    """One trace job's simulated life. ``state``: pending, queued, running, stopping, done."""

    __slots__ = (
        "attained",
        "attempt",
        "done_s",
        "finished_s",
        "gpus",
        "held",
        "held_until",
        "key",
        "lost_gpu_s",
        "preemptions",
        "qjob",
        "start_s",
        "state",
        "trace",
        "turn_until",
    )

    def __init__(self, trace: TraceJob, qjob: QueuedJob, key: tuple) -> None:
        self.turn_until: float | None = None
        self.trace = trace
        self.qjob = qjob
        self.key = key
        self.state = "pending"
        self.done_s = 0.0  # work saved by earlier attempts
        self.attained = 0.0  # GPU-seconds used by earlier attempts (las)
        self.attempt = 0
        self.start_s = 0.0
        self.gpus: tuple[int, ...] = ()
        self.held: Held | None = None
        self.held_until = 0.0  # the cached Held is valid until then (its last checkpoint moves)
        self.finished_s = 0.0
        self.preemptions = 0
        self.lost_gpu_s = 0.0


@dataclass
class _Tenant:
    guarantee: int
    demand: int = 0  # GPUs of its queued and running jobs
    alloc: int = 0  # GPUs its attempts hold
    used_gpu_s: float = 0.0
    windows: dict[int, list[float]] = field(default_factory=dict)  # hour -> [allocated GPU-s, owed GPU-s]


def guarantees(jobs: Sequence[TraceJob], gpus: int) -> dict[str, int]:
    """Each tenant's guarantee: its share of the jobs' GPU-time of ``gpus``, floored (the sum stays <= gpus)."""
    work: dict[str, float] = {}
    for j in jobs:
        work[j.tenant] = work.get(j.tenant, 0.0) + j.gpus * j.duration_s
    total = sum(work.values())
    if total <= 0:
        return {t: 0 for t in sorted(work)}
    return {t: math.floor(gpus * w / total + 1e-9) for t, w in sorted(work.items())}


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``values`` sorted."""
    if not values:
        return 0.0
    k = (len(values) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class Simulator:
    """One replay: ``Simulator(jobs, config).run()`` returns the report (a JSON-ready dict)."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        config: SimConfig,
        progress: Callable[[int, int], None] | None = None,
        planner: Callable[..., Plan] = plan,
    ) -> None:
        config.validate()
        self.plan = planner  # the production planner; tests may pass one with a known answer
        self.cfg = config
        self.pcfg = config.planner
        self.progress = progress
        self.rng = random.Random(config.seed)
        n, k = config.gpus, config.gpus_per_node
        self.gpu_node = [i // k for i in range(n)]
        self.inventory = Inventory(
            host="simulated",
            gpus=tuple(Gpu(i, "simulated-gpu", 0, node=f"node-{i // k}") for i in range(n)),
            cpus=float(n),
            memory=n,
        )
        fits = [j for j in jobs if j.gpus <= n]
        self.skipped_too_large = len(jobs) - len(fits)
        self.guarantee = guarantees(fits, n)
        # each tenant's terms as its row would hold them: the guarantee, weight 1, no caps, borrowing unlimited
        self.terms = [TenantTerms(t, guarantee_gpus=g, weight=1.0) for t, g in self.guarantee.items()]
        self.limits = pass_core.tenant_limits(self.terms)
        # ended attempts: (GPUs, start, end, turn's end) for ``attempts.gpu_seconds_in_window``
        self.usage_log: dict[str, list[tuple[int, float, float, float | None]]] = {t: [] for t in self.guarantee}
        self.tenants = {t: _Tenant(g) for t, g in self.guarantee.items()}
        self.origin = min((j.submit_s for j in fits), default=0.0)
        estimates = config.uses_estimates
        self.jobs: dict[str, _Job] = {}
        order = list(range(len(fits)))
        self.rng.shuffle(order)  # equal submit times: a seeded order, as random job ids give in the database
        for rank, j in zip(order, fits, strict=True):
            q = QueuedJob(
                id=j.job_id,
                tenant_id=j.tenant,
                gpus=j.gpus,
                cpus=0.0,
                memory=0,
                groups=self._groups(j.gpus),
                priority=0,
                submitted_at=EPOCH + timedelta(seconds=j.submit_s),
                max_run_time_s=j.duration_s if estimates else None,
                preemptible=True,
            )
            self.jobs[j.job_id] = _Job(j, q, (-q.priority, j.submit_s, rank))
        # the queue in the control plane's order: sort keys and, at the same index, the jobs as the planner sees them
        self.queue: list[tuple[tuple, str]] = []
        self.queued: list[QueuedJob] = []
        self.held_list: list[Held] | None = None  # the live attempts as Held, until one changes
        self.held_until = math.inf
        self.running: dict[str, _Job] = {}  # running and stopping, in start order
        self.free = set(range(n))
        self.events: list[tuple[float, int, float, int, str, int]] = []
        self.seq = 0
        self.real_events = 0  # events other than wake-ups still in the heap
        self.wake_pending = False
        # metrics
        self.now = self.origin
        self.alloc = 0
        self.queued_gpus = 0
        self.alloc_gpu_s = 0.0
        self.contended_s = 0.0
        self.contended_busy_s = 0.0
        self.hourly: dict[int, float] = {}
        self.passes = 0
        self.pass_seconds: list[float] = []
        self.preemptions = 0
        self.preemptions_finished_in_grace = 0
        self.node_violations = 0
        self.finished = 0

    def _groups(self, gpus: int) -> tuple[GroupDemand, ...]:
        k = self.cfg.gpus_per_node
        if gpus <= k:
            return ()
        groups: tuple[GroupDemand, ...] = (GroupDemand("worker", gpus // k, k),)
        if gpus % k:
            groups += (GroupDemand("worker-rest", 1, gpus % k),)
        return groups

    # --- the clock -------------------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, job_id: str = "", attempt: int = 0) -> None:
        self.seq += 1
        if kind not in (_WAKE, _LOOK):
            self.real_events += 1
        heapq.heappush(self.events, (t, kind, self.rng.random(), self.seq, job_id, attempt))

    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        for j in self.jobs.values():
            self._push(j.trace.submit_s, _ARRIVE, j.trace.job_id)
        last_pass = -math.inf
        pass_at: float | None = None
        total = len(self.jobs)
        handled = 0
        while self.events or pass_at is not None:
            if pass_at is not None and (not self.events or pass_at < self.events[0][0]):
                self._advance(pass_at)
                self._pass()
                last_pass, pass_at = pass_at, None
                continue
            t, kind, _, _, job_id, attempt = heapq.heappop(self.events)
            if kind == _LOOK and not (self.real_events or self.running or self.queue):
                continue  # the replay is over: no pass, and the clock stays at its end
            if kind == _WAKE:
                self.wake_pending = False
            elif kind != _LOOK:
                self.real_events -= 1
            self._advance(t)
            if self._handle(kind, job_id, attempt):
                # a submit wakes the control loop at once (``submit_job``), and the real loop polls the attempts and
                # passes every 0.2 s (``ControlLoop.tick``: supervise, then schedule): an attempt's end or stop is
                # placed on at once; only the timed looks (_WAKE, _LOOK) wait for the tick
                at = t if kind in (_ARRIVE, _STOP, _END) else max(t, last_pass + self.cfg.tick_s)
                pass_at = at if pass_at is None else min(pass_at, at)
            handled += 1
            if self.progress is not None and handled % 2048 == 0:
                self.progress(self.finished, total)
        if self.progress is not None:
            self.progress(self.finished, total)
        return self._report(time.perf_counter() - wall0)

    def _handle(self, kind: int, job_id: str, attempt: int) -> bool:
        """Apply one event; True when it changed what a pass would see."""
        if kind in (_WAKE, _LOOK):
            return bool(self.queue)
        job = self.jobs[job_id]
        if kind == _ARRIVE:
            self._enqueue(job)
            return True
        if job.attempt != attempt or job.state not in ("running", "stopping"):
            return False  # an event of an attempt that has already ended
        ran = self.now - job.start_s
        if kind == _END:
            end = attempts.attempt_end(exit_code=0, stopped=False, timed_out=False)
            if job.state == "stopping":
                self.preemptions_finished_in_grace += 1
        else:
            end = attempts.attempt_end(exit_code=None, stopped=True, timed_out=False, preempt_requested=True)
        self._release(job, ran)
        if end == attempts.AttemptEnd.SUCCEEDED:
            job.state = "done"
            job.finished_s = self.now
            job.done_s = job.trace.duration_s
            self.finished += 1
            t = self.tenants[job.trace.tenant]
            t.demand -= job.trace.gpus
        else:  # preempted: keep the work up to the last checkpoint, queue again where it was
            kept = attempts.last_checkpoint_s(ran, self.cfg.checkpoint_every_s)
            job.done_s = min(job.trace.duration_s, job.done_s + kept)
            job.lost_gpu_s += (ran - kept) * job.trace.gpus
            job.preemptions = attempts.requeue_after_preemption(
                job.qjob.submitted_at or EPOCH, 0, job.preemptions
            ).preemptions
            self.tenants[job.trace.tenant].demand -= job.trace.gpus  # _enqueue adds it back
            self._enqueue(job)
        return True

    # --- job state -------------------------------------------------------------------------------------------

    def _enqueue(self, job: _Job) -> None:
        if job.attained and job.qjob.attained_gpu_s != job.attained:
            job.qjob = dataclasses.replace(job.qjob, attained_gpu_s=job.attained)
        job.state = "queued"
        entry = (job.key, job.trace.job_id)
        i = bisect.bisect_left(self.queue, entry)
        self.queue.insert(i, entry)
        self.queued.insert(i, job.qjob)
        self.queued_gpus += job.trace.gpus
        self.tenants[job.trace.tenant].demand += job.trace.gpus

    def _reclaiming(self, job_id: str, turn_s: float | None = None) -> None:
        """``job_id`` was granted preemptions (``turn_s``: for its tenant's turn, that long): it stays marked (and is
        considered first) until it starts, as the control plane's ``reclaiming`` (and ``turn_seconds``) columns."""
        job = self.jobs.get(job_id)
        if job is None or job.state != "queued" or (job.qjob.reclaiming and turn_s is None):
            return
        i = bisect.bisect_left(self.queue, (job.key, job.trace.job_id))
        turn = job.qjob.turn_s if turn_s is None else turn_s
        job.qjob = self.queued[i] = dataclasses.replace(job.qjob, reclaiming=True, turn_s=turn)

    def _start(self, job: _Job, gpus: tuple[int, ...]) -> None:
        i = bisect.bisect_left(self.queue, (job.key, job.trace.job_id))
        del self.queue[i]
        del self.queued[i]
        if job.qjob.reclaiming or job.qjob.hold or job.qjob.turn_s is not None:
            job.qjob = dataclasses.replace(job.qjob, reclaiming=False, hold=(), hold_until=None, turn_s=None)
        self.queued_gpus -= job.trace.gpus
        job.state = "running"
        job.attempt += 1
        job.start_s = self.now
        job.gpus = gpus
        job.held = None
        self.held_list = None
        self.free.difference_update(gpus)
        self.alloc += len(gpus)
        self.tenants[job.trace.tenant].alloc += len(gpus)
        self.running[job.trace.job_id] = job
        remaining = max(0.0, job.trace.duration_s - job.done_s)
        self._push(self.now + remaining, _END, job.trace.job_id, job.attempt)
        if self.pcfg.policy == Policy.LAS:  # its las queue changes as it runs: a pass must look again then
            for bound in self.pcfg.las_queues_gpu_s:
                if bound > job.attained:
                    cross = self.now + (bound - job.attained) / job.trace.gpus
                    if cross < self.now + remaining:
                        self._push(cross, _WAKE)
                        self.wake_pending = True

    def _release(self, job: _Job, ran: float) -> None:
        del self.running[job.trace.job_id]
        lend = self.pcfg.lend_after_s
        if lend > 0 and self.pcfg.policy == Policy.FAIR_SHARE and self.guarantee[job.trace.tenant]:
            self._push(self.now + lend, _LOOK)  # what it kept idle for its tenant is lent then: a pass must look
        self.usage_log[job.trace.tenant].append((len(job.gpus), job.start_s, self.now, job.turn_until))
        job.turn_until = None
        self.free.update(job.gpus)
        self.alloc -= len(job.gpus)
        t = self.tenants[job.trace.tenant]
        t.alloc -= len(job.gpus)
        job.attained += ran * len(job.gpus)
        job.gpus = ()
        job.held = None
        self.held_list = None

    def _held(self, job: _Job) -> Held:
        """The running attempt as the control plane gives it to the pass (``pass_core.held_attempt``), its last
        checkpoint as the executor would have seen it; kept until that moves (or, fair-share, its tenant las queue
        does): a memo, the planner weighs nothing else of it that changes."""
        if job.held is not None and self.now < job.held_until and self.pcfg.policy != Policy.LAS:
            return job.held
        ran = self.now - job.start_s
        kept = attempts.last_checkpoint_s(ran, self.cfg.checkpoint_every_s)
        start = EPOCH + timedelta(seconds=job.start_s)
        stopping = job.state == "stopping"
        job.held = pass_core.held_attempt(
            job.trace.tenant,
            job.gpus,
            0.0,
            0,
            now=EPOCH + timedelta(seconds=self.now),
            job_id=job.trace.job_id,
            started_at=start,
            running_s=ran,
            checkpoint_at=start + timedelta(seconds=kept) if kept else None,
            attained_before_gpu_s=job.attained,
            priority=job.qjob.priority,
            submitted_at=job.qjob.submitted_at,
            max_run_time_s=job.qjob.max_run_time_s,
            preempt_requested=stopping,
            hold_gpus=job.qjob.hold,
            hold_until=job.qjob.hold_until,
            preemptions=job.preemptions,
            turn_until=None if job.turn_until is None else EPOCH + timedelta(seconds=job.turn_until),
        )
        every = self.cfg.checkpoint_every_s
        job.held_until = job.start_s + kept + every if every else math.inf
        # fair-share weighs a running job's attained service by its tenant's las queue: the Held is stale once the
        # job crosses the next boundary (before, a pass up to a checkpoint interval later saw the old queue, and
        # when the cache was filled, not the trace, decided what the planner saw)
        attained = job.held.attained_gpu_s
        for bound in self.pcfg.tenant_las_queues_gpu_s:
            if bound > attained and job.gpus:
                job.held_until = min(job.held_until, self.now + (bound - attained) / len(job.gpus))
                break
        return job.held

    # --- the scheduling pass ---------------------------------------------------------------------------------

    def _pass(self) -> None:
        if self.held_list is None or self.now >= self.held_until or self.pcfg.policy == Policy.LAS:
            self.held_list = [self._held(j) for j in self.running.values()]
            self.held_until = min((j.held_until for j in self.running.values()), default=math.inf)
        now = EPOCH + timedelta(seconds=self.now)
        if pass_core.needs_recent_usage(self.pcfg):
            recent = pass_core.recent_usage(self._spans(), self.now, self.pcfg.turn_window_s, self.pcfg.lend_after_s)
            self.limits = pass_core.tenant_limits(self.terms, recent)
        t0 = time.perf_counter()
        result = pass_core.decide(self.queued, self.held_list, self.limits, self.inventory, now, self.pcfg, self.plan)
        self.pass_seconds.append(time.perf_counter() - t0)
        self.passes += 1
        self._apply(result)
        if (
            self.queue
            and not self.wake_pending
            and self.pcfg.aging_step
            and self.pcfg.policy in (Policy.PRIORITY_BACKFILL, Policy.FAIR_SHARE)
            and (self.real_events or self.running)
        ):  # waiting raises effective priority: look again after an aging interval even if nothing happens
            self._push(self.now + self.pcfg.aging_interval_s, _WAKE)
            self.wake_pending = True

    def _spans(self) -> Iterator[AttemptSpan]:
        """The attempts recent usage counts, as the control plane reads them: each tenant's ended ones that ended (or
        whose turn ended) within the longer window, then the running ones. Older ended ones count for nothing and are
        forgotten."""
        since = self.now - max(self.pcfg.turn_window_s, self.pcfg.lend_after_s)
        for tenant, log in self.usage_log.items():
            keep = self.usage_log[tenant] = [x for x in log if max(x[2], x[3] or x[2]) > since]
            for gpus, started, ended, turn_until in keep:
                yield AttemptSpan(tenant, gpus, started, ended, turn_until)
        for job in self.running.values():
            yield AttemptSpan(job.trace.tenant, len(job.gpus), job.start_s, None, job.turn_until)

    def _apply(self, result: Plan) -> None:
        for job_id, gpus in result.placements:
            job = self.jobs.get(job_id)
            if job is None or job.state != "queued":
                raise RuntimeError(f"planner placed {job_id}, which is not queued")
            if len(gpus) != job.trace.gpus or len(set(gpus)) != len(gpus) or not self.free.issuperset(gpus):
                raise RuntimeError(f"planner placed {job_id} on GPUs {gpus}: not {job.trace.gpus} free GPUs")
            if not self._on_nodes(job, gpus):
                self.node_violations += 1
            self._start(job, gpus)
        for job_id, until in result.turns.items():
            turned = self.jobs.get(job_id)
            if turned is None or turned.state != "running" or turned.start_s != self.now:
                raise RuntimeError(f"planner gave {job_id} a turn, which it did not place")
            turned.turn_until = (until - EPOCH).total_seconds()
            self._push(turned.turn_until, _LOOK)  # its turn ends: a pass lets the owners take their GPUs back
        for p in result.preemptions:
            self._reclaiming(p.by, result.turn_grants.get(p.by))
            job = self.jobs.get(p.job_id)
            if job is None or job.state != "running":
                raise RuntimeError(f"planner preempted {p.job_id}, which is not a running attempt")
            job.state = "stopping"
            marks = pass_core.moved(p, EPOCH + timedelta(seconds=self.now), self.cfg.grace_s)
            if marks is not None:  # moved, not evicted: considered first once queued again, on the GPUs held for it
                job.qjob = dataclasses.replace(
                    job.qjob, reclaiming=marks.reclaiming, hold=marks.hold, hold_until=marks.hold_until
                )
            job.held = None
            self.held_list = None
            self.preemptions += 1
            self._push(self.now + self.cfg.grace_s, _STOP, p.job_id, job.attempt)

    def _on_nodes(self, job: _Job, gpus: tuple[int, ...]) -> bool:
        """A process's GPUs are on one node: the whole job's, or each gang replica's."""
        node = self.gpu_node
        sizes = [g.gpus for g in job.qjob.groups for _ in range(g.count)] or [len(gpus)]
        i = 0
        for size in sizes:
            replica = gpus[i : i + size]
            i += size
            if replica and any(node[g] != node[replica[0]] for g in replica):
                return False
        return True

    # --- metrics ---------------------------------------------------------------------------------------------

    def _advance(self, t: float) -> None:
        """Integrate allocation, contention and each tenant's share from the last change up to ``t``."""
        t0 = self.now
        if t <= t0:
            return
        n = self.cfg.gpus
        dt = t - t0
        self.alloc_gpu_s += self.alloc * dt
        if self.queued_gpus > n - self.alloc:
            self.contended_s += dt
            if self.alloc >= BUSY_FRACTION * n - 1e-9:
                self.contended_busy_s += dt
        active = [x for x in self.tenants.values() if x.demand]
        for w, d in self.window_spans(t):
            self.hourly[w] = self.hourly.get(w, 0.0) + self.alloc * d
            for x in active:
                acc = x.windows.get(w)
                if acc is None:
                    acc = x.windows[w] = [0.0, 0.0]
                acc[0] += x.alloc * d
                acc[1] += min(x.demand, x.guarantee) * d
                x.used_gpu_s += x.alloc * d
        self.now = t

    def window_spans(self, t: float) -> Iterator[tuple[int, float]]:
        """(one-hour window, seconds of it) from now up to ``t``."""
        t0 = self.now
        w = int((t0 - self.origin) // WINDOW_S)
        while t0 < t:
            # the window index steps: recomputed from the float time, an hour's end could round back into the
            # same window, and the loop would not advance (a trace whose first submit is fractional)
            end = min(t, self.origin + (w + 1) * WINDOW_S)
            yield w, end - t0
            t0 = end
            w += 1

    def _report(self, wall_s: float) -> dict[str, Any]:
        done = [j for j in self.jobs.values() if j.state == "done"]
        jcts = sorted(j.finished_s - j.trace.submit_s for j in done)
        end = max((j.finished_s for j in done), default=self.origin)
        span = max(end - self.origin, 0.0)
        n = self.cfg.gpus
        work = {t: 0.0 for t in self.tenants}
        for j in self.jobs.values():
            work[j.trace.tenant] += j.trace.gpus * j.trace.duration_s
        total_work = sum(work.values()) or 1.0
        tenants: dict[str, Any] = {}
        below_total = 0
        for name in sorted(self.tenants):
            x = self.tenants[name]
            with_demand = len(x.windows)
            below = sum(1 for a, owed in x.windows.values() if owed > 0 and a < FAIR_FRACTION * owed - 1e-6)
            below_total += below
            mine = sorted(j.finished_s - j.trace.submit_s for j in done if j.trace.tenant == name)
            tenants[name] = {
                "jobs": sum(1 for j in self.jobs.values() if j.trace.tenant == name),
                "guarantee_gpus": x.guarantee,
                "entitlement": round(x.guarantee / n, 4),
                "trace_gpu_time_share": round(work[name] / total_work, 4),
                "share": round(x.used_gpu_s / (n * span), 4) if span else 0.0,
                "windows_with_demand": with_demand,
                "windows_below_90pct": below,
                "below_fraction": round(below / with_demand, 4) if with_demand else 0.0,
                "avg_jct_s": round(sum(mine) / len(mine), 1) if mine else None,
            }
        hours = max(self.hourly, default=-1) + 1
        return {
            "policy": self.cfg.policy.value,
            "gpus": n,
            "gpus_per_node": self.cfg.gpus_per_node,
            "seed": self.cfg.seed,
            "tick_s": self.cfg.tick_s,
            "grace_s": self.cfg.grace_s,
            "checkpoint_every_s": self.cfg.checkpoint_every_s,
            "estimates": self.cfg.uses_estimates,
            "tenant_las_queues_gpu_s": list(self.cfg.tenant_las_queues_gpu_s),
            "defragment": self.cfg.defragment,
            "turn_window_s": self.cfg.turn_window_s,
            "lend_after_s": self.cfg.lend_after_s,
            "jobs": {
                "total": len(self.jobs),
                "finished": len(done),
                "unfinished": len(self.jobs) - len(done),
                "skipped_too_large": self.skipped_too_large,
            },
            "avg_jct_s": round(sum(jcts) / len(jcts), 1) if jcts else 0.0,
            "p50_jct_s": round(_percentile(jcts, 50), 1),
            "p99_jct_s": round(_percentile(jcts, 99), 1),
            "makespan_s": round(span, 1),
            "gpu_allocation": {
                "mean": round(self.alloc_gpu_s / (n * span), 4) if span else 0.0,
                "contended_time_s": round(self.contended_s, 1),
                "busy_when_contended": round(self.contended_busy_s / self.contended_s, 4) if self.contended_s else 1.0,
                "hourly": [round(self.hourly.get(h, 0.0) / (n * WINDOW_S), 4) for h in range(hours)],
            },
            "preemptions": self.preemptions,
            "preemptions_finished_in_grace": self.preemptions_finished_in_grace,
            "work_lost_gpu_s": round(sum(j.lost_gpu_s for j in self.jobs.values()), 1),
            "node_violations": self.node_violations,
            "tenants": tenants,
            "fairness": {
                "windows_below_90pct": below_total,
                "worst_below_fraction": max((t["below_fraction"] for t in tenants.values()), default=0.0),
            },
            "passes": self.passes,
            "timing": {
                "planner_ms_mean": round(1000 * sum(self.pass_seconds) / len(self.pass_seconds), 3)
                if self.pass_seconds
                else 0.0,
                "planner_ms_max": round(1000 * max(self.pass_seconds, default=0.0), 3),
                "planner_s_total": round(sum(self.pass_seconds), 3),
                "wall_s": round(wall_s, 3),
            },
        }


def simulate(
    jobs: Sequence[TraceJob], config: SimConfig, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Replay ``jobs`` under ``config``; the report's keys are described in docs/scheduling.md."""
    return Simulator(jobs, config, progress).run()
