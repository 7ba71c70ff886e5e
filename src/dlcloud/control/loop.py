"""The control loop: schedules queued jobs and supervises running attempts.

It runs in the leader control-plane process only (``leader.py``). Each tick:
1. supervise (``supervision.py``): poll every live attempt through the executor and apply what happened
   (RUNNING, exit, timeout, cancellation, restart policy) through ``job_states``;
2. schedule (``scheduling.py``): plan placements inside one write transaction, record the new attempts
   (STARTING) with their Workloads (``workloads.py``), commit, then start the workloads;
3. drive the studies (``study_driver.py``): record the trials that ended, prune, submit new trial jobs
   (scheduled by the next pass);
4. dispatch environment builds.

Beside it, for the same term of leadership, a thread of its own and a small pool of workers read the TensorBoard
event files of attempts into their metrics, tenants taking turns (``tensorboard.py``); supervision records an end
without waiting for it, then tells it to read the attempt's files a last time; a study's trial and a model
registered from a job wait until that reading is done (``settled``). Ended attempts' outputs and logs are saved on
a pool of the supervisor's (``savers``, tenants taking turns), started and stopped with the term too.

Recording the attempt before starting it means a crash in between leaves an attempt that never
launched; the supervisor sees it as lost-before-launch and starts it then, so nothing is lost and
nothing runs twice. Attempts hold their resources until ``finished_at`` is set.

Fencing: with a ``Leadership`` every pass starts with ``verify`` and every write transaction with ``fence``
(``write``, of the loop-service base ``loop_service.py``); ``LeadershipLost`` from either ends ``run``, so a
deposed leader writes nothing more.
"""

from __future__ import annotations

import logging

from dlcloud.control.env_builder import EnvironmentBuilder
from dlcloud.control.leader import Leadership
from dlcloud.control.loop_service import LoopService
from dlcloud.control.scheduling import SchedulingPass
from dlcloud.control.study_driver import StudyDriver
from dlcloud.control.supervision import Supervisor
from dlcloud.control.tensorboard import TensorBoardIngester
from dlcloud.executors.base import Executor, Workload
from dlcloud.services.platform import Platform

log = logging.getLogger(__name__)


class ControlLoop(LoopService):
    name = "control loop"

    def __init__(self, platform: Platform, executor: Executor, leadership: Leadership | None = None):
        super().__init__(platform, leadership)
        self.executor = executor
        if executor is not platform.executor:  # another instance (a restarted control plane in tests)
            executor.bind(platform.settings, platform.objects, platform.environments)
        # builds environments while this loop runs
        self.builds = EnvironmentBuilder(platform, leadership)
        self.scheduling = SchedulingPass(platform, executor, self.write)
        self.ingester = TensorBoardIngester(platform, executor, leadership)
        self.supervisor = Supervisor(
            platform,
            executor,
            self.write,
            self._start,
            self.wake,
            ended=self.ingester.ended,
            settled=self.ingester.settled,
        )
        self.studies = StudyDriver(platform, self.write, settled=self.ingester.settled)

    # -- driving (``run``, ``wake``: the loop-service base) ----------------------------------------
    def interval(self) -> float:
        return self.p.settings.supervisor_interval_seconds

    def starting(self) -> None:
        if self.builds.closed:  # shut down at the end of a former term of leadership
            self.builds = EnvironmentBuilder(self.p, self.leadership)
        self.studies.reset()
        self.ingester.start()
        self.supervisor.savers.start()

    def stopping(self) -> None:
        self.supervisor.savers.shutdown()  # saves not begun are the next leader's (the attempts end with them)
        self.ingester.shutdown()  # the next leader reads the event files again, from their start
        self.builds.shutdown()  # running builds stop; the next leader builds them again

    def tick(self) -> None:
        if self.leadership is not None:
            self.leadership.verify()
        self.executor.reap()
        self.supervise()
        self.schedule()
        self.studies.run()
        self.builds.dispatch()

    def supervise(self) -> None:
        """Poll every attempt that has not ended and apply what happened (``supervision``)."""
        self.supervisor.run()

    def schedule(self) -> int:
        """One scheduling pass, then start what it placed; returns the number of attempts started."""
        placed = self.scheduling.run()
        for handle, w in placed:
            self._start(handle, w)
        return len(placed)

    def _start(self, handle: str, w: Workload) -> None:
        try:
            self.executor.start(handle, w)
        except Exception:  # recorded, not launched: supervision sees it lost before launch and tries again
            log.exception("could not start job %s attempt %d", w.job_id, w.attempt)
