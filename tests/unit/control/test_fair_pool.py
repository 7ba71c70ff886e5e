"""The fair pool that reads event files (``control/fair_pool.py``): tenants take turns, a tenant runs one task at a
time, so a tenant that floods it holds one worker and waits, after each of its turns, for the others'. Real threads,
ordered by events: nothing here depends on how fast the machine is."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from dlcloud.control.fair_pool import FairPool

WAIT = 30.0  # bounds every wait, so a broken pool fails the test instead of hanging it


@pytest.fixture
def pools() -> Iterator[Callable[..., FairPool]]:
    made: list[FairPool] = []

    def make(workers: int, **kwargs) -> FairPool:
        pool = FairPool("test-pool", workers, **kwargs)
        pool.start()
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.shutdown(timeout=WAIT)


class Recorder:
    """Tasks that note their turn in ``order``; a task of ``hold`` waits for ``go`` first."""

    def __init__(self, n: int) -> None:
        self.order: list[str] = []
        self.go = threading.Event()
        self.started = threading.Event()
        self.all_done = threading.Event()
        self.left = n
        self._lock = threading.Lock()

    def task(self, name: str, hold: bool = False) -> Callable[[], None]:
        def run() -> None:
            with self._lock:
                self.order.append(name)
            if hold:
                self.started.set()
                assert self.go.wait(WAIT)
            with self._lock:
                self.left -= 1
                if self.left == 0:
                    self.all_done.set()

        return run


def test_a_flooding_tenant_waits_for_the_other_tenants_turn_after_each_of_its_own(pools) -> None:
    pool = pools(1)
    r = Recorder(11)
    pool.submit("flood", "f0", r.task("f0", hold=True))
    assert r.started.wait(WAIT)  # the flood's first pass has the only worker
    for i in range(1, 10):
        pool.submit("flood", f"f{i}", r.task(f"f{i}"))
    pool.submit("other", "o0", r.task("o0"))
    assert pool.load() == (1, 10)
    r.go.set()
    assert r.all_done.wait(WAIT)
    # the other tenant's attempt is read in the turn right after the flood's pass that was running, not after ten
    assert r.order == ["f0", "o0", *(f"f{i}" for i in range(1, 10))]


def test_with_two_workers_a_flooding_tenant_holds_one_and_the_other_tenant_is_read_meanwhile(pools) -> None:
    pool = pools(2)
    r = Recorder(11)
    other_done = threading.Event()
    pool.submit("flood", "f0", r.task("f0", hold=True))
    assert r.started.wait(WAIT)
    for i in range(1, 10):
        pool.submit("flood", f"f{i}", r.task(f"f{i}"))
    assert pool.load() == (1, 9)  # the second worker does not take the flood's next pass: one at a time per tenant
    pool.submit("other", "o0", lambda: (r.task("o0")(), other_done.set()))
    assert other_done.wait(WAIT)  # while the flood's pass still runs
    assert r.order == ["f0", "o0"] and not r.go.is_set()
    r.go.set()
    assert r.all_done.wait(WAIT)
    assert r.order == ["f0", "o0", *(f"f{i}" for i in range(1, 10))]


def test_tenants_take_turns_round_robin_and_a_tenants_attempts_in_the_order_they_came(pools) -> None:
    pool = pools(1)
    r = Recorder(8)
    pool.submit("hold", "h", r.task("h", hold=True))
    assert r.started.wait(WAIT)
    for name in ("a1", "a2", "a3"):
        pool.submit("a", name, r.task(name))
    for name in ("b1", "b2"):
        pool.submit("b", name, r.task(name))
    pool.submit("c", "c1", r.task("c1"))
    pool.submit("b", "b0", r.task("b0"), first=True)  # an ended attempt's last reading: first of its tenant's only
    r.go.set()
    assert r.all_done.wait(WAIT)
    assert r.order == ["h", "a1", "b0", "c1", "a2", "b1", "a3", "b2"]


def test_a_key_waits_or_runs_once_a_failing_task_leaves_its_worker_and_done_says_when_it_may_come_back(pools) -> None:
    done: list[str] = []
    back = threading.Event()

    def after(key) -> None:
        done.append(key)
        if key == "ok":
            back.set()

    pool = pools(1, done=after)
    r = Recorder(1)
    assert pool.submit("t", "held", r.task("held", hold=True))
    assert r.started.wait(WAIT)
    assert not pool.submit("t", "held", r.task("again")) and pool.busy("held")  # running: not twice
    assert pool.submit("t", "boom", lambda: 1 / 0)
    assert not pool.submit("t", "boom", lambda: None)  # waiting: not twice
    assert pool.submit("t", "ok", lambda: None)
    r.go.set()
    assert back.wait(WAIT)
    assert done == ["held", "boom", "ok"]  # the failing task was logged, its worker went on
    assert not pool.busy("boom") and pool.submit("t", "boom", lambda: None)
