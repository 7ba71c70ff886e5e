"""Asynchronous successive halving that pauses (control/asha.py): the rung ladder, the value a trial is ranked
by at a rung, and which paused trial earns the next rung, by hand-built trials; the study file's checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dlcloud.control.asha import Candidate, Rungs, promotion, rung_value, standing
from dlcloud.schemas.studies import Direction, StudySpec

MAX, MIN = Direction.MAXIMIZE, Direction.MINIMIZE
LADDER = Rungs(min_resource=3, reduction_factor=3)  # 3, 9, 27, ...


def paused(number: int, values: dict[int, float], budget: int, last: int = 81) -> Candidate:
    return Candidate(number, values, budget, last, paused=True)


def running(number: int, values: dict[int, float], budget: int, last: int = 81) -> Candidate:
    return Candidate(number, values, budget, last, paused=False)


def test_the_ladder_stops_at_each_trials_own_last_step():
    assert LADDER.below(81) == [3, 9, 27]
    assert LADDER.below(3) == [] and LADDER.below(4) == [3]
    assert LADDER.first_budget(81) == 3 and LADDER.first_budget(2) == 2
    assert [LADDER.next_budget(b, 81) for b in (3, 9, 27)] == [9, 27, 81]
    assert LADDER.next_budget(9, 20) == 20  # a trial of 20 epochs: its last rung is 20, not 27
    assert [*LADDER.below(81), 81] == [3, 9, 27, 81]
    assert [*Rungs(min_resource=1, reduction_factor=2).below(5), 5] == [1, 2, 4, 5]


def test_the_value_at_a_rung_is_the_best_or_the_last_up_to_its_step():
    points = {1: 0.5, 2: 0.9, 3: 0.7, 4: 0.95}
    assert rung_value(points, 3, best=True, direction=MAX) == 0.9
    assert rung_value(points, 3, best=False, direction=MAX) == 0.7
    assert rung_value(points, 3, best=True, direction=MIN) == 0.5
    assert rung_value({5: 1.0}, 3, best=True, direction=MAX) is None


def test_no_promotion_until_a_rung_has_reduction_factor_trials():
    """Two trials at a rung of factor 3: neither has beaten enough others to go on, however good."""
    a, b = paused(0, {3: 0.99}, 3), paused(1, {3: 0.2}, 3)
    assert promotion([a, b], LADDER, MAX, best=True) is None
    c = paused(2, {3: 0.5}, 3)
    assert promotion([a, b, c], LADDER, MAX, best=True) == (a, 9)


def test_the_top_third_is_promoted_and_the_direction_counts():
    trials = [paused(i, {3: v}, 3) for i, v in enumerate([0.4, 0.1, 0.9, 0.3, 0.8, 0.2])]
    pick = promotion(trials, LADDER, MAX, best=True)
    assert pick is not None and pick[0].number == 2
    pick = promotion(trials, LADDER, MIN, best=True)
    assert pick is not None and pick[0].number == 1


def test_a_promoted_trial_is_not_promoted_twice_and_the_next_best_follows():
    """Six at rung 3: two earn rung 9. The best went on already (its budget is 9): the second is next; a third
    is not (6 // 3 = 2)."""
    trials = [paused(i, {3: v}, 3) for i, v in enumerate([0.4, 0.1, 0.3, 0.8, 0.2])]
    trials.append(running(5, {3: 0.9, 4: 0.91}, 9))
    pick = promotion(trials, LADDER, MAX, best=True)
    assert pick is not None and (pick[0].number, pick[1]) == (3, 9)
    trials[3] = running(3, {3: 0.8}, 9)
    assert promotion(trials, LADDER, MAX, best=True) is None


def test_the_highest_rung_goes_first():
    low = [paused(i, {3: v}, 3) for i, v in enumerate([0.1, 0.2, 0.95])]
    high = [paused(10 + i, {3: 0.3, 9: v}, 9) for i, v in enumerate([0.5, 0.6, 0.7])]
    pick = promotion(low + high, LADDER, MAX, best=True)
    assert pick is not None and (pick[0].number, pick[1]) == (12, 27)


def test_running_and_finished_trials_count_at_the_rungs_they_reached():
    """Members of a rung are all trials that reached its step, running or not; only paused ones move."""
    trials = [
        running(0, {1: 0.1, 2: 0.2, 3: 0.99}, 9),  # reached 3 and runs on: first place, not paused
        paused(1, {3: 0.5}, 3),
        paused(2, {3: 0.4}, 3),
        paused(3, {3: 0.3}, 3),
        paused(4, {3: 0.2}, 3),
        paused(5, {3: 0.1}, 3),
        running(6, {1: 0.9}, 3),  # not at 3 yet: no member
    ]
    pick = promotion(trials, LADDER, MAX, best=True)
    assert pick is not None and pick[0].number == 1  # 6 members: the best two are 0 and 1
    assert "#5 of 6" in standing(trials[4], trials, LADDER, MAX, best=True)


def test_equal_values_go_by_trial_number():
    trials = [paused(i, {3: 0.5}, 3) for i in (4, 2, 7)]
    pick = promotion(trials, LADDER, MAX, best=True)
    assert pick is not None and pick[0].number == 2


def _study(**extra: object) -> dict:
    return {
        "name": "s",
        "algorithm": "asha",
        "objective": {"metric": "m"},
        "max_trials": 4,
        "trial": {"command": "true"},
        "search_space": {"x": {"type": "uniform", "low": 0, "high": 1}},
        **extra,
    }


def test_pausing_is_the_default_for_template_trials_only():
    assert not StudySpec.model_validate(_study()).pauses()
    template = {"template": "mlp", "data": "d@1", "label": "y"}
    assert StudySpec.model_validate(_study(trial=template)).pauses()
    off = _study(trial=template, early_stopping={"pause": False})
    assert not StudySpec.model_validate(off).pauses()
    on = _study(early_stopping={"pause": True, "max_resource": 27})
    assert StudySpec.model_validate(on).pauses()


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"early_stopping": {"pause": True}}, "early_stopping.pause needs max_resource"),
        ({"early_stopping": {"pause": True, "hyperband": True, "max_resource": 9}}, "hyperband runs with pause: false"),
        ({"early_stopping": {"min_resource": 9, "max_resource": 3}}, "max_resource (3) must be at least min_resource"),
        (
            {"name": "x" * 53, "early_stopping": {"pause": True, "max_resource": 9}},
            "a pausing ASHA study's name is at most 52 characters",
        ),
    ],
)
def test_a_pausing_study_file_is_checked(extra: dict, fragment: str):
    with pytest.raises(ValidationError) as info:
        StudySpec.model_validate(_study(**extra))
    assert fragment in str(info.value)


def test_finishing_takes_the_best_paused_trial_of_the_highest_rung():
    from dlcloud.control.asha import finishing

    trials = [
        paused(0, {3: 0.9}, 3),  # better, but lower
        paused(1, {3: 0.1, 9: 0.5}, 9),
        paused(2, {3: 0.2, 9: 0.6}, 9),
        running(3, {3: 0.3, 9: 0.99}, 27),  # not paused: not for the finisher
    ]
    pick = finishing(trials, LADDER, MAX, best=False)
    assert pick is not None and (pick[0].number, pick[1]) == (2, 27)
    assert finishing([paused(5, {}, 3)], LADDER, MAX, best=False) == (paused(5, {}, 3), 9)  # reported nothing
    assert finishing([running(0, {3: 1.0}, 9)], LADDER, MAX, best=False) is None
