"""TensorBoard event files as job metrics: the worker that reads them while attempts run (docs/metrics.md).

``TensorBoardIngester`` runs on a thread of its own in the leading control-plane process, started and stopped
with the control loop's term of leadership (``ControlLoop.run``), never on the loop's thread: a slow or hostile
job's event files delay the ingestion of other attempts by at most one bounded pass, and their supervision not
at all. The files are read through the executor (``Executor.read_event_files``), which parses them in a
sandboxed one-off process and bounds every pass.

Invariants:
- Every attempt that has not ended is read every ``tensorboard_interval_seconds``, every second while a pass
  left data behind (``EventRead.more``).
- Points are stored through the same upsert as a push (``metrics.store_event_scalars``): attempt = the attempt
  that ran, replica = the gang replica whose directory holds the file ("" otherwise). Reading a file again from
  its start stores nothing twice, so cursors live in memory only: a restarted control plane reads again.
- The last pass: before supervision records the end of an attempt it asks for one (``final_pass``, which never
  blocks); it reads until nothing is left, at most ``FINAL_PASSES`` passes. Supervision waits for it at most
  ``FINAL_WAIT_SECONDS``; without a running ingester (a loop driven tick by tick) there is none.
- A problem with an attempt's files (a corrupt file, too many files) is logged once per attempt.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from dlcloud.executors.base import Executor
from dlcloud.executors.event_files import EventCursor
from dlcloud.services import metrics
from dlcloud.services.leader import LeadershipLost
from dlcloud.services.platform import Platform
from dlcloud.store import metrics as store

log = logging.getLogger(__name__)
FINAL_PASSES = 10  # passes of an attempt's last reading, at most
FINAL_WAIT_SECONDS = 120.0  # how long supervision waits for the last reading before it records the end anyway
MORE_SECONDS = 1.0  # the next pass of an attempt whose last pass left data behind
ROUND_SECONDS = 1.0  # rounds over the live attempts (one query of them each) are at least this far apart
MAX_PROBLEMS_LOGGED = 20  # per attempt


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


@dataclass
class _State:
    cursor: EventCursor = field(default_factory=EventCursor)
    next_at: float = 0.0  # time.monotonic() of its next pass
    stored: int = 0  # values stored by this ingester
    passes: int = 0
    logged: set[str] = field(default_factory=set)


@dataclass
class _Final:
    asked: float  # time.monotonic()
    done: bool = False


class TensorBoardIngester:
    """Reads the TensorBoard event files of running attempts into their metrics, on its own thread."""

    def __init__(
        self,
        platform: Platform,
        executor: Executor,
        write: Callable[[], contextlib.AbstractContextManager[Session]],
    ) -> None:
        self.p = platform
        self.executor = executor
        self.write = write  # the control loop's write transaction: fenced
        self._states: dict[int, _State] = {}
        self._finals: dict[int, _Final] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- driving -----------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        """Start the thread (at the start of a term of leadership)."""
        if self.running:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlcloud-tensorboard", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the thread, after the pass it is in (at the end of a term of leadership)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def final_pass(self, attempt_id: int) -> bool:
        """Whether the last reading of the attempt's event files is done, so its end may be recorded. The first
        call asks for it and returns False; True once it is done, after ``FINAL_WAIT_SECONDS``, or when this
        ingester does not run."""
        if not self.running:
            return True
        now = time.monotonic()
        with self._lock:
            final = self._finals.get(attempt_id)
            if final is None:
                self._finals[attempt_id] = _Final(asked=now)
                self._wake.set()
                return False
            if not final.done and now - final.asked > FINAL_WAIT_SECONDS:
                log.warning("attempt %d: its last TensorBoard pass took too long; its end is recorded", attempt_id)
                final.done = True
            return final.done

    def stored(self, attempt_id: int) -> tuple[int, int]:
        """(values stored, passes made) for a live attempt by this ingester: what it did, for tests and logs."""
        with self._lock:
            state = self._states.get(attempt_id)
            return (state.stored, state.passes) if state is not None else (0, 0)

    def _run(self) -> None:
        while not self._stop.is_set():
            interval = self.p.settings.tensorboard_interval_seconds
            self._wake.clear()
            try:
                self.run_once()
            except LeadershipLost:
                return  # the control loop ends this term too
            except Exception:  # a failing pass (the database briefly down) must not end ingestion
                log.exception("TensorBoard ingestion pass failed")
            with self._lock:
                due = min((s.next_at for s in self._states.values()), default=time.monotonic() + interval)
            # rounds at most every ROUND_SECONDS (or interval): attempts falling due meanwhile wait for the round
            self._wake.wait(max(min(interval, ROUND_SECONDS), min(interval, due - time.monotonic())))

    # -- passes ------------------------------------------------------------------------------------------

    def run_once(self) -> None:
        """One round: the last readings asked for, then every live attempt whose pass is due."""
        live = {a.id: a for a in self._live()}
        with self._lock:
            for gone in [i for i in self._states if i not in live]:
                del self._states[gone]
            for gone in [i for i in self._finals if i not in live]:
                del self._finals[gone]
        for a in live.values():
            if self._stop.is_set():
                return
            self._finals_asked(live)
            state = self._state(a.id)
            if time.monotonic() >= state.next_at:
                self._pass(a, state)
        self._finals_asked(live)

    def _live(self) -> list[_Attempt]:
        with self.p.db.read() as s:
            rows = store.live_attempts(s)
            replicas = store.replica_names(s, [(row[2], row[4]) for row in rows])
        return [
            _Attempt(
                id=row[0],
                handle=row[1],
                job_id=row[2],
                tenant_id=row[3],
                number=row[4],
                since=row[5].timestamp(),
                slot=row[6],
                replicas=tuple(replicas.get((row[2], row[4]), ())),
            )
            for row in rows
        ]

    def _state(self, attempt_id: int) -> _State:
        with self._lock:
            return self._states.setdefault(attempt_id, _State())

    def _finals_asked(self, live: dict[int, _Attempt]) -> None:
        with self._lock:
            asked = [i for i, f in self._finals.items() if not f.done]
        for attempt_id in asked:
            a = live.get(attempt_id)
            if a is not None:
                state = self._state(attempt_id)
                for _ in range(FINAL_PASSES):
                    if self._stop.is_set() or not self._pass(a, state):
                        break
            with self._lock:
                final = self._finals.get(attempt_id)
                if final is not None:
                    final.done = True

    def _pass(self, a: _Attempt, state: _State) -> bool:
        """One bounded pass over the attempt's event files; whether data is left for another."""
        interval = self.p.settings.tensorboard_interval_seconds
        stored, more = 0, False
        try:
            read = self.executor.read_event_files(
                a.handle, state.cursor, since=a.since, sandbox_slot=a.slot, replicas=a.replicas
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
