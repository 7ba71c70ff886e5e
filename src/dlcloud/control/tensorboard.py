"""TensorBoard event files as job metrics: the worker pool that reads them (docs/metrics.md).

``TensorBoardIngester`` runs for a term of leadership (started and stopped with ``ControlLoop.run``), never on the
loop's thread: a thread of its own (a loop on the loop-service base, ``loop_service.py``: its ticks are rounds, its
writes fenced) finds the attempts due a pass, and a small pool of workers (``FairPool``: one
per core, at least two, at most four: ``pool_size``) runs the passes, the tenants taking turns and a tenant
running one pass at a time. A tenant with many or huge event files gets its turns, never everyone's: its passes
hold one worker, each pass is bounded (bytes, points, files and time: ``executors/event_files.py``) and its CPU
is charged to the job whose files it reads (the executor's ``_reader_charge``: on the local executor a cgroup with
the job's CPU quota). Nothing else waits for it: supervision records an attempt's end without it.

Invariants:
- Every attempt that has not ended is read every ``tensorboard_interval_seconds`` (every ``MORE_SECONDS`` while
  a pass left data behind, ``EventRead.more``), as soon as its tenant's turn comes.
- Points are stored through the same upsert as a push (``metrics.store_event_scalars``): attempt = the attempt
  that ran, replica = the gang replica whose directory holds the file ("" otherwise). Reading a file again from
  its start stores nothing twice, so cursors live in memory only: a restarted control plane reads again.
- The last reading comes after the end: supervision records an attempt's end, releasing its resources, as soon
  as the attempt ended, then says so (``ended``); an attempt a round finds ended, or that ended in the
  ``CATCH_UP_SECONDS`` before this term began, gets one too. It reads what was written until the end (``until``:
  later records are the next attempt's), first among its own tenant's turns, until nothing is left: at most
  ``FINAL_PASSES`` passes within ``FINAL_SECONDS``. Its points are the attempt's, stored shortly after its end;
  what reads a job's metrics as final once it ended (a study's trial, a model registered from it) waits for
  ``settled``.
- A problem with an attempt's files (a corrupt file, too many files) is logged once per attempt.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from dlcloud.control.fair_pool import FairPool, pool_size
from dlcloud.control.leader import Leadership, LeadershipLost
from dlcloud.control.loop_service import LoopService
from dlcloud.executors.base import Executor
from dlcloud.executors.event_files import EventCursor
from dlcloud.services import metrics
from dlcloud.services.platform import Platform
from dlcloud.store import metrics as store
from dlcloud.store.rows import utcnow

log = logging.getLogger(__name__)
FINAL_PASSES = 10  # passes of an attempt's last reading, at most
FINAL_SECONDS = 120.0  # an attempt's last reading ends this long after its end at the latest (``settled`` too)
CATCH_UP_SECONDS = 60.0  # attempts that ended this shortly before a term began get a last reading in it
UNTIL_SLACK_SECONDS = 1.0  # records stamped this long after an attempt's recorded end are still its own
MORE_SECONDS = 1.0  # the next pass of an attempt whose last pass left data behind
ROUND_SECONDS = 1.0  # queries of the attempts (one round) are at least this far apart
MAX_PROBLEMS_LOGGED = 20  # per attempt
READ_OUT_KEPT = 10_000  # ended attempts remembered as read to their end (a late ``ended`` reads them not again)


@dataclass(frozen=True)
class _Attempt:
    id: int
    handle: str
    job_id: str
    tenant_id: str
    number: int
    since: float  # Unix time it was placed: older files are an earlier attempt's
    slot: int | None  # its tenant's sandbox number
    replicas: tuple[str, ...]
    cpus: float  # what its reading is charged to
    until: float | None  # Unix time it ended (None: it runs)


@dataclass
class _State:
    cursor: EventCursor = field(default_factory=EventCursor)
    next_at: float = 0.0  # time.monotonic() of its next pass
    stored: int = 0  # values stored by this ingester
    passes: int = 0
    logged: set[str] = field(default_factory=set)


@dataclass
class _Final:
    job_id: str
    asked: float  # time.monotonic()
    passes: int = 0


class TensorBoardIngester(LoopService):
    """Reads the TensorBoard event files of attempts into their metrics, off the control loop's thread."""

    name = "TensorBoard ingestion"

    def __init__(
        self,
        platform: Platform,
        executor: Executor,
        leadership: Leadership | None = None,
        workers: int | None = None,
    ) -> None:
        super().__init__(platform, leadership)  # fenced by the control loop's leadership
        self.executor = executor
        self.workers = workers or pool_size()
        self._attempts: dict[int, _Attempt] = {}  # running, or ended with a last reading to come
        self._states: dict[int, _State] = {}
        self._finals: dict[int, _Final] = {}  # last readings to come
        self._read_out: dict[int, None] = {}  # ended attempts read to their end (insertion order: oldest first)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: FairPool | None = None
        self._refreshed = -math.inf  # time.monotonic() of the last round
        self._caught_up = False

    # -- driving -----------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        """Start the thread and the pool (at the start of a term of leadership)."""
        if self.running:
            return
        self._stop = threading.Event()
        self._refreshed, self._caught_up = -math.inf, False
        with self._lock:
            for state in self._states.values():  # a pass queued in the last term's pool never ran
                state.next_at = 0.0
        self._pool = FairPool("dlcloud-tensorboard", self.workers, done=lambda key: self._wake.set())
        self._pool.start()
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name="dlcloud-tensorboard", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the thread and the pool, after the passes they are in (at the end of a term of leadership)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        if self._pool is not None:
            self._pool.shutdown(timeout=timeout)

    def ended(self, attempt_id: int, job_id: str) -> None:
        """The attempt's end is recorded: its files get their last reading (soon; the caller never waits)."""
        if not self.running:
            return
        with self._lock:
            if attempt_id not in self._read_out:
                self._finals.setdefault(attempt_id, _Final(job_id, time.monotonic()))
        self._wake.set()

    def settled(self, job_id: str) -> bool:
        """Whether the job's metrics are all in: no last reading of an attempt of it to come (or given up after
        ``FINAL_SECONDS``), or no ingester runs."""
        if not self.running:
            return True
        now = time.monotonic()
        with self._lock:
            return not any(f.job_id == job_id and now - f.asked <= FINAL_SECONDS for f in self._finals.values())

    def stored(self, attempt_id: int) -> tuple[int, int]:
        """(values stored, passes made) for an attempt being read by this ingester: for tests and logs."""
        with self._lock:
            state = self._states.get(attempt_id)
            return (state.stored, state.passes) if state is not None else (0, 0)

    def read_bytes(self, attempt_id: int) -> int:
        """The bytes of an attempt's event files this ingester has read so far (the offsets of its cursor): for
        tests and logs."""
        with self._lock:
            state = self._states.get(attempt_id)
            return sum(f.offset for f in state.cursor.files.values()) if state is not None else 0

    def load(self) -> tuple[int, int]:
        """(passes running, passes waiting for a turn): for tests and logs."""
        pool = self._pool
        return pool.load() if pool is not None else (0, 0)

    def interval(self) -> float:
        """Until the next round: at most ``ROUND_SECONDS``, less when an attempt's pass is due sooner (woken sooner
        by ``ended`` and by every pass that ends, ``FairPool.done``)."""
        with self._lock:
            due = min((s.next_at for s in self._states.values()), default=math.inf)
        return min(self.p.settings.tensorboard_interval_seconds, ROUND_SECONDS, max(0.01, due - time.monotonic()))

    def stopping(self) -> None:
        self._stop.set()  # deposed (``LeadershipLost`` ended ``run``): the passes queued in the pool run no more

    # -- rounds ------------------------------------------------------------------------------------------

    def tick(self) -> None:
        """A round when one is due (the attempts from the database), then a turn queued for each attempt due one."""
        interval = self.p.settings.tensorboard_interval_seconds
        with self._lock:
            unknown = [i for i in self._finals if i not in self._attempts or self._attempts[i].until is None]
        if unknown or time.monotonic() - self._refreshed >= min(interval, ROUND_SECONDS):
            self._refreshed = time.monotonic()
            self._round(unknown)
        self._submit_due()

    def _round(self, unknown: Sequence[int]) -> None:
        """The attempts to read: those that run, and those that ended with a last reading to come."""
        catch_up = None if self._caught_up else utcnow() - timedelta(seconds=CATCH_UP_SECONDS)
        with self._lock:
            known = list(self._attempts)
        with self.p.db.read() as s:
            rows = store.reading_attempts(s)
            live = {row[0] for row in rows}
            rows += store.reading_attempts(s, ids=sorted({*unknown, *(i for i in known if i not in live)}))
            if catch_up is not None:
                rows += store.reading_attempts(s, ended_since=catch_up)
            replicas = store.replica_names(s, [(row[2], row[4]) for row in rows])
        self._caught_up = True
        found = {row[0]: _attempt(row, replicas.get((row[2], row[4]), ())) for row in rows}
        now = time.monotonic()
        with self._lock:
            for i, a in found.items():
                if a.until is not None and i not in self._read_out:  # ended: its last reading comes
                    self._finals.setdefault(i, _Final(a.job_id, now))
            self._attempts = {i: a for i, a in found.items() if a.until is None or i in self._finals}
            for gone in [i for i in self._states if i not in self._attempts]:
                del self._states[gone]
            # its job was deleted, or it has not ended: the supervisor asks for the last reading just before it
            # records the end (so that whoever sees the end sees the reading to come); that ask waits for the record
            for gone in [
                i
                for i, f in self._finals.items()
                if i not in found or (found[i].until is None and now - f.asked > FINAL_SECONDS)
            ]:
                del self._finals[gone]

    def _submit_due(self) -> None:
        pool = self._pool
        if pool is None:
            return
        now = time.monotonic()
        due: list[tuple[_Attempt, _State, bool]] = []
        with self._lock:
            for i, a in self._attempts.items():
                state = self._states.setdefault(i, _State())
                final = i in self._finals
                if final if a.until is not None else now >= state.next_at:
                    state.next_at = math.inf  # queued: its pass says when the next one is due
                    due.append((a, state, final))
        for a, state, final in due:
            pool.submit(a.tenant_id, a.id, functools.partial(self._turn, a, state), first=final)

    # -- turns -------------------------------------------------------------------------------------------

    def _turn(self, a: _Attempt, state: _State) -> None:
        """One pass over the attempt's files, on a worker of the pool; then, for an ended attempt, whether its last
        reading is over."""
        if self._stop.is_set():
            return
        try:
            more = self._pass(a, state)
        except LeadershipLost:
            self._stop.set()
            self._wake.set()
            return
        if a.until is None:
            return
        with self._lock:
            final = self._finals.get(a.id)
            if final is None:
                return
            final.passes += 1
            if more and final.passes < FINAL_PASSES and time.monotonic() - final.asked <= FINAL_SECONDS:
                return  # its next turn is queued by the next round
            self._read_out_locked(a.id)
        if more:
            log.warning(
                "job %s attempt %d: its last TensorBoard reading stopped after %d passes; the rest is not read",
                a.job_id,
                a.number,
                final.passes,
            )

    def _read_out_locked(self, attempt_id: int) -> None:
        self._finals.pop(attempt_id, None)
        self._attempts.pop(attempt_id, None)
        self._states.pop(attempt_id, None)
        self._read_out[attempt_id] = None
        while len(self._read_out) > READ_OUT_KEPT:
            del self._read_out[next(iter(self._read_out))]

    def _pass(self, a: _Attempt, state: _State) -> bool:
        """One bounded pass over the attempt's event files; whether data is left for another."""
        interval = self.p.settings.tensorboard_interval_seconds
        stored, more = 0, False
        try:
            read = self.executor.read_event_files(
                a.handle,
                state.cursor,
                since=a.since,
                sandbox_slot=a.slot,
                replicas=a.replicas,
                cpus=a.cpus,
                until=None if a.until is None else a.until + UNTIL_SLACK_SECONDS,
            )
            more = read.more
            problems = {p: p for p in read.problems}
            if read.scalars:
                stored, dropped = metrics.store_event_scalars(self.write, a.tenant_id, a.job_id, a.number, read.scalars)
                problems.update({why: f"{n} value(s) dropped: {why}" for why, n in dropped.items()})
            for key, problem in problems.items():
                if key not in state.logged and len(state.logged) < MAX_PROBLEMS_LOGGED:
                    state.logged.add(key)
                    log.warning("job %s attempt %d: TensorBoard event files: %s", a.job_id, a.number, problem)
        except LeadershipLost:
            raise
        except Exception:  # one attempt's trouble must not stop the ingestion of the others
            if "failed" not in state.logged:  # the trace once, then a line per failed pass
                state.logged.add("failed")
                log.exception("job %s attempt %d: TensorBoard ingestion failed; trying again", a.job_id, a.number)
            else:
                log.warning("job %s attempt %d: TensorBoard ingestion failed again", a.job_id, a.number)
        with self._lock:
            state.stored += stored
            state.passes += 1
            state.next_at = time.monotonic() + (min(MORE_SECONDS, interval) if more else interval)
        return more


def _attempt(row: tuple, replicas: Sequence[str]) -> _Attempt:
    """An attempt to read from a row of ``store.reading_attempts``."""
    attempt_id, handle, job_id, tenant_id, number, started_at, slot, cpus, finished_at = row
    return _Attempt(
        id=attempt_id,
        handle=handle,
        job_id=job_id,
        tenant_id=tenant_id,
        number=number,
        since=started_at.timestamp(),
        slot=slot,
        replicas=tuple(replicas),
        cpus=float(cpus or 1.0),
        until=None if finished_at is None else finished_at.timestamp(),
    )
