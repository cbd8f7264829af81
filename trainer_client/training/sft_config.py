"""``SFTConfig``: every knob of a supervised warm start, each with its doc (the ``sft`` flags come from these).

Kept apart from ``sft.py`` so that the command line can be built without importing torch. The
rollout fields (``PolicyRunConfig``'s, the same as ``GRPOConfig``'s) shape the replay of gold
turns: give both commands the same values, so the SFT data is tokenized, spliced and masked
exactly as the GRPO run's rollouts will be.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from trainer_client.rollout.types import RolloutConfig
from trainer_client.training.policy_run_config import PolicyRunConfig

__all__ = ["EXPORTS", "SFTConfig"]

EXPORTS = ("none", "verl-parquet")


@dataclass
class SFTConfig(PolicyRunConfig):
    """Every knob of a warm start; ``trainer-client sft --help`` shows each with the text under it (the
    policy's and the rollout's in ``PolicyRunConfig``, shared with ``GRPOConfig``)."""

    trajectories: list[str] = field(default_factory=list)
    """rollout JSONL files (trainer-client rollout --out) to learn from: the policy's own successful
    rollouts (rejection sampling; repeat the flag for several files)"""
    gold: str | None = None
    """gold turns JSONL ({"task": id, "turns": [...]} a line, tools.data.gold), replayed on --train-data's
    rows against the tool server"""
    train_data: str | None = None
    """training split, veRL-format parquet: the rows --gold is replayed on (rows of another split are
    refused)"""
    held_out: str | None = None
    """held-out split parquet (the GRPO run's --eval-data): a trajectory of one of its tasks (same
    prompt and ground truth) is an error, never data"""
    min_reward: float = 1.0
    """a trajectory is learned from only if its reward reaches this (gold replays and rollouts alike)"""
    out_dir: str = "runs/sft"
    """run folder: model/ (the warm-started HF model: trainer-client train --model <out_dir>/model),
    metrics.jsonl, summary.json, gold.jsonl"""
    export: str = "none"
    """also write the rendered data as <out_dir>/sft.parquet: verl-parquet (veRL's multi-turn SFT
    trainer; token-exact through trainer_client.verl.sft_dataset)"""
    train: bool = True
    """train the model (--no-train: only render, filter and export)"""

    dtype: str | None = None
    """compute dtype, float32 or bfloat16 (weights and AdamW stay float32); unset: float32 on a CPU
    without native bf16, else bfloat16"""

    epochs: int = 2
    """passes over the examples"""
    batch_size: int = 8
    """trajectories per optimizer step"""
    max_examples: int | None = None
    """use at most this many trajectories"""
    max_steps: int | None = None
    """stop after this many optimizer steps, in the seeded order (unlike --max-minutes, the same
    warm start on any machine)"""
    max_minutes: float | None = None
    """stop training once it has run this long (the model is saved as it is then)"""
    loss_sample: int = 16
    """trajectories the loss before and after training is measured on (a seeded sample; 0: all)"""

    # PolicyRunConfig's fields with other defaults (their docs are PolicyRunConfig's)
    micro_batch_tokens: int = 2048
    lr: float = 2e-5
    verifier: str = "tool_use"
    max_concurrency: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.trajectories, str):
            self.trajectories = [self.trajectories]
        if not self.trajectories and not self.gold:
            raise ValueError("nothing to learn from: give --gold (with --train-data) or --trajectories")
        if self.gold and not self.train_data:
            raise ValueError("--gold needs --train-data: the training rows its turns are replayed on")
        for name in ("epochs", "batch_size", "max_steps"):
            value = getattr(self, name)
            if value is None and name == "max_steps":
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SFTConfig.{name} must be a positive integer, got {value!r}")
        if self.export not in EXPORTS:
            raise ValueError(f"SFTConfig.export must be one of {', '.join(EXPORTS)}, got {self.export!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SFTConfig:
        """Build from a mapping (a YAML file); unknown keys are an error that names them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown SFT config keys {unknown}; known: {sorted(known)}")
        return cls(**values)

    def rollout_config(self) -> RolloutConfig:
        """The rollout the gold turns are replayed in (GRPOConfig.rollout_config's shape)."""
        greedy = {"temperature": 0.0, "top_p": 1.0, "max_tokens": self.max_tokens_per_turn}
        return self.rollout_shape(greedy, self.verifier, self.verifier_arguments)
