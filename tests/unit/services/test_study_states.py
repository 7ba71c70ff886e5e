"""A trial row's first state is set by ``study_states`` like every later move."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dlcloud.errors import InvalidState
from dlcloud.schemas.studies import TrialState
from dlcloud.services import study_states
from dlcloud.store.rows import StudyTrialRow


def _new_trial() -> StudyTrialRow:
    return StudyTrialRow(
        study_id="s-1", tenant_id="t-1", number=3, params={}, created_at=datetime(2026, 1, 1, tzinfo=UTC)
    )


def test_a_started_trial_runs_its_job_and_may_then_complete() -> None:
    t = _new_trial()
    study_states.start_trial(t, "j-1", "study-3")
    assert (t.state, t.job_id, t.job_name, t.reason) == (TrialState.RUNNING.value, "j-1", "study-3", "submitted")
    study_states.transition_trial(t, TrialState.COMPLETED, "done", value=0.5)
    assert t.state == TrialState.COMPLETED.value and t.value == 0.5 and t.finished_at is not None


def test_a_duplicate_ends_as_it_is_created_with_the_earlier_value_and_moves_no_more() -> None:
    t = _new_trial()
    study_states.record_duplicate(t, 1, 0.9)
    assert (t.state, t.duplicate_of, t.job_id, t.value) == (TrialState.DUPLICATE.value, 1, None, 0.9)
    assert t.finished_at == t.created_at and "trial 1" in (t.reason or "")
    with pytest.raises(InvalidState):
        study_states.transition_trial(t, TrialState.RUNNING, "again")
