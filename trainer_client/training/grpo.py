"""A single-process GRPO trainer: rollouts against the tool server, veRL's losses, one device.

Why it exists: veRL needs Ray, GPUs and vLLM/SGLang; this trainer runs the same algorithm
on a laptop CPU (or one GPU) with an HF model, so that a tool environment can be tried,
debugged and shown to learn before a cluster run. The algorithm pieces are veRL's own
(``verl.trainer.ppo.core_algos``): the group-normalized outcome advantage, the clipped
policy loss, ``kl_penalty`` and ``agg_loss`` with veRL's global token normalization.

Read it top to bottom: the config, the batch, the advantages, the loss, then the trainer,
whose ``train()`` is the loop. What is not the loop lives beside it: ``step_metrics`` (where a
step's time goes, per-kind figures), ``curriculum`` (which levels a step draws from),
``checkpoints`` (the state a rerun resumes from). One step:

1. **Rollout**: ``prompts_per_step`` prompts, each ``group_size`` times, through the
   rollout core (generate -> parse -> call tools over HTTP -> splice observations with
   loss mask 0) on the policy itself, rewarded by the server's ``/v1/verify``. With
   ``max_num_gen_batches`` > 1 (DAPO's dynamic sampling) more prompts are rolled out while
   fewer than ``prompts_per_step`` groups have a reward spread, and only such groups train.
2. **Advantage**: veRL's GRPO outcome advantage, broadcast over ``response_mask``, so
   observation (tool) tokens get advantage 0.
3. **Update**: micro-batches with gradient accumulation; rows of groups whose rewards
   are all equal carry no signal and (without KL or entropy terms) are skipped. One
   AdamW step per rollout batch (on-policy: the old log-probs are the current ones
   detached, so the PPO ratio is 1 at the step).
4. **Log, evaluate, save**: metrics as JSONL and TensorBoard, a held-out evaluation every
   ``eval_every`` steps, a checkpoint every ``save_every`` steps (a rerun resumes). A step's
   record splits its time (``time/generate_s``, ``time/tools_s``, ``time/verify_s``,
   ``time/rollout_other_s``: the rollout's wall time by what was in flight, ``PhaseClock``;
   then ``time/update_s``) and gives reward and success per problem kind or environment
   level (``success/<kind>``, ``reward_of/<kind>``, ``prompts/<kind>``).

With ``curriculum`` the prompts are drawn by task level (``training/curriculum.py``): from
the lowest level the model does not yet solve, plus a review share of the levels below;
its frontier and each level's recent success are logged as ``curriculum/...``.

Precision: the weights, their gradients and AdamW's state are float32 whatever ``dtype``;
``dtype=bfloat16`` runs the forward passes (the update's and generation's) under
``torch.autocast``, so the update keeps what AdamW meant (bfloat16 weights round most of a
step at lr 1e-5 away) and the policy sampled is the policy trained. Checkpoints are float32.

Speed lives elsewhere: the prompt prefix all rows share (system text, worked examples)
is computed once per step by the generator (``backends.hf_prefix``) and by the log-prob
computation (``logprobs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import random
import resource
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_client.backends.hf_prefix import (
    SharedPrefixGenerator,
    common_prefix_length,
    prompt_prefix,
    use_gqa_decode_attention,
)
from trainer_client.backends.models import autocast, load_model, torch_dtype
from trainer_client.rollout.core import RolloutConfig, RolloutCore, Task, Trajectory
from trainer_client.rollout.dataset import TaskRow, load_tasks
from trainer_client.rollout.summary import (
    METRICS_FILE,
    PLOT_FILE,
    RunLog,
    plot_reward_curve,
    summarize_run,
    trajectory_stats,
)
from trainer_client.templates.render import openai_tool_schemas, prompt_tools
from trainer_client.training.checkpoints import (
    latest_checkpoint,
    load_checkpoint,
    restore_trainer_state,
    save_checkpoint,
    trainer_state,
)
from trainer_client.training.config import GRPOConfig
from trainer_client.training.curriculum import LevelCurriculum, level_curriculum, next_of_level
from trainer_client.training.logprobs import response_logprobs, shared_prefix
from trainer_client.training.step_metrics import INVOKER_PHASES, PhaseClock, Timed, per_kind_stats, task_kind

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "PhaseClock",
    "RolloutBatch",
    "grpo_advantages",
    "per_kind_stats",
    "policy_loss_terms",
]

logger = logging.getLogger(__name__)
_kind = task_kind  # the name tests/trainer/training/test_grpo.py imports


# --------------------------------------------------------------------------- configuration
# GRPOConfig (trainer_client/training/config.py) holds every knob with its doc; it lives in its own
# module so that building the command line does not import torch.


def task_from_row(row: dict[str, Any]) -> Task:
    """One veRL-format dataset row -> a rollout ``Task`` (see ``dataset.TaskRow.task``)."""
    return TaskRow.from_row(row).task()


# --------------------------------------------------------------------------- the batch


@dataclass
class RolloutBatch:
    """A step's trajectories as padded tensors (veRL layout: responses right-padded).

    ``has_signal`` marks the rows of groups whose rewards differ: only those carry a
    policy gradient (a group of equal rewards has advantage 0, up to rounding noise).
    """

    trajectories: list[Trajectory]
    group_index: np.ndarray
    response_mask: torch.Tensor  # (rows, R): 1 = model token
    rewards: torch.Tensor  # (rows,)
    token_level_rewards: torch.Tensor  # (rows, R): reward at each row's last response token
    has_signal: list[bool]

    @classmethod
    def build(cls, trajectories: list[Trajectory], group_index: Sequence[int]) -> RolloutBatch:
        width = max(max((len(t.response_ids) for t in trajectories), default=0), 1)
        rows = len(trajectories)
        mask = torch.zeros((rows, width), dtype=torch.float32)
        rewards = torch.tensor([float(t.reward_score or 0.0) for t in trajectories], dtype=torch.float32)
        token_rewards = torch.zeros((rows, width), dtype=torch.float32)
        for i, t in enumerate(trajectories):
            n = len(t.response_ids)
            if n:
                mask[i, :n] = torch.tensor(t.response_mask, dtype=torch.float32)
                token_rewards[i, n - 1] = rewards[i]
        rewards_of: dict[int, set[float]] = defaultdict(set)
        for g, r in zip(group_index, rewards.tolist(), strict=True):
            rewards_of[int(g)].add(r)
        has_signal = [len(rewards_of[int(g)]) > 1 for g in group_index]
        return cls(trajectories, np.asarray(group_index), mask, rewards, token_rewards, has_signal)

    def signal_groups(self) -> list[int]:
        """The groups whose rewards differ, in order."""
        return sorted({int(g) for g, signal in zip(self.group_index, self.has_signal, strict=True) if signal})

    @classmethod
    def of_groups(cls, trajectories: list[Trajectory], group_size: int) -> RolloutBatch:
        """The batch of consecutive groups of ``group_size`` rows (as a step rolls them out)."""
        return cls.build(trajectories, [i // group_size for i in range(len(trajectories))])


def micro_batches(
    trajectories: Sequence[Trajectory], indices: Sequence[int], max_rows: int, max_tokens: int
) -> list[list[int]]:
    """Split rows into micro-batches of similar length, each within both budgets.

    Rows are sorted by length, so little of a micro-batch is padding, and packed while
    ``rows x padded length`` (prompt beyond the prefix all rows share, plus response)
    stays within ``max_tokens``: activation memory grows with that product (one
    over-long row gets a micro-batch to itself).
    """
    if not indices:
        return []
    shared = common_prefix_length([t.prompt_ids for t in trajectories])
    lengths = {
        i: len(t.prompt_ids) - shared + len(t.response_ids)
        for i, t in zip(indices, trajectories, strict=True)
    }
    batches: list[list[int]] = []
    current: list[int] = []
    for i in sorted(indices, key=lambda i: lengths[i], reverse=True):
        width = max([lengths[j] for j in current] + [lengths[i]])
        if current and (len(current) + 1 > max_rows or (len(current) + 1) * width > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    batches.append(current)
    return batches


# --------------------------------------------------------------------------- advantages


def clipped_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float, step: int
) -> float:
    """Clip the gradients to ``max_norm`` and take the optimizer step unless their norm is not
    finite (then the update of step ``step`` is skipped, with a warning); the norm."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        logger.warning("non-finite gradient norm at step %d; update skipped", step)
    return grad_norm


def grpo_advantages(batch: RolloutBatch, norm_adv_by_std: bool = True) -> torch.Tensor:
    """veRL's GRPO outcome advantage: (reward - group mean) / group std, on model tokens only."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    advantages, _returns = compute_grpo_outcome_advantage(
        token_level_rewards=batch.token_level_rewards,
        response_mask=batch.response_mask,
        index=batch.group_index,
        norm_adv_by_std_in_grpo=norm_adv_by_std,
    )
    return advantages


# --------------------------------------------------------------------------- the loss


def actor_loss_config(config: GRPOConfig, *, batch_num_tokens: int, global_batch_size: int) -> Any:
    """veRL's ``ActorConfig`` for the policy-loss functions, with the whole step's token count.

    ``global_batch_info`` makes ``agg_loss`` divide each micro-batch by the step's total
    tokens (not its own), so the accumulated gradient equals the full-batch one.
    """
    from verl.workers.config import ActorConfig

    actor = ActorConfig(
        strategy="fsdp",
        rollout_n=config.group_size,
        ppo_mini_batch_size=config.prompts_per_step,
        ppo_micro_batch_size_per_gpu=config.micro_batch_size,
        clip_ratio=config.clip_ratio,
        clip_ratio_low=config.clip_ratio,
        clip_ratio_high=config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high,
        loss_agg_mode=config.loss_agg_mode,
        entropy_coeff=config.entropy_coeff,
        use_kl_loss=config.kl_coef > 0,
        kl_loss_coef=config.kl_coef,
        kl_loss_type=config.kl_type,
        use_torch_compile=False,
    )
    actor.global_batch_info.update(
        dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size
    )
    return actor


def policy_loss_terms(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    actor_config: Any,
    ref_log_prob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor loss of one micro-batch, exactly as veRL's actor composes it.

    policy loss (``vanilla`` clipped objective) + ``kl_loss_coef`` * KL(policy, ref) via
    ``kl_penalty`` - ``entropy_coeff`` * entropy, each aggregated by ``agg_loss`` with
    ``response_mask``: tokens with mask 0 (observations, padding) contribute nothing.
    """
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty

    info = actor_config.global_batch_info
    mode = actor_config.loss_agg_mode
    policy_loss_fn = get_policy_loss_fn(actor_config.policy_loss.loss_mode)
    pg_loss, pg_metrics = policy_loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=mode,
        config=actor_config,
    )
    loss = pg_loss
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        **{k.split("/")[-1]: float(v) for k, v in pg_metrics.items()},
    }
    if ref_log_prob is not None and actor_config.use_kl_loss:
        kld = kl_penalty(log_prob, ref_log_prob, actor_config.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=mode, **info)
        loss = loss + actor_config.kl_loss_coef * kl_loss
        metrics["kl_loss"] = float(kl_loss.detach())
    if entropy is not None and actor_config.entropy_coeff > 0:
        entropy_loss = agg_loss(loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=mode, **info)
        loss = loss - actor_config.entropy_coeff * entropy_loss
    return loss, metrics


# --------------------------------------------------------------------------- the trainer
# (where a step's time goes and its per-kind figures: training/step_metrics.py)


class GRPOTrainer:
    """Runs a ``GRPOConfig``: ``asyncio.run(GRPOTrainer(config).train())``.

    The constructor loads everything (data, model, optimizer, rollout cores, the last
    checkpoint of ``out_dir``), so ``train_step()`` and ``evaluate()`` work on their own.
    ``invoker`` (a ``ToolClient`` built from ``config.server`` by default) runs the tools
    and verifiers; pass your own to reuse a client (then you close it).
    """

    def __init__(self, config: GRPOConfig, *, invoker: Any = None) -> None:
        from trainer_client.client.tool_client import ToolClient

        self._started = time.perf_counter()
        self.elapsed_before_s = 0.0  # wall time of earlier processes of this run (resume)
        self.config = cfg = config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.out_dir = Path(cfg.out_dir).expanduser()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.train_tasks = [row.task() for row in load_tasks(cfg.train_data, limit=cfg.max_train_rows)]
        self.eval_tasks = (
            [row.task() for row in load_tasks(cfg.eval_data, limit=cfg.eval_size)] if cfg.eval_data else []
        )

        self.compute_dtype = torch_dtype(cfg.dtype)
        if self.compute_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"GRPOConfig.dtype must be float32 or bfloat16, got {cfg.dtype!r} "
                "(float16 would need loss scaling, which this trainer does not do)"
            )
        # Master weights in float32 whatever ``dtype``: an AdamW step at lr 1e-5 is below half a
        # bfloat16 ulp of most weights, so bfloat16 weights would round ~90 % of each update
        # away. ``dtype`` is the compute dtype (torch.autocast) of the update and of generation.
        self.tokenizer, self.model = load_model(cfg.model, device=cfg.device, dtype=torch.float32)
        self.pad_token_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        if cfg.device == "cpu":
            use_gqa_decode_attention(self.model)
        self.ref_model = None  # the policy the run started from, for the KL term
        if cfg.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )

        if cfg.engine == "vllm":  # rollouts on vLLM; weights pushed to it before each step's rollouts
            from trainer_client.training.vllm_policy import VLLMPolicyEngine

            self.generator: Any = VLLMPolicyEngine(
                cfg.model,
                self.out_dir,
                url=cfg.engine_url,
                max_concurrency=cfg.max_concurrency,
                default_max_tokens=cfg.max_tokens_per_turn,
            )
        else:
            self.generator = SharedPrefixGenerator(
                self.model,
                self.tokenizer,
                max_batch_size=cfg.generation_batch_size,
                default_max_tokens=cfg.max_tokens_per_turn,
                compute_dtype=self.compute_dtype,  # samples from the policy the update computes
            )
        self._owns_invoker = invoker is None
        self.invoker = invoker if invoker is not None else ToolClient(cfg.server, toolset=cfg.toolset)
        self.clock = PhaseClock()
        self.train_core = self._core(cfg.rollout_config())
        self.eval_core = self._core(cfg.rollout_config(eval_mode=True))
        self.greedy_core = (
            self._core(cfg.rollout_config(eval_mode=True, temperature=0.0))
            if cfg.greedy_eval and cfg.eval_temperature > 0
            else None
        )
        self._tools_shown = False

        self.step, self.epoch, self.cursor = 0, 0, 0  # cursor: position in the shuffled training order
        self.order: list[int] = []
        self.curriculum = self._curriculum() if cfg.curriculum else None
        self.level_cursors: dict[int, int] = {}  # curriculum: position in each level's shuffled order
        self.level_epochs: dict[int, int] = {}
        self.log = RunLog(self.out_dir, tensorboard=cfg.tensorboard)
        if cfg.resume:
            self._resume()
        if not self.order:
            self._shuffle()
        (self.out_dir / "config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Forward passes in ``config.dtype`` (entered in the thread that runs them)."""
        return autocast(self.model.device, self.compute_dtype)

    def _core(self, rollout: RolloutConfig) -> RolloutCore:
        generator = Timed(self.generator, self.clock, {"generate": "generate"})
        invoker = Timed(self.invoker, self.clock, INVOKER_PHASES)
        return RolloutCore(self.tokenizer, generator, invoker, rollout, verifier=invoker)

    def _curriculum(self) -> LevelCurriculum:
        curriculum, self.tasks_of_level = level_curriculum(
            [t.metadata.get("level") for t in self.train_tasks], self.config
        )
        return curriculum

    # ------------------------------------------------------------------ the loop

    async def train(self) -> dict[str, Any]:
        """Run the remaining steps (all of them, or from the last checkpoint). Returns the run's summary."""
        cfg = self.config
        try:
            if self.step == 0 and cfg.eval_at_start:
                await self.evaluate_all()
            while self.step < cfg.steps:
                if cfg.max_minutes is not None and self.elapsed_s() > 60.0 * cfg.max_minutes:
                    logger.warning("time budget of %.0f min reached at step %d", cfg.max_minutes, self.step)
                    break
                record = await self.train_step()
                logger.info(
                    "step %d reward %.3f success %.3f (%.0f s)",
                    record["step"],
                    record["reward"],
                    record["success"],
                    record["time/step_s"],
                )
                if cfg.eval_every and self.step % cfg.eval_every == 0:
                    await self.evaluate()
                if cfg.save_every and (self.step % cfg.save_every == 0 or self.step == cfg.steps):
                    self.save_checkpoint()
            if not cfg.eval_every or self.step % cfg.eval_every != 0:
                await self.evaluate()
            await self.evaluate(greedy=True)
        finally:
            await self.close()
        if cfg.plot:
            plot_reward_curve(self.out_dir / METRICS_FILE, self.out_dir / PLOT_FILE)
        summary = summarize_run(self.out_dir / METRICS_FILE)
        summary["wall_s_this_process"] = time.perf_counter() - self._started
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    async def train_step(self) -> dict[str, Any]:
        """One step: sample prompts, roll out each group, advantages, one update; returns the logged record."""
        cfg = self.config
        await self._show_tools()
        t0, cpu0 = time.perf_counter(), time.process_time()
        sync_s = await self._sync_engine()
        self.model.eval()
        self.generator.clear_prefix_cache()
        self.clock.reset()
        prompts: list[Task] = []
        trajectories: list[Trajectory] = []
        for draw in range(cfg.max_num_gen_batches):  # more than one: dynamic sampling
            drawn = self._next_prompts(draw)
            tasks = [p for p in drawn for _ in range(cfg.group_size)]
            trajectories += await self.train_core.run_batch(tasks, max_concurrency=cfg.max_concurrency)
            prompts += drawn
            spread = RolloutBatch.of_groups(trajectories, cfg.group_size).signal_groups()
            if len(spread) >= cfg.prompts_per_step:
                break
        phases = self.clock.split()
        phased_s = sum(phases.values())  # the rollout's wall time, split by what was in flight
        rollout_s = time.perf_counter() - t0 - sync_s

        # Dynamic sampling trains on groups with a spread only (as DAPO's filter); one batch, or
        # none with a spread, trains on all (equal-reward rows cost nothing in the update then).
        kept = list(range(len(prompts)))
        if cfg.max_num_gen_batches > 1 and spread:
            kept = spread[: cfg.prompts_per_step]
        rows = [t for g in kept for t in trajectories[g * cfg.group_size : (g + 1) * cfg.group_size]]
        batch = RolloutBatch.of_groups(rows, cfg.group_size)
        advantages = grpo_advantages(batch, cfg.norm_adv_by_std)
        t1 = time.perf_counter()
        update = await asyncio.to_thread(self.update, batch, advantages)
        update_s = time.perf_counter() - t1
        self.step += 1
        if self.curriculum is not None:
            for g, prompt in enumerate(prompts):
                group = trajectories[g * cfg.group_size : (g + 1) * cfg.group_size]
                successes = [(t.reward_score or 0.0) >= cfg.success_threshold for t in group]
                self.curriculum.observe(int(prompt.metadata["level"]), successes, step=self.step)

        generated = sum(sum(t.response_mask) for t in trajectories)
        calls = sum(t.metrics.get("calls", 0) for t in trajectories)
        record = self._record(
            "train",
            **trajectory_stats(trajectories, cfg.success_threshold),
            **update,
            **per_kind_stats(trajectories, cfg.success_threshold, cfg.group_size),
            **(self.curriculum.metrics() if self.curriculum is not None else {}),
            groups_with_signal=len(spread),
            gen_batches=len(prompts) // cfg.prompts_per_step,
            trained_groups=len(kept),
            rollout_tokens_per_s=generated / rollout_s if rollout_s > 0 else 0.0,
            tool_calls_per_s=calls / rollout_s if rollout_s > 0 else 0.0,
            **{
                "time/rollout_s": rollout_s,
                # the rollout's wall time by what was in flight (PhaseClock), then the update
                "time/generate_s": phases["generate"],
                "time/tools_s": phases["tools"],
                "time/verify_s": phases["verify"],
                "time/rollout_other_s": phases["other"],
                # what the tool server and the client cost the rollout: its wall time with no
                # generation in flight (tool calls, verification, parsing and splicing)
                "time/tool_share": 1.0 - phases["generate"] / phased_s if phased_s > 0 else 0.0,
                "time/update_s": update_s,
                "time/step_s": time.perf_counter() - t0,
                # CPU seconds of this process (all its threads): the cost on a shared machine,
                # where wall time depends on what else runs
                "time/cpu_s": time.process_time() - cpu0,
                # the process's peak resident memory so far (Linux reports KiB): a run that
                # outgrows the machine shows it here before the OOM killer does
                "memory/max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                **({"time/weight_sync_s": sync_s} if cfg.engine == "vllm" else {}),
            },
            lr=self.optimizer.param_groups[0]["lr"],
            epoch=self.epoch,
        )
        self.log.samples("train", self.step, trajectories[:: cfg.group_size][:4])
        return record

    def update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """Gradient accumulation over micro-batches, then one clipped AdamW step."""
        cfg = self.config
        warmup = cfg.warmup_steps
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * (min(1.0, (self.step + 1) / warmup) if warmup > 0 else 1.0)
        needs_all_rows = self.ref_model is not None or cfg.entropy_coeff > 0
        active = [i for i, signal in enumerate(batch.has_signal) if signal or needs_all_rows]
        rows = [batch.trajectories[i] for i in active]
        mask, advantages = batch.response_mask.to(self.model.device), advantages.to(self.model.device)
        actor_cfg = actor_loss_config(
            cfg, batch_num_tokens=int(mask.sum().item()), global_batch_size=len(batch.trajectories)
        )
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # The prompt prefix all rows share runs once per step, for the policy (its gradient
        # finished by prefix.backward() after the micro-batches) and for the reference.
        # Forward passes under autocast (this thread's), backward passes outside it.
        ids = prompt_prefix([t.prompt_ids for t in rows])
        with self._autocast():
            prefix = shared_prefix(self.model, ids, detach=True) if ids else None
            ref_prefix = None
            if ids and self.ref_model is not None:
                with torch.no_grad():
                    ref_prefix = shared_prefix(self.ref_model, ids)

        sums: dict[str, float] = defaultdict(float)
        for idx in micro_batches(rows, active, cfg.micro_batch_size, cfg.micro_batch_tokens):
            prompts = [batch.trajectories[i].prompt_ids for i in idx]
            responses = [batch.trajectories[i].response_ids for i in idx]
            width = max(max((len(r) for r in responses), default=0), 1)
            m = mask[idx, :width]
            with self._autocast():
                log_prob, entropy = response_logprobs(
                    self.model,
                    prompts,
                    responses,
                    pad_token_id=self.pad_token_id,
                    temperature=cfg.temperature,
                    with_entropy=True,
                    entropy_grad=cfg.entropy_coeff > 0,  # the bonus needs its gradient; else a metric
                    prefix=prefix,
                )
                ref_log_prob = None
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref_log_prob, _ = response_logprobs(
                            self.ref_model,
                            prompts,
                            responses,
                            pad_token_id=self.pad_token_id,
                            temperature=cfg.temperature,
                            prefix=ref_prefix,
                        )
            if ref_log_prob is not None:
                sums["kl_sum"] += float(((log_prob.detach() - ref_log_prob) * m).sum())
            loss, metrics = policy_loss_terms(
                log_prob=log_prob,
                old_log_prob=log_prob.detach(),
                advantages=advantages[idx, :width],
                response_mask=m,
                actor_config=actor_cfg,
                ref_log_prob=ref_log_prob,
                entropy=entropy,
            )
            loss.backward()
            for key, value in metrics.items():
                sums[key] += value
            sums["entropy_sum"] += float((entropy.detach() * m).sum())
            sums["tokens"] += float(m.sum())
        if prefix is not None:
            prefix.backward()

        grad_norm = 0.0
        if active:
            grad_norm = clipped_step(self.model, self.optimizer, cfg.max_grad_norm, self.step + 1)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.generator.clear_prefix_cache()  # the weights changed: cached prefixes are stale
        tokens = sums["tokens"]
        out = {
            "pg_loss": sums["pg_loss"],  # already normalized by the step's tokens
            "grad_norm": grad_norm,
            "entropy": sums["entropy_sum"] / tokens if tokens else 0.0,
            "trained_rows": float(len(active)),
        }
        if self.ref_model is not None:
            out["kl"] = sums["kl_sum"] / tokens if tokens else 0.0
            out["kl_loss"] = sums["kl_loss"]
        return out

    async def evaluate(self, *, greedy: bool = False) -> dict[str, Any] | None:
        """Roll out the held-out tasks (``eval_samples`` times each at ``eval_temperature``, or
        once greedily with ``greedy``) and log success overall and per problem kind (or
        environment level).

        Returns None when there is nothing to evaluate (no held-out split; ``greedy`` without
        ``greedy_eval`` at a sampling temperature)."""
        cfg = self.config
        core = self.greedy_core if greedy else self.eval_core
        if not self.eval_tasks or core is None:
            return None
        await self._show_tools()
        await self._sync_engine()
        self.model.eval()
        self.generator.clear_prefix_cache()
        t0 = time.perf_counter()
        samples = 1 if greedy else max(1, cfg.eval_samples)
        tasks = [t for t in self.eval_tasks for _ in range(samples)]
        trajectories = await core.run_batch(tasks, max_concurrency=cfg.max_concurrency)
        by_kind: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            by_kind[task_kind(t.task)].append(float((t.reward_score or 0.0) >= cfg.success_threshold))
        per_kind = (
            {f"success/{k}": sum(v) / len(v) for k, v in sorted(by_kind.items())} if len(by_kind) > 1 else {}
        )
        split = "eval_greedy" if greedy else "eval"
        record = self._record(
            split,
            **trajectory_stats(trajectories, cfg.success_threshold),
            eval_size=len(self.eval_tasks),
            eval_samples=samples,
            temperature=0.0 if greedy else cfg.eval_temperature,
            **{"time/eval_s": time.perf_counter() - t0},
            **per_kind,
        )
        self.log.samples(split, self.step, trajectories[:: max(1, len(trajectories) // 8)])
        logger.info("%s at step %d: success %.3f", split, self.step, record["success"])
        return record

    async def evaluate_all(self) -> None:
        """The evaluations of a checkpoint: sampled, and greedy when ``greedy_eval`` asks for it."""
        await self.evaluate()
        await self.evaluate(greedy=True)

    async def _sync_engine(self) -> float:
        """engine=vllm: make the server sample from the current policy (once per step); seconds taken."""
        sync = getattr(self.generator, "sync_weights", None)
        return await sync(self.model, self.step) if sync is not None else 0.0

    async def close(self) -> None:
        if self._owns_invoker:
            await self.invoker.aclose()
        await self.generator.aclose()
        self.log.close()

    # ------------------------------------------------------------------ data and logs

    async def _show_tools(self) -> None:
        """Once: give every task the tool schemas its prompt shows (``config.tool_schemas``):
        the dataset's ``extra_info.tools``, else the toolset's from the server's ``/v1/tools``."""
        if self._tools_shown:
            return
        cfg = self.config
        server_tools = None
        if cfg.tool_schemas != "none" and hasattr(self.invoker, "list_tools"):
            server_tools = openai_tool_schemas(await self.invoker.list_tools(cfg.toolset))
        for task in self.train_tasks + self.eval_tasks:
            dataset_tools = task.metadata.get("tools")
            task.tools = prompt_tools(
                cfg.tool_schemas,
                messages=task.messages,
                dataset_tools=dataset_tools if isinstance(dataset_tools, list) else None,
                server_tools=server_tools,
                renders_tools=self.train_core.renderer.renders_tools,
                format=cfg.format,
            )
        self._tools_shown = True

    def _shuffle(self) -> None:
        rng = random.Random(self.config.seed + self.epoch)
        self.order = list(range(len(self.train_tasks)))
        rng.shuffle(self.order)
        self.cursor = 0

    def _next_prompts(self, draw: int = 0) -> list[Task]:
        """The prompts of a step's ``draw``-th rollout batch (more than one: dynamic sampling)."""
        if self.curriculum is not None:
            key = f"{self.config.seed}:curriculum:{self.step}" + (f":{draw}" if draw else "")
            rng = random.Random(key)  # the same after a resume
            return [
                self._next_of_level(level)
                for level in self.curriculum.levels_for_step(self.config.prompts_per_step, rng)
            ]
        chosen: list[Task] = []
        while len(chosen) < self.config.prompts_per_step:
            if self.cursor >= len(self.order):
                self.epoch += 1
                self._shuffle()
            chosen.append(self.train_tasks[self.order[self.cursor]])
            self.cursor += 1
        return chosen

    def _next_of_level(self, level: int) -> Task:
        """The next task of ``level`` in that level's own shuffled order (reshuffled each pass)."""
        index = next_of_level(
            self.tasks_of_level[level], level, self.level_cursors, self.level_epochs, self.config.seed
        )
        return self.train_tasks[index]

    def elapsed_s(self) -> float:
        """Wall time of the run so far, resumed processes included."""
        return self.elapsed_before_s + time.perf_counter() - self._started

    def _record(self, split: str, **values: Any) -> dict[str, Any]:
        record = {
            "time": time.time(),
            "elapsed_min": round(self.elapsed_s() / 60.0, 2),
            "split": split,
            "step": self.step,
            **values,
        }
        self.log.write(record)
        return record

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Model (HF format), optimizer, data cursor and RNG states under checkpoints/step_N."""
        return save_checkpoint(
            self.out_dir,
            self.step,
            model=self.model,
            tokenizer=self.tokenizer,
            state=trainer_state(self),
            keep=self.config.keep_checkpoints,
        )

    def _resume(self) -> None:
        path = latest_checkpoint(self.out_dir)
        if path is None:
            return
        # the reference model stays the run's starting point: only the policy is loaded
        restore_trainer_state(self, load_checkpoint(path, self.model))
        logger.info("resumed from %s at step %d", path, self.step)
