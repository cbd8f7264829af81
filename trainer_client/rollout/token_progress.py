"""A progress line by model tokens, for the demo: how far a rollout is and how long is left, from its first seconds.

A trajectory takes tens of seconds on a CPU, so counting finished trajectories (a progress
bar) shows nothing for the first minute and then an ETA that jumps. ``GenerationProgress``
counts model tokens as the generator returns them instead: the rate is known after the first
batch, and the ETA is the tokens still expected over that rate. Until a trajectory has
finished, the expected tokens are the budget (turns x tokens per turn), so the first ETA is
an upper bound (``ETA <= ``); then the finished trajectories' mean.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CountingGenerator", "GenerationProgress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class CountingGenerator:
    """A generation backend that tells ``progress`` how many tokens each turn produced."""

    def __init__(self, generator: Any, progress: GenerationProgress) -> None:
        self._generator = generator
        self._progress = progress

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        output = await self._generator.generate(request_id, **kwargs)
        self._progress.add_tokens(len(output.token_ids))
        return output

    def __getattr__(self, name: str) -> Any:  # everything else is the backend's own
        return getattr(self._generator, name)


class GenerationProgress:
    """Model tokens and finished trajectories over time, as one line (``line``) or a ticker (``run``)."""

    def __init__(
        self,
        total_trajectories: int,
        max_tokens_per_trajectory: int,
        finished: Callable[[], list[dict[str, Any]]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total_trajectories
        self.budget = max_tokens_per_trajectory
        self.finished = finished  # the records of the trajectories that finished so far
        self.clock = clock
        self.started = clock()
        self.tokens = 0
        self.first_tokens_at: float | None = None

    def wrap(self, generator: Any) -> CountingGenerator:
        return CountingGenerator(generator, self)

    def add_tokens(self, n: int) -> None:
        if self.first_tokens_at is None:
            self.first_tokens_at = self.clock()
        self.tokens += n

    def line(self) -> str:
        now = self.clock()
        records = self.finished()
        done = len(records)
        head = f"{format_duration(now - self.started)}: {done}/{self.total} trajectories"
        if not self.tokens:
            return f"{head}, generating the first turns (up to {self.budget} tokens per trajectory)"
        rate = self.tokens / max(now - self.started, 1e-9)
        head += f", {self.tokens:,} model tokens ({rate:.1f}/s)"
        if done >= self.total:
            return head
        if done:  # the finished trajectories' mean; what runs now has produced part of it already
            mean = sum(_model_tokens(r) for r in records) / done
            expected, bound = max(mean * self.total, self.tokens), "~"
        else:
            expected, bound = max(float(self.budget * self.total), float(self.tokens)), "<= "
        return f"{head}, ETA {bound}{format_duration((expected - self.tokens) / rate)}"

    async def run(self, say: Callable[[str], None], interval_s: float = 10.0) -> None:
        """``say`` a line at once, then every ``interval_s`` until cancelled."""
        while True:
            say(self.line())
            await asyncio.sleep(interval_s)


def _model_tokens(record: dict[str, Any]) -> int:
    mask = record.get("response_mask") or ()
    return sum(1 for m in mask if m)
