"""The dynamic batcher: batching, results per request, flushing, back-pressure, timeouts, errors, lifecycle.

Requests queue behind a batch that blocks in ``predict`` (``Model.hold``) until the test releases it, so which
requests share a batch is decided by the test, never by timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from dlcloud.serving.batching import BatchingConfig, DynamicBatcher
from dlcloud.serving.errors import BadRequest, InferenceFailed, Overloaded, PayloadTooLarge, Timeout, Unavailable

Arrays = dict[str, np.ndarray]
HELD = -1000.0  # the value of the request that blocks in predict


def compute(inputs: Arrays) -> Arrays:
    """A deterministic per-row function: y = 2x + 1, s = the row's sum."""
    x = inputs["x"]
    return {"y": x * 2 + 1, "s": x.reshape(len(x), -1).sum(axis=1)}


class Model:
    """``compute`` that records every batch it sees; its first ``hold`` batches block until ``release``."""

    def __init__(self, hold: int = 0, fn: Callable[[Arrays], Arrays] = compute) -> None:
        self.fn = fn
        self.hold = hold
        self.batches: list[Arrays] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, inputs: Arrays) -> Arrays:
        with self._lock:
            self.batches.append({name: np.array(value, copy=True) for name, value in inputs.items()})
            held = len(self.batches) <= self.hold
        if held:
            self.entered.set()
            if not self.release.wait(60):
                raise RuntimeError("the test never released the held batch")
        return self.fn(inputs)

    @property
    def rows(self) -> list[int]:
        return [len(batch["x"]) for batch in self.batches]

    def saw(self, value: float) -> bool:
        return any(bool((batch["x"] == value).any()) for batch in self.batches)


Factory = Callable[..., Awaitable[DynamicBatcher]]


@pytest.fixture
async def make() -> AsyncIterator[Factory]:
    """Create and start batchers; at the end release their held batches and stop them."""
    created: list[tuple[DynamicBatcher, Any]] = []

    async def factory(predict: Any, name: str = "m", on_batch: Any = None, **config: Any) -> DynamicBatcher:
        batcher = DynamicBatcher(predict, BatchingConfig(**config), name=name, on_batch=on_batch)
        await batcher.start()
        created.append((batcher, predict))
        return batcher

    yield factory
    for batcher, predict in created:
        if isinstance(predict, Model):
            predict.release.set()
        await asyncio.wait_for(batcher.stop(drain=False), 30)


async def wait_until(predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.001)


def rows_of(seed: int, n: int = 1, width: int = 4, dtype: Any = np.float32) -> np.ndarray:
    """``n`` distinct random rows (positive values: ``HELD`` and negative markers never collide)."""
    return np.random.default_rng(seed).uniform(1, 100, size=(n, width)).astype(dtype)


def assert_outputs(result: Arrays, x: np.ndarray) -> None:
    expected = compute({"x": x})
    assert set(result) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(result[name], value)


async def occupy(batcher: DynamicBatcher, model: Model) -> asyncio.Task[Arrays]:
    """Submit a request that blocks in predict, so the requests submitted next queue behind it."""
    task = asyncio.create_task(batcher.submit({"x": np.full((1, 4), HELD, np.float32)}, timeout=600))
    await wait_until(model.entered.is_set, what="the held batch to start")
    return task


async def enqueue(batcher: DynamicBatcher, requests: list[Arrays]) -> list[asyncio.Task[Arrays]]:
    """Submit each request in a task of its own; return once all of them wait in the queue."""
    tasks = [asyncio.create_task(batcher.submit(inputs)) for inputs in requests]
    await wait_until(lambda: batcher.queue_depth == len(requests), what=f"{len(requests)} queued requests")
    return tasks


async def assert_results(tasks: list[asyncio.Task[Arrays]], inputs: list[np.ndarray]) -> None:
    """Each task answers ``compute`` of its own request's ``x``."""
    for x, result in zip(inputs, await asyncio.wait_for(asyncio.gather(*tasks), 30), strict=True):
        assert_outputs(result, x)


async def test_concurrent_submitters_get_their_own_rows(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model)
    held = await occupy(batcher, model)
    inputs = [rows_of(i, n=1 + i % 3) for i in range(63)]
    tasks = await enqueue(batcher, [{"x": x} for x in inputs])
    assert batcher.inflight == 64
    model.release.set()
    await assert_results(tasks, inputs)
    assert_outputs(await held, np.full((1, 4), HELD, np.float32))
    assert max(model.rows[1:]) > 3, "requests were not batched together"
    assert max(model.rows) <= 32
    assert sum(model.rows[1:]) == sum(len(x) for x in inputs)
    assert batcher.queue_depth == 0
    assert batcher.inflight == 0


async def test_gathered_requests_share_batches_without_a_held_batch(make: Factory) -> None:
    model = Model()
    batcher = await make(model, max_batch_size=16)
    inputs = [rows_of(100 + i) for i in range(48)]
    await assert_results([asyncio.create_task(batcher.submit({"x": x})) for x in inputs], inputs)
    assert max(model.rows) <= 16
    assert len(model.batches) < 48


async def test_max_batch_size_is_respected(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model, max_batch_size=8)
    held = await occupy(batcher, model)
    inputs = [rows_of(200 + i, n=1 + i % 3) for i in range(40)]
    tasks = await enqueue(batcher, [{"x": x} for x in inputs])
    model.release.set()
    await assert_results(tasks, inputs)
    await held
    assert all(rows <= 8 for rows in model.rows), model.rows
    assert max(model.rows[1:]) > 3


async def test_preferred_size_flushes_without_waiting_for_the_delay(make: Factory) -> None:
    model = Model()
    batcher = await make(model, max_batch_size=32, max_queue_delay=600.0, preferred_batch_sizes=(4,))
    inputs = [rows_of(300 + i) for i in range(4)]
    tasks = [asyncio.create_task(batcher.submit({"x": x})) for x in inputs[:3]]
    for _ in range(5):
        await asyncio.sleep(0)
    assert model.batches == [], "3 rows are not a preferred size: the batch must wait"
    tasks.append(asyncio.create_task(batcher.submit({"x": inputs[3]})))
    await assert_results(tasks, inputs)
    assert model.rows == [4]


async def test_queue_delay_forms_a_bigger_batch(make: Factory) -> None:
    async def submit_one_by_one(batcher: DynamicBatcher, seed: int) -> None:
        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(batcher.submit({"x": rows_of(seed + i)})))
            for _ in range(3):
                await asyncio.sleep(0)  # let the batcher act on each arrival
        for i, result in enumerate(await asyncio.wait_for(asyncio.gather(*tasks), 30)):
            assert_outputs(result, rows_of(seed + i))

    eager = Model()
    await submit_one_by_one(await make(eager, max_batch_size=4), 400)
    assert eager.rows[0] == 1, "eager batching runs the first request at once"

    delayed = Model()
    await submit_one_by_one(await make(delayed, max_batch_size=4, max_queue_delay=600.0), 500)
    assert delayed.rows == [4]


async def test_queue_delay_expires(make: Factory) -> None:
    model = Model()
    batcher = await make(model, max_batch_size=32, max_queue_delay=0.02)
    x = rows_of(600, n=2)
    assert_outputs(await asyncio.wait_for(batcher.submit({"x": x}), 30), x)
    assert model.rows == [2]


async def test_incompatible_requests_run_in_separate_batches(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model)
    held = await occupy(batcher, model)
    requests = {
        "a": {"x": rows_of(700)},
        "b": {"x": rows_of(701, width=3)},  # other trailing dims
        "c": {"x": rows_of(702, n=2)},  # compatible with a
        "d": {"x": rows_of(703, dtype=np.float64)},  # other dtype
        "e": {"x": rows_of(704), "w": np.zeros((1, 2), np.int64)},  # other input names
        "f": {"x": rows_of(705)},  # compatible with a and c
    }
    tasks = await enqueue(batcher, list(requests.values()))
    model.release.set()
    await assert_results(tasks, [inputs["x"] for inputs in requests.values()])
    await held
    seen = [(len(b["x"]), b["x"].shape[1], b["x"].dtype, sorted(b)) for b in model.batches[1:]]
    assert seen == [
        (4, 4, np.float32, ["x"]),  # a + c + f, in FIFO order
        (1, 3, np.float32, ["x"]),
        (1, 4, np.float64, ["x"]),
        (1, 4, np.float32, ["w", "x"]),
    ]
    np.testing.assert_array_equal(
        model.batches[1]["x"], np.concatenate([requests["a"]["x"], requests["c"]["x"], requests["f"]["x"]])
    )


async def test_oversize_request_runs_alone(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model, max_batch_size=4)
    held = await occupy(batcher, model)
    inputs = [rows_of(800, n=2), rows_of(801, n=6), rows_of(802, n=1)]
    tasks = await enqueue(batcher, [{"x": x} for x in inputs])
    model.release.set()
    await assert_results(tasks, inputs)
    await held
    assert model.rows[1:] == [2, 6, 1]


async def test_full_queue_raises_overloaded_with_retry_after(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model, max_queue_size=2)
    held = await occupy(batcher, model)
    queued = await enqueue(batcher, [{"x": rows_of(900 + i)} for i in range(2)])
    with pytest.raises(Overloaded, match=r"queue of model m is full \(2 requests waiting, at most 2\)") as info:
        await batcher.submit({"x": rows_of(902)})
    assert info.value.status == 429
    assert int(info.value.headers["Retry-After"]) >= 1
    model.release.set()
    await asyncio.wait_for(asyncio.gather(held, *queued), 30)
    assert not model.saw(float(rows_of(902)[0, 0]))
    assert_outputs(await batcher.submit({"x": rows_of(903)}), rows_of(903))  # room again


async def test_queued_bytes_are_bounded_too(make: Factory) -> None:
    row = rows_of(0).nbytes  # one row of 4 float32: 16 bytes
    model = Model(hold=1)
    batcher = await make(model, max_queue_bytes=3 * row, max_queue_size=100)
    held = await occupy(batcher, model)  # running, not queued: its bytes do not count
    queued = await enqueue(batcher, [{"x": rows_of(950)}, {"x": rows_of(951, n=2)}])
    assert batcher.queued_bytes == 3 * row
    full = rf"queue of model m is full \(2 requests holding {3 * row} bytes waiting, at most {3 * row} bytes; this one"
    with pytest.raises(Overloaded, match=full) as info:
        await batcher.submit({"x": np.full((1, 4), -9.0, np.float32)})
    assert info.value.status == 429
    assert int(info.value.headers["Retry-After"]) >= 1
    # a request that could never fit is refused for good, whatever the queue holds
    with pytest.raises(PayloadTooLarge, match=f"hold {4 * row} bytes; the queue of model m takes at most {3 * row}"):
        await batcher.submit({"x": rows_of(952, n=4)})
    assert batcher.queue_depth == 2
    model.release.set()
    await asyncio.wait_for(asyncio.gather(held, *queued), 30)
    assert batcher.queued_bytes == 0
    assert not model.saw(-9.0)
    assert_outputs(await batcher.submit({"x": rows_of(953, n=3)}), rows_of(953, n=3))  # room again


async def test_queued_bytes_leave_with_cancelled_timed_out_and_failed_requests(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model)
    held = await occupy(batcher, model)
    text = np.array([[b"a" * 1000]], dtype=object)
    (gone,) = await enqueue(batcher, [{"x": np.full((1, 4), -5.0, np.float32), "text": text}])
    assert batcher.queued_bytes == 16 + text.nbytes + 1000  # object arrays count what they point at
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert batcher.queued_bytes == 0
    with pytest.raises(Timeout):
        await batcher.submit({"x": np.full((1, 4), -6.0, np.float32)}, timeout=0.01)
    assert batcher.queued_bytes == 0
    (stopped,) = await enqueue(batcher, [{"x": np.full((1, 4), -7.0, np.float32)}])
    model.release.set()
    await batcher.stop(drain=False)
    with pytest.raises(Unavailable):
        await stopped
    await held
    assert batcher.queued_bytes == 0


async def test_timeout_while_queued_fails_the_request_before_it_runs(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model, timeout=0.05)
    held = await occupy(batcher, model)
    patient = asyncio.create_task(batcher.submit({"x": rows_of(1001)}, timeout=600))
    with pytest.raises(Timeout, match=r"request waited more than 0\.05 s in the queue of model m") as info:
        await batcher.submit({"x": np.full((1, 4), -7.0, np.float32)})  # the configured default
    assert info.value.status == 504
    with pytest.raises(Timeout, match=r"more than 0\.01 s"):
        await batcher.submit({"x": np.full((1, 4), -8.0, np.float32)}, timeout=0.01)
    assert batcher.queue_depth == 1
    model.release.set()
    assert_outputs(await asyncio.wait_for(patient, 30), rows_of(1001))
    await held
    assert not model.saw(-7.0)
    assert not model.saw(-8.0)


async def test_failing_batch_fails_only_its_requests(make: Factory) -> None:
    def fragile(inputs: Arrays) -> Arrays:
        if (inputs["x"] == -1).any():
            raise ValueError("boom: negative one")
        return compute(inputs)

    model = Model(hold=1, fn=fragile)
    batches: list[tuple[int, float]] = []
    batcher = await make(model, on_batch=lambda rows, seconds: batches.append((rows, seconds)))
    held = await occupy(batcher, model)
    bad, unlucky = await enqueue(batcher, [{"x": np.full((2, 4), -1.0, np.float32)}, {"x": rows_of(1100)}])
    model.release.set()
    assert_outputs(await asyncio.wait_for(held, 30), np.full((1, 4), HELD, np.float32))
    for task in (bad, unlucky):
        with pytest.raises(InferenceFailed, match=r"model m failed on a batch of 3 rows: ValueError: boom") as info:
            await asyncio.wait_for(task, 30)
        assert info.value.status == 500
        assert "Traceback" not in info.value.message
    assert model.rows == [1, 3]
    assert_outputs(await batcher.submit({"x": rows_of(1101)}), rows_of(1101))  # the next batch works
    assert [rows for rows, _ in batches] == [1, 3, 1]
    assert all(seconds >= 0 for _, seconds in batches)


async def test_bad_request_in_a_batch_fails_only_that_request(make: Factory) -> None:
    def strict(inputs: Arrays) -> Arrays:
        if (inputs["x"] < 0).any() and (inputs["x"] != HELD).all():
            raise BadRequest("x must be >= 0")
        return compute(inputs)

    model = Model(hold=1, fn=strict)
    batcher = await make(model)
    held = await occupy(batcher, model)
    good1, good2 = rows_of(1200, n=2), rows_of(1201)
    tasks = await enqueue(batcher, [{"x": good1}, {"x": np.full((1, 4), -3.0, np.float32)}, {"x": good2}])
    model.release.set()
    await held
    assert_outputs(await asyncio.wait_for(tasks[0], 30), good1)
    with pytest.raises(BadRequest, match="x must be >= 0") as info:
        await tasks[1]
    assert info.value.status == 400
    assert_outputs(await tasks[2], good2)
    assert model.rows == [1, 4, 2, 1, 1]  # the batch, then each request alone


async def test_wrong_output_rows_fail_the_batch(make: Factory) -> None:
    batcher = await make(lambda inputs: {"y": inputs["x"][:-1]})
    with pytest.raises(InferenceFailed, match=r"model m returned 2 rows for a batch of 3 \(output 'y'\)"):
        await batcher.submit({"x": rows_of(1300, n=3)})

    model2 = Model(hold=1, fn=lambda inputs: {"y": inputs["x"][:-1]} if len(inputs["x"]) > 1 else compute(inputs))
    batcher2 = await make(model2, name="n")
    held = await occupy(batcher2, model2)
    tasks = await enqueue(batcher2, [{"x": rows_of(1301 + i)} for i in range(2)])
    model2.release.set()
    await held
    for task in tasks:
        with pytest.raises(InferenceFailed, match=r"model n returned 1 rows for a batch of 2"):
            await asyncio.wait_for(task, 30)


async def test_cancelled_caller_is_dropped_from_the_queue(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model)
    held = await occupy(batcher, model)
    (gone,) = await enqueue(batcher, [{"x": np.full((1, 4), -5.0, np.float32)}])
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert batcher.queue_depth == 0
    assert batcher.inflight == 1
    model.release.set()
    await asyncio.wait_for(held, 30)
    assert_outputs(await batcher.submit({"x": rows_of(1400)}), rows_of(1400))
    assert not model.saw(-5.0)
    assert model.rows == [1, 1]


async def test_stop_with_drain_completes_queued_work(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model)
    held = await occupy(batcher, model)
    inputs = [rows_of(1500 + i) for i in range(3)]
    tasks = await enqueue(batcher, [{"x": x} for x in inputs])
    stopping = asyncio.create_task(batcher.stop(drain=True))
    await wait_until(lambda: batcher.state == "stopping")
    with pytest.raises(Unavailable, match="model m is stopping") as info:
        await batcher.submit({"x": rows_of(1510)})
    assert info.value.status == 503
    model.release.set()
    await asyncio.wait_for(stopping, 30)
    assert batcher.state == "stopped"
    await assert_results(tasks, inputs)
    await held
    with pytest.raises(Unavailable, match="model m is stopped"):
        await batcher.submit({"x": rows_of(1511)})
    await batcher.stop()  # idempotent


async def test_stop_without_drain_fails_queued_requests(make: Factory) -> None:
    model = Model(hold=1)
    batcher = await make(model)
    held = await occupy(batcher, model)
    tasks = await enqueue(batcher, [{"x": np.full((1, 4), -9.0, np.float32)} for _ in range(2)])
    stopping = asyncio.create_task(batcher.stop(drain=False))
    for task in tasks:
        with pytest.raises(Unavailable, match="model m stopped before the request ran"):
            await asyncio.wait_for(task, 30)
    assert not stopping.done(), "stop waits for the running batch"
    assert batcher.inflight == 1
    model.release.set()
    await asyncio.wait_for(stopping, 30)
    assert_outputs(await held, np.full((1, 4), HELD, np.float32))
    assert not model.saw(-9.0)
    with pytest.raises(Unavailable):
        await batcher.submit({"x": rows_of(1600)})


async def test_start_and_stop_are_idempotent_and_a_batcher_restarts() -> None:
    batcher = DynamicBatcher(compute, BatchingConfig(), name="m")
    with pytest.raises(Unavailable, match="model m is not started"):
        await batcher.submit({"x": rows_of(1700)})
    await batcher.start()
    await batcher.start()
    assert_outputs(await batcher.submit({"x": rows_of(1701)}), rows_of(1701))
    await batcher.stop()
    await batcher.stop(drain=False)
    assert batcher.state == "stopped"
    await batcher.start()
    assert_outputs(await batcher.submit({"x": rows_of(1702)}), rows_of(1702))
    await batcher.stop()


async def test_batching_disabled_runs_each_request_as_given(make: Factory) -> None:
    seen: list[Arrays] = []
    release = threading.Event()

    def echo(inputs: Arrays) -> Arrays:
        seen.append(inputs)
        if len(seen) == 1:
            release.wait(60)
        return {"out": inputs["x"], "count": np.array(len(seen))}  # a 0-d output is fine unbatched

    batcher = await make(echo, max_batch_size=0)
    first = asyncio.create_task(batcher.submit({"x": np.zeros((2, 3))}))
    await wait_until(lambda: len(seen) == 1)
    requests = [{"x": np.ones((1, 3))}, {"x": np.ones((1, 3))}, {"x": np.array(5.0)}, {"x": np.ones((4, 2, 2))}]
    tasks = await enqueue(batcher, requests)
    release.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    await first
    assert len(seen) == 5
    for inputs, got, result in zip(requests, seen[1:], results, strict=True):
        assert got is inputs  # passed as given: no concatenation, no copy
        assert result["out"] is inputs["x"]


async def test_request_without_a_common_batch_dim_runs_alone(make: Factory) -> None:
    def lengths(inputs: Arrays) -> Arrays:
        if "w" not in inputs:
            return compute(inputs)  # the held request
        return {"n": np.array([len(inputs["x"]), len(inputs["w"])])}  # no batch dim: returned as given

    model = Model(hold=1, fn=lengths)
    batcher = await make(model)
    held = await occupy(batcher, model)
    odd = {"x": rows_of(1800, n=3), "w": np.zeros((2, 1))}
    tasks = await enqueue(batcher, [odd, dict(odd)])
    model.release.set()
    await held
    for task in tasks:
        np.testing.assert_array_equal((await asyncio.wait_for(task, 30))["n"], [3, 2])
    assert model.rows == [1, 3, 3]


async def test_bytes_inputs_batch(make: Factory) -> None:
    def shout(inputs: Arrays) -> Arrays:
        words = inputs["text"]
        upper = np.array([[w.upper() for w in row] for row in words], dtype=object)
        return {"upper": upper, "length": np.array([[len(w) for w in row] for row in words], dtype=np.int64)}

    model = Model(hold=1, fn=shout)
    # Model records batches by "x" (for rows); give every request an x too, as a second input
    batcher = await make(model)
    held_inputs = {"x": np.full((1, 4), HELD, np.float32), "text": np.array([[b"held"]], dtype=object)}
    held = asyncio.create_task(batcher.submit(held_inputs))
    await wait_until(model.entered.is_set)
    texts = [[[b"a"]], [[b"hello"], [b"world!"]], [[b""]], [[b"\x00\xff bytes"], [b"z"]]]
    requests = [{"x": rows_of(1900 + i, n=len(t)), "text": np.array(t, dtype=object)} for i, t in enumerate(texts)]
    tasks = await enqueue(batcher, requests)
    model.release.set()
    await held
    for text, task in zip(texts, tasks, strict=True):
        result = await asyncio.wait_for(task, 30)
        assert result["upper"].dtype == object
        assert result["upper"].tolist() == [[w.upper() for w in row] for row in text]
        assert result["length"].tolist() == [[len(w) for w in row] for row in text]
    assert model.rows == [1, 6]
    assert model.batches[1]["text"].dtype == object


async def test_instances_run_batches_concurrently(make: Factory) -> None:
    barrier = threading.Barrier(2, timeout=30)

    def meet(inputs: Arrays) -> Arrays:
        barrier.wait()  # passes only if two batches run at the same time
        return compute(inputs)

    model = Model(fn=meet)
    batcher = await make(model, instances=2)
    first = asyncio.create_task(batcher.submit({"x": rows_of(2000)}))
    await wait_until(lambda: len(model.batches) == 1)
    second = asyncio.create_task(batcher.submit({"x": rows_of(2001)}))
    assert_outputs(await asyncio.wait_for(first, 30), rows_of(2000))
    assert_outputs(await asyncio.wait_for(second, 30), rows_of(2001))
    assert model.rows == [1, 1]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_batch_size": -1}, "max_batch_size must be >= 0"),
        ({"max_queue_delay": -0.1}, "max_queue_delay must be >= 0"),
        ({"max_queue_size": 0}, "max_queue_size must be >= 1"),
        ({"max_queue_bytes": 0}, "max_queue_bytes must be >= 1"),
        ({"timeout": 0}, "timeout must be > 0"),
        ({"instances": 0}, "instances must be >= 1"),
        ({"max_batch_size": 8, "preferred_batch_sizes": (4, 16)}, r"between 1 and max_batch_size \(8\)"),
        ({"max_batch_size": 0, "preferred_batch_sizes": (4,)}, "preferred_batch_sizes"),
    ],
)
def test_config_is_validated(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchingConfig(**config)


async def test_non_positive_timeout_is_a_bad_request(make: Factory) -> None:
    batcher = await make(Model())
    with pytest.raises(BadRequest, match="timeout must be > 0 seconds, got 0"):
        await batcher.submit({"x": rows_of(2100)}, timeout=0)
