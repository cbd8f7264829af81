"""The level curriculum (trainer_client/training/curriculum.py) on fake success streams."""

from __future__ import annotations

import random

import pytest

from trainer_client.training.curriculum import LevelCurriculum


def test_it_starts_at_the_lowest_level_and_moves_up_as_success_rises() -> None:
    curriculum = LevelCurriculum([3, 1, 2, 2], promote_at=0.5, window=4, review=0.25)
    assert curriculum.levels == [1, 2, 3] and curriculum.frontier == 1
    rng = random.Random(0)
    assert curriculum.levels_for_step(8, rng) == [1] * 8, "nothing below the first level to review"

    curriculum.observe(1, [True, False, False, False], step=1)  # 0.25: signal, not solved
    curriculum.observe(1, [True, True, False, False], step=1)  # window mean 0.375
    assert curriculum.frontier == 1
    curriculum.observe(1, [True, True, True, True], step=2)  # mean (0.25 + 0.5 + 1) / 3 = 0.58
    assert curriculum.frontier == 2 and curriculum.promoted_at == {2: 2}

    levels = curriculum.levels_for_step(8, rng)
    assert sorted(levels) == [1, 1, 2, 2, 2, 2, 2, 2], "a quarter reviews level 1"
    # level 2's groups all fail: no promotion however many come
    for step in range(3, 10):
        curriculum.observe(2, [False] * 6, step=step)
    assert curriculum.frontier == 2
    metrics = curriculum.metrics()
    assert metrics["curriculum/frontier"] == 2.0
    assert metrics["curriculum/window_success/level_2"] == 0.0
    # success at level 2 rises: the window (4 groups) forgets the failures
    for step in range(10, 14):
        curriculum.observe(2, [True, True, True, False, False, False], step=step)
    assert curriculum.frontier == 3 and curriculum.promoted_at[3] == 13
    # the last level is never left, and the frontier never moves down
    for step in range(14, 20):
        curriculum.observe(3, [True] * 6, step=step)
        curriculum.observe(1, [False] * 6, step=step)
    assert curriculum.frontier == 3


def test_a_level_solved_from_the_start_is_passed_after_half_a_window() -> None:
    """Groups that all succeed carry no signal: the curriculum moves on once it has seen enough of them."""
    curriculum = LevelCurriculum([1, 2, 3], promote_at=0.8, window=8, review=0.0)
    for _ in range(3):
        curriculum.observe(1, [True] * 4)
    assert curriculum.frontier == 1, "three groups are fewer than half the window"
    curriculum.observe(1, [True] * 4)
    assert curriculum.frontier == 2
    assert curriculum.levels_for_step(4, random.Random(0)) == [2, 2, 2, 2], "review 0: frontier only"


def test_its_state_survives_a_checkpoint() -> None:
    curriculum = LevelCurriculum([1, 2], window=4)
    for _ in range(2):
        curriculum.observe(1, [True, True, False])
    resumed = LevelCurriculum([1, 2], window=4)
    resumed.load_state_dict(curriculum.state_dict())
    assert (resumed.frontier, resumed.metrics()) == (curriculum.frontier, curriculum.metrics())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"levels": []}, "at least one level"),
        ({"levels": [1], "promote_at": 0.0}, "promote_at"),
        ({"levels": [1], "window": 0}, "window"),
        ({"levels": [1], "review": 1.0}, "review"),
    ],
)
def test_bad_settings_say_what_is_wrong(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LevelCurriculum(**arguments)
