"""``GRPOConfig``: every knob of a local GRPO run, each with its doc (the ``train`` flags come from these).

Kept apart from ``grpo.py`` so that the command line can be built without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from trainer_client.rollout.types import RolloutConfig
from trainer_client.training.policy_run_config import PolicyRunConfig

__all__ = ["GRPOConfig"]


@dataclass
class GRPOConfig(PolicyRunConfig):
    """Every knob of a run; ``trainer-client train --help`` shows each with the text under it (the
    policy's and the rollout's in ``PolicyRunConfig``, shared with ``SFTConfig``)."""

    train_data: str
    """training split, veRL-format parquet (python -m tools.data build)"""
    eval_data: str | None = None
    """held-out split, veRL-format parquet"""
    out_dir: str = "runs/grpo"
    """run folder: metrics, tensorboard, plot, checkpoints"""
    dtype: str = "float32"
    """compute dtype, float32 or bfloat16: the weights and AdamW stay float32 either way (bfloat16 runs
    the forward passes under torch.autocast; checkpoints are float32)"""

    steps: int = 20
    """optimizer steps in total"""
    prompts_per_step: int = 8
    """prompts per step"""
    group_size: int = 8
    """rollouts per prompt: the GRPO group"""
    max_num_gen_batches: int = 1
    """DAPO's dynamic sampling (veRL's algorithm.filter_groups.max_num_gen_batches) when above 1: while
    fewer than prompts_per_step groups have a reward spread, roll out another prompts_per_step prompts,
    up to this many batches a step; the update then takes up to prompts_per_step groups with a spread
    and drops the rest (1: one batch, every group in the update)"""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas"""

    clip_ratio: float = 0.2
    """PPO clip ratio"""
    clip_ratio_high: float | None = None
    """upper PPO clip ratio (DAPO's clip-higher, e.g. 0.28); unset: clip_ratio"""
    loss_agg_mode: str = "token-mean"
    """veRL agg_loss mode"""
    norm_adv_by_std: bool = True
    """divide advantages by the group's std (--no-norm-adv-by-std: Dr.GRPO)"""
    kl_coef: float = 0.0
    """KL-to-reference loss coefficient; 0 loads no reference model"""
    kl_type: str = "low_var_kl"
    """veRL kl_penalty type"""
    entropy_coeff: float = 0.0
    """entropy bonus coefficient"""

    user_tool: str = "llm"
    """server tool playing the simulated user of rows with a user scenario (extra_info.user_sim)"""
    max_user_turns: int = 10
    """messages the simulated user may send per trajectory"""
    temperature: float = 1.0
    """sampling temperature of training rollouts"""
    top_p: float = 1.0
    """nucleus sampling of training rollouts"""
    generation_batch_size: int = 32
    """rows decoded together"""
    engine: str = "hf"
    """what generates the rollouts: hf (the policy itself, in this process) or vllm (a vLLM server; the
    update stays on the HF policy, whose weights vLLM reloads before each step's rollouts)"""
    engine_url: str | None = None
    """the vLLM server of engine=vllm, started with weight sync (trainer-client serve-model --weight-sync)
    for the same model; unset: the trainer starts its own from .venv-vllm (make vllm)"""

    eval_every: int = 5
    """evaluate every N steps; 0: only at the start and the end"""
    eval_size: int = 64
    """held-out rows evaluated"""
    eval_temperature: float = 0.0
    """held-out sampling temperature (0: greedy)"""
    eval_samples: int = 1
    """rollouts per held-out problem (useful when eval_temperature > 0)"""
    greedy_eval: bool = False
    """also evaluate greedily at the start and the end (split 'eval_greedy')"""
    eval_verifier: str | None = None
    """verifier for held-out success (unset: --verifier)"""
    eval_verifier_arguments: dict[str, Any] | None = None
    """its arguments as JSON"""
    success_threshold: float = 1.0
    """held-out score counted as a success"""
    eval_at_start: bool = True
    """evaluate before step 1 (the baseline)"""
    save_every: int = 10
    """checkpoint every N steps; 0 disables"""
    keep_checkpoints: int = 2
    """checkpoints kept"""
    resume: bool = True
    """resume from the out dir's latest checkpoint"""
    tensorboard: bool = True
    """TensorBoard events next to metrics.jsonl"""
    plot: bool = True
    """write reward_curve.png at the end"""
    max_train_rows: int | None = None
    """use only the first N training rows"""
    curriculum: bool = False
    """draw each step's prompts by task level (a row's extra_info.level): the lowest level not yet
    solved (the frontier) and, for review, the levels below it (trainer_client/training/curriculum.py)"""
    curriculum_promote_at: float = 0.5
    """move the curriculum's frontier up once its recent groups' mean success reaches this"""
    curriculum_window: int = 8
    """recent groups per level the curriculum reads (a promotion needs at least half of them)"""
    curriculum_review: float = 0.25
    """share of a step's prompts drawn from the levels below the curriculum's frontier"""
    max_minutes: float | None = None
    """stop training once the run is this old (then evaluate)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        for name in ("steps", "prompts_per_step", "group_size", "max_num_gen_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GRPOConfig.{name} must be a positive integer, got {value!r}")
        if self.group_size < 2:
            raise ValueError(
                "GRPOConfig.group_size must be at least 2: GRPO normalizes rewards within a group"
            )
        if self.kl_coef < 0 or self.entropy_coeff < 0:
            raise ValueError("kl_coef and entropy_coeff must not be negative")
        if self.eval_every < 0 or self.save_every < 0:
            raise ValueError("eval_every and save_every must be >= 0 (0 disables)")
        if self.clip_ratio_high is not None and self.clip_ratio_high < self.clip_ratio:
            raise ValueError(
                f"GRPOConfig.clip_ratio_high ({self.clip_ratio_high}) must be >= clip_ratio ({self.clip_ratio})"
            )
        if not 0.0 < self.curriculum_promote_at <= 1.0 or not 0.0 <= self.curriculum_review < 1.0:
            raise ValueError(
                "GRPOConfig.curriculum_promote_at must be in (0, 1] and curriculum_review in [0, 1), got "
                f"{self.curriculum_promote_at} and {self.curriculum_review}"
            )
        if self.curriculum_window < 1:
            raise ValueError(f"GRPOConfig.curriculum_window must be at least 1, got {self.curriculum_window}")
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"GRPOConfig.engine must be hf or vllm, got {self.engine!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GRPOConfig:
        """Build from a mapping (a YAML file); unknown keys are an error that names them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown GRPO config keys {unknown}; known: {sorted(known)}")
        return cls(**values)

    def rollout_config(self, *, eval_mode: bool = False, temperature: float | None = None) -> RolloutConfig:
        if temperature is None:
            temperature = self.eval_temperature if eval_mode else self.temperature
        verifier, arguments = self.verifier, self.verifier_arguments
        if eval_mode and self.eval_verifier is not None:
            verifier, arguments = self.eval_verifier, self.eval_verifier_arguments or {}
        sampling = {
            "temperature": temperature,
            "top_p": 1.0 if eval_mode else self.top_p,
            "max_tokens": self.max_tokens_per_turn,
        }
        return self.rollout_shape(
            sampling, verifier, arguments, user_tool=self.user_tool, max_user_turns=self.max_user_turns
        )
