"""A trajectory's ids grow only by appending, under one token budget; the loss mask covers sampled ids only."""

from __future__ import annotations

import pytest

from hybridflow.tools.trajectory import Segment, TrajectoryTokens


def test_segments_mask_and_budget():
    t = TrajectoryTokens(prompt_ids=[1, 2, 3], budget=12)
    t.add_assistant([10, 11])
    assert t.add_observation([20, 21, 22])
    assert t.room == 4 and t.turns == 1
    assert not t.add_observation([30, 31, 32, 33])  # would leave the next turn no token to sample
    t.add_assistant([12, 13, 14, 15])
    assert t.ids == [1, 2, 3, 10, 11, 20, 21, 22, 12, 13, 14, 15] and t.room == 0 and t.turns == 2
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1]
    assert t.segments == [Segment("prompt", 0, 3), Segment("assistant", 3, 5), Segment("observation", 5, 8),
                          Segment("assistant", 8, 12)]
    assert t.response_ids() == t.ids[3:] and t.observation_share() == 3 / 9
    with pytest.raises(ValueError, match="exceed the 0 left"):
        t.add_assistant([16])


def test_prompt_over_budget_is_refused():
    with pytest.raises(ValueError, match="over the budget of 2"):
        TrajectoryTokens(prompt_ids=[1, 2, 3], budget=2)
