"""A curriculum by task level: which levels a GRPO step's prompts are drawn from.

Why: a GRPO group whose samples all fail (or all succeed) has advantage 0 and teaches
nothing. A 135M model fails every level-2 task at first, so a run that mixes levels spends
most of its rollouts on groups without signal. The curriculum trains where groups have
signal (some but not all samples succeed) and moves up as success there rises
(FTRL's complexity scaling, used as a schedule).

The level is the task's own (``Task.metadata["level"]``: a row's ``extra_info.level``,
which ``tools.data`` writes from the pack's complexity tags). The rule:

- the *frontier* starts at the lowest level; a step draws ``1 - review`` of its prompts
  from the frontier and ``review`` from the levels below it (so a learned level is not
  forgotten);
- after each step, each group's success rate (share of its samples that succeeded) joins
  its level's window (the last ``window`` groups);
- the frontier moves up one level when its window holds at least ``window // 2`` groups
  and their mean success is ``>= promote_at`` (a level the model already solves, with
  groups that mostly all succeed, has little signal left). It never moves down.

Pure Python, no torch: it is unit-tested on a fake success stream.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["LevelCurriculum", "level_curriculum", "next_of_level"]


class LevelCurriculum:
    """The frontier level and each level's recent group success (see the module's docstring)."""

    def __init__(
        self, levels: Iterable[int], *, promote_at: float = 0.5, window: int = 8, review: float = 0.25
    ) -> None:
        self.levels = sorted(set(int(level) for level in levels))
        if not self.levels:
            raise ValueError("a curriculum needs at least one level")
        if not 0.0 < promote_at <= 1.0:
            raise ValueError(f"curriculum promote_at must be in (0, 1], got {promote_at}")
        if window < 1:
            raise ValueError(f"curriculum window must be at least 1 group, got {window}")
        if not 0.0 <= review < 1.0:
            raise ValueError(f"curriculum review must be in [0, 1), got {review}")
        self.promote_at, self.window, self.review = promote_at, window, review
        self.index = 0  # position of the frontier in self.levels
        self.recent: dict[int, deque[float]] = {level: deque(maxlen=window) for level in self.levels}
        self.promoted_at: dict[int, int] = {}  # level -> the step after which it became the frontier

    @property
    def frontier(self) -> int:
        return self.levels[self.index]

    def levels_for_step(self, prompts: int, rng: random.Random) -> list[int]:
        """The level of each of a step's ``prompts``: the frontier, and ``review`` of them below it."""
        below = self.levels[: self.index]
        reviewed = round(self.review * prompts) if below else 0
        return [rng.choice(below) for _ in range(reviewed)] + [self.frontier] * (prompts - reviewed)

    def observe(self, level: int, successes: Sequence[bool | float], step: int = 0) -> None:
        """One group's outcomes (a success flag per sample) at ``level``; may move the frontier up."""
        if level not in self.recent or not successes:
            return
        self.recent[level].append(sum(float(s) for s in successes) / len(successes))
        while self.index < len(self.levels) - 1 and self._solved(self.frontier):
            self.index += 1
            self.promoted_at[self.frontier] = step

    def _solved(self, level: int) -> bool:
        window = self.recent[level]
        return len(window) >= max(1, self.window // 2) and sum(window) / len(window) >= self.promote_at

    def metrics(self) -> dict[str, float]:
        """What the step's record logs: the frontier and each level's window success."""
        out: dict[str, float] = {"curriculum/frontier": float(self.frontier)}
        for level, window in self.recent.items():
            if window:
                out[f"curriculum/window_success/level_{level}"] = sum(window) / len(window)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "recent": {str(k): list(v) for k, v in self.recent.items()},
            "promoted_at": {str(k): v for k, v in self.promoted_at.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.index = min(int(state.get("index", 0)), len(self.levels) - 1)
        for key, values in (state.get("recent") or {}).items():
            if int(key) in self.recent:
                self.recent[int(key)].extend(float(v) for v in values)
        self.promoted_at = {int(k): int(v) for k, v in (state.get("promoted_at") or {}).items()}


def level_curriculum(levels: Sequence[Any], config: Any) -> tuple[LevelCurriculum, dict[int, list[int]]]:
    """The curriculum of a training set whose rows have these ``levels`` (``extra_info.level``),
    with ``config``'s ``curriculum_*`` settings, and the row indices of each level."""
    missing = sum(level is None for level in levels)
    if missing:
        raise ValueError(
            f"curriculum needs every training row's extra_info.level, and {missing} of {len(levels)} "
            "rows have none: build environment rows with python -m tools.data build --tasks env:..., "
            "or train without --curriculum"
        )
    tasks_of_level: dict[int, list[int]] = defaultdict(list)
    for index, level in enumerate(levels):
        tasks_of_level[int(level)].append(index)
    curriculum = LevelCurriculum(
        tasks_of_level,
        promote_at=config.curriculum_promote_at,
        window=config.curriculum_window,
        review=config.curriculum_review,
    )
    return curriculum, tasks_of_level


def next_of_level(
    indices: Sequence[int], level: int, cursors: dict[int, int], epochs: dict[int, int], seed: int
) -> int:
    """The next row of ``level`` in that level's own shuffled order, reshuffled each pass;
    ``cursors`` and ``epochs`` (the trainer's, saved in its checkpoints) move on."""
    cursor = cursors.get(level, 0)
    if cursor >= len(indices):
        epochs[level] = epochs.get(level, 0) + 1
        cursor = 0
    order = list(indices)
    random.Random(f"{seed}:level:{level}:{epochs.get(level, 0)}").shuffle(order)
    cursors[level] = cursor + 1
    return order[cursor]
