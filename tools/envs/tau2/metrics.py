"""τ²-bench's metrics as its leaderboard reports them, from per-trajectory verdicts.

τ² (``tau2.metrics.agent_metrics.compute_metrics``) reports the average reward over every
simulation, and pass^k for k = 1 .. the fewest trials any task has: per task,
C(successes, k) / C(trials, k) (the chance that k trials drawn from its n all succeed,
arXiv 2406.12045), averaged over the tasks. A trial succeeds when its reward is 1 within
1e-6. That module imports pandas, so the few lines are repeated here; the tests check
them against it.

Feed ``tau2_score`` one ``(task id, reward)`` per trajectory: the reward is τ²'s own (the
eval-mode ``tool_use`` score of a τ² pack, or its ``benchmark`` component).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tools.envs.tau2.verdict import is_successful

__all__ = ["Tau2Score", "pass_hat_k", "tau2_score"]


def pass_hat_k(num_trials: int, success_count: int, k: int) -> float:
    """τ²'s pass^k of one task: C(successes, k) / C(trials, k)."""
    if num_trials < k:
        raise ValueError(f"pass^{k} needs at least {k} trials of each task, got {num_trials}")
    return math.comb(success_count, k) / math.comb(num_trials, k)


@dataclass(frozen=True)
class Tau2Score:
    """τ²'s metrics of one pack: ``pass_hat[k]`` for k = 1 .. ``k``; ``uneven`` notes tasks
    with more trials than the fewest (τ² then stops at the fewest, as here)."""

    pack: str
    tasks: int
    trials: int
    avg_reward: float
    pass_hat: dict[int, float] = field(default_factory=dict)
    total_tasks: int | None = None  # tasks of the benchmark split, when known
    uneven: str = ""

    @property
    def k(self) -> int:
        return max(self.pass_hat, default=0)

    def table(self) -> str:
        """τ²'s summary (``display_metrics``), pass^k as the leaderboard's percentages."""
        of = f" of {self.total_tasks}" if self.total_tasks is not None else ""
        lines = [
            f"{self.pack}: {self.tasks}{of} tasks, {self.trials} trials",
            f"  average reward  {self.avg_reward:.4f}",
            *(f"  pass^{k:<2}         {value * 100:.2f}%" for k, value in self.pass_hat.items()),
        ]
        if self.total_tasks is not None and self.tasks < self.total_tasks:
            lines.append(
                f"  note: {self.total_tasks - self.tasks} tasks have no trial (τ² averages over the tasks run)"
            )
        if self.uneven:
            lines.append(f"  note: {self.uneven}")
        return "\n".join(lines)


def tau2_score(pack: str, verdicts: Iterable[tuple[str, float]], total_tasks: int | None = None) -> Tau2Score:
    """τ²'s average reward and pass^k from ``(task id, reward)`` pairs of one pack."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for task, reward in verdicts:
        rewards[task].append(float(reward))
    if not rewards:
        raise ValueError(f"no trajectories of {pack} to score")
    trials = [len(r) for r in rewards.values()]
    k = min(trials)
    uneven = ""
    if k < max(trials):
        uneven = f"tasks have {k} to {max(trials)} trials: pass^k up to k = {k}, the fewest (as τ² does)"
    successes = {task: sum(is_successful(r) for r in rs) for task, rs in rewards.items()}
    pass_hat = {
        j: sum(pass_hat_k(len(rewards[t]), successes[t], j) for t in rewards) / len(rewards)
        for j in range(1, k + 1)
    }
    every = [r for rs in rewards.values() for r in rs]
    return Tau2Score(pack, len(rewards), len(every), sum(every) / len(every), pass_hat, total_tasks, uneven)
