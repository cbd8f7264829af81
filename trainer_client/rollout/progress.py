"""Progress of a batch of rollouts, in the log: a line when it starts, then at most one every
``every_s`` seconds as trajectories finish (done, elapsed, an estimate of the time left), and
one when the last is done. ``trainer-client train --verbose`` shows them, so a run is never
silent for the minutes a held-out evaluation or a step's rollouts take on a CPU."""

from __future__ import annotations

import logging
import time

__all__ = ["BatchProgress"]

logger = logging.getLogger("trainer_client.rollout")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class BatchProgress:
    def __init__(self, total: int, *, every_s: float = 15.0) -> None:
        self.total, self.every_s, self.done = total, every_s, 0
        self.started = self.last = time.monotonic()
        logger.info("rollout: %d trajectories started", total)

    def finished_one(self) -> None:
        self.done += 1
        now = time.monotonic()
        elapsed = now - self.started
        if self.done == self.total:
            logger.info("rollout: %d/%d trajectories done in %s", self.done, self.total, _duration(elapsed))
        elif now - self.last >= self.every_s:
            self.last = now
            left = elapsed / self.done * (self.total - self.done)  # trajectories finish in waves: rough
            logger.info(
                "rollout: %d/%d trajectories done (%s, about %s left)",
                self.done, self.total, _duration(elapsed), _duration(left),
            )  # fmt: skip
