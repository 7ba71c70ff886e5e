"""The loop-service base (``control/loop_service.py``): ``run`` ticks until stopped or deposed, survives a failing
tick, brackets the term with ``starting``/``stopping``, and ``write`` is fenced only when there is a leadership.
Real threads, ordered by events: nothing here depends on how fast the machine is."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from dlcloud.control.leader import LeadershipLost
from dlcloud.control.loop_service import LoopService, fenced_write

WAIT = 30.0  # bounds every wait, so a broken loop fails the test instead of hanging it


class _Loop(LoopService):
    name = "test loop"

    def __init__(self, ticks: list[Callable[[], None]], interval: float = WAIT) -> None:
        platform: Any = SimpleNamespace(db=None)  # run never touches the platform
        super().__init__(platform)
        self.ticks = list(ticks)
        self.seconds = interval
        self.events: list[str] = []
        self.ticked = threading.Event()

    def interval(self) -> float:
        return self.seconds

    def starting(self) -> None:
        self.events.append("starting")

    def stopping(self) -> None:
        self.events.append("stopping")

    def tick(self) -> None:
        self.events.append("tick")
        step = self.ticks.pop(0) if self.ticks else (lambda: None)
        try:
            step()
        finally:
            self.ticked.set()


def _lose() -> None:
    raise LeadershipLost("a newer leader took epoch 2 (ours was 1)")


def _fail() -> None:
    raise RuntimeError("database briefly down")


def test_a_lost_leadership_ends_run_and_stops_the_term(caplog: pytest.LogCaptureFixture) -> None:
    loop = _Loop([lambda: None, _lose], interval=0.0)
    with caplog.at_level(logging.WARNING, logger=__name__):
        loop.run(threading.Event())  # returns by itself: no stop is ever set
    assert loop.events == ["starting", "tick", "tick", "stopping"]
    assert "stopped leading the scheduler: a newer leader took epoch 2" in caplog.text


def test_a_failing_tick_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    loop = _Loop([_fail, _lose], interval=0.0)
    with caplog.at_level(logging.ERROR, logger=__name__):
        loop.run(threading.Event())
    assert loop.events == ["starting", "tick", "tick", "stopping"]
    assert "test loop tick failed" in caplog.text


def test_wake_runs_the_next_tick_at_once_and_stop_ends_the_loop() -> None:
    loop = _Loop([], interval=WAIT)  # without a wake the second tick would come only after WAIT seconds
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    assert loop.ticked.wait(WAIT)
    loop.ticked.clear()
    loop.wake()
    assert loop.ticked.wait(WAIT)
    stop.set()
    loop.wake()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert loop.events[0] == "starting" and loop.events[-1] == "stopping"
    assert loop.events.count("tick") >= 2


class _Writes:
    """A database or a leadership: ``write`` yields the session it names and counts the writes."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.writes = 0

    @contextlib.contextmanager
    def write(self) -> Iterator[str]:
        self.writes += 1
        yield self.session


def test_a_write_is_fenced_only_with_a_leadership() -> None:
    db: Any = _Writes("plain session")
    leadership: Any = _Writes("fenced session")
    with fenced_write(db, None) as s:
        assert s == "plain session"
    with fenced_write(db, leadership) as s:
        assert s == "fenced session"
    assert (db.writes, leadership.writes) == (1, 1)
