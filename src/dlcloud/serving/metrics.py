"""Prometheus metrics of the model server, per model and version, in a registry owned by the app."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _QueueCollector(Collector):
    """Queue depth and in-flight requests, read from the live batchers at scrape time."""

    def __init__(self, source: Callable[[], Iterator[tuple[str, str, int, int]]]) -> None:
        self._source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "dlcloud_serving_queue_depth", "Requests waiting in the batch queue", labels=["model", "version"]
        )
        inflight = GaugeMetricFamily(
            "dlcloud_serving_inflight_requests", "Requests accepted and not answered", labels=["model", "version"]
        )
        for model, version, queued, running in self._source():
            depth.add_metric([model, version], queued)
            inflight.add_metric([model, version], running)
        yield depth
        yield inflight


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "dlcloud_serving_requests",
            "Inference requests by model, version, protocol and status code",
            ["model", "version", "protocol", "code"],
            registry=self.registry,
        )
        self.errors = Counter(
            "dlcloud_serving_request_errors",
            "Inference requests answered with an error",
            ["model", "version", "protocol", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "dlcloud_serving_request_duration_seconds",
            "Time from receiving an inference request to answering it",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "dlcloud_serving_batch_size",
            "Rows per executed batch",
            ["model", "version"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_latency = Histogram(
            "dlcloud_serving_batch_duration_seconds",
            "Time the model took per batch",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.model_events = Counter(
            "dlcloud_serving_model_events",
            "Model lifecycle events: load, load_failed, swap, unload",
            ["model", "version", "event"],
            registry=self.registry,
        )

    def watch_queues(self, source: Callable[[], Iterator[tuple[str, str, int, int]]]) -> None:
        self.registry.register(_QueueCollector(source))

    def batch_observer(self, model: str, version: str) -> Callable[[int, float], None]:
        size = self.batch_size.labels(model, version)
        took = self.batch_latency.labels(model, version)

        def observe(rows: int, seconds: float) -> None:
            size.observe(rows)
            took.observe(seconds)

        return observe
