"""The control loop: schedules queued jobs and supervises running attempts.

It runs in the leader control-plane process only (``leader.py``). Each tick:
1. supervise: poll every live attempt through the executor and apply what happened (RUNNING, exit,
   timeout, cancellation, restart policy) through ``job_states``;
2. schedule: plan placements with ``scheduler.planner`` inside one write transaction, record the new
   attempts (STARTING), commit, then start the workloads.

Recording the attempt before starting it means a crash in between leaves an attempt that never
launched; the supervisor sees it as lost-before-launch and starts it then, so nothing is lost and
nothing runs twice. Attempts hold their resources until ``finished_at`` is set.

Fencing: with a ``Leadership`` every pass starts with ``verify`` and every write transaction with ``fence``
(``_write``); ``LeadershipLost`` from either ends ``run``, so a deposed leader writes nothing more.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from sqlalchemy import ColumnElement, Connection, Row, and_, insert, or_, select, text, update
from sqlalchemy.orm import Session

from dlcloud.errors import DlcloudError
from dlcloud.executors.base import AttemptReport, Executor, ReplicaReport, Workload
from dlcloud.scheduler.planner import GroupDemand, Held, Limits, QueuedJob, plan
from dlcloud.schemas.jobs import DEFAULT_POST_TIMEOUT_SECONDS, JobState
from dlcloud.services import gangs, job_states, recipes
from dlcloud.services.datasets import env_name as dataset_env_name
from dlcloud.services.env_builds import EnvironmentBuilder
from dlcloud.services.jobs import QUEUE_STATES, RESOLVED_DATASETS, job_dir, job_env
from dlcloud.services.leader import Leadership, LeadershipLost
from dlcloud.services.platform import Platform
from dlcloud.services.ports import PortAllocator, attempt_ports, release_ports
from dlcloud.storage.cache import ObjectCache
from dlcloud.storage.objects import ObjectDamaged
from dlcloud.storage.tree_cache import CacheFull, TreeCache
from dlcloud.store.rows import AttemptRow, CodeRow, EnvironmentBuildRow, JobRow, ReplicaRow, TenantRow, utcnow

log = logging.getLogger(__name__)
SCHEDULE_LOCK_ID = 0x646C636C6F7565  # PostgreSQL advisory lock: one scheduling pass at a time
LOCAL_ADDRESS = "localhost"  # how the replicas of a gang on this host reach each other


def post_note(report: AttemptReport) -> str:
    """What a failed post_command adds to the reason of the attempt's final event ('' when it succeeded or
    none ran): post never changes the attempt's outcome, but its failure must not go unnoticed."""
    if report.post_timed_out:
        return f"; post_command timed out (exit code {report.post_exit_code})"
    if report.post_exit_code:
        return f"; post_command failed with exit code {report.post_exit_code}"
    return ""


QUEUE_ORDER = (JobRow.priority.desc(), JobRow.created_at, JobRow.id)


def _behind(row: Row) -> ColumnElement[bool]:
    """Jobs after ``row`` in QUEUE_ORDER."""
    return or_(
        JobRow.priority < row.priority,
        and_(
            JobRow.priority == row.priority,
            or_(JobRow.created_at > row.created_at, and_(JobRow.created_at == row.created_at, JobRow.id > row.id)),
        ),
    )


class _EnvironmentHolds:
    """Queued jobs whose environment is not READY: held while it builds, failed when its build failed.
    The builds are read once per pass, and only when a job in the queue runs in a built environment."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.failed: dict[str, str] = {}  # job id -> the reason it fails
        self._builds: dict[str, tuple[str, str | None]] | None = None

    def reason(self, r: Row) -> str | None:
        if r.environment_hash is None:
            return None
        if self._builds is None:
            q = select(EnvironmentBuildRow.spec_hash, EnvironmentBuildRow.state, EnvironmentBuildRow.error)
            self._builds = {h: (st, e) for h, st, e in self.conn.execute(q.where(EnvironmentBuildRow.state != "READY"))}
        state, error = self._builds.get(r.environment_hash, ("READY", None))
        if state == "FAILED":
            self.failed[r.id] = f"environment {r.environment!r} failed to build: {error}"
            return f"environment {r.environment!r} failed to build"
        return None if state == "READY" else f"environment {r.environment!r} is building"


def _read_queue(conn: Connection, seen: list[Row], holds: _EnvironmentHolds) -> Iterator[QueuedJob]:
    """The queue in QUEUE_ORDER, read lazily in growing chunks: a pass that stops at the first job that
    must wait reads one small chunk, not the whole queue. Rows handed out are appended to ``seen``."""
    size = 512
    after: Row | None = None
    while True:
        q = select(
            JobRow.id,
            JobRow.tenant_id,
            JobRow.gpus,
            JobRow.cpus,
            JobRow.memory,
            JobRow.gpu_type,
            JobRow.not_before,
            JobRow.wait_reason,
            JobRow.priority,
            JobRow.created_at,
            JobRow.environment,
            JobRow.environment_hash,
            JobRow.replica_groups,
        ).where(JobRow.state.in_(QUEUE_STATES))
        if after is not None:
            q = q.where(_behind(after))
        rows = conn.execute(q.order_by(*QUEUE_ORDER).limit(size)).all()
        for r in rows:
            seen.append(r)
            groups = tuple(
                GroupDemand(g["role"], int(g["count"]), int(g["gpus"]), g.get("gpu_type"))
                for g in r.replica_groups or ()
            )
            yield QueuedJob(
                r.id, r.tenant_id, r.gpus, r.cpus, r.memory, r.gpu_type, r.not_before, holds.reason(r), groups
            )
        if len(rows) < size:
            return
        after = rows[-1]
        size = min(size * 4, 16_384)


class ControlLoop:
    def __init__(self, platform: Platform, executor: Executor, leadership: Leadership | None = None):
        self.p = platform
        self.executor = executor
        self.leadership = leadership  # None: unfenced (tests that drive the loop without an election)
        self._stopping: set[int] = set()  # attempt ids already sent a stop
        self._relaunched: set[int] = set()
        self._wake = threading.Event()
        # builds environments while this loop runs
        self.builds = EnvironmentBuilder(platform, leadership)
        cache = platform.settings.data_dir / "cache"
        self.code_cache = ObjectCache(cache / "objects", platform.objects)
        self.data_cache = TreeCache(cache / "datasets", platform.objects, platform.settings.dataset_cache_max_bytes)

    # -- driving -----------------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Run passes until ``stop`` is set or this process stops leading."""
        interval = self.p.settings.supervisor_interval_seconds
        if self.builds.closed:  # shut down at the end of a former term of leadership
            self.builds = EnvironmentBuilder(self.p, self.leadership)
        try:
            while not stop.is_set():
                try:
                    self.tick()
                except LeadershipLost as exc:
                    log.warning("stopped leading the scheduler: %s", exc)
                    return
                except Exception:  # the loop must survive a failing tick (e.g. database briefly down)
                    log.exception("control loop tick failed")
                self._wake.wait(interval)
                self._wake.clear()
        finally:
            self.builds.shutdown()  # running builds stop; the next leader builds them again

    def tick(self) -> None:
        if self.leadership is not None:
            self.leadership.verify()
        self.executor.reap()
        self.supervise()
        self.schedule()
        self.builds.dispatch()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Session]:
        """A write transaction of the loop: fenced, so it is refused (``LeadershipLost``) once another
        process leads."""
        if self.leadership is None:
            with self.p.db.write() as s:
                yield s
        else:
            with self.leadership.write() as s:
                yield s

    # -- scheduling --------------------------------------------------------------------------------
    def schedule(self) -> int:
        """One scheduling pass; returns the number of attempts started."""
        now = utcnow()
        workloads: list[Workload] = []
        with self._write() as s:
            if not self.p.db.is_sqlite:
                # passes must not interleave (two would place the same job); SQLite's BEGIN IMMEDIATE
                # already serialises them, PostgreSQL needs this transaction-scoped lock
                s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEDULE_LOCK_ID})
            conn = s.connection()
            seen: list[Row] = []  # queue rows the planner looked at, in order
            holds = _EnvironmentHolds(conn)
            queue = _read_queue(conn, seen, holds)
            first = next(queue, None)
            if first is None:
                return 0
            held = [
                Held(t, tuple(g), c, m)
                for t, g, c, m in conn.execute(
                    select(AttemptRow.tenant_id, AttemptRow.gpus, AttemptRow.cpus, AttemptRow.memory).where(
                        AttemptRow.finished_at.is_(None)
                    )
                )
            ]
            limits = {
                t: Limits(g, c, m, r)
                for t, g, c, m, r in conn.execute(
                    select(
                        TenantRow.id,
                        TenantRow.quota_gpus,
                        TenantRow.quota_cpus,
                        TenantRow.quota_memory,
                        TenantRow.quota_max_running_jobs,
                    )
                )
            }
            result = plan(itertools.chain((first,), queue), held, limits, self.p.inventory, now)
            placed = {job_id for job_id, _ in result.placements}
            reasons = result.wait_reasons
            # write the wait reasons that changed; a job no longer held back by something specific gets its
            # reason cleared (a placed job's is cleared by its transition)
            changed = [
                {"id": r.id, "wait_reason": reasons.get(r.id)}
                for r in seen
                if r.wait_reason != reasons.get(r.id) and r.id not in placed and r.id not in holds.failed
            ]
            if changed:
                s.execute(update(JobRow), changed)
            if result.blocked_by is not None:
                # the jobs behind the blocked one were not looked at: they wait behind it, for no reason of
                # their own
                s.execute(
                    update(JobRow)
                    .where(JobRow.state.in_(QUEUE_STATES), JobRow.wait_reason.is_not(None), _behind(seen[-1]))
                    .values(wait_reason=None)
                    .execution_options(synchronize_session=False)
                )
            jobs = self._load_for_placement(s, [job_id for job_id, _ in result.placements])
            attempts: list[dict] = []
            events: list[dict] = []
            replicas: list[dict] = []
            settings = self.p.settings
            ports = PortAllocator(s, settings.job_port_range_start, settings.job_port_range_end)
            for job_id, gpus in result.placements:
                job = jobs.get(job_id)
                if job is None or job.state not in QUEUE_STATES:
                    continue  # cancelled since the queue was read (PostgreSQL); its resources stay free
                try:
                    data = self._datasets(job, job.attempt + 1)
                except CacheFull as exc:  # waits until jobs that hold the cache end
                    job.wait_reason = f"waiting for room in the dataset cache: {exc.message}"
                    continue
                except DlcloudError as exc:  # its data is gone or damaged in the store: it can never start
                    # the reason names the datasets, not where the store keeps them (another tenant's, maybe)
                    log.error("job %s: its datasets cannot be read: %s", job.id, exc.message)
                    names = ", ".join(
                        f"{d['owner']}/{d['name']}@{d['version']}" for d in job.spec.get(RESOLVED_DATASETS) or []
                    )
                    why = f"its datasets ({names}) are missing or damaged in the server's storage; ask an administrator"
                    job_states.transition(s, job, JobState.FAILED, why, at=now, events=events)
                    continue
                needed = recipes.ports_needed(job.spec, job.replica_groups)
                got = ports.allocate(job.id, job.attempt + 1, needed, now)
                if got is None:
                    job.wait_reason = (
                        f"waiting for {needed} free port(s) in {settings.job_port_range_start}-"
                        f"{settings.job_port_range_end}"
                    )
                    continue
                workloads.append(self._place(s, job, gpus, now, attempts, events, replicas, got, data))
            if holds.failed:  # their environment failed to build: they can never start
                for job in s.scalars(select(JobRow).where(JobRow.id.in_(list(holds.failed))).with_for_update()):
                    if job.state in QUEUE_STATES:
                        job_states.transition(s, job, JobState.FAILED, holds.failed[job.id], at=now, events=events)
            if attempts:
                s.execute(insert(AttemptRow), attempts)
            if replicas:
                s.execute(insert(ReplicaRow), replicas)
            job_states.add_events(s, events)
        for w in workloads:
            self._start(w)
        return len(workloads)

    def _load_for_placement(self, s: Session, job_ids: list[str]) -> dict[str, JobRow]:
        """The jobs to place, locked, in a few queries; their code rows go into the identity map so that
        ``_workload`` needs no query (a query would autoflush, turning batched inserts into one per row)."""
        jobs: dict[str, JobRow] = {}
        for lo in range(0, len(job_ids), 500):
            q = select(JobRow).where(JobRow.id.in_(job_ids[lo : lo + 500])).with_for_update()
            jobs.update((j.id, j) for j in s.scalars(q))
        tenant_ids = sorted({j.tenant_id for j in jobs.values()})
        s.scalars(select(TenantRow).where(TenantRow.id.in_(tenant_ids))).all()  # their sandbox slots
        code_ids = sorted({j.code_id for j in jobs.values() if j.code_id})
        for lo in range(0, len(code_ids), 500):
            s.scalars(select(CodeRow).where(CodeRow.id.in_(code_ids[lo : lo + 500]))).all()
        return jobs

    def _place(
        self,
        s: Session,
        job: JobRow,
        gpus: tuple[int, ...],
        now: datetime,
        attempts: list[dict],
        events: list[dict],
        replicas: list[dict],
        ports: list[int],
        data: list[tuple[str, Path]],
    ) -> Workload:
        """Record attempt ``job.attempt + 1``: the attempt, replica and event rows go to ``attempts`` /
        ``replicas`` / ``events`` for one bulk insert each."""
        job.attempt += 1
        attempt_dir = job_dir(self.p, job.tenant_id, job.id) / f"attempt-{job.attempt}"
        workload = self._workload(s, job, gpus, attempt_dir, ports, data)
        for r in workload.replicas:
            replicas.append(
                {
                    "job_id": job.id,
                    "tenant_id": job.tenant_id,
                    "attempt": job.attempt,
                    "name": r.name,
                    "role": r.role,
                    "index": r.index,
                    "host": self.p.inventory.host,
                    "gpus": list(r.gpus),
                    "cpus": r.cpus,
                    "memory": r.memory_bytes,
                    "ports": list(r.ports),
                    "state": "running",
                    "exit_code": None,
                }
            )
        attempts.append(
            {
                "job_id": job.id,
                "tenant_id": job.tenant_id,
                "user_id": job.user_id,
                "number": job.attempt,
                "host": self.p.inventory.host,
                "gpus": list(gpus),
                "cpus": job.cpus,
                "memory": job.memory,
                "attempt_dir": str(attempt_dir),
                "started_at": now,
                "ports": list(ports) or None,
            }
        )
        where = f" on GPU(s) {','.join(map(str, gpus))}" if gpus else ""
        if workload.replicas:
            where = f" as a gang of {len(workload.replicas)} replica(s){where}"
        job_states.transition(
            s,
            job,
            JobState.STARTING,
            f"attempt {job.attempt} placed on {self.p.inventory.host}{where}",
            at=now,
            events=events,
        )
        return workload

    def _datasets(self, job: JobRow, attempt: int) -> list[tuple[str, Path]]:
        """(name, local read-only directory) of each dataset version the job reads, pinned in this host's
        dataset cache for the attempt (released when it ends). With a local store, the stored tree itself;
        with a remote one, fetched once into the cache (here, in the placing pass: moves to the executor with
        opaque workload handles)."""
        out = []
        for d in job.spec.get(RESOLVED_DATASETS) or []:
            key = str(d["storage_key"])
            manifest = self.p.objects.tree_manifest(key)
            if manifest.artifact_sha256() != d["sha256"]:
                raise ObjectDamaged(key, "does not hold the version the job was given")
            out.append((str(d["name"]), self.data_cache.acquire(key, manifest, _holder(job.id, attempt))))
        return out

    def _workload(
        self, s, job: JobRow, gpus: tuple[int, ...], attempt_dir: Path, ports: list[int], data: list[tuple[str, Path]]
    ) -> Workload:
        jd = job_dir(self.p, job.tenant_id, job.id)
        code_archive = package = None
        if job.code_id:
            code = s.get(CodeRow, job.code_id)
            if code is not None:
                # a local store's own file; a remote store's object is fetched into this host's cache first
                # (here, in the placing transaction: moves to the executor with opaque workload handles)
                local = self.code_cache.path(code.storage_key, code.sha256)
                if code.kind == "archive":
                    code_archive = local
                else:
                    package = local
        env = job_env(self.p, job)  # env and the decrypted secret_env
        env.update(
            {
                "DLCLOUD_JOB": job.name,
                "DLCLOUD_JOB_ID": job.id,
                "DLCLOUD_ATTEMPT": str(job.attempt),
                "DLCLOUD_CHECKPOINT_DIR": str(jd / "checkpoints"),
                "DLCLOUD_OUTPUT_DIR": str(jd / "outputs"),
                "DLCLOUD_ENVIRONMENT": job.environment or "default",
                "DLCLOUD_DATASETS": json.dumps({name: str(path) for name, path in data}),
            }
        )
        env.update({dataset_env_name(name): str(path) for name, path in data})
        per_slot: list[tuple[int, ...]] = [gpus]
        if job.replica_groups:
            per_slot, rest = [], list(gpus)
            for slot in recipes.slots(job.replica_groups):
                per_slot.append(tuple(rest[: slot.gpus]))
                rest = rest[slot.gpus :]
        launch = None
        if job.replica_groups or (job.spec.get("framework") or "none") != "none":
            launch = recipes.build(
                job.spec,
                job.replica_groups,
                command=job.command,
                job_id=job.id,
                attempt=job.attempt,
                max_restarts=job.max_restarts,
                host=LOCAL_ADDRESS,
                ports=ports,
                gpus=per_slot,
                attempt_dir=attempt_dir,
                as_root=self.executor.jobs_run_as_root,
            )
            env.update(launch.env)
        grace = job.spec.get("grace_period")
        timeout = None
        if job.timeout_seconds is not None:
            elapsed = (utcnow() - job.started_at).total_seconds() if job.started_at else 0.0
            timeout = max(job.timeout_seconds - elapsed, 0.5)
        return Workload(
            job_id=job.id,
            tenant_id=job.tenant_id,
            attempt=job.attempt,
            attempt_dir=attempt_dir,
            command=job.command,
            pre_command=job.spec.get("pre_command"),
            post_command=job.spec.get("post_command"),
            post_timeout_seconds=float(job.spec.get("post_timeout") or DEFAULT_POST_TIMEOUT_SECONDS),
            env=env,
            code_archive=code_archive,
            package=package,
            venv=self.p.environments.location(job.environment_hash) if job.environment_hash else None,
            gpus=gpus,
            cpus=job.cpus,
            memory_bytes=job.memory,
            timeout_seconds=timeout,
            grace_seconds=float(grace) if grace is not None else self.p.settings.stop_grace_seconds,
            log_max_bytes=self.p.settings.job_log_max_bytes,
            replicas=launch.replicas if launch else (),
            data_dirs=(jd / "checkpoints", jd / "outputs"),
            readonly_dirs=tuple(path for _name, path in data),
            sandbox_slot=tenant.sandbox_slot if (tenant := s.get(TenantRow, job.tenant_id)) is not None else None,
        )

    def _start(self, w: Workload) -> None:
        try:
            self.executor.start(w)
        except OSError:
            log.exception("could not start job %s attempt %d", w.job_id, w.attempt)

    # -- supervision -------------------------------------------------------------------------------
    def supervise(self) -> None:
        with self.p.db.read() as s:
            live = s.execute(
                select(AttemptRow.id, AttemptRow.attempt_dir, JobRow.id, JobRow.state, JobRow.cancel_requested)
                .join(JobRow, JobRow.id == AttemptRow.job_id)
                .where(AttemptRow.finished_at.is_(None))
            ).all()
        for attempt_id, attempt_dir, job_id, state, cancel in live:
            path = Path(attempt_dir)
            report = self.executor.poll(path)
            if cancel and attempt_id not in self._stopping and report.state in ("pending", "running"):
                self._stopping.add(attempt_id)
                self.executor.stop(path)
            if report.replicas:
                report = self._gang(job_id, attempt_id, path, report)
            if report.state == "running" and state == JobState.STARTING.value:
                self._mark_running(job_id, attempt_id, report)
            elif report.state == "exited":
                self._finish(job_id, attempt_id, report)
            elif report.state == "lost":
                self._lost(job_id, attempt_id, report)

    def _gang(self, job_id: str, attempt_id: int, path: Path, report: AttemptReport) -> AttemptReport:
        """Whole-gang semantics (``gangs``): once one replica failed, or the deciding ones are done, stop the
        rest; once all ended, the attempt's report is the gang's summary."""
        verdict = gangs.verdict(report.replicas)
        if verdict.over and attempt_id not in self._stopping and report.state in ("pending", "running"):
            self._stopping.add(attempt_id)
            if verdict.culprit is not None:
                why = gangs.failure_message(verdict.culprit) + ": stopping the other replicas"
            elif verdict.timed_out:
                why = "a replica timed out: stopping the gang"
            else:
                why = "the deciding replica(s) succeeded: stopping the rest of the gang"
            log.info("job %s: %s", job_id, why)
            self._note(job_id, why)
            self.executor.stop(path)
        if report.state == "exited":
            return gangs.summarize(report)
        return report

    def _note(self, job_id: str, reason: str) -> None:
        """Show what the gang is doing in the job's reason (no state change)."""
        with self._write() as s:
            job = s.get(JobRow, job_id)
            if job is not None and not job.cancel_requested:
                job.reason = reason

    def _record_replicas(self, s: Session, job: JobRow, report: AttemptReport, lost: bool = False) -> None:
        """The end of each replica of the attempt that just ended, on its record."""
        if not job.replica_groups:
            return
        by_name: dict[str, ReplicaReport] = {r.name: r for r in report.replicas}
        rows = s.scalars(select(ReplicaRow).where(ReplicaRow.job_id == job.id, ReplicaRow.attempt == job.attempt))
        for row in rows:
            r = by_name.get(row.name)
            if r is None:
                row.state = "lost" if lost else row.state
                continue
            row.exit_code = r.exit_code
            if r.state == "lost":
                row.state = "lost"
            elif r.stopped or r.timed_out:
                row.state = "stopped"
            elif r.state == "exited":
                row.state = "succeeded" if r.exit_code == 0 else "failed"
            else:
                row.state = "lost"

    def _mark_running(self, job_id: str, attempt_id: int, report: AttemptReport) -> None:
        with self._write() as s:
            job = s.get(JobRow, job_id)
            if job is None or job.state != JobState.STARTING.value:
                return
            job_states.transition(
                s, job, JobState.RUNNING, f"attempt {job.attempt} running (pid {report.pid})", at=report.started_at
            )

    def _finish(self, job_id: str, attempt_id: int, report: AttemptReport) -> None:
        now = report.finished_at or utcnow()
        with self._write() as s:
            attempt = s.get(AttemptRow, attempt_id)
            job = s.get(JobRow, job_id)
            if attempt is None or job is None or attempt.finished_at is not None:
                return
            code = report.exit_code
            attempt.finished_at = now
            attempt.exit_code = code
            job.exit_code = code
            release_ports(s, job.id, attempt.number)
            holder = _holder(job.id, attempt.number)
            self._record_replicas(s, job, report)
            detail = f" ({report.message})" if report.message else ""
            if report.replicas:  # the message names the failing replica, its code and last lines
                failure = f"attempt {job.attempt} failed: {report.message}"
            else:
                failure = f"attempt {job.attempt} failed with exit code {code}{detail}"
            job_states.end_attempt(
                s,
                job,
                attempt,
                exit_code=code,
                started_at=report.started_at,
                now=now,
                stopped=report.stopped,
                timed_out=report.timed_out,
                failure=failure,
                note=post_note(report),
            )
        self.data_cache.release(holder)
        self._stopping.discard(attempt_id)
        self.wake()

    def _lost(self, job_id: str, attempt_id: int, report: AttemptReport) -> None:
        if not report.launched and attempt_id not in self._relaunched:
            # recorded but never launched (crash between commit and start): launch it now, if still leading
            with self._write() as s:
                job = s.get(JobRow, job_id)
                attempt = s.get(AttemptRow, attempt_id)
                if job is None or attempt is None or attempt.finished_at is not None:
                    return
                ports = attempt_ports(s, job.id, attempt.number)
                try:
                    data = self._datasets(job, attempt.number)
                except DlcloudError as exc:
                    log.error("job %s attempt %d: its datasets cannot be read: %s", job_id, attempt.number, exc)
                    data = None
                if data is not None:
                    w = self._workload(s, job, tuple(attempt.gpus), Path(attempt.attempt_dir), ports, data)
            if data is None:
                report = AttemptReport(
                    state="lost", message="its datasets could not be read to relaunch it", launched=False
                )
                self._relaunched.add(attempt_id)
                self._lost(job_id, attempt_id, report)
                return
            self._relaunched.add(attempt_id)
            log.warning("job %s attempt %d was recorded but never launched; launching it now", job_id, w.attempt)
            self._start(w)
            return
        now = utcnow()
        with self.p.db.read() as s:
            attempt_row = s.get(AttemptRow, attempt_id)
            attempt_dir = Path(attempt_row.attempt_dir) if attempt_row else None
        if attempt_dir is not None and report.launched:
            self.executor.stop(attempt_dir)  # whatever the dead launcher left running must not hold on
        with self._write() as s:
            attempt = s.get(AttemptRow, attempt_id)
            job = s.get(JobRow, job_id)
            if attempt is None or job is None or attempt.finished_at is not None:
                return
            attempt.finished_at = now
            attempt.outcome = "lost"
            release_ports(s, job.id, attempt.number)
            holder = _holder(job.id, attempt.number)
            self._record_replicas(s, job, report, lost=True)
            if job.cancel_requested:
                job_states.transition(s, job, JobState.CANCELLED, "cancelled; attempt lost", at=now)
            else:
                why = f"attempt {job.attempt} lost: {report.message or 'its processes vanished'}"
                job_states.fail_or_restart(s, job, why, now)
        self.data_cache.release(holder)
        self.wake()


def _holder(job_id: str, attempt: int) -> str:
    """Who holds an attempt's pins in the dataset cache."""
    return f"{job_id}.{attempt}"
