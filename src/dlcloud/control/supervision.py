"""Supervision: polls every attempt that has not ended through the executor and applies what happened.

RUNNING once the executor says so; the end of an attempt (exit, timeout, stop, loss) through ``job_states``
(``end_attempt``, ``fail_or_restart``: the restart policy lives there); whole-gang semantics through
``gangs``; the job's outputs saved into the object store before an attempt's end is recorded (and, for a job
that succeeded with ``register_model``, a model registered from them once its metrics are all in: ``job_models``,
``settled``); an attempt that was recorded but never launched (a crash between the scheduling pass's commit and the
start) started again.

An attempt's end is recorded, and its resources released, as soon as the executor says it ended and its outputs
are saved: the last reading of its TensorBoard event files comes after (``ended`` tells the ingester,
``tensorboard.py``), so no tenant's event files ever hold the end of another tenant's job, nor of its own. Outputs and
logs are saved on a pool of their own (``savers``, a ``FairPool``: tenants take turns, one save of a tenant at a
time), never on the loop's thread, so one tenant's large outputs hold no other tenant's ends (nor the scheduling
pass); a loop driven tick by tick (no pool started) saves on its own thread.

A preempted job's attempt (``preempt_requested``, set by the scheduling pass) is stopped exactly like a cancelled
one: SIGTERM, the grace period, the whole gang. The flag is in the database, so a control plane that restarts
mid-preemption stops the attempt again and finishes the preemption (``job_states.requeue_preempted``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from dlcloud.control import gangs, workloads
from dlcloud.control.checkpoint_saves import CheckpointSaves
from dlcloud.control.fair_pool import FairPool, pool_size
from dlcloud.control.leader import LeadershipLost
from dlcloud.control.ports import attempt_ports, release_ports
from dlcloud.errors import DlcloudError
from dlcloud.executors.base import AttemptReport, Executor, Workload
from dlcloud.executors.outputs import LEFT_OUT_SUFFIX
from dlcloud.schemas.jobs import JobState
from dlcloud.services import job_models, job_states, replica_states, storage_quota
from dlcloud.services.job_keys import logs_key, outputs_key
from dlcloud.services.platform import Platform
from dlcloud.storage.objects import StorageError
from dlcloud.store import jobs as job_store
from dlcloud.store.rows import AttemptRow, JobRow, utcnow

log = logging.getLogger(__name__)
SAVE_TRIES = 20  # passes that may fail to save an ended attempt's outputs (the store down) before it ends anyway


def post_note(report: AttemptReport) -> str:
    """What a failed post_command adds to the reason of the attempt's final event ('' when it succeeded or
    none ran): post never changes the attempt's outcome, but its failure must not go unnoticed."""
    if report.post_timed_out:
        return f"; post_command timed out (exit code {report.post_exit_code})"
    if report.post_exit_code:
        return f"; post_command failed with exit code {report.post_exit_code}"
    return ""


@dataclass(frozen=True)
class _Ended:
    """An attempt that exited this pass, its outputs saved: its end is recorded with the others (``_finish``)."""

    job_id: str
    attempt_id: int
    number: int
    report: AttemptReport


class Supervisor:
    """Applies what the executor reports; ``start`` starts a workload (the loop's, which logs failures)."""

    def __init__(
        self,
        platform: Platform,
        executor: Executor,
        write: Callable[[], contextlib.AbstractContextManager[Session]],
        start: Callable[[str, Workload], None],
        wake: Callable[[], None],
        ended: Callable[[int, str], None] = lambda attempt_id, job_id: None,
        settled: Callable[[str], bool] = lambda job_id: True,
    ) -> None:
        self.p = platform
        self.ended = ended  # an attempt's end is recorded: its event files get their last reading
        self.settled = settled  # whether a job's metrics are all in (no last reading of its files to come)
        self.executor = executor
        self.write = write
        self.start = start
        self.wake = wake
        self._stopping: set[int] = set()  # attempt ids already sent a stop
        self._relaunched: set[int] = set()
        self._lost_stopped: set[int] = set()  # lost attempts whose leftovers were stopped
        self._save_tries: dict[str, int] = {}  # handle -> failed saves of its outputs
        self._registering: set[str] = set()  # jobs that succeeded, their model registered once their metrics are in
        self.savers = FairPool("dlcloud-outputs", pool_size(), done=lambda key: wake())  # started by the loop's run
        self._saves: dict[int, bool] = {}  # attempt id -> what its save on the pool said, until the loop takes it
        self._saves_lock = threading.Lock()
        self._checkpoints: dict[int, datetime] = {}  # attempt id -> the last change to its checkpoints recorded
        self.checkpoint_saves = CheckpointSaves(executor, platform.settings, platform.objects, self.savers, self._tell)

    def run(self) -> None:
        """Poll every attempt that has not ended and apply what happened to it."""
        with self.p.db.read() as s:
            live = job_store.unfinished_attempts(s)
        ended: list[_Ended] = []
        with self._saves_lock:
            for gone in set(self._saves) - {row[0] for row in live}:  # its job was deleted meanwhile
                del self._saves[gone]
        for gone in set(self._checkpoints) - {row[0] for row in live}:
            del self._checkpoints[gone]
        self.checkpoint_saves.forget({row[1] for row in live})
        for attempt_id, handle, tenant_id, number, job_id, state, cancel, preempt in live:
            try:
                # a preemption stops the attempt as a cancel does; how it ends decides the rest (job_states)
                self._supervise(attempt_id, handle, tenant_id, number, job_id, state, cancel or preempt, ended)
            except LeadershipLost:
                raise
            except Exception:  # one attempt's trouble must not stop the supervision of the others
                log.exception("job %s attempt %d: supervision failed; trying again at the next pass", job_id, number)
        if ended:
            self._finish(ended)
        self._register_settled()

    def _supervise(
        self,
        attempt_id: int,
        handle: str,
        tenant_id: str,
        number: int,
        job_id: str,
        state: str,
        cancel: bool,
        ended: list[_Ended],
    ) -> None:
        report = self.executor.poll(handle)
        if cancel and attempt_id not in self._stopping and report.state in ("pending", "running"):
            self._stopping.add(attempt_id)
            self.executor.stop(handle)
        if report.replicas:
            report = self._gang(job_id, attempt_id, handle, report)
        if report.state == "running" and report.checkpoint_at is not None:
            self._checkpointed(attempt_id, report.checkpoint_at)
            self.checkpoint_saves.running(tenant_id, job_id, number, handle, report.checkpoint_at)
        if report.state == "running" and state == JobState.STARTING.value:
            self._mark_running(job_id, attempt_id, report)
        elif report.state == "pending" and report.message and state == JobState.STARTING.value:
            self._note(job_id, report.message)  # e.g. waiting for room in the dataset cache
        elif report.state == "exited":
            if self._saved(attempt_id, tenant_id, lambda: self._save_outputs(job_id, tenant_id, number, handle)):
                ended.append(_Ended(job_id, attempt_id, number, report))  # recorded with the others (``_finish``)
        elif report.state == "lost":
            if report.launched:
                if attempt_id not in self._lost_stopped:
                    self._lost_stopped.add(attempt_id)
                    self.executor.stop(handle)  # whatever the dead launcher left running stops before the save
                save = functools.partial(self._save_outputs, job_id, tenant_id, number, handle, retry=False)
                if not self._saved(attempt_id, tenant_id, save):
                    return
            self._lost_stopped.discard(attempt_id)
            self._lost(job_id, attempt_id, report)

    def _checkpointed(self, attempt_id: int, at: datetime) -> None:
        """Record the attempt's last change to its checkpoints when it is later than the one recorded: the
        scheduling pass reads it as the attempt's progress (a preemption loses the work since)."""
        if self._checkpoints.get(attempt_id, at - timedelta(seconds=1)) >= at:
            return
        with self.write() as s:
            job_store.record_checkpoint(s, attempt_id, at)
        self._checkpoints[attempt_id] = at

    def _saved(self, attempt_id: int, tenant_id: str, save: Callable[[], bool]) -> bool:
        """Whether the ended attempt's outputs and logs are saved (``save`` said True), so its end may be recorded.
        The first call queues ``save`` on the savers' pool and says False; once it ran, the loop is woken and the
        next call says what it said (False: queued again). Without a running pool, it saves here and now."""
        if not self.savers.running:
            return save()
        with self._saves_lock:
            said = self._saves.pop(attempt_id, None)
        if said:
            return True

        def task() -> None:
            try:
                result = save()
            except LeadershipLost:  # this process no longer leads: the loop ends its term too
                return
            with self._saves_lock:
                self._saves[attempt_id] = result

        self.savers.submit(tenant_id, attempt_id, task)  # nothing while it waits or runs
        return False

    def _save_outputs(self, job_id: str, tenant_id: str, number: int, handle: str, retry: bool = True) -> bool:
        """The job's outputs as the attempt left them, the attempt's logs, and (``checkpoint_saves``) the job's
        checkpoints, into the object store (``job_keys``) before the attempt's end is recorded; the earlier attempts'
        saved outputs go (registering reads the latest). Outputs and checkpoints count in the tenant's storage quota
        (``storage_quota``): outputs over what it leaves are refused before a byte is copied, and the job is told.
        False: the store failed, try again at the next pass (they stay with the executor meanwhile), at most
        ``SAVE_TRIES`` times; then the job is told."""
        try:
            self.executor.archive_logs(handle, logs_key(tenant_id, job_id, number))
            checkpoints = self.executor.checkpoints_bytes(handle)
            with self.write() as s:
                storage_quota.record_checkpoints(s, job_id, checkpoints)
            self._save_counted(job_id, tenant_id, number, handle)
            self.checkpoint_saves.at_end(tenant_id, job_id, number, handle)
        except LeadershipLost:  # a write of the quota's found this process deposed: nothing more of it
            raise
        except StorageError as exc:
            tries = self._save_tries[handle] = self._save_tries.get(handle, 0) + 1
            if retry and tries < SAVE_TRIES:
                log.error("job %s attempt %d: outputs not saved yet (%s); trying again", job_id, number, exc.message)
                return False
            self._tell(job_id, number, "its outputs and logs could not be saved: the server's storage failed")
        except DlcloudError as exc:  # over the limits or the storage quota: the job is told
            self._tell(job_id, number, exc.message)
        except Exception:  # whatever the outputs hold, the attempt ends
            log.exception("job %s attempt %d: outputs not saved", job_id, number)
            self._tell(job_id, number, "its outputs could not be saved (see the server log)")
        self._save_tries.pop(handle, None)
        return True

    def _save_counted(self, job_id: str, tenant_id: str, number: int, handle: str) -> None:
        """Save the outputs, admitted by the storage quota once measured (``storage_quota.admit_outputs``) and
        counted from then on; once stored, the earlier attempts' go and the job counts the new ones alone."""
        admitted: list[tuple[int, int]] = []  # (size, what the saved outputs took before), once admitted

        def admit(size: int) -> None:
            with self.write() as s:
                admitted.append((size, storage_quota.admit_outputs(s, job_id, size)))

        key = outputs_key(tenant_id, job_id, number)
        saved = False
        try:
            saved = self.executor.save_outputs(handle, key, admit=admit)
            if saved:
                for earlier in range(1, number):  # an attempt that saved none kept an earlier one's
                    previous = outputs_key(tenant_id, job_id, earlier)
                    self.p.objects.delete_prefix(previous)
                    self.p.objects.delete(previous + LEFT_OUT_SUFFIX)
        finally:
            if admitted:
                size, before = admitted[-1]
                with self.write() as s:
                    storage_quota.settle_outputs(s, job_id, size if saved else None, before)

    def _tell(self, job_id: str, number: int, what: str) -> None:
        log.warning("job %s attempt %d: %s", job_id, number, what)
        with self.write() as s:
            job = s.get(JobRow, job_id)
            if job is not None:
                job_states.note(s, job, f"attempt {number}: {what}")

    def _gang(self, job_id: str, attempt_id: int, handle: str, report: AttemptReport) -> AttemptReport:
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
            self.executor.stop(handle)
        if report.state == "exited":
            return gangs.summarize(report)
        return report

    def _note(self, job_id: str, reason: str) -> None:
        """Show what the gang is doing in the job's reason (no state change)."""
        with self.write() as s:
            job = s.get(JobRow, job_id)
            if job is not None and not job.cancel_requested:
                job.reason = reason

    def _mark_running(self, job_id: str, attempt_id: int, report: AttemptReport) -> None:
        with self.write() as s:
            job = s.get(JobRow, job_id)
            if job is None or job.state != JobState.STARTING.value:
                return
            job_states.transition(
                s, job, JobState.RUNNING, f"attempt {job.attempt} running (pid {report.pid})", at=report.started_at
            )

    def _finish(self, ended: list[_Ended]) -> None:
        """Record the ends of the attempts that exited this pass (their outputs saved) in one write transaction, each
        in its own savepoint: one that fails is rolled back alone and tried again at the next pass (the executor
        still reports it exited), the others are recorded. Then the models of the jobs that succeeded are registered
        and the loop is woken once."""
        recorded: list[tuple[_Ended, bool]] = []  # each end recorded, and whether its job's model is to be registered
        for e in ended:  # the last reading is asked for before the ends are visible: who sees an end (a study, a
            self.ended(e.attempt_id, e.job_id)  # test's settled()) also sees that reading to come
        try:
            with self.write() as s:
                for e in ended:
                    try:
                        with s.begin_nested():
                            register = self._end(s, e)
                    except LeadershipLost:
                        raise
                    except Exception:
                        log.exception("job %s attempt %d: its end not recorded; trying again at the next pass",
                                      e.job_id, e.number)  # fmt: skip
                        continue
                    if register is not None:
                        recorded.append((e, register))
        except LeadershipLost:
            raise
        except Exception:  # the transaction itself failed (the database): nothing was recorded, all are tried again
            log.exception("the ends of %d attempt(s) not recorded; trying again at the next pass", len(ended))
            return
        for e, register in recorded:
            self._stopping.discard(e.attempt_id)
            self.ended(e.attempt_id, e.job_id)  # again, now that the end is recorded: the reading starts at once
            if register:  # the outputs are saved (``_save_outputs`` ran first): the model comes from them
                self._registering.add(e.job_id)
        if recorded:
            self.wake()

    def _register_settled(self) -> None:
        """Register the models of the jobs that succeeded once their metrics are all in (the version's metrics are
        the job's last values: the last reading of its event files first)."""
        for job_id in [j for j in self._registering if self.settled(j)]:
            self._registering.discard(job_id)
            job_models.register_after_success(self.p, job_id)

    def _end(self, s: Session, e: _Ended) -> bool | None:
        """Record one attempt's end; None when there was nothing to record (it was already), else whether its job
        succeeded and asks for its model to be registered."""
        report = e.report
        now = report.finished_at or utcnow()
        attempt = s.get(AttemptRow, e.attempt_id)
        job = s.get(JobRow, e.job_id)
        if attempt is None or job is None or attempt.finished_at is not None:
            return None
        code = report.exit_code
        attempt.finished_at = now
        attempt.exit_code = code
        job.exit_code = code
        release_ports(s, job.id, attempt.number)
        replica_states.record_ends(s, job, report)
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
        return job.state == JobState.SUCCEEDED.value and job.platform_state.register_model is not None

    def _lost(self, job_id: str, attempt_id: int, report: AttemptReport) -> None:
        if not report.launched and attempt_id not in self._relaunched:
            # recorded but never launched (crash between commit and start): launch it now, if still leading
            with self.write() as s:
                job = s.get(JobRow, job_id)
                attempt = s.get(AttemptRow, attempt_id)
                if job is None or attempt is None or attempt.finished_at is not None:
                    return
                ports = attempt_ports(s, job.id, attempt.number)
                handle = attempt.handle
                w = workloads.build(self.p, self.executor, s, job, tuple(attempt.gpus), handle, ports)
            self._relaunched.add(attempt_id)
            log.warning("job %s attempt %d was recorded but never launched; launching it now", job_id, w.attempt)
            self.start(handle, w)
            return
        now = utcnow()  # whatever the dead launcher left running was stopped (``_supervise``)
        self.ended(attempt_id, job_id)  # before the end is visible: whoever sees it also sees the reading to come
        with self.write() as s:
            attempt = s.get(AttemptRow, attempt_id)
            job = s.get(JobRow, job_id)
            if attempt is None or job is None or attempt.finished_at is not None:
                return
            attempt.finished_at = now
            attempt.outcome = "lost"
            release_ports(s, job.id, attempt.number)
            replica_states.record_ends(s, job, report, lost=True)
            job_states.account_attempt(job, attempt, now)
            if job.cancel_requested:
                job_states.transition(s, job, JobState.CANCELLED, "cancelled; attempt lost", at=now)
            elif job.preempt_requested:
                job_states.requeue_preempted(s, job, attempt, now, "; it was lost")
            else:
                why = f"attempt {job.attempt} lost: {report.message or 'its processes vanished'}"
                job_states.fail_or_restart(s, job, why, now)
        self.ended(attempt_id, job_id)  # again, now that the end is recorded: the reading starts at once
        self.wake()
