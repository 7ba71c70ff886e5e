"""Server settings that depend on each other are refused with a message that says what is allowed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dlcloud.settings import Settings


def test_a_turn_window_is_off_or_long_enough_for_a_turn(tmp_path) -> None:
    assert Settings(data_dir=tmp_path, scheduling_turn_window_seconds=0).scheduling_turn_window_seconds == 0
    assert Settings(data_dir=tmp_path, scheduling_turn_window_seconds=1800).scheduling_turn_window_seconds == 1800
    with pytest.raises(
        ValidationError, match="scheduling_turn_window_seconds must be 0 \\(no turns\\) or at least 1800"
    ):
        Settings(data_dir=tmp_path, scheduling_turn_window_seconds=600)
