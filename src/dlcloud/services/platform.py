"""The handles every service needs, built once at the entry point (``dlcloud up`` / tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dlcloud.executors.base import Executor
from dlcloud.executors.environments import EnvironmentBackend, NoEnvironments
from dlcloud.scheduler.inventory import Inventory
from dlcloud.services.secrets import SecretBox
from dlcloud.settings import Settings
from dlcloud.storage.objects import ObjectStore
from dlcloud.storage.stores import open_object_store
from dlcloud.store.db import Database


def _no_wake() -> None:
    return None


@dataclass(frozen=True)
class Platform:
    settings: Settings
    db: Database
    box: SecretBox
    inventory: Inventory
    wake: Callable[[], None] = field(default=_no_wake)  # nudges the control loop after a change
    # nudges the worker computing dataset versions registered in place (control/dataset_sources.py)
    wake_sources: Callable[[], None] = field(default=_no_wake)
    # whether user code runs sandboxed (the executor's isolation, told at start); when it does not, only the
    # bootstrap tenant may run code unless settings.allow_unsandboxed_tenants (``require_isolation``)
    isolated: bool = True
    isolation: str = ""  # the executor's own words for it, for the start-up banner and docs
    # where code uploads and model artifacts are kept; None: the store settings.storage_url names
    objects: ObjectStore = field(default=None)  # type: ignore[assignment]
    # builds runtime environments and says where workloads find them: the executor's (Executor.environments)
    environments: EnvironmentBackend = field(default_factory=NoEnvironments)
    # runs workloads, and is asked for their logs and to forget deleted jobs; None: this process runs none
    # (then no job has attempts to read). Bound here to the settings, store and environments above.
    executor: Executor | None = None

    def __post_init__(self) -> None:
        if self.objects is None:
            object.__setattr__(self, "objects", open_object_store(self.settings))
        if self.executor is not None:
            self.executor.bind(self.settings, self.objects, self.environments)
