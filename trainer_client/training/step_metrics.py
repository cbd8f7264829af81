"""What a GRPO step measures besides its loss: where its rollout time goes, and reward per kind.

``PhaseClock`` splits a step's rollout wall time by what was in flight (generation, tools,
verification, the rest); ``Timed`` wraps the generator and the tool client so their calls count
towards it; ``per_kind_stats`` gives success and reward per problem kind or environment level.
Beside ``grpo.py``'s loop, which reads these figures into each step's record.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any

from trainer_client.rollout.core import Task, Trajectory

__all__ = ["INVOKER_PHASES", "PHASES", "PhaseClock", "Timed", "per_kind_stats", "task_kind"]

# --------------------------------------------------------------------------- where a step's time goes

PHASES = ("generate", "tools", "verify")  # by priority: while one is in flight, the time is its


class PhaseClock:
    """A step's rollout wall time split by what was in flight: generation, else tool calls
    (and session binding/release), else verification; ``other`` is the rest (parsing,
    splicing, the event loop). Trajectories overlap, so per-trajectory sums would count the
    same second many times; this split adds up to the rollout's wall time."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.busy = dict.fromkeys(PHASES, 0)
        self.seconds = dict.fromkeys((*PHASES, "other"), 0.0)
        self._since = time.perf_counter()

    def _tick(self) -> None:
        now = time.perf_counter()
        phase = next((p for p in PHASES if self.busy[p]), "other")
        self.seconds[phase] += now - self._since
        self._since = now

    @contextlib.contextmanager
    def _in(self, phase: str) -> Iterator[None]:
        self._tick()
        self.busy[phase] += 1
        try:
            yield
        finally:
            self._tick()
            self.busy[phase] -= 1

    async def timed(self, phase: str, awaitable: Awaitable[Any]) -> Any:
        with self._in(phase):
            return await awaitable

    def split(self) -> dict[str, float]:
        """Seconds per phase since ``reset``."""
        self._tick()
        return dict(self.seconds)


class Timed:
    """A generator or tool client whose named coroutine methods count towards a ``PhaseClock``
    phase; every other attribute is the wrapped object's."""

    def __init__(self, inner: Any, clock: PhaseClock, phases: dict[str, str]) -> None:
        self._inner, self._clock, self._phases = inner, clock, phases

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        phase = self._phases.get(name)
        if phase is None:
            return attribute

        async def timed(*args: Any, **kwargs: Any) -> Any:
            return await self._clock.timed(phase, attribute(*args, **kwargs))

        return timed


INVOKER_PHASES = {
    "call_tools": "tools",
    "create_session": "tools",
    "release_session": "tools",
    "verify": "verify",
}


def task_kind(task: Task | None) -> str:
    """A held-out task's group in the per-kind success: its ``kind`` (built-in tasks) or
    its environment ``level``."""
    metadata = task.metadata if task else {}
    if metadata.get("kind"):
        return str(metadata["kind"])
    return f"level_{metadata['level']}" if metadata.get("level") is not None else "all"


def per_kind_stats(trajectories: Sequence[Trajectory], threshold: float, group_size: int) -> dict[str, float]:
    """Reward, success and prompt count per problem kind or environment level of a step
    (``success/<kind>``, ``reward_of/<kind>``, ``prompts/<kind>``); none for untagged rows."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        by_kind[task_kind(t.task)].append(float(t.reward_score or 0.0))
    out: dict[str, float] = {}
    for kind, rewards in sorted(by_kind.items()):
        if kind == "all":
            continue
        out[f"success/{kind}"] = sum(r >= threshold for r in rewards) / len(rewards)
        out[f"reward_of/{kind}"] = sum(rewards) / len(rewards)
        out[f"prompts/{kind}"] = float(len(rewards) // max(1, group_size))
    return out
