"""The engine-agnostic rollout core: generate → parse → invoke → update, per trajectory, all
trajectories at once.

* ``core``: ``RolloutCore``, the loop itself;
* ``types``: what it consumes and produces (``RolloutConfig``, ``Task``, ``Trajectory``, ...);
* ``state``: one trajectory's mutable state while it runs; ``parse``: one turn parsed;
* ``observations`` and ``observation_budget``: the texts shown besides tool results, and one
  turn's observations fitted to ``max_obs_tokens``;
* ``user_turns`` and ``user_sim``: later user turns, static or from a simulated user;
* ``dataset``: tasks from veRL-format parquet; ``runner``: rows rolled out, each record
  written as it finishes (``records``: one JSONL line per trajectory); ``summary``: the
  numbers of a run.
"""

from trainer_client.rollout.core import RolloutCore
from trainer_client.rollout.types import (
    TRUNCATION_MARKER,
    RolloutConfig,
    StopReason,
    Task,
    ToolInvoker,
    Trajectory,
    Verifier,
)

__all__ = [
    "TRUNCATION_MARKER",
    "RolloutConfig",
    "RolloutCore",
    "StopReason",
    "Task",
    "ToolInvoker",
    "Trajectory",
    "Verifier",
]
