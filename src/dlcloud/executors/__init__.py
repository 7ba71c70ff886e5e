"""Executors materialise Workloads; they decide nothing.

Queue, quotas, placement (which GPUs), restart policy and timeouts are decided above (scheduler/,
services/jobs.py). An executor only starts a Workload, reports what happened to it and stops it.
Executors never import api/ or services/.

Look implementations up with ``registry.get_executor_class(name)``; the error lists the valid names.
"""

from __future__ import annotations

from dlcloud.executors.base import AttemptReport, Executor, Workload

__all__ = ["AttemptReport", "Executor", "Workload"]
