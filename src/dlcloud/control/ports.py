"""The managed port range of distributed jobs (settings ``job_port_range_start`` .. ``job_port_range_end``).

Invariants: a port is held by at most one live attempt (``job_ports.port`` is the primary key; its queries are
store/ports.py's); ports are allocated in the scheduling transaction that places the attempt (so two concurrent
passes cannot hand out the same port: passes are serialised) and released in the transaction that ends it. A
port the executor says is taken where its attempts run (``Executor.port_is_free``: on this host, something is
bound to it) is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.orm import Session

from dlcloud.store.ports import attempt_ports, held_ports, hold_ports, release_ports

__all__ = ["PortAllocator", "attempt_ports", "release_ports"]


class PortAllocator:
    """Hands out ports for the attempts placed in one scheduling pass (reads the held ports once)."""

    def __init__(self, s: Session, low: int, high: int, *, is_free: Callable[[int], bool]) -> None:
        self.s = s
        self.low, self.high = low, high
        self.is_free = is_free
        self._held: set[int] | None = None

    def allocate(self, job_id: str, attempt: int, count: int, now: datetime) -> list[int] | None:
        """``count`` ports for attempt ``attempt`` of ``job_id``, recorded in the session; None when the range
        has not that many free."""
        if count <= 0:
            return []
        if self._held is None:
            self._held = held_ports(self.s)
        found: list[int] = []
        for port in range(self.low, self.high + 1):
            if port in self._held:
                continue
            if self.is_free(port):
                found.append(port)
                if len(found) == count:
                    break
        if len(found) < count:
            return None
        self._held.update(found)
        hold_ports(self.s, job_id, attempt, found, now)
        return found
