"""scheduler/pass_core.py: the pass's pure core, shared by the control plane and the trace simulator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dlcloud.scheduler.contract import HOLD_MARGIN_S, Held, Limits, Plan, PlanConfig, Policy, Preemption, QueuedJob
from dlcloud.scheduler.inventory import Gpu, Inventory
from dlcloud.scheduler.pass_core import (
    AttemptSpan,
    Marks,
    RecentUsage,
    TenantTerms,
    decide,
    held_attempt,
    moved,
    needs_recent_usage,
    recent_usage,
    tenant_limits,
)

NOW = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
GiB = 1024**3


def test_tenant_limits_take_the_stored_terms_with_defaults_for_unset_ones() -> None:
    terms = [
        TenantTerms("t-a", quota_gpus=8, quota_max_running_jobs=3, guarantee_gpus=4, borrow_gpus=2, weight=2.0),
        TenantTerms("t-b"),  # no terms at all: nothing guaranteed, weight 1, no caps
    ]
    limits = tenant_limits(terms)
    assert limits == {
        "t-a": Limits(8, None, None, 3, guarantee_gpus=4, borrow_gpus=2, weight=2.0),
        "t-b": Limits(guarantee_gpus=0, guarantee_cpus=0.0, guarantee_memory=0, weight=1.0),
    }
    assert list(limits) == ["t-a", "t-b"]  # the tenants' order as given
    assert limits["t-a"].recent_gpu_s is None and limits["t-a"].recent_peak_gpus is None  # no usage: no turns


def test_tenant_limits_give_a_tenant_without_recent_attempts_zero_usage() -> None:
    recent = RecentUsage(gpu_s={"t-a": 7200.0}, peak_gpus={"t-a": 2})
    limits = tenant_limits([TenantTerms("t-a"), TenantTerms("t-b")], recent)
    assert (limits["t-a"].recent_gpu_s, limits["t-a"].recent_peak_gpus) == (7200.0, 2)
    assert (limits["t-b"].recent_gpu_s, limits["t-b"].recent_peak_gpus) == (0.0, 0)
    only_peaks = tenant_limits([TenantTerms("t-b")], RecentUsage(peak_gpus={}))
    assert (only_peaks["t-b"].recent_gpu_s, only_peaks["t-b"].recent_peak_gpus) == (None, 0)


@pytest.mark.parametrize(
    ("policy", "turns", "lend", "needed"),
    [
        (Policy.FAIR_SHARE, 3600.0, 600.0, True),
        (Policy.FAIR_SHARE, 0.0, 600.0, True),
        (Policy.FAIR_SHARE, 3600.0, 0.0, True),
        (Policy.FAIR_SHARE, 0.0, 0.0, False),
        (Policy.LAS, 3600.0, 600.0, False),
        (Policy.FIFO, 3600.0, 600.0, False),
        (Policy.PRIORITY_BACKFILL, 3600.0, 600.0, False),
    ],
)
def test_only_fair_share_with_turns_or_kept_gpus_needs_recent_usage(
    policy: Policy, turns: float, lend: float, needed: bool
) -> None:
    assert needs_recent_usage(PlanConfig(policy=policy, turn_window_s=turns, lend_after_s=lend)) is needed


def test_recent_usage_counts_the_window_a_turn_through_its_end_and_the_peak() -> None:
    now = 10_000.0
    spans = [
        AttemptSpan("a", 2, now - 7200, None),  # live for 2 h: 2 x 3600 in the window, held now
        AttemptSpan("a", 1, now - 5400, now - 1800),  # 1 x 1800; ended 30 min ago, ran 1 h: not kept for (> lend)
        AttemptSpan("a", 4, now - 600, now - 540, now + 1200),  # a turn: counted through its end, 4 x 600
        AttemptSpan("b", 3, now - 10_000, now - 7200),  # before the window: nothing
        AttemptSpan("b", 0, now - 60, None),  # no GPUs: nothing
    ]
    r = recent_usage(spans, now, 3600.0, 900.0)
    assert r.gpu_s == pytest.approx({"a": 2 * 3600 + 1800 + 4 * 600, "b": 0.0})
    assert r.peak_gpus == {"a": 2 + 4}  # the live 2 with the turn's 4, which ended 9 min ago and ran 1 min
    short = recent_usage(spans, now, 0.0, 300.0)
    assert (short.gpu_s, short.peak_gpus) == (None, {"a": 2})
    assert recent_usage(spans, now, 0.0, 0.0) == RecentUsage()


def test_an_attempt_ended_exactly_lend_after_ago_is_lent_even_where_subtraction_rounds() -> None:
    # (1/7 + 600) - 600 < 1/7 in floating point: the pass asked for at ``end + lend`` must find the GPUs lent
    end = 1 / 7
    now = end + 600.0
    assert now - 600.0 < end  # the rounding the rule guards against
    r = recent_usage([AttemptSpan("a", 8, 0.0, end)], now, 0.0, 600.0)
    assert r.peak_gpus == {}


def test_recent_usage_adds_each_tenant_s_attempts_in_the_order_given() -> None:
    # the simulator and the control plane give them in their own orders; the sum is a left fold, reproducible
    xs = [AttemptSpan("a", 1, 0.0, 0.1), AttemptSpan("a", 1, 0.0, 0.2), AttemptSpan("a", 1, 0.0, 0.3)]
    got = recent_usage(xs, 1.0, 3600.0, 0.0).gpu_s
    assert got == {"a": (0.1 + 0.2) + 0.3}


def _held(**kw: object) -> Held:
    started = NOW - timedelta(hours=1)
    args: dict[str, object] = {"now": NOW, "job_id": "j1", "started_at": started, "running_s": 3600.0}
    args.update(kw)
    return held_attempt("t-a", (0, 1), 2.0, GiB, **args)  # type: ignore[arg-type]


def test_a_held_attempt_loses_the_work_since_its_last_checkpoint_else_since_its_start() -> None:
    started = NOW - timedelta(hours=1)
    assert _held().progress_at == started
    assert _held(checkpoint_at=NOW - timedelta(minutes=5)).progress_at == NOW - timedelta(minutes=5)


def test_a_held_attempt_s_attained_service_is_its_job_s_and_its_gpus_over_its_run() -> None:
    assert _held(attained_before_gpu_s=100.0).attained_gpu_s == 100.0 + 2 * 3600.0
    assert _held(running_s=-5.0).attained_gpu_s == 0.0  # a start in the future (clock skew) counts nothing


def test_a_moved_attempt_holds_its_next_gpus_while_it_stops_until_the_hold_ends() -> None:
    later = NOW + timedelta(seconds=30)
    moving = _held(preempt_requested=True, hold_gpus=[4, 5], hold_until=later)
    assert (moving.stopping, moving.hold) == (True, (4, 5))
    assert _held(preempt_requested=True, hold_gpus=[4, 5], hold_until=NOW).hold == ()  # the hold ended
    cancelled = _held(preempt_requested=True, cancel_requested=True, hold_gpus=[4, 5], hold_until=later)
    assert (cancelled.stopping, cancelled.hold) == (True, ())  # it does not come back
    assert _held(hold_gpus=[4, 5], hold_until=later).hold == ()  # not stopping: nothing held
    assert _held(cancel_requested=True).stopping


def test_only_a_defrag_victim_is_moved_on_the_gpus_chosen_until_the_grace_period_and_a_tick() -> None:
    p = Preemption("v", "by", "defrag", "", move_to=(6, 7))
    assert moved(p, NOW, 30.0) == Marks(True, (6, 7), NOW + timedelta(seconds=30.0 + HOLD_MARGIN_S))
    assert moved(Preemption("v", "by", "reclaim", ""), NOW, 30.0) is None


def test_decide_calls_the_planner_it_is_given_with_the_pass_s_inputs() -> None:
    inventory = Inventory("h", tuple(Gpu(i, "g") for i in range(2)), 8.0, 8 * GiB)
    queue = [QueuedJob("j1", "t-a", 1, 1.0, GiB)]
    config = PlanConfig(policy=Policy.FAIR_SHARE)
    limits = tenant_limits([TenantTerms("t-a", guarantee_gpus=2)])
    seen: list[tuple[object, ...]] = []

    def planner(*args: object) -> Plan:
        seen.append(args)
        return Plan(placements=[("j1", (1,))])

    assert decide(queue, [], limits, inventory, NOW, config, planner).placements == [("j1", (1,))]
    assert seen == [(queue, [], limits, inventory, NOW, config)]
    real = decide(queue, [], limits, inventory, NOW, config)  # the production planner
    assert [job_id for job_id, _ in real.placements] == ["j1"]
