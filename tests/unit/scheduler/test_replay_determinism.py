"""Replay determinism at scale: 5,000 Philly jobs per policy, replayed twice through the scheduling pass's pure core
(``scheduler/pass_core.py``, which the control plane's pass drives too), decide the same.

Each policy replays the whole 5,000-job slice on a cluster where it has to decide (queues build, and las and
fair-share preempt: hundreds of preemptions, turns, defragmentation) yet one replay stays within seconds on a 2-core
machine: a pass costs in proportion to the attempts running (las, fair-share) or the queue (priority-backfill).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlcloud.scheduler import pass_core
from dlcloud.scheduler.planner import Plan, Policy
from dlcloud.scheduler.simulator import SimConfig, Simulator
from dlcloud.scheduler.trace import load_trace

DECIDE = pass_core.decide
PHILLY_5000 = Path(__file__).parents[2] / "data" / "philly_2017-10-02_first5000.csv"


def _replay(
    policy: Policy, gpus: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict, list[tuple[str, str, float, int]]]:
    """The report (less its timing) and every job's outcome: state, finish time, preemptions. Every pass goes through
    the core the control plane's pass calls (``pass_core.decide``)."""
    decided: list[Plan] = []

    def counted(*args: object, **kw: object) -> Plan:
        decided.append(DECIDE(*args, **kw))  # type: ignore[arg-type]
        return decided[-1]

    monkeypatch.setattr(pass_core, "decide", counted)
    sim = Simulator(load_trace(PHILLY_5000), SimConfig(gpus=gpus, gpus_per_node=8, policy=policy, seed=3))
    report = sim.run()
    report.pop("timing")
    assert len(decided) == report["passes"] > 0
    outcomes = sorted((j.trace.job_id, j.state, j.finished_s, j.preemptions) for j in sim.jobs.values())
    return report, outcomes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "gpus", "preempts"),
    # measured on 2 cores, one replay: fifo 3 s, priority-backfill 7 s, las 14 s (1,816 preemptions), fair-share 27 s
    # (730 preemptions)
    [
        (Policy.FIFO, 256, False),
        (Policy.PRIORITY_BACKFILL, 512, False),
        (Policy.LAS, 128, True),
        (Policy.FAIR_SHARE, 512, True),
    ],
)
def test_5000_philly_jobs_replay_identically(
    policy: Policy, gpus: int, preempts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, first_jobs = _replay(policy, gpus, monkeypatch)
    second, second_jobs = _replay(policy, gpus, monkeypatch)
    assert first == second
    assert first_jobs == second_jobs
    assert first["jobs"]["total"] == first["jobs"]["finished"] == 5000
    assert first["gpu_allocation"]["contended_time_s"] > 0  # queues built: the policy had something to decide
    assert (first["preemptions"] > 100) == preempts
