"""fair-share rule: turns. A tenant short of its guarantee over the turn window, whose job is larger than what its
guarantee leaves, takes capacity for a bounded turn (``Turns``): its length, who can spare GPUs for it, its victims."""

from __future__ import annotations

from datetime import timedelta

from dlcloud.scheduler.contract import Limits, QueuedJob
from dlcloud.scheduler.policies.turns import TURN_DUE_BELOW, held_over_window
from tests.unit.scheduler.fair_share.build import fair_share, ids
from tests.unit.scheduler.scenarios import NOW, job, nodes, running

HOUR = 3600.0


def waited(minutes: float, gpus: int = 8) -> QueuedJob:
    return job("a0", "a", gpus, submitted_at=NOW - timedelta(minutes=minutes))


def test_a_turn_is_as_long_as_the_tenant_needs_to_reach_its_guarantee_at_the_jobs_size() -> None:
    fs = fair_share([], [], {"a": Limits(guarantee_gpus=4, recent_gpu_s=0)}, nodes(2, 8))
    t = fs.p.tenant("a")
    assert fs.turns.length(waited(120), t, TURN_DUE_BELOW) == 1800  # 4 x 3600 / 8 GPUs, at most half the window
    t.lim = Limits(guarantee_gpus=4, recent_gpu_s=2 * HOUR)
    assert fs.turns.length(waited(120), t, TURN_DUE_BELOW) == 900  # (14400 - 7200) / 8


def test_no_turn_before_the_job_waited_nor_for_a_tenant_that_held_its_guarantee() -> None:
    fs = fair_share([], [], {"a": Limits(guarantee_gpus=4, recent_gpu_s=0)}, nodes(2, 8))
    t = fs.p.tenant("a")
    assert fs.turns.length(waited(10), t, TURN_DUE_BELOW) is None  # under TURN_MIN_WAIT_S
    t.lim = Limits(guarantee_gpus=4, recent_gpu_s=4 * HOUR)
    assert fs.turns.length(waited(120), t, TURN_DUE_BELOW) is None
    t.lim = Limits(guarantee_gpus=1, recent_gpu_s=0)
    assert fs.turns.length(waited(120), t, TURN_DUE_BELOW) is None  # 8 GPUs x 900 s > 1 GPU x the window


def test_a_tenant_spares_gpus_only_while_it_keeps_90_percent_of_its_guarantee_over_the_window() -> None:
    held = [running(f"b{i}", "b", (i,)) for i in range(4)]
    fs = fair_share([], held, {"b": Limits(guarantee_gpus=4, recent_gpu_s=4 * HOUR)}, nodes(1, 8))
    assert fs.turns.can_spare("b", 0, 1800)
    assert not fs.turns.can_spare("b", 1, 1800)  # 7200 + 3 x 1800 < 0.9 x 14400
    assert not fs.turns.can_spare("nobody", 0, 1800)  # no guarantee, no recent usage


def test_turn_victims_borrowed_first_never_its_own_tenants_nor_one_on_its_turn() -> None:
    held = [
        running("own", "a", (0,)),
        running("c-borrowed", "c", (1,), minutes=5),
        running("b-owed", "b", (2,), minutes=5),
        running("b-on-turn", "b", (3,), turn_until=NOW + timedelta(minutes=5)),
        running("b-owed2", "b", (4,), minutes=30),
    ]
    limits = {"a": Limits(guarantee_gpus=4, recent_gpu_s=0), "b": Limits(guarantee_gpus=2, recent_gpu_s=2 * HOUR)}
    fs = fair_share([], held, limits, nodes(1, 8))
    assert ids(fs.turns.candidates(fs.p.tenant("a"), 900)) == ["c-borrowed", "b-owed", "b-owed2"]
    assert fs.turns.affordable(900)([c for c in fs.turns.candidates(fs.p.tenant("a"), 900)][:2])
    # b (3 GPUs now, its guarantee of 2 held over the window) cannot give up both of its owed attempts for a
    # half-window turn: 3600 + 1 x 1800 GPU-s < 90 % of 7200
    assert not fs.turns.affordable(1800)(fs.turns.candidates(fs.p.tenant("a"), 1800))


def test_owed_jobs_are_told_of_other_tenants_turns() -> None:
    held = [running("b-turn", "b", (0,), turn_until=NOW + timedelta(minutes=5))]
    fs = fair_share([job("a0", "a")], held, {"a": Limits(guarantee_gpus=1)}, nodes(1, 1))
    assert fs.turns.of_others["a"].startswith(
        "; 1 GPU(s) run other tenants' turns, the first ending 2024-01-01T12:05:00"
    )
    assert "b" not in fs.turns.of_others


def test_held_over_window() -> None:
    fs = fair_share([], [], {"a": Limits(guarantee_gpus=4, recent_gpu_s=0.9 * 4 * HOUR)}, nodes(1, 4))
    assert held_over_window(fs.p.tenant("a"), HOUR)
    assert not held_over_window(fs.p.tenant("a"), 0)  # turns off: unknown
    fs.p.tenant("a").lim = Limits(guarantee_gpus=4, recent_gpu_s=0.8 * 4 * HOUR)
    assert not held_over_window(fs.p.tenant("a"), HOUR)
