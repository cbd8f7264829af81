"""``PolicyRunConfig``: the fields ``train`` (``GRPOConfig``) and ``sft`` (``SFTConfig``) share, each
documented once (the flags of both commands come from these).

The policy and its optimizer, and the shape of a rollout: how a trajectory is rendered, cut and
scored. Give both commands the same rollout values and the SFT data is tokenized, spliced and
masked exactly as the GRPO run's rollouts will be. A subclass may change a default by declaring
the field again (without a doc: this one is kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer_client.rollout.types import RolloutConfig
from trainer_client.templates.render import TOOL_SCHEMA_MODES

__all__ = ["PolicyRunConfig"]


@dataclass(kw_only=True)
class PolicyRunConfig:
    """The fields of a run that trains a policy on trajectories rolled out against the tool server."""

    server: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000"])
    """tool server URL; repeat the flag for replicas"""
    model: str = "smollm2"
    """'smollm2' (the packaged SmolLM2-135M-Instruct) or a local HF model directory"""
    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1, ..."""
    threads: int | None = None
    """torch CPU threads (1 is fastest on a busy 2-core machine)"""
    seed: int = 0
    """data order and sampling seed"""

    micro_batch_size: int = 8
    """most rows in one forward/backward; gradients accumulate over micro-batches"""
    micro_batch_tokens: int = 1024
    """most padded tokens (beyond the prefix all rows share) in one forward/backward: the memory bound"""
    lr: float = 1e-5
    """AdamW learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    warmup_steps: int = 0
    """linear learning-rate warm-up steps"""
    max_grad_norm: float = 1.0
    """gradient clipping norm"""

    format: str = "hermes"
    """tool-call format: hermes, search_r1, llama3_json, pythonic"""
    toolset: str | None = None
    """server toolset the model may use"""
    tool_schemas: str = "auto"
    """tool schemas through the chat template: auto (where the template renders them and the
    prompt does not name the tools), server (always), none"""
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
    verifier: str = "math_equal"
    """server verifier scoring a trajectory (the reward)"""
    verifier_arguments: dict[str, Any] = field(default_factory=dict)
    """verifier arguments as JSON"""
    max_concurrency: int = 64
    """trajectories in flight at once"""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if isinstance(self.server, str):
            self.server = [self.server]
        for positive in ("micro_batch_size", "max_turns", "response_length"):
            value = getattr(self, positive)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}.{positive} must be a positive integer, got {value!r}")
        if self.lr <= 0:
            raise ValueError(f"{name}.lr must be positive, got {self.lr}")
        if self.tool_schemas not in TOOL_SCHEMA_MODES:
            raise ValueError(
                f"{name}.tool_schemas must be one of {', '.join(TOOL_SCHEMA_MODES)}, got {self.tool_schemas!r}"
            )

    def rollout_shape(
        self, sampling_params: dict[str, Any], verifier: str, arguments: dict[str, Any], **extra: Any
    ) -> RolloutConfig:
        """The ``RolloutConfig`` of these fields with ``sampling_params`` and the verifier given (and
        ``extra`` RolloutConfig fields): the one place both commands build a rollout from."""
        return RolloutConfig(
            format=self.format,
            max_turns=self.max_turns,
            max_calls_per_turn=self.max_calls_per_turn,
            max_obs_tokens=self.max_obs_tokens,
            response_length=self.response_length,
            sampling_params=sampling_params,
            toolset=self.toolset,
            verifier=verifier,
            verifier_arguments=dict(arguments),
            **extra,
        )
