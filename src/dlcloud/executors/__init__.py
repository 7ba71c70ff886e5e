"""Executors materialise Workloads; they decide nothing.

Queue, quotas, placement (which GPUs), restart policy and timeouts are decided above (scheduler/,
services/jobs.py). An executor only starts a Workload, reports what happened to it and stops it.
Executors never import api/ or services/.

Look implementations up with ``get_executor_class(name)``; the error lists the valid names.
"""

from __future__ import annotations

from dlcloud.errors import InvalidArgument
from dlcloud.executors.base import AttemptReport, Executor, Workload

__all__ = ["AttemptReport", "Executor", "Workload", "get_executor_class"]


def get_executor_class(name: str) -> type[Executor]:
    if name == "local":
        from dlcloud.executors.local.executor import LocalExecutor

        return LocalExecutor
    if name == "simulated":
        from dlcloud.executors.simulated import SimulatedExecutor

        return SimulatedExecutor
    raise InvalidArgument(f"unknown executor {name!r}; valid executors: local, simulated")
