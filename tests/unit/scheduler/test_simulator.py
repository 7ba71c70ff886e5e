"""The trace simulator: known answers on hand-made traces, determinism on a slice of the Philly trace."""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from dlcloud.errors import InvalidArgument
from dlcloud.scheduler.attempts import AttemptEnd, attempt_end, last_checkpoint_s, requeue_after_preemption
from dlcloud.scheduler.contract import HOLD_MARGIN_S
from dlcloud.scheduler.inventory import Inventory
from dlcloud.scheduler.planner import Held, Limits, Plan, PlanConfig, Policy, Preemption, QueuedJob
from dlcloud.scheduler.simulator import EPOCH, SimConfig, Simulator, guarantees, simulate
from dlcloud.scheduler.trace import TraceJob, load_trace

PHILLY_SLICE = Path(__file__).parents[2] / "data" / "philly_2017-10-02_first2000.csv"


def tj(job_id: str, submit: float, duration: float, gpus: int = 1, tenant: str = "a") -> TraceJob:
    return TraceJob(job_id, submit, gpus, duration, tenant)


def cfg(gpus: int = 1, per_node: int = 1, **kw: object) -> SimConfig:
    kw.setdefault("tick_s", 1.0)
    return SimConfig(gpus=gpus, gpus_per_node=per_node, policy=kw.pop("policy", Policy.FIFO), **kw)  # type: ignore[arg-type]


def jcts(sim: Simulator) -> dict[str, float]:
    return {j.trace.job_id: j.finished_s - j.trace.submit_s for j in sim.jobs.values() if j.state == "done"}


def test_one_job_completes_in_its_duration() -> None:
    sim = Simulator([tj("1", 50.0, 3600.0)], cfg())
    r = sim.run()
    assert jcts(sim) == {"1": 3600.0}
    assert (r["avg_jct_s"], r["p50_jct_s"], r["p99_jct_s"], r["makespan_s"]) == (3600.0, 3600.0, 3600.0, 3600.0)
    assert r["gpu_allocation"]["mean"] == 1.0
    assert r["jobs"] == {"total": 1, "finished": 1, "unfinished": 0, "skipped_too_large": 0}


def test_two_jobs_on_one_gpu_run_one_after_the_other() -> None:
    sim = Simulator([tj("1", 0.0, 100.0), tj("2", 10.0, 50.0)], cfg())
    r = sim.run()
    assert jcts(sim) == {"1": 100.0, "2": 100.0 + 50.0 - 10.0}  # the second waits for the first: d1 + d2
    assert r["makespan_s"] == 150.0
    assert r["gpu_allocation"]["mean"] == 1.0
    # from t=10 to 100 one GPU-job waited with no GPU free, and the one GPU was busy
    assert r["gpu_allocation"]["contended_time_s"] == 90.0
    assert r["gpu_allocation"]["busy_when_contended"] == 1.0


def test_a_submit_and_an_end_pass_at_once() -> None:
    # as the control loop: a submit wakes it (the second job starts when it arrives, 10 s after the first pass) ...
    sim = Simulator([tj("1", 0.0, 5.0, tenant="a"), tj("2", 10.0, 5.0, tenant="b")], cfg(gpus=2, tick_s=60.0))
    sim.run()
    assert jcts(sim) == {"1": 5.0, "2": 5.0}
    # ... and it sees an attempt's end at its next poll (0.2 s): the second job, queued at 1 s behind the first on
    # the one GPU, starts when the first ends (5 s), not at the pass a tick after the submit's (61 s)
    sim = Simulator([tj("1", 0.0, 5.0, tenant="a"), tj("2", 1.0, 5.0, tenant="b")], cfg(gpus=1, tick_s=60.0))
    r = sim.run()
    assert jcts(sim) == {"1": 5.0, "2": 5.0 + 5.0 - 1.0}
    assert r["passes"] == 4  # the two submits and the two ends


def test_a_tenant_s_idle_guarantee_stays_unlent_for_lend_after_s_then_is_lent() -> None:
    # a and b are each guaranteed 1 of the 2 GPUs (equal GPU-time). a's first job ends at 100 s; b's second job,
    # submitted at 120 s, finds a's GPU idle
    trace = [
        tj("a1", 0.0, 100.0, tenant="a"),
        tj("b1", 0.0, 400.0, tenant="b"),
        tj("b2", 120.0, 500.0, tenant="b"),
        tj("a2", 300.0, 800.0, tenant="a"),
    ]
    sim = Simulator(trace, cfg(gpus=2, tick_s=60.0, policy=Policy.FAIR_SHARE, lend_after_s=600.0))
    assert sim.guarantee == {"a": 1, "b": 1}
    r = sim.run()
    # kept for a: b2 waits for b's own GPU (b1 ends at 400); a2 starts when submitted, nothing preempted
    assert jcts(sim) == {"a1": 100.0, "b1": 400.0, "b2": 400.0 - 120.0 + 500.0, "a2": 800.0}
    assert r["preemptions"] == 0
    # lent at once: b2 borrows a's GPU at 120 s; a2 reclaims it, starting when b2 stops after the 30-s grace period
    # (the stop passes at once, as the control loop's next poll: not a tick later)
    sim = Simulator(trace, cfg(gpus=2, tick_s=60.0, policy=Policy.FAIR_SHARE, lend_after_s=0.0))
    r = sim.run()
    assert jcts(sim)["a2"] == 30.0 + 800.0 and r["preemptions"] == 1
    # a comes back only much later: its GPU is lent once its first job ended lend_after_s ago (a pass looks then)
    later = [*trace[:3], tj("a2", 5000.0, 800.0, tenant="a")]
    sim = Simulator(later, cfg(gpus=2, tick_s=60.0, policy=Policy.FAIR_SHARE, lend_after_s=200.0))
    assert sim.guarantee == {"a": 1, "b": 1}
    sim.run()
    assert jcts(sim)["b2"] == (100.0 + 200.0) - 120.0 + 500.0


def test_only_the_gpus_of_jobs_that_ran_shorter_than_lend_after_s_are_kept() -> None:
    # 5 GPUs: a guaranteed 2, b and c 1 each, each running a long 1-GPU job. a's second job ends; 100 s later b
    # asks for 2 more GPUs (borrowing: beyond its guarantee), and 2 are idle. a's job ran 300 s: one is kept for a,
    # and b2 starts at the pass at a's end + 600 s. It ran 1,000 s (longer than the window): both are lent at once
    for a_ran, b2_starts in ((300.0, 300.0 + 600.0), (1000.0, 1100.0)):
        trace = [
            tj("a0", 0.0, 22_000.0 - a_ran, tenant="a"),
            tj("a1", 0.0, a_ran, tenant="a"),
            tj("b0", 0.0, 11_500.0, tenant="b"),
            tj("b2", a_ran + 100.0, 500.0, gpus=2, tenant="b"),
            tj("c0", 0.0, 12_000.0, tenant="c"),
            tj("d0", 30_000.0, 4000.0, tenant="d"),  # the rest of the GPU-time: no guarantee
        ]
        sim = Simulator(trace, cfg(gpus=5, per_node=5, tick_s=60.0, policy=Policy.FAIR_SHARE, lend_after_s=600.0))
        assert sim.guarantee == {"a": 2, "b": 1, "c": 1, "d": 0}
        r = sim.run()
        assert sim.jobs["b2"].finished_s - 500.0 == b2_starts, (a_ran, jcts(sim))
        assert r["preemptions"] == 0


def test_kept_gpus_are_lent_at_the_pass_asked_for_whatever_the_rounding() -> None:
    # (65136.544 + 600) - 600 < 65136.544 in floating point: the pass at end + lend_after_s must still lend a's GPU
    for end in (65136.5, 65136.544):
        trace = [
            tj("a0", 0.0, end, tenant="a"),  # a's guarantee: its GPU-time
            tj("a1", end - 100.0, 100.0, tenant="a"),  # a short job: its GPU is kept after it ends
            tj("b1", end + 10.0, 5.0, gpus=2, tenant="b"),
        ]
        sim = Simulator(trace, cfg(gpus=2, per_node=2, policy=Policy.FAIR_SHARE, lend_after_s=600.0))
        r = sim.run()
        a_end = max(sim.jobs["a0"].finished_s, sim.jobs["a1"].finished_s)
        assert r["jobs"]["unfinished"] == 0 and sim.jobs["b1"].finished_s == a_end + 600.0 + 5.0
        assert len(r["gpu_allocation"]["hourly"]) == math.ceil(r["makespan_s"] / 3600)  # no empty hour after the end


def test_a_gang_larger_than_a_node_runs_across_nodes_and_too_large_jobs_are_skipped() -> None:
    sim = Simulator([tj("gang", 0.0, 100.0, gpus=16), tj("huge", 0.0, 100.0, gpus=64)], cfg(gpus=32, per_node=8))
    r = sim.run()
    assert jcts(sim) == {"gang": 100.0}
    assert r["jobs"]["skipped_too_large"] == 1
    assert sim.jobs["gang"].qjob.groups[0].count == 2 and sim.jobs["gang"].qjob.groups[0].gpus == 8
    assert r["gpu_allocation"]["mean"] == 0.5


def test_remainder_replica_for_gangs_not_a_multiple_of_the_node() -> None:
    sim = Simulator([tj("g", 0.0, 1.0, gpus=12)], cfg(gpus=16, per_node=8))
    assert [(g.count, g.gpus) for g in sim.jobs["g"].qjob.groups] == [(1, 8), (1, 4)]


class Recording(ABC):
    """A planner with a known answer (``decide``) that records what each pass saw: (now, queue, held)."""

    def __init__(self) -> None:
        self.seen: list[tuple[datetime, list[QueuedJob], list[Held]]] = []

    def __call__(
        self,
        queue: Iterable[QueuedJob],
        held: Iterable[Held],
        limits: dict[str, Limits],
        inventory: Inventory,
        now: datetime,
        config: PlanConfig,
    ) -> Plan:
        queue, held = list(queue), list(held)
        self.seen.append((now, queue, held))
        return self.decide(queue, held, inventory)

    @abstractmethod
    def decide(self, queue: list[QueuedJob], held: list[Held], inventory: Inventory) -> Plan: ...


class Reclaimer(Recording):
    """Places what fits, tenant ``b``'s jobs first, then in queue order; a queued job of tenant ``b`` that does not
    fit preempts the first running, not yet stopping attempt of tenant ``a``."""

    def decide(self, queue: list[QueuedJob], held: list[Held], inventory: Inventory) -> Plan:
        used = {g for h in held for g in h.gpus}
        free = [g.index for g in inventory.gpus if g.index not in used]
        result = Plan()
        for q in sorted(queue, key=lambda q: q.tenant_id != "b"):
            if len(free) >= q.gpus:
                result.placements.append((q.id, tuple(free[: q.gpus])))
                free = free[q.gpus :]
            elif q.tenant_id == "b":
                victims = [h for h in held if h.tenant_id == "a" and not h.stopping]
                if victims:
                    result.preemptions.append(Preemption(victims[0].job_id, q.id, "reclaim", "reclaimed"))
        return result


def test_a_preempted_job_loses_the_work_since_its_last_checkpoint_and_keeps_its_submit_time() -> None:
    planner = Reclaimer()
    trace = [tj("a1", 0.0, 10_000.0, tenant="a"), tj("b1", 1000.0, 500.0, tenant="b")]
    sim = Simulator(trace, cfg(checkpoint_every_s=300.0, grace_s=30.0), planner=planner)
    r = sim.run()
    # preempted at 1000, stopped at 1030 after running 1030 s: 900 s kept (3 checkpoints), 130 s lost;
    # b1 runs 1030-1530, then a1 runs its remaining 9,100 s
    assert jcts(sim) == {"b1": 1530.0 - 1000.0, "a1": 1530.0 + 9100.0}
    assert r["preemptions"] == 1
    assert r["work_lost_gpu_s"] == 130.0
    grace_passes = [held for now, queue, held in planner.seen if any(h.stopping for h in held)]
    assert grace_passes == []  # no pass ran during the grace period: nothing changed until the stop
    requeued = [q for now, queue, _ in planner.seen for q in queue if q.id == "a1" and (now - EPOCH).seconds >= 1030]
    assert requeued and all(q.submitted_at == EPOCH for q in requeued)
    assert requeued[0].attained_gpu_s == 1030.0  # GPU-seconds used, lost work included


def test_a_victim_that_ends_during_the_grace_period_succeeds() -> None:
    trace = [tj("a1", 0.0, 1010.0, tenant="a"), tj("b1", 1000.0, 500.0, tenant="b")]
    sim = Simulator(trace, cfg(checkpoint_every_s=300.0, grace_s=30.0), planner=Reclaimer())
    r = sim.run()
    assert jcts(sim) == {"a1": 1010.0, "b1": 1010.0 - 1000.0 + 500.0}
    assert (r["preemptions"], r["preemptions_finished_in_grace"], r["work_lost_gpu_s"]) == (1, 1, 0.0)


def test_without_checkpoints_a_preempted_job_starts_over() -> None:
    trace = [tj("a1", 0.0, 2000.0, tenant="a"), tj("b1", 1000.0, 100.0, tenant="b")]
    sim = Simulator(trace, cfg(checkpoint_every_s=0.0, grace_s=0.0), planner=Reclaimer())
    r = sim.run()
    # stopped at once (no grace): the stop passes at once (b1 waits for exactly it), a1 starts over after b1
    assert jcts(sim) == {"b1": 100.0, "a1": 1100.0 + 2000.0}
    assert r["work_lost_gpu_s"] == 1000.0


class Mover(Recording):
    """Places queued jobs on the first free GPUs (a job with held GPUs on those), and when ``b1`` is queued and
    ``a1`` runs, moves ``a1`` (a "defrag" preemption) to GPU 1."""

    def decide(self, queue: list[QueuedJob], held: list[Held], inventory: Inventory) -> Plan:
        holds = {g for h in held for g in h.hold} | {g for q in queue for g in q.hold}
        used = {g for h in held for g in h.gpus} | holds
        free = [g.index for g in inventory.gpus if g.index not in used]
        result = Plan()
        for q in queue:
            if q.hold:
                result.placements.append((q.id, q.hold))
            elif q.id == "b1" and any(h.job_id == "a1" and not h.stopping for h in held):
                result.preemptions.append(Preemption("a1", "b1", "defrag", "moved", move_to=(1,)))
            elif len(free) >= q.gpus:
                result.placements.append((q.id, tuple(free[: q.gpus])))
                free = free[q.gpus :]
        return result


def test_a_moved_job_carries_its_held_gpus_until_it_is_placed_again() -> None:
    planner = Mover()
    # c1 arrives while a1 stops: the pass it causes sees a1 stopping
    trace = [tj("a1", 0.0, 5000.0, tenant="a"), tj("b1", 1000.0, 100.0, tenant="b"), tj("c1", 1010.0, 1.0, tenant="c")]
    sim = Simulator(trace, cfg(gpus=2, per_node=1, checkpoint_every_s=300.0, grace_s=30.0), planner=planner)
    sim.run()
    seen = [((now - EPOCH).total_seconds(), queue, held) for now, queue, held in planner.seen]
    stopping = [h for t, _, held in seen for h in held if h.job_id == "a1" and h.stopping]
    assert stopping and all(h.hold == (1,) for h in stopping)  # while it stops, its next GPUs are held
    queued = [q for t, queue, _ in seen for q in queue if q.id == "a1" and t >= 1030]
    assert queued and queued[0].hold == (1,) and queued[0].reclaiming  # then its queued job carries them
    # and the end of its hold (a victim chained for it may still be stopping): the move's pass + grace + margin
    assert queued[0].hold_until == EPOCH + timedelta(seconds=1000.0 + 30.0 + HOLD_MARGIN_S)
    after = [h for t, _, held in seen for h in held if h.job_id == "a1" and t > 1031]
    assert after and after[0].gpus == (1,) and after[0].hold == () and after[0].preemptions == 1
    assert all(not q.hold and q.hold_until is None for t, queue, _ in seen for q in queue if q.id == "a1" and t > 1031)


def test_every_pass_sees_a_running_jobs_tenant_las_queue_as_it_is_then() -> None:
    """The simulator keeps each running job's Held from pass to pass (until its next checkpoint): not past the moment
    its attained service crosses a boundary of ``tenant_las_queues_gpu_s``, which fair-share weighs."""
    planner = Reclaimer()
    bounds = (1000.0, 5000.0)
    # a1 runs alone on the one GPU; each later submit (it waits) causes a pass, around a1's boundary crossings
    trace = [tj("a1", 0.0, 10_000.0)] + [tj(f"w{t}", float(t), 10.0) for t in (950, 1100, 1700, 4900, 5100)]
    sim = Simulator(trace, cfg(checkpoint_every_s=900.0, tenant_las_queues_gpu_s=bounds), planner=planner)
    sim.run()
    seen = [((now - EPOCH).total_seconds(), h) for now, _, held in planner.seen for h in held if h.job_id == "a1"]
    assert [t for t, _ in seen] == [950.0, 1100.0, 1700.0, 4900.0, 5100.0]
    for t, h in seen:  # a1 started at 0 on one GPU: t GPU-seconds attained at t
        assert bisect.bisect_right(bounds, h.attained_gpu_s) == bisect.bisect_right(bounds, t), (t, h.attained_gpu_s)


def test_the_attempt_rules_shared_with_the_control_plane() -> None:
    assert attempt_end(exit_code=None, stopped=True, timed_out=False, preempt_requested=True) == AttemptEnd.PREEMPTED
    assert attempt_end(exit_code=0, stopped=False, timed_out=False, preempt_requested=True) == AttemptEnd.SUCCEEDED
    # exiting non-zero while asked to stop for a preemption (a trainer that exits 1 on SIGTERM) is no failure
    assert attempt_end(exit_code=1, stopped=False, timed_out=False, preempt_requested=True) == AttemptEnd.PREEMPTED
    assert attempt_end(exit_code=1, stopped=False, timed_out=False) == AttemptEnd.FAILED
    assert attempt_end(exit_code=None, stopped=False, timed_out=True) == AttemptEnd.TIMED_OUT
    assert attempt_end(exit_code=None, stopped=True, timed_out=False) == AttemptEnd.CANCELLED
    assert (
        attempt_end(exit_code=None, stopped=True, timed_out=False, cancel_requested=True, preempt_requested=True)
        == AttemptEnd.CANCELLED
    )
    again = requeue_after_preemption(EPOCH, restarts=2, preemptions=0)
    assert (again.submitted_at, again.restarts, again.preemptions, again.not_before) == (EPOCH, 2, 1, None)
    assert last_checkpoint_s(1030.0, 300.0) == 900.0
    assert last_checkpoint_s(299.0, 300.0) == 0.0
    assert last_checkpoint_s(1030.0, 0.0) == 0.0


def test_an_attempts_gpu_seconds_over_the_window_count_a_turn_through_its_end() -> None:
    from dlcloud.scheduler.attempts import gpu_seconds_in_window as used

    # window [1000, 4600]: 2 GPUs running since 0 count the whole window; one that ran 2000-3000 counts 1000 s
    assert used(2, 0.0, None, None, 1000.0, 4600.0) == 2 * 3600.0
    assert used(1, 2000.0, 3000.0, None, 1000.0, 4600.0) == 1000.0
    assert used(4, 0.0, 900.0, None, 1000.0, 4600.0) == 0.0  # ended before the window
    # placed for a turn until 5000, failed at 4000: counted through the turn's end, up to now
    assert used(4, 3900.0, 4000.0, 5000.0, 1000.0, 4600.0) == 4 * 700.0
    assert used(4, 3900.0, 4000.0, 5000.0, 1000.0, 5400.0) == 4 * 1100.0


def test_guarantees_are_proportional_to_gpu_time_and_never_exceed_the_cluster() -> None:
    trace = [tj("1", 0, 100, gpus=1, tenant="a"), tj("2", 0, 100, gpus=2, tenant="b"), tj("3", 0, 300, tenant="c")]
    g = guarantees(trace, 10)
    assert g == {"a": 1, "b": 3, "c": 5}  # shares 1/6, 2/6, 3/6 of 10 GPUs, floored
    philly = guarantees(load_trace(PHILLY_SLICE), 256)
    assert sum(philly.values()) <= 256
    assert sum(philly.values()) >= 256 - len(philly)


def test_fairness_windows_count_hours_a_tenant_got_less_than_it_was_owed() -> None:
    # two GPUs, each tenant guaranteed one (equal GPU-time); FIFO gives a's second job the second GPU, so b,
    # arriving half a second later, gets nothing for two hours: two hours below 90 % of what it was owed
    trace = [tj("a1", 0.0, 7200.0, tenant="a"), tj("a2", 0.5, 7200.0, tenant="a"), tj("b1", 1.0, 14400.0, tenant="b")]
    sim = Simulator(trace, cfg(gpus=2, per_node=1))
    r = sim.run()
    assert sim.guarantee == {"a": 1, "b": 1}
    assert jcts(sim)["b1"] == 7200.0 - 1.0 + 14400.0
    b, a = r["tenants"]["b"], r["tenants"]["a"]
    assert (b["windows_with_demand"], b["windows_below_90pct"]) == (6, 2)
    assert a["windows_below_90pct"] == 0
    assert r["fairness"] == {"windows_below_90pct": 2, "worst_below_fraction": round(2 / 6, 4)}
    # with the jobs arriving the other way round nobody is short
    trace = [tj("a1", 0.0, 7200.0, tenant="a"), tj("b1", 0.5, 14400.0, tenant="b"), tj("a2", 1.0, 7200.0, tenant="a")]
    assert simulate(trace, cfg(gpus=2, per_node=1))["fairness"]["windows_below_90pct"] == 0


def test_bad_configuration_is_refused_with_a_clear_message() -> None:
    with pytest.raises(InvalidArgument, match="--gpus-per-node must divide --gpus: 10 GPUs"):
        Simulator([], SimConfig(gpus=10, gpus_per_node=4))
    with pytest.raises(InvalidArgument, match="--tick must be > 0"):
        Simulator([], SimConfig(gpus=8, gpus_per_node=8, tick_s=0))


def test_bad_traces_name_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="trace file not found"):
        load_trace(tmp_path / "nope.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit,num_gpus\n1,2,3\n")
    with pytest.raises(InvalidArgument, match="missing column.*submit_time_s, duration_s, user"):
        load_trace(bad)
    bad.write_text("job_id,submit_time_s,num_gpus,duration_s,user\n1,0,1,10,a\n2,5,two,10,a\n")
    with pytest.raises(InvalidArgument, match=r"bad.csv:3: num_gpus must be a number, got 'two'"):
        load_trace(bad)
    bad.write_text("job_id,submit_time_s,num_gpus,duration_s,user\n1,0,1,-10,a\n")
    with pytest.raises(InvalidArgument, match=r"bad.csv:2: duration_s must be a finite number >= 0"):
        load_trace(bad)
    bad.write_text("job_id,submit_time_s,num_gpus,duration_s,user\n1,0,1,10,a\n1,0,1,10,a\n")
    with pytest.raises(InvalidArgument, match="appears twice"):
        load_trace(bad)


def test_trace_window_and_limit() -> None:
    all_jobs = load_trace(PHILLY_SLICE)
    assert len(all_jobs) == 2000
    window = load_trace(PHILLY_SLICE, start_s=3600, end_s=7200)
    assert window and all(3600 <= j.submit_s < 7200 for j in window)
    assert [j.job_id for j in load_trace(PHILLY_SLICE, limit_jobs=5)] == ["0", "1", "2", "3", "4"]


def _without_timing(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "timing"}


@pytest.mark.parametrize(
    ("policy", "limit"),
    # the whole slice under FIFO; shorter prefixes under the policies whose passes look at the whole queue
    [(Policy.FIFO, 2000), (Policy.PRIORITY_BACKFILL, 400), (Policy.LAS, 400), (Policy.FAIR_SHARE, 50)],
)
def test_a_philly_slice_replays_identically_for_a_seed(policy: Policy, limit: int) -> None:
    jobs = load_trace(PHILLY_SLICE, limit_jobs=limit)
    config = SimConfig(gpus=64, gpus_per_node=8, policy=policy, seed=3)
    first, second = simulate(jobs, config), simulate(jobs, config)
    assert _without_timing(first) == _without_timing(second)
    assert first["jobs"]["finished"] == limit
    assert first["passes"] > 10
    assert 0 < first["gpu_allocation"]["mean"] <= 1
    assert set(first["tenants"]) == {j.tenant for j in jobs}
    for tenant in first["tenants"].values():
        assert 0 <= tenant["windows_below_90pct"] <= tenant["windows_with_demand"]


def test_a_trace_whose_first_submit_is_fractional_ends() -> None:
    # the hour windows are counted from the first submit: at 490.4646124193495 s an hour's end rounded back into
    # the same window, and the replay never ended (found fuzzing the simulator)
    sim = Simulator([tj("j", 490.4646124193495, 40_000.0)], cfg())
    r = sim.run()
    assert jcts(sim) == {"j": 40_000.0}
    assert r["tenants"]["a"]["windows_with_demand"] == 12  # 40,000 s from the first submit: 11.1 hours
