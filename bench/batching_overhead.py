"""Dynamic batcher overhead: what ``DynamicBatcher.submit`` adds to a model call, in-process (no HTTP).

Two models, each request one row:

- ``identity``: returns its inputs; measures the batcher's own cost.
- ``matmul``: ``tanh(x @ W1) @ W2`` (float32), hidden size chosen so that one call on a full batch
  (``--max-batch-size`` rows) takes about 1 ms on this machine.

Measured:

- concurrency 1: submit -> result latency of sequential requests vs calling ``predict`` directly on the
  event-loop thread (and ``asyncio.to_thread(predict)``, the bare cost of leaving the loop, for reference);
  overhead = batcher p50 - direct p50 (target: <= 1 ms).
- concurrency 64: requests/s of 64 coroutines, each submitting one row at a time in a loop, vs the ceiling
  of calling ``predict`` directly on full batches back to back (rows/s) (target: >= 70 %).

BLAS threads matter on small machines: with OpenBLAS's default (one thread per core) a 2-core machine has
no core left for the event loop while a batch runs, so ``predict`` and the loop slow each other down. Run
once as is and once with ``OPENBLAS_NUM_THREADS=1`` (one intra-op thread per instance, the usual serving
setting) to see both.

    python bench/batching_overhead.py                  # uvloop (what the server runs) and asyncio
    OPENBLAS_NUM_THREADS=1 python bench/batching_overhead.py --seconds 5 --loop uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from _common import load_average, machine, percentile  # bench/ is on sys.path when run as a script

from dlcloud.serving.batching import BatchingConfig, DynamicBatcher

Arrays = dict[str, np.ndarray]
WIDTH = 64  # input features per row
TARGET_OVERHEAD_US = 1000.0
TARGET_THROUGHPUT = 0.70


@dataclass(frozen=True)
class Model:
    name: str
    predict: Callable[[Arrays], Arrays]
    note: str


def identity_model() -> Model:
    return Model("identity", lambda inputs: inputs, "returns its inputs")


def matmul_model(batch: int, target_s: float = 1e-3) -> Model:
    """tanh(x @ W1) @ W2 with the hidden size whose full-batch call is closest to ``target_s``."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, WIDTH), dtype=np.float32)
    best: tuple[float, int, Callable[[Arrays], Arrays]] | None = None
    for hidden in (256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192):
        w1 = rng.standard_normal((WIDTH, hidden), dtype=np.float32) / np.sqrt(WIDTH)
        w2 = rng.standard_normal((hidden, hidden), dtype=np.float32) / np.sqrt(hidden)

        predict = two_layers(w1, w2)
        took = time_call(predict, {"x": x})
        if best is None or abs(took - target_s) < abs(best[0] - target_s):
            best = (took, hidden, predict)
        if took > target_s:
            break
    assert best is not None
    took, hidden, predict = best
    one = time_call(predict, {"x": x[:1]})
    return Model(
        "matmul",
        predict,
        f"tanh(x[n,{WIDTH}] @ W1[{WIDTH},{hidden}]) @ W2[{hidden},{hidden}] float32: "
        f"{took * 1e3:.2f} ms for {batch} rows, {one * 1e3:.2f} ms for 1 row",
    )


def two_layers(w1: np.ndarray, w2: np.ndarray) -> Callable[[Arrays], Arrays]:
    def predict(inputs: Arrays) -> Arrays:
        return {"y": np.tanh(inputs["x"] @ w1) @ w2}

    return predict


def time_call(predict: Callable[[Arrays], Arrays], inputs: Arrays, repeat: int = 50) -> float:
    """Median seconds of one call."""
    for _ in range(5):
        predict(inputs)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        predict(inputs)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def row(i: int) -> Arrays:
    return {"x": np.full((1, WIDTH), i % 97, dtype=np.float32)}


# -- concurrency 1 ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    direct: list[float]
    to_thread: list[float]
    batcher: list[float]


async def latency(model: Model, config: BatchingConfig, n: int) -> Latency:
    inputs = [row(i) for i in range(n)]
    direct, threaded, batched = [], [], []
    for x in inputs[: n // 10]:  # warm-up
        model.predict(x)
    for x in inputs:
        t0 = time.perf_counter()
        model.predict(x)
        direct.append(time.perf_counter() - t0)
    for x in inputs:
        t0 = time.perf_counter()
        await asyncio.to_thread(model.predict, x)
        threaded.append(time.perf_counter() - t0)
    batcher = DynamicBatcher(model.predict, config, name=model.name)
    await batcher.start()
    try:
        for x in inputs[: n // 10]:
            await batcher.submit(x)
        for x in inputs:
            t0 = time.perf_counter()
            await batcher.submit(x)
            batched.append(time.perf_counter() - t0)
    finally:
        await batcher.stop()
    return Latency(direct, threaded, batched)


# -- concurrency 64 --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    ceiling_rows_s: float
    batcher_req_s: float
    mean_batch_rows: float


async def throughput(model: Model, config: BatchingConfig, clients: int, seconds: float) -> Throughput:
    full = {"x": np.concatenate([row(i)["x"] for i in range(config.max_batch_size)])}
    calls = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        model.predict(full)
        calls += 1
    ceiling = calls * config.max_batch_size / (time.perf_counter() - t0)

    batch_rows: list[int] = []
    batcher = DynamicBatcher(model.predict, config, name=model.name, on_batch=lambda r, _s: batch_rows.append(r))
    await batcher.start()
    done = 0
    stop_at = 0.0
    measuring = False

    async def client(i: int) -> None:
        nonlocal done
        x = row(i)
        while True:
            await batcher.submit(x)
            if measuring:
                done += 1
            if time.perf_counter() >= stop_at:
                return

    try:
        stop_at = time.perf_counter() + seconds * 0.25 + seconds
        warm = asyncio.gather(*(client(i) for i in range(clients)))
        await asyncio.sleep(seconds * 0.25)
        measuring = True
        batch_rows.clear()
        t0 = time.perf_counter()
        await warm
        elapsed = time.perf_counter() - t0
    finally:
        await batcher.stop()
    return Throughput(ceiling, done / elapsed, statistics.fmean(batch_rows) if batch_rows else 0.0)


# -- report ----------------------------------------------------------------------------------------


async def measure(models: list[Model], config: BatchingConfig, args: argparse.Namespace, loop_name: str) -> None:
    print(f"\nevent loop: {loop_name}; {config}")
    print("\nconcurrency 1, one row per request: submit -> result (us)")
    header = f"{'model':<10}{'path':<24}{'p50':>9}{'mean':>9}{'p99':>9}"
    print(header)
    print("-" * len(header))
    for model in models:
        result = await latency(model, config, args.requests)
        for label, samples in (
            ("direct predict()", result.direct),
            ("asyncio.to_thread", result.to_thread),
            ("DynamicBatcher.submit", result.batcher),
        ):
            us = [s * 1e6 for s in samples]
            p50, mean, p99 = percentile(us, 50), statistics.fmean(us), percentile(us, 99)
            print(f"{model.name:<10}{label:<24}{p50:>9.1f}{mean:>9.1f}{p99:>9.1f}")
        overhead = (percentile(result.batcher, 50) - percentile(result.direct, 50)) * 1e6
        ok = "ok" if overhead <= TARGET_OVERHEAD_US else "MISSED"
        print(f"{model.name:<10}{'overhead (p50)':<24}{overhead:>9.1f}   target <= {TARGET_OVERHEAD_US:.0f} us: {ok}")
    print(f"\nconcurrency {args.clients}, one row per request, {args.seconds:g} s each")
    header = (
        f"{'model':<10}{'ceiling rows/s':>16}{'batcher req/s':>16}{'of ceiling':>12}{'mean batch':>12}"
        f"{'us/request':>13}"
    )
    print(header)
    print("-" * len(header))
    for model in models:
        t = await throughput(model, config, args.clients, args.seconds)
        share = t.batcher_req_s / t.ceiling_rows_s
        ok = "ok" if share >= TARGET_THROUGHPUT else "below 70 %"
        if model.name == "identity":
            ok = "(batcher-bound: the model is free)"
        print(
            f"{model.name:<10}{t.ceiling_rows_s:>16,.0f}{t.batcher_req_s:>16,.0f}{share:>11.0%} "
            f"{t.mean_batch_rows:>11.1f}{1e6 / t.batcher_req_s:>13.2f}  {ok}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="sequential requests at concurrency 1")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0, help="measuring time per throughput run")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--loop", choices=["uvloop", "asyncio", "both"], default="both")
    args = ap.parse_args()

    config = BatchingConfig(max_batch_size=args.max_batch_size)
    models = [identity_model(), matmul_model(args.max_batch_size)]
    print(f"machine: {machine()}; load average {load_average()}")
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset: one per core)')}")
    for model in models:
        print(f"  {model.name}: {model.note}")
    loops = ["uvloop", "asyncio"] if args.loop == "both" else [args.loop]
    for loop_name in loops:
        if loop_name == "uvloop":
            import uvloop

            uvloop.run(measure(models, config, args, loop_name))
        else:
            asyncio.run(measure(models, config, args, loop_name))


if __name__ == "__main__":
    main()
