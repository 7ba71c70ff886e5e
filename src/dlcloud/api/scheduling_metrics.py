"""Scheduling metrics on ``/metrics``, read from the database at scrape time (any control-plane replica answers
the same): queue length and the longest wait per tenant, preemptions so far, GPUs allocated and in total.

Per tenant (a ``tenant`` label) only when ``/metrics`` takes a scrape token (``metrics_scrape_token``); an open
``/metrics`` gives the same series as platform totals, without the label: tenant names, queues and GPUs are not
for whoever reaches the API, jobs included (docs/isolation.md)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from dlcloud.services.jobs import QUEUE_STATES
from dlcloud.services.platform import Platform
from dlcloud.store.rows import AttemptRow, JobRow, TenantRow, utcnow


class SchedulingCollector(Collector):
    def __init__(self, platform: Platform, *, per_tenant: bool) -> None:
        self.p = platform
        self.per_tenant = per_tenant

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = utcnow()
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
        with self.p.db.read() as s:
            names = dict(s.execute(select(TenantRow.id, TenantRow.name)).all())
            waits: dict[str, list[float]] = {}
            for tid, created in s.execute(
                select(JobRow.tenant_id, JobRow.created_at).where(JobRow.state.in_(QUEUE_STATES))
            ):
                waits.setdefault(tid, []).append(max(0.0, (now - created).total_seconds()))
            gpus: dict[str, int] = {}
            for tid, held in s.execute(
                select(AttemptRow.tenant_id, AttemptRow.gpus).where(AttemptRow.finished_at.is_(None))
            ):
                gpus[tid] = gpus.get(tid, 0) + len(held or [])
            preemptions = {
                tid: float(n or 0)
                for tid, n in s.execute(
                    select(JobRow.tenant_id, func.sum(JobRow.preemptions)).group_by(JobRow.tenant_id)
                )
            }
        if self.per_tenant:
            for tid, ws in waits.items():
                tenant = [names.get(tid, tid)]
                queued.add_metric(tenant, len(ws))
                waited.add_metric(tenant, max(ws))
                avg.add_metric(tenant, sum(ws) / len(ws))
            for tid, n in gpus.items():
                allocated.add_metric([names.get(tid, tid)], n)
            for tid, x in preemptions.items():
                preempted.add_metric([names.get(tid, tid)], x)
        else:
            every = [w for ws in waits.values() for w in ws]
            queued.add_metric([], len(every))
            waited.add_metric([], max(every, default=0.0))
            avg.add_metric([], sum(every) / len(every) if every else 0.0)
            allocated.add_metric([], sum(gpus.values()))
            preempted.add_metric([], sum(preemptions.values()))
        total.add_metric([], len(self.p.inventory.gpus))
        yield from (queued, waited, avg, allocated, total, preempted)
