"""The loop-service base: what every background loop of the control plane shares (run, tick, fenced write, stop).

The loops on it: the control loop (``loop.py``) and the TensorBoard ingester (``tensorboard.py``), for a term of
leadership; the dataset-source worker (``dataset_sources.py``), in every server process.

A loop runs ``tick``, then waits ``interval`` seconds (asked after every tick), or less when ``wake`` is called,
until ``stop`` is set or this process stops leading (``LeadershipLost`` from a tick ends ``run``); a tick that
fails otherwise is logged and the loop goes on (the database may be briefly down). ``starting`` and ``stopping``
bracket a term: what the loop starts for the term it stops in ``stopping``, which runs however ``run`` ends.

Every write of a loop goes through ``write``: with a ``Leadership`` it is fenced (``leader.py``), so once another
process leads it is refused with ``LeadershipLost`` and its transaction rolls back; without one (a loop of every
process, and tests that drive a loop without an election) it is a plain ``db.write()``.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
from collections.abc import Iterator

from sqlalchemy.orm import Session

from dlcloud.control.leader import Leadership, LeadershipLost
from dlcloud.services.platform import Platform
from dlcloud.store.db import Database


@contextlib.contextmanager
def fenced_write(db: Database, leadership: Leadership | None) -> Iterator[Session]:
    """A write transaction of a loop: fenced by ``leadership`` when there is one, else ``db.write()``."""
    if leadership is None:
        with db.write() as s:
            yield s
    else:
        with leadership.write() as s:
            yield s


class LoopService(abc.ABC):
    """A background loop of the control plane; subclasses give ``tick`` and ``interval``."""

    name = "loop"  # in the log line of a failing tick

    def __init__(self, platform: Platform, leadership: Leadership | None = None) -> None:
        self.p = platform
        self.leadership = leadership  # None: unfenced (a loop of every process; tests without an election)
        self._wake = threading.Event()
        self._log = logging.getLogger(type(self).__module__)

    @abc.abstractmethod
    def interval(self) -> float:
        """Seconds to wait after a tick when nothing wakes the loop (asked after every tick: a loop whose next
        work is due sooner waits less)."""

    @abc.abstractmethod
    def tick(self) -> None:
        """One round of the loop's work; its writes go through ``write``."""

    def starting(self) -> None:  # noqa: B027 (an optional hook: doing nothing is its default)
        """At the start of ``run``, before the first tick."""

    def stopping(self) -> None:  # noqa: B027 (an optional hook: doing nothing is its default)
        """At the end of ``run``, however it ends."""

    def wake(self) -> None:
        """Run the next tick now rather than after the interval."""
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set or this process stops leading."""
        self.starting()
        try:
            while not stop.is_set():
                try:
                    self.tick()
                except LeadershipLost as exc:
                    self._log.warning("stopped leading the scheduler: %s", exc)
                    return
                except Exception:  # the loop must survive a failing tick (e.g. database briefly down)
                    self._log.exception("%s tick failed", self.name)
                self._wake.wait(self.interval())
                self._wake.clear()
        finally:
            self.stopping()

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction of the loop: fenced, so it is refused (``LeadershipLost``) once another process
        leads."""
        with fenced_write(self.p.db, self.leadership) as s:
            yield s
