"""``SFTConfig``: every knob of a supervised warm start, each with its doc (the ``sft`` flags come from these).

Kept apart from ``sft.py`` so that the command line can be built without importing torch. The
rollout fields (``format`` ... ``verifier_arguments``) shape the replay of gold turns and take
the same names and meaning as ``GRPOConfig``'s: give both commands the same values, so the SFT
data is tokenized, spliced and masked exactly as the GRPO run's rollouts will be.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from trainer_client.rollout.types import RolloutConfig
from trainer_client.templates.render import TOOL_SCHEMA_MODES

__all__ = ["EXPORTS", "SFTConfig"]

EXPORTS = ("none", "verl-parquet")


@dataclass
class SFTConfig:
    """Every knob of a warm start; ``trainer-client sft --help`` shows each with the text under it."""

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

    server: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000"])
    """tool server URL (the gold replay's tools and verifier)"""
    model: str = "smollm2"
    """'smollm2' (the packaged SmolLM2-135M-Instruct) or a local HF model directory"""
    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1, ..."""
    dtype: str | None = None
    """compute dtype, float32 or bfloat16 (weights and AdamW stay float32); unset: float32 on a CPU
    without native bf16, else bfloat16"""
    threads: int | None = None
    """torch CPU threads"""
    seed: int = 0
    """data order seed"""

    epochs: int = 2
    """passes over the examples"""
    batch_size: int = 8
    """trajectories per optimizer step"""
    micro_batch_size: int = 8
    """most rows in one forward/backward; gradients accumulate over micro-batches"""
    micro_batch_tokens: int = 2048
    """most padded tokens (beyond the prefix all rows share) in one forward/backward: the memory bound"""
    lr: float = 2e-5
    """AdamW learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    warmup_steps: int = 0
    """linear learning-rate warm-up steps"""
    max_grad_norm: float = 1.0
    """gradient clipping norm"""
    max_examples: int | None = None
    """use at most this many trajectories"""
    max_minutes: float | None = None
    """stop training once it has run this long (the model is saved as it is then)"""
    loss_sample: int = 16
    """trajectories the loss before and after training is measured on (a seeded sample; 0: all)"""

    format: str = "hermes"
    """tool-call format: hermes, search_r1, llama3_json, pythonic"""
    toolset: str | None = None
    """server toolset the model may use"""
    tool_schemas: str = "auto"
    """tool schemas through the chat template: auto, server, none (as trainer-client train)"""
    max_turns: int = 4
    """assistant turns per trajectory"""
    max_calls_per_turn: int = 4
    """tool calls run per turn"""
    max_obs_tokens: int = 128
    """tokens one observation turn may add"""
    response_length: int = 384
    """response tokens per trajectory, model and tools together"""
    max_tokens_per_turn: int = 128
    """tokens one generation turn may produce"""
    verifier: str = "tool_use"
    """server verifier scoring the gold replays"""
    verifier_arguments: dict[str, Any] = field(default_factory=dict)
    """verifier arguments as JSON"""
    max_concurrency: int = 32
    """gold replays in flight at once"""

    def __post_init__(self) -> None:
        if isinstance(self.server, str):
            self.server = [self.server]
        if isinstance(self.trajectories, str):
            self.trajectories = [self.trajectories]
        if not self.trajectories and not self.gold:
            raise ValueError("nothing to learn from: give --gold (with --train-data) or --trajectories")
        if self.gold and not self.train_data:
            raise ValueError("--gold needs --train-data: the training rows its turns are replayed on")
        for name in ("epochs", "batch_size", "micro_batch_size", "max_turns", "response_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SFTConfig.{name} must be a positive integer, got {value!r}")
        if self.lr <= 0:
            raise ValueError(f"SFTConfig.lr must be positive, got {self.lr}")
        if self.export not in EXPORTS:
            raise ValueError(f"SFTConfig.export must be one of {', '.join(EXPORTS)}, got {self.export!r}")
        if self.tool_schemas not in TOOL_SCHEMA_MODES:
            raise ValueError(
                f"SFTConfig.tool_schemas must be one of {', '.join(TOOL_SCHEMA_MODES)}, got {self.tool_schemas!r}"
            )

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
        return RolloutConfig(
            format=self.format,
            max_turns=self.max_turns,
            max_calls_per_turn=self.max_calls_per_turn,
            max_obs_tokens=self.max_obs_tokens,
            response_length=self.response_length,
            sampling_params={"temperature": 0.0, "top_p": 1.0, "max_tokens": self.max_tokens_per_turn},
            toolset=self.toolset,
            verifier=self.verifier,
            verifier_arguments=dict(self.verifier_arguments),
        )
