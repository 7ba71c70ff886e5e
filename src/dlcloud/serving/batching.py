"""The per-model-version dynamic batcher: concurrent requests are merged into one ``predict`` call.

This module owns the queue of one model version; its state is only changed by the methods below, all of
which run on the event loop (worker threads only run ``predict`` and hand results back with
``call_soon_threadsafe``).

Vocabulary:

- *request*: one ``submit()`` call; a dict of arrays whose dim 0 is the batch (a request may carry several
  *rows*). It owns one future, the only thing its caller waits on.
- *compatible*: requests with the same input names, dtypes and trailing dims (``shape[1:]``); only those are
  concatenated along dim 0. A request whose inputs have no common dim 0 (0-d arrays, different dim 0s) is
  never merged: it runs alone, as given, and its outputs are returned as the model gave them.
- *batch*: the requests of one ``predict`` call, FIFO among compatible requests. The oldest queued request
  always starts the next batch, so skipping incompatible requests can delay but never starve them.
- *instance*: a worker thread; ``instances`` batches may run at once.

Flushing: eager by default (``max_queue_delay == 0``): as soon as an instance is free, the next batch takes
whatever is queued, up to ``max_batch_size`` rows; while batches run, new requests accumulate, so batches
are large under load and latency is minimal at concurrency 1. With ``max_queue_delay > 0`` a batch waits up
to that long after its oldest request arrived, unless it is full, cannot grow (the next compatible request
does not fit), its rows equal a preferred size or reach the largest one, or the batcher is draining.

Invariants:

- ``predict`` never runs on the event loop, and each request is given to ``predict`` at most once (except the
  BadRequest retry below), or never if it timed out, was cancelled or the batcher stopped without draining.
- A request larger than ``max_batch_size`` rows is never split: it runs alone.
- The queue is bounded twice: at most ``max_queue_size`` requests and ``max_queue_bytes`` bytes of input
  arrays wait (a request's bytes count from ``submit()`` until its batch starts or it leaves the queue).
  Beyond either bound ``submit()`` raises ``Overloaded`` (429 + Retry-After); a request that alone holds
  more than ``max_queue_bytes`` can never be queued and gets ``PayloadTooLarge`` (413).
- Every future is completed exactly once: with its slice of the outputs or with a ``ServingError``.
- A failing batch fails every request in it (``InferenceFailed`` with the exception's type and message; the
  traceback goes to the server log), and only those. A ``ServingError`` raised by ``predict`` is passed
  through as is. ``BadRequest`` is the client's fault: when a batch of several requests raises it, each
  request is retried alone, so one bad request fails only itself.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlcloud.serving.errors import (
    BadRequest,
    InferenceFailed,
    Overloaded,
    PayloadTooLarge,
    ServingError,
    Timeout,
    Unavailable,
)

__all__ = ["BatchingConfig", "DynamicBatcher"]

logger = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
Predict = Callable[[Arrays], Arrays]
OnBatch = Callable[[int, float], None]
# (name, dtype, trailing dims) per input, sorted by name: requests with equal keys can be concatenated
BatchKey = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]

# request states
_QUEUED, _STARTED, _DROPPED = 0, 1, 2
# batcher states
_NEW, _RUNNING, _STOPPING, _STOPPED = "new", "running", "stopping", "stopped"
# a delay timer may fire this much before its time by the loop's clock (uvloop's clock has 1 ms resolution)
_TIMER_SLACK = 0.002
# weight of the newest batch in the moving average of batch latency (for Retry-After)
_LATENCY_WEIGHT = 0.2


@dataclass(frozen=True)
class BatchingConfig:
    """How one model version batches. Defaults: eager batches of up to 32 rows, one instance."""

    max_batch_size: int = 32  # rows per batch; 0 disables batching (each request runs alone, as given)
    max_queue_delay: float = 0.0  # seconds to wait for more rows once a batch has started forming; 0 = eager
    preferred_batch_sizes: tuple[int, ...] = ()  # flush at once when a forming batch reaches one of these
    max_queue_size: int = 1024  # queued requests beyond which submit() raises Overloaded
    max_queue_bytes: int = 1024**3  # bytes of queued input arrays beyond which submit() raises Overloaded
    timeout: float | None = None  # default per-request deadline (seconds) while queued
    instances: int = 1  # batches that may run concurrently (worker threads)

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size must be >= 0 (0 disables batching), got {self.max_batch_size}")
        if not self.max_queue_delay >= 0:
            raise ValueError(f"max_queue_delay must be >= 0 seconds, got {self.max_queue_delay}")
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.max_queue_bytes < 1:
            raise ValueError(f"max_queue_bytes must be >= 1, got {self.max_queue_bytes}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {self.timeout}")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if any(not 1 <= size <= self.max_batch_size for size in self.preferred_batch_sizes):
            raise ValueError(
                f"preferred_batch_sizes must be between 1 and max_batch_size ({self.max_batch_size}), "
                f"got {list(self.preferred_batch_sizes)}"
            )


class _Request:
    """One submitted request; lives in the queue until it starts, times out or is dropped."""

    __slots__ = ("deadline", "enqueued", "future", "inputs", "key", "nbytes", "rows", "state", "timeout", "timer")

    def __init__(
        self,
        inputs: Arrays,
        rows: int,
        key: BatchKey | None,
        future: asyncio.Future[Arrays],
        enqueued: float,
        nbytes: int = 0,
    ) -> None:
        self.inputs = inputs
        self.rows = rows
        self.nbytes = nbytes
        self.key = key
        self.future = future
        self.enqueued = enqueued
        self.state = _QUEUED
        self.deadline: float | None = None
        self.timeout = 0.0
        self.timer: asyncio.TimerHandle | None = None


def _batch_key(inputs: Arrays) -> tuple[int, BatchKey | None]:
    """The rows of a request and its compatibility key (None: it cannot be merged with other requests)."""
    rows = -1
    key = []
    for name in sorted(inputs):
        array = inputs[name]
        shape = array.shape
        if not shape:
            return 1, None
        if rows < 0:
            rows = shape[0]
        elif shape[0] != rows:
            return 1, None
        key.append((name, array.dtype, shape[1:]))
    if rows < 0:
        return 1, None
    return rows, tuple(key)


def _request_bytes(inputs: Arrays) -> int:
    """Bytes a request's arrays hold: their buffers, plus the strings and bytes an object array points at."""
    total = 0
    for array in inputs.values():
        total += array.nbytes
        if array.dtype.hasobject:
            total += sum(len(item) for item in array.flat if isinstance(item, bytes | str))
    return total


def _rows_as_given(inputs: Arrays) -> int:
    """Rows of a request that runs as given (batching disabled): dim 0 of its first input, else 1."""
    for array in inputs.values():
        return int(array.shape[0]) if array.shape else 1
    return 1


class DynamicBatcher:
    """Merges concurrent ``submit()`` calls into ``predict`` calls on worker threads.

    ``predict`` is synchronous and row-independent: for any split of a batch along dim 0 it must return the
    same rows as for the whole batch. ``on_batch(rows, seconds)`` is called on the event loop after every
    batch (also failed ones) with the batch's rows and the seconds its worker spent on it (concatenating,
    ``predict``, splitting); use it for a batch-size histogram and batch latency.

    ``start()`` creates the ``instances`` worker threads and binds the batcher to the running loop; there is
    no resident batching task: forming a batch is a loop callback scheduled when a request arrives, a batch
    finishes or a ``max_queue_delay`` timer fires, which costs less per request than waking a task.
    """

    def __init__(
        self, predict: Predict, config: BatchingConfig, *, name: str = "", on_batch: OnBatch | None = None
    ) -> None:
        self._predict = predict
        self._config = config
        self.name = name
        self._label = f"model {name}" if name else "the model"
        self._on_batch = on_batch
        self._state = _NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[_Request] = collections.deque()
        self._queued = 0  # live (not started, not dropped) requests in _queue
        self._queued_rows = 0
        self._queued_bytes = 0
        self._free = 0  # idle instances
        self._running_requests = 0
        self._dispatch_pending = False
        self._timer: asyncio.TimerHandle | None = None  # max_queue_delay timer
        self._timer_at = 0.0
        self._latency: float | None = None  # moving average of batch seconds
        self._work: queue.SimpleQueue[list[_Request] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._preferred = frozenset(config.preferred_batch_sizes)
        self._largest_preferred = max(config.preferred_batch_sizes, default=0)

    @property
    def config(self) -> BatchingConfig:
        return self._config

    @property
    def state(self) -> str:
        """``new``, ``running``, ``stopping`` or ``stopped``."""
        return self._state

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch (not started yet)."""
        return self._queued

    @property
    def queued_bytes(self) -> int:
        """Bytes of input arrays held by the requests waiting for a batch."""
        return self._queued_bytes

    @property
    def inflight(self) -> int:
        """Requests submitted and not finished: queued plus those in running batches."""
        return self._queued + self._running_requests

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker threads on the running loop. Idempotent; a stopped batcher can be started again."""
        if self._state is _RUNNING:
            return
        if self._state is _STOPPING:
            raise RuntimeError(f"the batcher of {self._label} is stopping; await stop() before starting it again")
        loop = asyncio.get_running_loop()
        self._loop = loop
        work: queue.SimpleQueue[list[_Request] | None] = queue.SimpleQueue()
        self._work = work
        self._free = self._config.instances
        self._latency = None
        self._threads = [
            threading.Thread(
                target=self._worker, args=(loop, work), name=f"batcher-{self.name or 'model'}-{i}", daemon=True
            )
            for i in range(self._config.instances)
        ]
        for thread in self._threads:
            thread.start()
        self._state = _RUNNING

    async def stop(self, drain: bool = True) -> None:
        """Stop accepting requests and wait until running batches are done. Idempotent.

        Args:
            drain: True runs everything queued first (without waiting for ``max_queue_delay``); False fails
                the queued requests with ``Unavailable`` (running batches still finish).
        """
        if self._state is _NEW or self._state is _STOPPED:
            self._state = _STOPPED
            return
        self._state = _STOPPING
        if not drain:
            self._fail_queued()
        self._dispatch()  # flush what was waiting for max_queue_delay
        if self._queued or self._free < self._config.instances:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter
        if self._state is _STOPPING:
            self._state = _STOPPED
            self._cancel_timer()
            for _ in self._threads:
                self._work.put(None)
            self._threads = []

    # -- the hot path ------------------------------------------------------------------------------------

    async def submit(self, inputs: Arrays, *, timeout: float | None = None) -> Arrays:
        """Queue one request and wait for its outputs (dim 0 sliced back to this request's rows).

        Args:
            inputs: input name -> array whose dim 0 is the batch.
            timeout: seconds the request may wait in the queue before its batch starts; default
                ``config.timeout`` (None: no limit). Once started, a request runs to completion.

        Returns:
            output name -> array; with batching, this request's rows of the batch's outputs.

        Raises:
            Unavailable: the batcher is not running (not started, stopping or stopped).
            Overloaded: ``max_queue_size`` requests are already queued, or this request's arrays would take the
                queued bytes over ``max_queue_bytes`` (``retry_after`` is an estimate).
            PayloadTooLarge: this request's arrays alone hold more than ``max_queue_bytes``.
            Timeout: the deadline passed before the request's batch started; ``predict`` never saw it.
            InferenceFailed: ``predict`` raised or returned outputs whose dim 0 is not the batch's rows.
            BadRequest: ``predict`` rejected this request (other ``ServingError``s pass through too).
        """
        if self._state is not _RUNNING:
            raise self._unavailable()
        config = self._config
        if self._queued >= config.max_queue_size:
            raise self._overloaded()
        nbytes = _request_bytes(inputs)
        if self._queued_bytes + nbytes > config.max_queue_bytes:
            if nbytes > config.max_queue_bytes:
                raise PayloadTooLarge(
                    f"the request's tensors hold {nbytes} bytes; the queue of {self._label} takes at most "
                    f"{config.max_queue_bytes} bytes: send fewer rows per request"
                )
            raise self._overloaded(nbytes)
        loop = self._loop
        assert loop is not None
        if config.max_batch_size:
            rows, key = _batch_key(inputs)
        else:
            rows, key = _rows_as_given(inputs), None
        future: asyncio.Future[Arrays] = loop.create_future()
        request = _Request(inputs, rows, key, future, loop.time(), nbytes)
        if timeout is None:
            timeout = config.timeout
        if timeout is not None:
            if not timeout > 0:
                raise BadRequest(f"timeout must be > 0 seconds, got {timeout}")
            request.timeout = timeout
            request.deadline = deadline = request.enqueued + timeout
            request.timer = loop.call_at(deadline, self._expire, request)
        self._queue.append(request)
        self._queued += 1
        self._queued_rows += rows
        self._queued_bytes += nbytes
        if not self._dispatch_pending:
            self._dispatch_pending = True
            loop.call_soon(self._dispatch)
        try:
            return await future
        except asyncio.CancelledError:
            # the caller went away (client disconnected): drop the request if its batch has not started
            if request.state is _QUEUED:
                self._drop(request)
            raise

    # -- forming batches (event loop) --------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Start batches while an instance is free and requests are queued."""
        self._dispatch_pending = False
        while self._free and self._queued:
            batch = self._take()
            if batch is None:
                return
            self._free -= 1
            self._running_requests += len(batch)
            self._work.put(batch)

    def _take(self) -> list[_Request] | None:
        """Remove and return the next batch; None when it should wait for more rows (a timer is set)."""
        config = self._config
        loop = self._loop
        assert loop is not None
        now = loop.time()
        q = self._queue
        while q and not self._is_live(q[0], now):
            q.popleft()
        if not q:
            return None
        head = q[0]
        batch = [head]
        rows = head.rows
        key = head.key
        limit = config.max_batch_size
        complete = key is None or rows >= limit
        if not complete:
            for request in itertools.islice(q, 1, None):
                if request.key != key or not self._is_live(request, now):
                    continue
                if rows + request.rows > limit:
                    complete = True  # FIFO among compatible requests: the next one does not fit
                    break
                batch.append(request)
                rows += request.rows
                if rows == limit:
                    complete = True
                    break
        if (
            not complete
            and config.max_queue_delay
            and self._state is _RUNNING
            and rows not in self._preferred
            and not (self._largest_preferred and rows >= self._largest_preferred)
        ):
            flush_at = head.enqueued + config.max_queue_delay
            if now < flush_at - _TIMER_SLACK:
                self._set_timer(flush_at)
                return None
        self._cancel_timer()
        for request in batch:
            request.state = _STARTED
            if request.timer is not None:
                request.timer.cancel()
        self._queued -= len(batch)
        self._queued_rows -= rows
        self._queued_bytes -= sum(request.nbytes for request in batch)
        taken = 0
        while q and q[0].state is not _QUEUED:
            taken += q.popleft().state is _STARTED
        if taken < len(batch):  # some were behind incompatible requests
            self._queue = collections.deque(r for r in q if r.state is _QUEUED)
        return batch

    def _is_live(self, request: _Request, now: float) -> bool:
        """False for requests that must not run: dropped, cancelled or past their deadline (then failed)."""
        if request.state is not _QUEUED:
            return False
        if request.future.done():  # cancelled; submit() has not run its except clause yet
            self._drop(request, compact=False)
            return False
        if request.deadline is not None and request.deadline <= now:
            self._expire(request, compact=False)
            return False
        return True

    def _set_timer(self, when: float) -> None:
        if self._timer is not None:
            if self._timer_at == when:
                return
            self._timer.cancel()
        assert self._loop is not None
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _expire(self, request: _Request, compact: bool = True) -> None:
        if request.state is not _QUEUED:
            return
        if not request.future.done():
            request.future.set_exception(
                Timeout(f"request waited more than {request.timeout:g} s in the queue of {self._label}")
            )
        self._drop(request, compact)

    def _drop(self, request: _Request, compact: bool = True) -> None:
        """Take a queued request out of the accounting; its queue entry is removed lazily."""
        request.state = _DROPPED
        request.inputs = {}  # a dead entry must not hold the arrays until it is popped
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None
        self._queued -= 1
        self._queued_rows -= request.rows
        self._queued_bytes -= request.nbytes
        if compact and len(self._queue) > 2 * self._queued + 64:
            self._queue = collections.deque(r for r in self._queue if r.state is _QUEUED)
        self._check_idle()

    def _fail_queued(self) -> None:
        for request in self._queue:
            if request.state is _QUEUED:
                if not request.future.done():
                    request.future.set_exception(Unavailable(f"{self._label} stopped before the request ran; retry it"))
                request.state = _DROPPED
                if request.timer is not None:
                    request.timer.cancel()
        self._queue.clear()
        self._queued = 0
        self._queued_rows = 0
        self._queued_bytes = 0

    def _check_idle(self) -> None:
        if self._state is _STOPPING and not self._queued and self._free == self._config.instances:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _finish(self, batch: list[_Request], results: list[Any], seconds: float) -> None:
        """Called on the loop by a worker: complete the futures, start the next batch."""
        self._free += 1
        self._running_requests -= len(batch)
        latency = self._latency
        self._latency = seconds if latency is None else latency + _LATENCY_WEIGHT * (seconds - latency)
        for request, result in zip(batch, results, strict=True):
            future = request.future
            if not future.done():  # a cancelled caller's future is done
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        if self._on_batch is not None:
            try:
                self._on_batch(sum(r.rows for r in batch), seconds)
            except Exception:
                logger.exception("on_batch callback of %s failed", self._label)
        if self._queued:
            self._dispatch()
        else:
            self._check_idle()

    # -- running batches (worker threads) ----------------------------------------------------------------

    def _worker(self, loop: asyncio.AbstractEventLoop, work: queue.SimpleQueue[list[_Request] | None]) -> None:
        while True:
            batch = work.get()
            if batch is None:
                return
            started = time.perf_counter()
            try:
                results = self._run(batch)
            except BaseException as exc:  # a bug here must not leave futures pending forever
                results = self._failed(exc, batch, sum(r.rows for r in batch))
            seconds = time.perf_counter() - started
            try:
                loop.call_soon_threadsafe(self._finish, batch, results, seconds)
            except RuntimeError:  # the loop is closed: nobody waits for these results any more
                return

    def _run(self, batch: list[_Request]) -> list[Any]:
        """Outputs (or the exception) per request, in the batch's order."""
        if len(batch) == 1:
            return [self._run_alone(batch[0])]
        rows = sum(r.rows for r in batch)
        try:
            inputs = {name: np.concatenate([r.inputs[name] for r in batch]) for name in batch[0].inputs}
            outputs = self._predict(inputs)
            self._check_rows(outputs, rows)
        except BadRequest:
            # The client's fault, but whose? Retry each request alone so a bad one fails only itself.
            return [self._run_alone(request) for request in batch]
        except Exception as exc:
            return self._failed(exc, batch, rows)
        results = []
        start = 0
        items = list(outputs.items())
        for request in batch:
            stop = start + request.rows
            results.append({name: value[start:stop] for name, value in items})
            start = stop
        return results

    def _run_alone(self, request: _Request) -> Any:
        try:
            outputs = self._predict(request.inputs)
            if request.key is not None:
                self._check_rows(outputs, request.rows)
            return outputs
        except ServingError as exc:
            return exc
        except Exception as exc:
            return self._failed(exc, [request], request.rows)[0]

    def _check_rows(self, outputs: Any, rows: int) -> None:
        if not isinstance(outputs, Mapping):
            raise InferenceFailed(f"{self._label} returned {type(outputs).__name__}, expected a dict of arrays")
        for name, value in outputs.items():
            shape = getattr(value, "shape", None)
            if not shape:
                raise InferenceFailed(
                    f"{self._label} returned output {name!r} without a batch dimension for a batch of {rows} rows"
                )
            if shape[0] != rows:
                raise InferenceFailed(f"{self._label} returned {shape[0]} rows for a batch of {rows} (output {name!r})")

    def _failed(self, exc: BaseException, batch: list[_Request], rows: int) -> list[Any]:
        """One exception per request (an exception object must not be raised in several tasks)."""
        if isinstance(exc, ServingError):
            return [exc, *(_copy_error(exc) for _ in batch[1:])]
        logger.error("%s failed on a batch of %d rows", self._label, rows, exc_info=exc)
        message = f"{self._label} failed on a batch of {rows} rows: {type(exc).__name__}: {exc}"
        return [InferenceFailed(message) for _ in batch]

    # -- errors ------------------------------------------------------------------------------------------

    def _unavailable(self) -> Unavailable:
        if self._state is _NEW:
            return Unavailable(f"{self._label} is not started yet")
        return Unavailable(f"{self._label} is {self._state} and accepts no new requests")

    def _overloaded(self, nbytes: int | None = None) -> Overloaded:
        """The queue is full: of requests, or (``nbytes`` given) of bytes for a request of ``nbytes``."""
        config = self._config
        if self._latency is None:
            retry_after = 1
        else:
            queued_batches = max(1, math.ceil(self._queued_rows / (config.max_batch_size or 1)))
            waves = math.ceil(queued_batches / config.instances) + 1  # + the batches running now
            retry_after = max(1, math.ceil(self._latency * waves))
        if nbytes is None:
            full = f"{self._queued} requests waiting, at most {config.max_queue_size}"
        else:
            full = (
                f"{self._queued} requests holding {self._queued_bytes} bytes waiting, at most "
                f"{config.max_queue_bytes} bytes; this one holds {nbytes}"
            )
        return Overloaded(
            f"the queue of {self._label} is full ({full}); retry in {retry_after} s", retry_after=retry_after
        )


def _copy_error(exc: ServingError) -> ServingError:
    try:
        return copy.copy(exc)
    except Exception:  # a subclass whose constructor copy cannot call
        return exc
