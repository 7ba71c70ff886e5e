"""Scheduling metrics on ``/metrics``, read from the database at scrape time (any control-plane replica answers
the same): queue length and the longest wait per tenant, preemptions so far, GPUs allocated and in total.

Per tenant (a ``tenant`` label) only when ``/metrics`` takes a scrape token (``metrics_scrape_token``); an open
``/metrics`` gives the same series as platform totals, without the label: tenant names, queues and GPUs are not
for whoever reaches the API, jobs included (docs/isolation.md)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dlcloud.services import jobs
from dlcloud.services.platform import Platform


class SchedulingCollector(Collector):
    def __init__(self, platform: Platform, *, per_tenant: bool) -> None:
        self.p = platform
        self.per_tenant = per_tenant

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["tenant"] if self.per_tenant else []
        queued = GaugeMetricFamily("dlcloud_queue_length", "Jobs waiting in the queue", labels=labels)
        waited = GaugeMetricFamily(
            "dlcloud_queue_wait_seconds_max", "Longest wait of a queued job since it was submitted", labels=labels
        )
        avg = GaugeMetricFamily(
            "dlcloud_queue_wait_seconds_avg", "Average wait of the queued jobs since submission", labels=labels
        )
        allocated = GaugeMetricFamily("dlcloud_gpus_allocated", "GPUs held by live attempts", labels=labels)
        total = GaugeMetricFamily("dlcloud_gpus_total", "GPUs this control plane schedules")
        preempted = CounterMetricFamily(
            "dlcloud_preemptions", "Attempts stopped for another job (of the jobs not deleted)", labels=labels
        )
        figures = jobs.scheduling_figures(self.p)
        if self.per_tenant:
            for tenant, f in figures.items():
                if f.queued:
                    queued.add_metric([tenant], f.queued)
                    waited.add_metric([tenant], f.wait_max_s)
                    avg.add_metric([tenant], f.wait_sum_s / f.queued)
                if f.gpus:
                    allocated.add_metric([tenant], f.gpus)
                preempted.add_metric([tenant], f.preemptions)
        else:
            every = sum(f.queued for f in figures.values())
            queued.add_metric([], every)
            waited.add_metric([], max((f.wait_max_s for f in figures.values()), default=0.0))
            avg.add_metric([], sum(f.wait_sum_s for f in figures.values()) / every if every else 0.0)
            allocated.add_metric([], sum(f.gpus for f in figures.values()))
            preempted.add_metric([], sum(f.preemptions for f in figures.values()))
        total.add_metric([], len(self.p.inventory.gpus))
        yield from (queued, waited, avg, allocated, total, preempted)
