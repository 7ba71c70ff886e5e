"""A few worker threads that take turns across tenants: the control plane's background work that one tenant's jobs
cause (reading their TensorBoard event files, ``tensorboard.py``; saving an ended attempt's outputs and logs,
``supervision.py``), shared so that no tenant's work holds another's.

Vocabulary: a *task* is one bounded piece of work (one pass over an attempt's event files), submitted under its
tenant and a *key* (the attempt); a *turn* is a worker running one task.

Invariants:
- At most one task of a tenant runs at a time: a tenant with many or slow tasks holds one worker, never more, and
  the other workers serve the other tenants (so the pool has at least two).
- Turns go round the tenants: a free worker takes the first waiting task of the tenant whose last turn is the
  oldest (a tenant that never had one first), among the tenants with a task waiting and none running; a tenant
  that floods waits, after each of its turns, for every other waiting tenant's. A tenant's own tasks run in the
  order they came
  (a key submitted again after its turn goes to the back: round robin over a tenant's attempts), except those
  submitted ``first`` (an ended attempt's last reading), which go to the front of their tenant's queue only.
- A key is waiting or running at most once: ``submit`` of such a key does nothing and says False.
- A task that raises is logged; its worker goes on. ``done`` is called with the key after each turn, once the key
  may be submitted again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)
Task = Callable[[], None]
MIN_WORKERS, MAX_WORKERS = 2, 4  # a tenant that floods holds one worker: another is always there for the others


def pool_size() -> int:
    """Workers for this host: one per core, at least ``MIN_WORKERS``, at most ``MAX_WORKERS``."""
    return max(MIN_WORKERS, min(os.cpu_count() or 1, MAX_WORKERS))


class FairPool:
    """Worker threads that run tasks one tenant at a time each, the tenants taking turns (see the module)."""

    def __init__(self, name: str, workers: int, done: Callable[[Hashable], None] = lambda key: None) -> None:
        self.name = name
        self.size = max(1, workers)
        self.done = done
        self._cond = threading.Condition()
        self._waiting: dict[str, deque[tuple[Hashable, Task]]] = {}  # by tenant, in the order they came
        self._turns = 0
        self._last: dict[str, int] = {}  # tenant -> the number of its last turn
        self._running: dict[str, Hashable] = {}  # tenant -> the key of its task running
        self._keys: set[Hashable] = set()  # waiting or running
        self._threads: list[threading.Thread] = []
        self._stopped = True  # until ``start``

    @property
    def running(self) -> bool:
        with self._cond:
            return not self._stopped and any(t.is_alive() for t in self._threads)

    def start(self) -> None:
        with self._cond:
            self._stopped = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True) for i in range(self.size)
        ]
        for t in self._threads:
            t.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Drop what waits and stop the workers, after the turns they are in."""
        with self._cond:
            self._stopped = True
            self._waiting.clear()
            self._keys.difference_update(k for k in list(self._keys) if k not in self._running.values())
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=timeout)
        self._threads = []

    def submit(self, tenant: str, key: Hashable, task: Task, *, first: bool = False) -> bool:
        """Queue ``task`` for a turn of ``tenant``; False (and nothing queued) when ``key`` waits or runs already."""
        with self._cond:
            if self._stopped or key in self._keys:
                return False
            self._keys.add(key)
            queue = self._waiting.setdefault(tenant, deque())
            if first:
                queue.appendleft((key, task))
            else:
                queue.append((key, task))
            self._cond.notify()
            return True

    def busy(self, key: Hashable) -> bool:
        """Whether ``key`` waits for a turn or has one."""
        with self._cond:
            return key in self._keys

    def load(self) -> tuple[int, int]:
        """(tasks running, tasks waiting): for tests and logs."""
        with self._cond:
            return len(self._running), sum(len(q) for q in self._waiting.values())

    def _take(self) -> tuple[str, Hashable, Task] | None:
        """The next turn (the lock held): see the module's invariants."""
        chosen, oldest = None, self._turns + 1
        for tenant in self._waiting:  # in the order they came: the first of equals wins
            last = self._last.get(tenant, -1)
            if last < oldest and tenant not in self._running:
                chosen, oldest = tenant, last
        if chosen is None:
            return None
        queue = self._waiting[chosen]
        key, task = queue.popleft()
        if not queue:
            del self._waiting[chosen]
        self._turns += 1
        self._last[chosen] = self._turns
        self._running[chosen] = key
        return chosen, key, task

    def _work(self) -> None:
        while True:
            with self._cond:
                turn = None
                while not self._stopped and (turn := self._take()) is None:
                    self._cond.wait()
                if turn is None:
                    return
            tenant, key, task = turn
            try:
                task()
            except Exception:  # one task's trouble must not end the worker
                log.exception("%s: a task of tenant %s failed", self.name, tenant)
            finally:
                with self._cond:
                    del self._running[tenant]
                    self._keys.discard(key)
                    self._cond.notify_all()  # that tenant's next task may go now
            try:
                self.done(key)
            except Exception:
                log.exception("%s: after a task of tenant %s", self.name, tenant)
