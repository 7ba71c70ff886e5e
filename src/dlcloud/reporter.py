"""``dlcloud.report``: push a job's metrics to the platform from the job's own code.

Purpose: ``dlcloud.report(step=3, loss=0.2)`` from training code inside a job. Points go into a buffer and a
daemon thread sends them in batches to ``$DLCLOUD_METRICS_URL`` with ``$DLCLOUD_METRICS_TOKEN`` (a token
scoped to this one job and attempt).

Invariants:
- ``report`` never raises into user code and never blocks on the network: it validates, appends under a
  lock and returns. A bad name or value is dropped with one warning per name.
- At most ``max_buffer`` points wait; past that the oldest are dropped (one log line per overflow).
- Retries (connection errors, 429, 5xx) back off exponentially; while the API stays unreachable, points older
  than ``give_up_after`` seconds are dropped (one log line per outage). Re-sending a point is safe: the server
  keys points by (metric, step), so a resent point overwrites itself.
- 401/403 (token expired or wrong) stop sending for the rest of the process (one log line); 400/404/422 drop
  that batch (one log line); 413 halves the batch.
- At interpreter exit the buffer is flushed for at most ``exit_timeout`` seconds.
- After ``fork`` the child starts afresh (no inherited lock, buffer, thread or connection), so forked
  DataLoader workers can report without deadlocks.

The process's reporter is the one module-level object here, on purpose: ``report`` is a process-wide call with
no object to hang it on. It is built on the first ``report`` from the environment, never at import.

Vocabulary: a *point* is one step of one or more metrics of this process (``{"step", "metrics", "time",
"replica"}``); a *batch* is the points of one request (at most 1000).
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import os
import random
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from multiprocessing import util as mp_util
from typing import Any

import httpx

log = logging.getLogger("dlcloud.report")

NAME_RE = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")
MAX_POINTS_PER_REQUEST = 1000
MAX_METRICS_PER_POINT = 100
MAX_WARNED_NAMES = 1000  # bounds the memory of "already warned about this name"


@dataclass(frozen=True)
class _Point:
    created: float  # time.monotonic(), for the give-up bound
    wall: float  # time.time(), sent as ISO 8601 UTC
    step: int
    metrics: dict[str, float]

    def payload(self, replica: str) -> dict[str, Any]:
        iso = datetime.fromtimestamp(self.wall, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return {"step": self.step, "metrics": self.metrics, "time": iso, "replica": replica}


class _Outcome(Enum):
    SENT = "sent"
    RETRY = "retry"
    DROPPED = "dropped"
    STOP = "stop"


@dataclass
class _Once:
    """Log each key once."""

    seen: set[str] = field(default_factory=set)

    def warn(self, key: str, message: str, *args: object) -> None:
        if key in self.seen or len(self.seen) >= MAX_WARNED_NAMES:
            return
        self.seen.add(key)
        log.warning(message, *args)


def _number(value: Any) -> float | None:
    """A finite float from an int, float, numpy scalar or one-element tensor; None for anything else."""
    if isinstance(value, bool | str | bytes):
        return None
    if not isinstance(value, int | float) and hasattr(value, "item"):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


class Reporter:
    """The buffer and sender thread behind :func:`report`. One per process; tests build their own."""

    def __init__(
        self,
        url: str,
        token: str,
        replica: str = "",
        *,
        flush_interval: float = 1.0,
        batch_size: int = 500,
        max_buffer: int = 100_000,
        give_up_after: float = 300.0,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
        request_timeout: float = 10.0,
    ):
        self.url = url
        self.replica = replica
        self.flush_interval = flush_interval
        self.batch_size = min(batch_size, MAX_POINTS_PER_REQUEST)
        self.max_buffer = max_buffer
        self.give_up_after = give_up_after
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        # built here, in the reporting thread, so that httpx has imported all it needs before the sender thread
        # exists: a fork while that thread imported would leave the child half-imported modules
        self._http = httpx.Client(
            timeout=httpx.Timeout(request_timeout, connect=min(5.0, request_timeout)),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        self._cond = threading.Condition(threading.Lock())
        self._buffer: deque[_Point] = deque()
        self._inflight = 0
        self._wake = False
        self._stopped = False  # the token was refused: send nothing more
        self._next_step = 0
        self._thread: threading.Thread | None = None
        self._once = _Once()
        self._overflowing = False
        self._gave_up = False

    # --- called from user code -------------------------------------------------------------------------------

    def report(self, step: int | None, metrics: Mapping[str, Any]) -> None:
        clean: dict[str, float] = {}
        for name, value in metrics.items():
            if not isinstance(name, str) or not NAME_RE.match(name):
                self._once.warn(
                    f"name:{name}",
                    "dlcloud.report: metric name %r dropped: names are 1-128 characters of A-Z a-z 0-9 _ . - /",
                    name,
                )
                continue
            number = _number(value)
            if number is None:
                self._once.warn(
                    f"value:{name}", "dlcloud.report: %s=%r dropped: values must be finite numbers", name, value
                )
                continue
            clean[name] = number
        if step is not None:
            try:
                step = int(step) if not isinstance(step, bool) else -1
            except (TypeError, ValueError):
                step = -1
            if step < 0:
                self._once.warn("step", "dlcloud.report: a report with step=%r dropped: step must be an int >= 0", step)
                return
        with self._cond:
            if self._stopped:
                return
            if step is None:
                step = self._next_step
                self._next_step += 1
            if not clean:
                return
            created, wall = time.monotonic(), time.time()
            items = list(clean.items())
            for i in range(0, len(items), MAX_METRICS_PER_POINT):  # the server takes 100 metrics a point
                self._buffer.append(_Point(created, wall, step, dict(items[i : i + MAX_METRICS_PER_POINT])))
            self._trim()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dlcloud-metrics", daemon=True)
                self._thread.start()
            if len(self._buffer) >= self.batch_size:
                self._cond.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Send what is buffered now; wait at most ``timeout`` seconds (0: start sending, do not wait). True when
        nothing is left to send."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._wake = True
            self._cond.notify_all()
            while (self._buffer or self._inflight) and not self._stopped:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return not self._buffer

    def pending(self) -> int:
        """Points buffered or in flight."""
        with self._cond:
            return len(self._buffer) + self._inflight

    # --- the sender thread -----------------------------------------------------------------------------------

    def _trim(self) -> None:
        """Drop the oldest points past ``max_buffer``; holds the lock."""
        extra = len(self._buffer) - self.max_buffer
        if extra <= 0:
            if not self._buffer:
                self._overflowing = False
            return
        for _ in range(extra):
            self._buffer.popleft()
        if not self._overflowing:
            self._overflowing = True
            log.warning(
                "dlcloud.report: more than %d metric points wait to be sent; dropping the oldest", self.max_buffer
            )

    def _expire(self) -> None:
        """While the API is unreachable, drop points older than ``give_up_after``; holds the lock."""
        limit = time.monotonic() - self.give_up_after
        dropped = 0
        while self._buffer and self._buffer[0].created < limit:
            self._buffer.popleft()
            dropped += 1
        if dropped and not self._gave_up:
            self._gave_up = True
            log.warning(
                "dlcloud.report: the metrics API at %s has been unreachable for %g s; dropping the metric points "
                "older than that (%d so far)",
                self.url,
                self.give_up_after,
                dropped,
            )

    def _run(self) -> None:
        try:
            self._loop(self._http)
        except Exception as exc:  # a bug here must not grow the buffer for ever: stop, say so once
            log.warning("dlcloud.report: the metrics sender stopped: %r; metrics are no longer sent", exc)
            with self._cond:
                self._stopped = True
                self._buffer.clear()
                self._inflight = 0
                self._cond.notify_all()

    def _loop(self, http: httpx.Client) -> None:
        delay = self.flush_interval
        failures = 0
        while True:
            with self._cond:
                deadline = time.monotonic() + delay
                while not (self._wake or self._stopped):
                    now = time.monotonic()
                    if now >= deadline or (len(self._buffer) >= self.batch_size and not failures):
                        break
                    self._cond.wait(deadline - now)
                self._wake = False
                if self._stopped:
                    self._buffer.clear()
                    self._cond.notify_all()
                    http.close()
                    return
                batch = [self._buffer.popleft() for _ in range(min(len(self._buffer), MAX_POINTS_PER_REQUEST))]
                self._inflight = len(batch)
            outcome = self._send(http, batch) if batch else _Outcome.SENT
            with self._cond:
                self._inflight = 0
                if outcome is _Outcome.RETRY:
                    self._buffer.extendleft(reversed(batch))
                    self._trim()
                    self._expire()
                    delay = min(self.retry_max, self.retry_initial * 2**failures) * random.uniform(0.8, 1.0)
                    failures += 1
                else:
                    if outcome is _Outcome.STOP:
                        self._stopped = True
                    failures = 0
                    self._gave_up = False
                    more = len(self._buffer) >= self.batch_size
                    delay = 0.0 if more else self.flush_interval
                    self._trim()
                self._cond.notify_all()

    def _send(self, http: httpx.Client, batch: list[_Point]) -> _Outcome:
        body = {"points": [p.payload(self.replica) for p in batch]}
        try:
            resp = http.post(self.url, json=body)
        except httpx.HTTPError:
            return _Outcome.RETRY
        status = resp.status_code
        if status < 300:
            return _Outcome.SENT
        if status in (401, 403):
            log.warning(
                "dlcloud.report: the metrics token was refused (HTTP %d: %s); metrics of this process are no "
                "longer sent",
                status,
                _error_message(resp),
            )
            return _Outcome.STOP
        if status == 413 and len(batch) > 1:
            half = len(batch) // 2
            first = self._send(http, batch[:half])
            if first is not _Outcome.SENT:
                return first  # a retry resends both halves: the server overwrites what it has
            return self._send(http, batch[half:])
        if status == 429 or status >= 500:
            return _Outcome.RETRY
        self._once.warn(
            f"http:{status}",
            "dlcloud.report: the metrics API refused %d points (HTTP %d: %s); they are dropped",
            len(batch),
            status,
            _error_message(resp),
        )
        return _Outcome.DROPPED


def _error_message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error") or {}
        return str(err.get("message") or err.get("code") or resp.text[:200])
    except (ValueError, AttributeError):
        return resp.text[:200]


# --- the process's reporter --------------------------------------------------------------------------------------

EXIT_TIMEOUT = 3.0

_lock = threading.Lock()
_reporter: Reporter | None = None
_disabled = False  # no DLCLOUD_METRICS_URL/TOKEN: report() is a no-op (warned once)
_hooks_registered = False
_failed_once = False


def _get() -> Reporter | None:
    global _reporter, _disabled, _hooks_registered
    if _reporter is not None or _disabled:
        return _reporter
    with _lock:
        if _reporter is not None or _disabled:
            return _reporter
        url, token = os.environ.get("DLCLOUD_METRICS_URL"), os.environ.get("DLCLOUD_METRICS_TOKEN")
        if not (url and token):
            _disabled = True
            log.warning(
                "dlcloud.report: DLCLOUD_METRICS_URL and DLCLOUD_METRICS_TOKEN are not set (not inside a dlcloud "
                "job); metrics are not sent"
            )
            return None
        _reporter = Reporter(url, token, os.environ.get("DLCLOUD_REPLICA", ""))
        if not _hooks_registered:
            _hooks_registered = True
            atexit.register(_flush_at_exit)
            os.register_at_fork(after_in_child=_reset)
        _register_worker_exit()
        return _reporter


def _register_worker_exit() -> None:
    """A multiprocessing child leaves through os._exit, past atexit: flush from its finalizers instead."""
    if multiprocessing.parent_process() is None:
        return
    mp_util.Finalize(None, _flush_at_exit, exitpriority=100)


def _flush_at_exit() -> None:
    reporter = _reporter
    if reporter is None:
        return
    if not reporter.flush(EXIT_TIMEOUT):
        log.warning(
            "dlcloud.report: %d metric points were not sent before exit (the metrics API at %s did not answer "
            "within %g s)",
            reporter.pending(),
            reporter.url,
            EXIT_TIMEOUT,
        )


def _reset() -> None:
    """Forget the process's reporter (after fork: the parent's lock, buffer, thread and connection stay there)."""
    global _lock, _reporter, _disabled
    _lock = threading.Lock()
    _reporter = None
    _disabled = False


def report(step: int | None = None, **metrics: Any) -> None:
    """Record metrics of this job at ``step`` (default: one more than this process's previous automatic step)."""
    try:
        reporter = _get()
        if reporter is not None:
            reporter.report(step, metrics)
    except Exception as exc:  # report() must never break training: any failure is logged once, never raised
        global _failed_once
        if not _failed_once:
            _failed_once = True
            log.warning("dlcloud.report: failed: %r", exc)


def flush(timeout: float = 5.0) -> bool:
    """Send the buffered metrics now, waiting at most ``timeout`` seconds (0: start sending and return at once);
    True when all were sent."""
    reporter = _reporter
    return True if reporter is None else reporter.flush(timeout)
