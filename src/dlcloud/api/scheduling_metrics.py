"""Scheduling metrics on ``/metrics``, read from the database at scrape time (any control-plane replica answers
the same): queue length and the longest wait per tenant, preemptions so far, GPUs allocated and in total."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from dlcloud.services.jobs import QUEUE_STATES
from dlcloud.services.platform import Platform
from dlcloud.store.rows import AttemptRow, JobRow, TenantRow, utcnow


class SchedulingCollector(Collector):
    def __init__(self, platform: Platform) -> None:
        self.p = platform

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = utcnow()
        queued = GaugeMetricFamily("dlcloud_queue_length", "Jobs waiting in the queue", labels=["tenant"])
        waited = GaugeMetricFamily(
            "dlcloud_queue_wait_seconds_max", "Longest wait of a queued job since it was submitted", labels=["tenant"]
        )
        avg = GaugeMetricFamily(
            "dlcloud_queue_wait_seconds_avg", "Average wait of the queued jobs since submission", labels=["tenant"]
        )
        allocated = GaugeMetricFamily("dlcloud_gpus_allocated", "GPUs held by live attempts", labels=["tenant"])
        total = GaugeMetricFamily("dlcloud_gpus_total", "GPUs this control plane schedules")
        preempted = CounterMetricFamily(
            "dlcloud_preemptions", "Attempts stopped for another job (of the jobs not deleted)", labels=["tenant"]
        )
        with self.p.db.read() as s:
            names = dict(s.execute(select(TenantRow.id, TenantRow.name)).all())
            for tid, n, oldest in s.execute(
                select(JobRow.tenant_id, func.count(), func.min(JobRow.created_at))
                .where(JobRow.state.in_(QUEUE_STATES))
                .group_by(JobRow.tenant_id)
            ):
                tenant = names.get(tid, tid)
                queued.add_metric([tenant], n)
                waited.add_metric([tenant], max(0.0, (now - oldest).total_seconds()) if oldest else 0.0)
            waits: dict[str, list[float]] = {}
            for tid, created in s.execute(
                select(JobRow.tenant_id, JobRow.created_at).where(JobRow.state.in_(QUEUE_STATES))
            ):
                waits.setdefault(tid, []).append(max(0.0, (now - created).total_seconds()))
            for tid, ws in waits.items():
                avg.add_metric([names.get(tid, tid)], sum(ws) / len(ws))
            gpus: dict[str, int] = {}
            for tid, held in s.execute(
                select(AttemptRow.tenant_id, AttemptRow.gpus).where(AttemptRow.finished_at.is_(None))
            ):
                gpus[tid] = gpus.get(tid, 0) + len(held or [])
            for tid, n in gpus.items():
                allocated.add_metric([names.get(tid, tid)], n)
            for tid, n in s.execute(select(JobRow.tenant_id, func.sum(JobRow.preemptions)).group_by(JobRow.tenant_id)):
                preempted.add_metric([names.get(tid, tid)], float(n or 0))
        total.add_metric([], len(self.p.inventory.gpus))
        yield from (queued, waited, avg, allocated, total, preempted)
