"""The executors by name (``Settings.executor``): ``get_executor_class(name)``; the error lists the valid names.

Apart from the package's ``__init__`` so that importing one executor module (the launch helpers, a test of
``base``) loads no implementation; whoever picks an executor by name imports this.
"""

from __future__ import annotations

from dlcloud.errors import InvalidArgument
from dlcloud.executors.base import Executor
from dlcloud.executors.local.executor import LocalExecutor
from dlcloud.executors.simulated import SimulatedExecutor

EXECUTORS: dict[str, type[Executor]] = {"local": LocalExecutor, "simulated": SimulatedExecutor}


def get_executor_class(name: str) -> type[Executor]:
    try:
        return EXECUTORS[name]
    except KeyError:
        raise InvalidArgument(f"unknown executor {name!r}; valid executors: {', '.join(EXECUTORS)}") from None
