"""A single-process GRPO trainer: rollouts against the tool server, veRL's losses, one device.

Why it exists: veRL needs Ray, GPUs and vLLM/SGLang; this trainer runs the same algorithm
on a laptop CPU (or one GPU) with an HF model, so that a tool environment can be tried,
debugged and shown to learn before a cluster run. The algorithm pieces are veRL's own
(``verl.trainer.ppo.core_algos``): the group-normalized outcome advantage
(``compute_grpo_outcome_advantage``), the clipped policy loss (``vanilla``), ``kl_penalty``
and ``agg_loss`` with veRL's global token normalization; nothing is re-derived here.

One step:

1. **Rollout**: ``prompts_per_step`` prompts, each ``group_size`` times, through the
   rollout core (generate -> parse -> call tools over HTTP -> splice observations with
   mask 0) on the policy itself (``SharedPrefixGenerator``), rewarded by the server's
   ``/v1/verify``.
2. **Advantage**: veRL's GRPO outcome advantage, broadcast over ``response_mask``, so
   observation (tool) tokens get advantage 0.
3. **Update**: micro-batches with gradient accumulation; rows of groups whose rewards
   are all equal carry zero advantage and (without KL or entropy terms) zero gradient,
   so they are skipped. One AdamW step per rollout batch (on-policy, so the old
   log-probs are the current ones detached and the PPO ratio is 1 at the step).

Evaluation on a held-out split (greedy by default) every ``eval_every`` steps,
checkpoints with optimizer state every ``save_every`` steps (and resume from the last
one), metrics as JSONL and TensorBoard, and a PNG of the reward curve.

CPU cost is dominated by the long few-shot prompt that every row shares, so both the
generator and the training forward compute that prefix once and reuse its key/value
cache (exact: attention is causal, the prefix's keys do not depend on what follows).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.checkpoint

from trainer_client.backends.hf import HFGenerator
from trainer_client.dataset import TaskRow, load_tasks
from trainer_client.rollout import RolloutConfig, RolloutCore, Task, Trajectory
from trainer_client.templates import TOOL_SCHEMA_MODES, openai_tool_schemas, prompt_tools

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "reward_curve.png"
CHECKPOINTS = "checkpoints"
LATEST = "latest"


# --------------------------------------------------------------------------- configuration


@dataclass
class GRPOConfig:
    """Every knob of a run. ``trainer-client train --help`` documents the same names.

    Rollout budgets mirror ``RolloutConfig``; ``max_tokens_per_turn`` caps one
    generation turn. ``verifier``/``verifier_arguments`` give the training reward;
    ``eval_verifier`` (default: the same) scores the held-out split, and an eval
    trajectory succeeds when that score is at least ``success_threshold``.
    """

    train_data: str
    server: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000"])
    eval_data: str | None = None
    out_dir: str = "runs/grpo"
    model: str = "smollm2"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    seed: int = 0
    # schedule
    steps: int = 20
    prompts_per_step: int = 8
    group_size: int = 8
    micro_batch_size: int = 8  # most rows in one forward/backward
    micro_batch_tokens: int = 1024  # most padded tokens (beyond the shared prefix) in one forward/backward
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    # losses (veRL names)
    clip_ratio: float = 0.2
    loss_agg_mode: str = "token-mean"
    norm_adv_by_std: bool = True
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    # rollout
    format: str = "hermes"
    toolset: str | None = None
    tool_schemas: str = "auto"  # tool schemas in the prompt: auto | server | none (templates.prompt_tools)
    max_turns: int = 4
    max_calls_per_turn: int = 4
    max_obs_tokens: int = 128
    response_length: int = 384
    max_tokens_per_turn: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    verifier: str = "math_equal"
    verifier_arguments: dict[str, Any] = field(default_factory=dict)
    max_concurrency: int = 64
    generation_batch_size: int = 32
    # evaluation, checkpoints, logs
    eval_every: int = 5
    eval_size: int = 64
    eval_temperature: float = 0.0
    eval_samples: int = 1  # rollouts per held-out problem (useful when eval_temperature > 0)
    greedy_eval: bool = False  # also evaluate greedily at the start and the end ("eval_greedy")
    eval_verifier: str | None = None
    eval_verifier_arguments: dict[str, Any] | None = None
    success_threshold: float = 1.0
    eval_at_start: bool = True
    save_every: int = 10
    keep_checkpoints: int = 2
    resume: bool = True
    tensorboard: bool = True
    plot: bool = True
    max_train_rows: int | None = None
    max_minutes: float | None = None  # stop training (then evaluate) once the run is this old

    def __post_init__(self) -> None:
        if isinstance(self.server, str):
            self.server = [self.server]
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        positive = (
            "steps",
            "prompts_per_step",
            "group_size",
            "micro_batch_size",
            "max_turns",
            "response_length",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GRPOConfig.{name} must be a positive integer, got {value!r}")
        if self.group_size < 2:
            raise ValueError(
                "GRPOConfig.group_size must be at least 2: GRPO normalizes rewards within a group"
            )
        if self.lr <= 0:
            raise ValueError(f"GRPOConfig.lr must be positive, got {self.lr}")
        if self.kl_coef < 0 or self.entropy_coeff < 0:
            raise ValueError("kl_coef and entropy_coeff must not be negative")
        if self.eval_every < 0 or self.save_every < 0:
            raise ValueError("eval_every and save_every must be >= 0 (0 disables)")
        if self.tool_schemas not in TOOL_SCHEMA_MODES:
            raise ValueError(
                f"GRPOConfig.tool_schemas must be one of {', '.join(TOOL_SCHEMA_MODES)}, got {self.tool_schemas!r}"
            )

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
        verifier = (self.eval_verifier or self.verifier) if eval_mode else self.verifier
        arguments = self.verifier_arguments
        if eval_mode and self.eval_verifier is not None:
            arguments = self.eval_verifier_arguments or {}
        return RolloutConfig(
            format=self.format,
            max_turns=self.max_turns,
            max_calls_per_turn=self.max_calls_per_turn,
            max_obs_tokens=self.max_obs_tokens,
            response_length=self.response_length,
            sampling_params={
                "temperature": temperature,
                "top_p": 1.0 if eval_mode else self.top_p,
                "max_tokens": self.max_tokens_per_turn,
            },
            toolset=self.toolset,
            verifier=verifier,
            verifier_arguments=dict(arguments),
        )


# --------------------------------------------------------------------------- data


def task_from_row(row: dict[str, Any]) -> Task:
    """One veRL-format dataset row -> a rollout ``Task`` (see ``dataset.TaskRow.task``)."""
    return TaskRow.from_row(row).task()


# --------------------------------------------------------------------------- shared-prefix computation


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of token sequences."""
    if not sequences:
        return 0
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for other in sequences[1:]:
        i = 0
        while i < n and other[i] == first[i]:
            i += 1
        n = i
        if n == 0:
            break
    return n


def _cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of an HF cache (transformers 5 ``DynamicCache``)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return [(k, v) for k, v in cache]  # legacy tuple format


def _expanded_cache(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: int, length: int, capacity: int | None = None
) -> Any:
    """A fresh ``DynamicCache`` holding the first ``length`` positions of a one-row prefix, for ``rows`` rows.

    Without ``capacity``, ``expand`` makes views, so the prefix is stored once and the
    model's own cache update (a concatenation) never writes to it: right for one
    forward pass. With ``capacity`` (decoding), every layer gets a preallocated buffer
    that new positions are written into, instead of re-concatenating the whole cache at
    every step (half of a CPU decode step otherwise).
    """
    from transformers import DynamicCache

    cache = DynamicCache(
        [
            (k[:, :, :length].expand(rows, -1, -1, -1), v[:, :, :length].expand(rows, -1, -1, -1))
            for k, v in layers
        ]
    )
    if capacity is not None:
        cache.layers = [_PreallocatedLayer(layer.keys, layer.values, capacity) for layer in cache.layers]
    return cache


def _preallocated_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` that writes new positions into spare capacity (grows by half when full)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
            super().__init__()
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True
            self._length = 0
            self._k = keys.new_empty((*keys.shape[:2], max(capacity, keys.shape[-2]), keys.shape[-1]))
            self._v = values.new_empty((*values.shape[:2], self._k.shape[-2], values.shape[-1]))
            self.update(keys, values)

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            end = self._length + key_states.shape[-2]
            if end > self._k.shape[-2]:
                grown = max(end, self._k.shape[-2] * 3 // 2)
                for name in ("_k", "_v"):
                    old = getattr(self, name)
                    new = old.new_empty((*old.shape[:2], grown, old.shape[-1]))
                    new[:, :, : self._length] = old[:, :, : self._length]
                    setattr(self, name, new)
            self._k[:, :, self._length : end] = key_states
            self._v[:, :, self._length : end] = value_states
            self._length = end
            self.keys = self._k[:, :, :end]
            self.values = self._v[:, :, :end]
            return self.keys, self.values

    return PreallocatedLayer


def _PreallocatedLayer(keys: torch.Tensor, values: torch.Tensor, capacity: int) -> Any:  # noqa: N802
    global _PREALLOCATED_LAYER
    if _PREALLOCATED_LAYER is None:
        _PREALLOCATED_LAYER = _preallocated_layer_class()
    return _PREALLOCATED_LAYER(keys, values, capacity)


_PREALLOCATED_LAYER: type | None = None


class SharedPrefixGenerator(HFGenerator):
    """``HFGenerator`` that computes the prompt prefix shared by a batch once.

    Few-shot prompts are long (SmolLM2 arithmetic: ~560 of ~620 prompt tokens are the
    same system turn and worked examples), and every turn re-reads the whole context.
    This keeps the key/value cache of the longest shared prefix seen (a few anchors);
    a batch whose rows share at least ``min_prefix`` tokens with an anchor starts from a
    slice of it and prefills only the rest. Sampling, stopping and log-probs are the
    parent's; only the prefill differs, and it is exact (causal attention).
    """

    def __init__(self, *args: Any, min_prefix: int = 32, max_anchors: int = 4, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.min_prefix = min_prefix
        self.max_anchors = max_anchors
        self._anchors: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.prefix_tokens_reused = 0
        self.prefill_tokens = 0

    def clear_prefix_cache(self) -> None:
        """Drop cached prefixes: call after the weights change (every optimizer step)."""
        self._anchors.clear()

    def _prefix_for(self, prompts: list[list[int]], capacity: int) -> tuple[int, Any]:
        shared = common_prefix_length(prompts)
        shared = min(shared, min(len(p) for p in prompts) - 1)  # every row keeps >= 1 token to feed
        if shared < self.min_prefix:
            return 0, None
        best, best_len = None, 0
        for anchor in self._anchors:
            n = common_prefix_length([anchor[0][:shared], prompts[0][:shared]])
            if n > best_len:
                best, best_len = anchor, n
        if best is None or best_len < self.min_prefix:
            ids = prompts[0][:shared]
            out = self.model(
                input_ids=torch.tensor([ids], device=self.device), use_cache=True, logits_to_keep=1
            )
            best, best_len = (ids, _cache_layers(out.past_key_values)), shared
            self._anchors.insert(0, best)
            del self._anchors[self.max_anchors :]
            self.prefill_tokens += shared
        return best_len, _expanded_cache(best[1], len(prompts), best_len, capacity)

    @torch.inference_mode()
    def _run_batch(self, batch: list[Any]) -> None:
        prompts = [r.prompt_ids for r in batch]
        capacity = max(len(p) for p in prompts) + max(r.max_tokens for r in batch) + 1
        shared, cache = self._prefix_for(prompts, capacity)
        if cache is None:
            self.prefill_tokens += sum(len(p) for p in prompts)
            super()._run_batch(batch)
            return
        rows = len(batch)
        suffixes = [p[shared:] for p in prompts]
        width = max(len(s) for s in suffixes)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((rows, shared + width), dtype=torch.long)
        attention[:, :shared] = 1
        for i, s in enumerate(suffixes):
            input_ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            attention[i, shared + width - len(s) :] = 1
        self.prefix_tokens_reused += shared * rows
        self.prefill_tokens += sum(len(s) for s in suffixes)
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._decode_from(batch, out, attention, positions[:, -1])


@dataclass
class SharedPrefix:
    """The key/value cache of a prompt prefix, computed once and reused by many rows.

    ``layers`` are the (keys, values) the rows attend to. With ``detach=True`` (see
    :func:`shared_prefix`) they are leaves that collect the rows' gradients; then
    :meth:`backward` pushes those through the prefix computation once, however many
    micro-batches used it, which is exact and costs one prefix backward per step.
    """

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    graph: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def backward(self) -> None:
        if self.graph is None:
            return
        outputs, grads = [], []
        for (k, v), (gk, gv) in zip(self.layers, self.graph, strict=True):
            for leaf, node in ((k, gk), (v, gv)):
                if leaf.grad is not None:
                    outputs.append(node)
                    grads.append(leaf.grad)
        if outputs:
            torch.autograd.backward(outputs, grads)
        self.graph = None


def shared_prefix(model: Any, ids: Sequence[int], *, detach: bool = False) -> SharedPrefix:
    """Run ``ids`` (one row) through ``model`` and keep its key/value cache.

    ``detach`` (with grad enabled): the rows get leaf copies, so that each micro-batch's
    backward stops there, and :meth:`SharedPrefix.backward` finishes once per step.
    """
    device = next(model.parameters()).device
    body, _head = _body_and_head(model)
    tokens = torch.tensor([list(ids)], device=device)
    out = (
        body(input_ids=tokens, use_cache=True)
        if body is not None
        else model(input_ids=tokens, use_cache=True)
    )
    layers = _cache_layers(out.past_key_values)
    if detach and torch.is_grad_enabled():
        leaves = [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in layers]
        return SharedPrefix(list(ids), leaves, layers)
    return SharedPrefix(list(ids), layers)


def response_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    min_prefix: int = 32,
    prefix: SharedPrefix | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and optionally entropies) of ``responses`` given ``prompts``.

    Returns tensors of shape ``(rows, max_response_len)`` (zeros past each response's
    end). Gradients flow when called with grad enabled. The prompt prefix shared by all
    rows is run once (one row) and its key/value cache is expanded to every row, which
    is exact; pass ``prefix`` (from :func:`shared_prefix`) to reuse one across calls.
    Log-probs use ``logits / temperature``, as the sampler does and as veRL's actor does.
    """
    rows = len(prompts)
    device = next(model.parameters()).device
    body, head = _body_and_head(model)
    cache = None
    if prefix is not None:
        shared = len(prefix.ids)
        if any(len(p) <= shared or list(p[:shared]) != prefix.ids for p in prompts):
            raise ValueError("every prompt must start with the shared prefix and extend beyond it")
        cache = _expanded_cache(prefix.layers, rows, shared)
    else:
        shared = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
        if shared >= min_prefix:
            cache = _expanded_cache(shared_prefix(model, prompts[0][:shared]).layers, rows, shared)
        else:
            shared = 0
    suffixes = [list(p[shared:]) for p in prompts]
    s_width = max(len(s) for s in suffixes)
    r_width = max(max((len(r) for r in responses), default=0), 1)
    input_ids = torch.full((rows, s_width + r_width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((rows, shared + s_width + r_width), dtype=torch.long)
    attention[:, :shared] = 1
    labels = torch.full((rows, r_width), pad_token_id, dtype=torch.long)
    valid = torch.zeros((rows, r_width), dtype=torch.float32)
    for i, (s, r) in enumerate(zip(suffixes, responses, strict=True)):
        input_ids[i, s_width - len(s) : s_width] = torch.tensor(s, dtype=torch.long)
        attention[i, shared + s_width - len(s) : shared + s_width + len(r)] = 1
        if r:
            input_ids[i, s_width : s_width + len(r)] = torch.tensor(list(r), dtype=torch.long)
            labels[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
            valid[i, : len(r)] = 1.0
    input_ids, attention, labels, valid = (t.to(device) for t in (input_ids, attention, labels, valid))
    positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, shared:]
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": positions,
        "past_key_values": cache,
        "use_cache": cache is not None,
    }
    if body is None:  # a model whose head does more than a linear layer: logits as the model makes them
        logits = model(**inputs, logits_to_keep=r_width + 1).logits[:, :-1]
        log_probs, entropy = _token_logprobs(logits, labels, temperature, with_entropy, head=None)
        return log_probs * valid, (entropy * valid if entropy is not None else None)
    # position s_width-1+j predicts response token j
    hidden = body(**inputs).last_hidden_state[:, s_width - 1 : s_width - 1 + r_width]
    # The vocabulary projection in row chunks, recomputed in backward (checkpoint): the
    # full (rows, tokens, vocab) logits and their softmax would take gigabytes.
    vocab = int(getattr(head, "out_features", 0) or head.weight.shape[0])
    chunk = max(1, LOGITS_CHUNK_ELEMENTS // (r_width * vocab))
    pieces = [
        torch.utils.checkpoint.checkpoint(
            _token_logprobs,
            hidden[i : i + chunk],
            labels[i : i + chunk],
            temperature,
            with_entropy,
            head,
            use_reentrant=False,
        )
        if torch.is_grad_enabled()
        else _token_logprobs(hidden[i : i + chunk], labels[i : i + chunk], temperature, with_entropy, head)
        for i in range(0, rows, chunk)
    ]
    log_probs = torch.cat([p[0] for p in pieces]) * valid
    entropy = torch.cat([p[1] for p in pieces]) * valid if with_entropy else None
    return log_probs, entropy


LOGITS_CHUNK_ELEMENTS = 1 << 26  # float32 logits per chunk (256 MB)


def _body_and_head(model: Any) -> tuple[Any, Any]:
    """(decoder without the LM head, the LM head) when logits are exactly ``head(hidden)``, else (None, None)."""
    config = getattr(model, "config", None)
    if any(
        getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    ):
        return None, None
    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if body is None or body is model or not isinstance(head, torch.nn.Linear):
        return None, None
    return body, head


def _token_logprobs(
    hidden_or_logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool, head: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``labels`` (and entropies, without gradient) under ``logits / temperature``."""
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    logits = (head(hidden_or_logits) if head is not None else hidden_or_logits).float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    log_probs = logprobs_from_logits(logits, labels)
    with torch.no_grad():
        entropy = entropy_from_logits(logits) if with_entropy else torch.zeros_like(log_probs)
    return log_probs, entropy


# --------------------------------------------------------------------------- batches and losses


@dataclass
class RolloutBatch:
    """A step's trajectories as padded tensors (veRL layout: responses right-padded)."""

    trajectories: list[Trajectory]
    group_index: np.ndarray
    response_mask: torch.Tensor  # (rows, R): 1 = model token
    rewards: torch.Tensor  # (rows,)
    token_level_rewards: torch.Tensor  # (rows, R): reward at each row's last response token

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
        return cls(trajectories, np.asarray(group_index), mask, rewards, token_rewards)


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
        clip_ratio_high=config.clip_ratio,
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
    order = sorted(indices, key=lambda i: lengths[i], reverse=True)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = max([lengths[j] for j in current] + [lengths[i]])
        if current and (len(current) + 1 > max_rows or (len(current) + 1) * width > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    batches.append(current)
    return batches


# --------------------------------------------------------------------------- the trainer


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0


def trajectory_stats(trajectories: Sequence[Trajectory], threshold: float) -> dict[str, float]:
    """Reward, success, length and tool-use statistics of a set of trajectories."""
    rewards = [float(t.reward_score or 0.0) for t in trajectories]
    model_tokens = [sum(t.response_mask) for t in trajectories]
    calls = [t.metrics.get("calls", 0) for t in trajectories]
    errors = [t.metrics.get("tool_errors", 0) for t in trajectories]
    stats = {
        "reward": _mean(rewards),
        "success": _mean(float(r >= threshold) for r in rewards),
        "response_length": _mean(len(t.response_ids) for t in trajectories),
        "model_tokens": _mean(model_tokens),
        "num_turns": _mean(t.num_turns for t in trajectories),
        "tool_calls": _mean(calls),
        "tool_errors": _mean(errors),
        "tool_error_rate": (sum(errors) / sum(calls)) if sum(calls) else 0.0,
        "parse_errors": _mean(t.metrics.get("parse_errors", 0) for t in trajectories),
        "answered": _mean(float(t.final_answer is not None) for t in trajectories),
        "unscored": float(sum(t.reward_score is None for t in trajectories)),
    }
    components: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for key, value in t.reward_components.items():
            components[key].append(float(value))
    for key, values in components.items():
        stats[f"reward/{key}"] = _mean(values)
    return stats


class GRPOTrainer:
    """Runs a ``GRPOConfig``: ``asyncio.run(GRPOTrainer(config).train())``.

    ``invoker`` (a ``ToolClient`` by default, built from ``config.server``) runs the
    tools and verifiers; pass your own to reuse a client.
    """

    def __init__(self, config: GRPOConfig, *, invoker: Any = None) -> None:
        self.config = config
        self.out_dir = Path(config.out_dir).expanduser()
        self._invoker = invoker
        self._owns_invoker = invoker is None
        self.step = 0
        self.cursor = 0  # position in the shuffled training order
        self.epoch = 0
        self.order: list[int] = []
        self._writer: Any = None
        self.elapsed_before_s = 0.0  # wall time of earlier processes of this run (resume)
        self._started = time.perf_counter()

    # ------------------------------------------------------------------ set-up

    def _setup(self) -> None:
        from trainer_client.models import load_model

        cfg = self.config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.train_tasks = [row.task() for row in load_tasks(cfg.train_data, limit=cfg.max_train_rows)]
        self.eval_tasks = (
            [row.task() for row in load_tasks(cfg.eval_data, limit=cfg.eval_size)] if cfg.eval_data else []
        )
        self.tokenizer, self.model = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
        self.pad_token_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        if cfg.device == "cpu":
            use_gqa_decode_attention(self.model)
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )
        self.generator = SharedPrefixGenerator(
            self.model,
            self.tokenizer,
            max_batch_size=cfg.generation_batch_size,
            default_max_tokens=cfg.max_tokens_per_turn,
        )
        self._resume()
        if not self.order:
            self._shuffle()
        (self.out_dir / "config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))

    def _shuffle(self) -> None:
        rng = random.Random(self.config.seed + self.epoch)
        self.order = list(range(len(self.train_tasks)))
        rng.shuffle(self.order)
        self.cursor = 0

    def _next_prompts(self) -> list[Task]:
        chosen: list[Task] = []
        while len(chosen) < self.config.prompts_per_step:
            if self.cursor >= len(self.order):
                self.epoch += 1
                self._shuffle()
            chosen.append(self.train_tasks[self.order[self.cursor]])
            self.cursor += 1
        return chosen

    def _lr_scale(self) -> float:
        warmup = self.config.warmup_steps
        return min(1.0, (self.step + 1) / warmup) if warmup > 0 else 1.0

    # ------------------------------------------------------------------ the loop

    async def train(self) -> dict[str, Any]:
        """Run the remaining steps (all of them, or from the last checkpoint). Returns a summary."""
        from trainer_client.client import ToolClient

        self._started = started = time.perf_counter()
        self._setup()
        cfg = self.config
        invoker = self._invoker or ToolClient(cfg.server, toolset=cfg.toolset)
        try:
            self.train_core = RolloutCore(
                self.tokenizer, self.generator, invoker, cfg.rollout_config(), verifier=invoker
            )
            self.eval_core = RolloutCore(
                self.tokenizer, self.generator, invoker, cfg.rollout_config(eval_mode=True), verifier=invoker
            )
            await self._choose_tool_schemas(invoker)
            self.greedy_core = None
            if cfg.greedy_eval and cfg.eval_temperature > 0:
                self.greedy_core = RolloutCore(
                    self.tokenizer,
                    self.generator,
                    invoker,
                    cfg.rollout_config(eval_mode=True, temperature=0.0),
                    verifier=invoker,
                )
            if self.step == 0 and cfg.eval_at_start and self.eval_tasks:
                await self.evaluate()
                if self.greedy_core is not None:
                    await self.evaluate(greedy=True)
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
                if self.eval_tasks and cfg.eval_every and self.step % cfg.eval_every == 0:
                    await self.evaluate()
                if cfg.save_every and (self.step % cfg.save_every == 0 or self.step == cfg.steps):
                    self.save_checkpoint()
            if self.eval_tasks and (not cfg.eval_every or self.step % cfg.eval_every != 0):
                await self.evaluate()
            if self.eval_tasks and self.greedy_core is not None:
                await self.evaluate(greedy=True)
        finally:
            if self._owns_invoker:
                await invoker.aclose()
            await self.generator.aclose()
            if self._writer is not None:
                self._writer.close()
        if cfg.plot:
            plot_reward_curve(self.out_dir / METRICS_FILE, self.out_dir / PLOT_FILE)
        summary = summarize_run(self.out_dir / METRICS_FILE)
        summary["wall_s_this_process"] = time.perf_counter() - started
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    async def _choose_tool_schemas(self, invoker: Any) -> None:
        """Give every task the tool schemas its prompt shows (``config.tool_schemas``): the
        dataset's ``extra_info.tools``, else the toolset's from the server's ``/v1/tools``."""
        cfg = self.config
        server_tools = None
        if cfg.tool_schemas != "none" and hasattr(invoker, "list_tools"):
            server_tools = openai_tool_schemas(await invoker.list_tools(cfg.toolset))
        renders_tools = self.train_core.renderer.renders_tools
        for task in self.train_tasks + self.eval_tasks:
            dataset_tools = task.metadata.get("tools")
            task.tools = prompt_tools(
                cfg.tool_schemas,
                messages=task.messages,
                dataset_tools=dataset_tools if isinstance(dataset_tools, list) else None,
                server_tools=server_tools,
                renders_tools=renders_tools,
                format=cfg.format,
            )

    async def train_step(self) -> dict[str, Any]:
        """One rollout + one optimizer step; returns the logged record."""
        cfg = self.config
        t0 = time.perf_counter()
        prompts = self._next_prompts()
        tasks = [p for p in prompts for _ in range(cfg.group_size)]
        group_index = [i for i in range(len(prompts)) for _ in range(cfg.group_size)]
        self.model.eval()
        self.generator.clear_prefix_cache()
        trajectories = await self.train_core.run_batch(tasks, max_concurrency=cfg.max_concurrency)
        rollout_s = time.perf_counter() - t0
        batch = RolloutBatch.build(trajectories, group_index)
        advantages = grpo_advantages(batch, cfg.norm_adv_by_std)

        t1 = time.perf_counter()
        update = await asyncio.to_thread(self._update, batch, advantages)
        update_s = time.perf_counter() - t1
        self.step += 1

        generated = sum(sum(t.response_mask) for t in trajectories)
        calls = sum(t.metrics.get("calls", 0) for t in trajectories)
        record: dict[str, Any] = {
            "split": "train",
            "step": self.step,
            **trajectory_stats(trajectories, cfg.success_threshold),
            **update,
            "groups_with_signal": int(
                sum(len(set(batch.rewards[batch.group_index == g].tolist())) > 1 for g in set(group_index))
            ),
            "rollout_tokens_per_s": generated / rollout_s if rollout_s > 0 else 0.0,
            "tool_calls_per_s": calls / rollout_s if rollout_s > 0 else 0.0,
            "time/rollout_s": rollout_s,
            "time/update_s": update_s,
            "time/step_s": time.perf_counter() - t0,
            "lr": self.optimizer.param_groups[0]["lr"],
            "epoch": self.epoch,
        }
        self._log(record)
        self._dump_samples("train", trajectories[:: cfg.group_size][:4])
        return record

    def _update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """Gradient accumulation over micro-batches, then one clipped AdamW step."""
        cfg = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * self._lr_scale()
        mask = batch.response_mask
        rows = list(range(len(batch.trajectories)))
        needs_all_rows = self.ref_model is not None or cfg.entropy_coeff > 0
        # Rows of a group whose rewards are all equal have no signal (their float advantage
        # is rounding noise): skipped unless a KL or entropy term needs every row.
        groups = set(batch.group_index.tolist())
        flat = {g for g in groups if len(set(batch.rewards[batch.group_index == g].tolist())) == 1}
        active = [i for i in rows if needs_all_rows or int(batch.group_index[i]) not in flat]
        actor_cfg = actor_loss_config(
            cfg, batch_num_tokens=int(mask.sum().item()), global_batch_size=len(rows)
        )
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        entropy_sum, entropy_tokens, kl_sum = 0.0, 0.0, 0.0
        # The prompt prefix all rows share (system prompt, worked examples) runs once per
        # step, for the policy (with gradients, finished by prefix.backward()) and the reference.
        prompts = [batch.trajectories[i].prompt_ids for i in active]
        shared = min(common_prefix_length(prompts), min(map(len, prompts)) - 1) if prompts else 0
        prefix = ref_prefix = None
        if shared >= 32:
            prefix = shared_prefix(self.model, prompts[0][:shared], detach=True)
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_prefix = shared_prefix(self.ref_model, prompts[0][:shared])
        for idx in micro_batches(
            [batch.trajectories[i] for i in active], active, cfg.micro_batch_size, cfg.micro_batch_tokens
        ):
            trajs = [batch.trajectories[i] for i in idx]
            width = max(max((len(t.response_ids) for t in trajs), default=0), 1)
            m = mask[idx, :width]
            log_prob, entropy = response_logprobs(
                self.model,
                [t.prompt_ids for t in trajs],
                [t.response_ids for t in trajs],
                pad_token_id=self.pad_token_id,
                temperature=cfg.temperature,
                with_entropy=True,
                prefix=prefix,
            )
            ref_log_prob = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_log_prob, _ = response_logprobs(
                        self.ref_model,
                        [t.prompt_ids for t in trajs],
                        [t.response_ids for t in trajs],
                        pad_token_id=self.pad_token_id,
                        temperature=cfg.temperature,
                        prefix=ref_prefix,
                    )
                kl_sum += float(((log_prob.detach() - ref_log_prob) * m).sum())
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
            if entropy is not None:
                entropy_sum += float((entropy * m).sum())
                entropy_tokens += float(m.sum())
        if prefix is not None:
            prefix.backward()
        grad_norm = 0.0
        if active:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
            if math.isfinite(grad_norm):
                self.optimizer.step()
            else:
                logger.warning("non-finite gradient norm at step %d; update skipped", self.step + 1)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.generator.clear_prefix_cache()
        tokens = float(mask[active].sum()) if active else 0.0
        out = {
            "pg_loss": sums.get("pg_loss", 0.0),  # already normalized by the step's tokens
            "grad_norm": grad_norm,
            "entropy": entropy_sum / entropy_tokens if entropy_tokens else 0.0,
            "trained_rows": float(len(active)),
        }
        if self.ref_model is not None:
            out["kl"] = kl_sum / tokens if tokens else 0.0
            out["kl_loss"] = sums.get("kl_loss", 0.0)
        return out

    async def evaluate(self, *, greedy: bool = False) -> dict[str, Any]:
        """Roll out the held-out tasks (``eval_samples`` times each, at ``eval_temperature``;
        once and greedily with ``greedy``); logs success overall and per problem kind."""
        cfg = self.config
        self.model.eval()
        self.generator.clear_prefix_cache()
        t0 = time.perf_counter()
        core = self.greedy_core if greedy and self.greedy_core is not None else self.eval_core
        samples = 1 if greedy else max(1, cfg.eval_samples)
        tasks = [t for t in self.eval_tasks for _ in range(samples)]
        trajectories = await core.run_batch(tasks, max_concurrency=cfg.max_concurrency)
        elapsed = time.perf_counter() - t0
        record: dict[str, Any] = {
            "split": "eval_greedy" if greedy else "eval",
            "step": self.step,
            **trajectory_stats(trajectories, cfg.success_threshold),
            "eval_size": len(self.eval_tasks),
            "eval_samples": samples,
            "temperature": 0.0 if greedy else cfg.eval_temperature,
            "time/eval_s": elapsed,
        }
        by_kind: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            kind = (t.task.metadata.get("kind") if t.task else None) or "all"
            by_kind[str(kind)].append(float((t.reward_score or 0.0) >= cfg.success_threshold))
        if len(by_kind) > 1:
            for kind, values in sorted(by_kind.items()):
                record[f"success/{kind}"] = _mean(values)
        self._log(record)
        self._dump_samples(record["split"], trajectories[:: max(1, len(trajectories) // 8)])
        logger.info("%s at step %d: success %.3f", record["split"], self.step, record["success"])
        return record

    def _dump_samples(self, split: str, trajectories: Sequence[Trajectory]) -> None:
        """A few trajectories per step/eval in samples.jsonl: what the model actually wrote."""
        with open(self.out_dir / SAMPLES_FILE, "a") as handle:
            for t in trajectories:
                prompt_len = len(t.task.messages) if t.task else 0
                record = {
                    "split": split,
                    "step": self.step,
                    "reward": t.reward_score,
                    "ground_truth": t.task.ground_truth if t.task else None,
                    "kind": t.task.metadata.get("kind") if t.task else None,
                    "stop_reason": str(t.stop_reason),
                    "messages": t.messages[prompt_len:],
                }
                handle.write(json.dumps(record, default=str) + "\n")

    # ------------------------------------------------------------------ logs

    def elapsed_s(self) -> float:
        """Wall time of the run so far, resumed processes included."""
        return self.elapsed_before_s + time.perf_counter() - self._started

    def _log(self, record: dict[str, Any]) -> None:
        record = {"time": time.time(), "elapsed_min": round(self.elapsed_s() / 60.0, 2), **record}
        with open(self.out_dir / METRICS_FILE, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if not self.config.tensorboard:
            return
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard not installed: JSONL only
                self.config.tensorboard = False
                return
            self._writer = SummaryWriter(str(self.out_dir / "tensorboard"))
        prefix = record["split"]
        for key, value in record.items():
            if key in ("time", "split", "step") or not isinstance(value, int | float):
                continue
            self._writer.add_scalar(f"{prefix}/{key}", value, record["step"])
        self._writer.flush()

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Model (HF format), optimizer, data cursor and RNG states under checkpoints/step_N."""
        root = self.out_dir / CHECKPOINTS
        target = root / f"step_{self.step:06d}"
        tmp = root / f".tmp_step_{self.step:06d}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        self.model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "step": self.step,
                "epoch": self.epoch,
                "cursor": self.cursor,
                "order": self.order,
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
                "elapsed_s": self.elapsed_s(),
            },
            tmp / "trainer_state.pt",
        )
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
        (root / LATEST).write_text(target.name)
        kept = sorted(p for p in root.glob("step_*") if p.is_dir())
        for old in kept[: max(0, len(kept) - max(1, self.config.keep_checkpoints))]:
            shutil.rmtree(old, ignore_errors=True)
        logger.info("saved checkpoint %s", target)
        return target

    def _resume(self) -> None:
        root = self.out_dir / CHECKPOINTS
        latest = root / LATEST
        if not self.config.resume or not latest.is_file():
            return
        path = root / latest.read_text().strip()
        if not (path / "trainer_state.pt").is_file():
            logger.warning("checkpoint pointer %s names no usable checkpoint; starting fresh", latest)
            return
        from transformers import AutoModelForCausalLM

        state = torch.load(path / "trainer_state.pt", weights_only=False)
        weights = AutoModelForCausalLM.from_pretrained(path, dtype=next(self.model.parameters()).dtype)
        self.model.load_state_dict(weights.state_dict())
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.epoch, self.cursor = int(state["step"]), int(state["epoch"]), int(state["cursor"])
        self.order = list(state["order"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        self.elapsed_before_s = float(state.get("elapsed_s", 0.0))
        # The reference policy is the model the run started from, not the checkpoint.
        logger.info("resumed from %s at step %d", path, self.step)


# --------------------------------------------------------------------------- reading and plotting runs


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSONL records of a run (train and eval), in order."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def summarize_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """First and last eval success, failure-rate ratio, steps and minutes of a run."""
    records = read_metrics(path)
    evals = [r for r in records if r.get("split") == "eval"]
    train = [r for r in records if r.get("split") == "train"]
    summary: dict[str, Any] = {"steps": train[-1]["step"] if train else 0}
    if records:
        summary["minutes"] = records[-1].get("elapsed_min")
    if evals:
        first, last = evals[0], evals[-1]
        best = max(evals, key=lambda r: r["success"])
        summary.update(
            baseline_success=first["success"],
            final_success=last["success"],
            best_success=best["success"],
            best_step=best["step"],
            eval_size=last.get("eval_size"),
            eval_samples=last.get("eval_samples"),
            eval_temperature=last.get("temperature"),
            final_minutes=last.get("elapsed_min"),
            best_minutes=best.get("elapsed_min"),
            baseline_failure=1 - first["success"],
            final_failure=1 - last["success"],
        )
        if first["success"] < 1:
            summary["failure_ratio"] = round((1 - last["success"]) / (1 - first["success"]), 3)
        summary["eval_curve"] = [[r["step"], r.get("elapsed_min"), r["success"]] for r in evals]
        kinds = sorted(k for k in last if k.startswith("success/"))
        if kinds:
            summary["per_kind"] = {k.split("/", 1)[1]: [first.get(k), last.get(k)] for k in kinds}
    greedy = [r for r in records if r.get("split") == "eval_greedy"]
    if greedy:
        summary["greedy_baseline_success"] = greedy[0]["success"]
        summary["greedy_final_success"] = greedy[-1]["success"]
        summary["greedy_steps"] = [greedy[0]["step"], greedy[-1]["step"]]
        kinds = sorted(k for k in greedy[-1] if k.startswith("success/"))
        if kinds:
            summary["greedy_per_kind"] = {
                k.split("/", 1)[1]: [greedy[0].get(k), greedy[-1].get(k)] for k in kinds
            }
    if train:
        summary["train_reward_first"] = train[0]["reward"]
        summary["train_reward_last"] = train[-1]["reward"]
        summary["rollout_tokens_per_s"] = round(_mean(r["rollout_tokens_per_s"] for r in train), 1)
        summary["tool_calls_per_s"] = round(_mean(r["tool_calls_per_s"] for r in train), 2)
    return summary


def plot_reward_curve(metrics_path: str | os.PathLike[str], out_png: str | os.PathLike[str]) -> Path | None:
    """Training reward (and its moving average) and held-out success against steps, as a PNG."""
    records = read_metrics(metrics_path)
    train = [r for r in records if r.get("split") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    if not train and not evals:
        return None
    with contextlib.suppress(ImportError):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        if train:
            steps = [r["step"] for r in train]
            rewards = [r["reward"] for r in train]
            ax.plot(steps, rewards, color="tab:blue", alpha=0.35, label="train reward (batch mean)")
            window = 5
            smooth = [_mean(rewards[max(0, i - window + 1) : i + 1]) for i in range(len(rewards))]
            ax.plot(steps, smooth, color="tab:blue", label=f"train reward ({window}-step mean)")
        if evals:
            temperature = evals[-1].get("temperature", 0.0)
            ax.plot(
                [r["step"] for r in evals],
                [r["success"] for r in evals],
                "o-",
                color="tab:red",
                label=f"held-out success (T={temperature:g})",
            )
        greedy = [r for r in records if r.get("split") == "eval_greedy"]
        if greedy:
            ax.plot(
                [r["step"] for r in greedy],
                [r["success"] for r in greedy],
                "s--",
                color="tab:green",
                label="held-out success (greedy)",
            )
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("reward / success rate")
        ax.set_ylim(-0.02, 1.1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title("GRPO with tool calls")
        fig.tight_layout()
        out = Path(out_png)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
        plt.close(fig)
        return out
    logger.warning("matplotlib is not installed; no plot written (pip install matplotlib)")
    return None


# --------------------------------------------------------------------------- decode attention for GQA on CPU

GQA_ATTENTION = "toolfactory_gqa_sdpa"


def _gqa_sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA that never copies the key/value cache for grouped-query attention when decoding.

    transformers' ``sdpa`` path repeats every KV head for its query heads when a mask is
    given (always, with padded batches): on CPU that copy is most of a decode step
    (SmolLM2: 9 query heads share 3 KV heads; py-spy showed ~60 % of decode time in
    ``repeat_kv``). With one query token, the query heads of a KV head can instead be laid
    out as that head's "query positions", which is the same computation without a copy.
    Prefill and training (more than one query token) use transformers' own ``sdpa``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    batch, heads, _, dim = query.shape
    grouped = query.reshape(batch, heads // groups, groups, dim)
    mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=False
    )
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_gqa_decode_attention(model: Any) -> bool:
    """Switch ``model`` to :func:`_gqa_sdpa` (same results, faster CPU decoding); False if unsupported."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        AttentionInterface.register(GQA_ATTENTION, _gqa_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_ATTENTION, sdpa_mask)
        model.set_attn_implementation(GQA_ATTENTION)
    except (ImportError, AttributeError, ValueError) as exc:
        logger.info("keeping the model's attention implementation: %s", exc)
        return False
    return True
